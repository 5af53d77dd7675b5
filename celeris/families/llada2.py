"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.*-mini, -flash): block-causal MoE (Ling names).

Its published sampler is a threshold of 0.95; LLaDA2.1's generation config adds token
editing (``editing_threshold``, ``max_post_steps``). Its mask (``<|mask|>``, 156895) and EOS
(``<|endoftext|>``, 156892) ids are given in its model card.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig, check_plain_rope_and_silu, pop_unused
from .layouts import BlockLayout
from .registry import Family, register

_LAYER = r"^(model\.layers\.\d+)\."
# LLaDA2's (Ling/Bailing) tensor names -> ours: fused query_key_value, dense output, per-head
# q/k norms
RENAMES = (
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (_LAYER + r"attention\.query_key_value\.", r"\1.self_attn.qkv_proj."),
    (_LAYER + r"attention\.dense\.", r"\1.self_attn.o_proj."),
    (_LAYER + r"attention\.query_layernorm\.", r"\1.self_attn.q_norm."),
    (_LAYER + r"attention\.key_layernorm\.", r"\1.self_attn.k_norm."),
)


class LLaDA2MoeConfig(CelerisConfig):
    """inclusionAI/LLaDA2.0-*/LLaDA2.1-* configs (model_type "llada2_moe"), as read by their
    modeling_llada2_moe.py: block-causal attention (blocks of 32 unless the config says
    ``block_size``), one fused q/k/v projection, per-head q/k RMSNorm (``use_qk_norm``), RoPE
    on the first ``partial_rotary_factor`` of each head, logits not shifted. The first
    ``first_k_dense_replace`` layers are dense; the others route with sigmoid scores:
    ``expert_bias`` picks the experts (the ``n_group`` groups ranked by the sum of their two
    best biased scores, the best ``topk_group`` kept) but the weights are the unbiased scores
    of the chosen experts, normalised (top-k > 1) and times ``routed_scaling_factor``; the
    shared experts are one MLP of ``num_shared_experts * moe_intermediate_size``."""

    model_type = "llada2_moe"

    def __init__(self, **kwargs) -> None:
        check_plain_rope_and_silu(kwargs)
        if "use_qkv_bias" in kwargs or "n_group" in kwargs or "first_k_dense_replace" in kwargs:
            self._upstream_fields(kwargs)
        if kwargs.get("block_size") is None:
            kwargs["block_size"] = kwargs.pop("block_length", None) or 32
        kwargs.setdefault("attention", "block_causal")
        kwargs.setdefault("family", "llada2")
        super().__init__(**kwargs)

    @staticmethod
    def _upstream_fields(kw: dict) -> None:
        if not kw.get("num_key_value_heads"):
            kw["num_key_value_heads"] = None                  # upstream 0: as many as heads
        kw.setdefault("qkv_bias", bool(kw.pop("use_qkv_bias", False)))
        kw.setdefault("qk_norm", bool(kw.pop("use_qk_norm", True)))
        kw.setdefault("o_bias", bool(kw.pop("use_bias", True)))
        kw.setdefault("fused_qkv", True)
        kw.setdefault("partial_rotary_factor", 0.5)
        kw.setdefault("rms_norm_eps", 1e-5)
        kw.setdefault("max_position_embeddings", 16384)
        experts = kw.setdefault("num_experts", 16) or 0
        top_k = kw.setdefault("num_experts_per_tok", 2)
        first_dense = kw.pop("first_k_dense_replace", 0) or 0
        layers = kw.get("num_hidden_layers", 24)
        kw.setdefault("moe_layers", list(range(first_dense, layers)) if experts else [])
        shared = kw.pop("num_shared_experts", 0) or 0
        kw.setdefault("shared_expert_intermediate_size",
                      shared * (kw.get("moe_intermediate_size") or 0))
        score = kw.pop("score_function", "sigmoid")
        kw.setdefault("router_score", score)
        kw.setdefault("router_bias", "select")                # the gate's expert_bias buffer
        kw.setdefault("router_groups", kw.pop("n_group", 8))
        kw.setdefault("router_topk_groups", kw.pop("topk_group", 4))
        kw.setdefault("routed_scaling_factor", 2.5)
        kw["norm_topk_prob"] = top_k > 1                      # the upstream rule, not the key
        kw.setdefault("router_fp32", True)
        pop_unused(kw, "norm_head", "embedding_dropout", "attention_dropout", "output_dropout",
                    "use_cache", "use_sliding_window", "sliding_window", "max_window_layers",
                    "output_router_logits", "moe_router_enable_expert_bias", "router_dtype",
                    "rotary_dim")


LLADA2 = register(Family(
    name="llada2", display="LLaDA2.x (MoE)", model_types=("llada2_moe",),
    config_class=LLaDA2MoeConfig, architectures=("LLaDA2MoeModelLM",), causal_lm=True,
    renames=RENAMES, experts=True, special_ids={"mask": 156895, "eos": 156892},
    sampler={"decoding": "threshold", "threshold": 0.95},
    generation_keys={"editing_threshold": "edit_threshold",
                     "max_post_steps": "max_post_edit_steps"},
    layout=BlockLayout))
