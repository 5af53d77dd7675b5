"""LLaDA (GSAI-ML/LLaDA-8B-*, iLLaDA) and LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-*).

Full-attention masked diffusion models with LLaDA's OLMo-lineage names, in their config.json
(``d_model``, ``n_layers``, ...) and their tensors (``model.transformer.blocks.<i>.ff_out``,
...). LLaDA-MoE shares the model_type "llada" (its config adds OLMoE-style MoE keys); the dllm
toolkit's converted LLaDA-MoE checkpoints say "lladamoe". Both families decode with LLaDA's
own sampler settings (the GenerationParams defaults: low-confidence remasking, fixed steps);
their mask ids come from config.json, except LLaDA-MoE's, which only its model card gives.
"""

from __future__ import annotations

from typing import Any

from ..model.configuration import CelerisConfig, check_plain_rope_and_silu, pop_unused
from .layouts import CanvasLayout
from .registry import Family, register

# Upstream LLaDA (OLMo lineage) field names -> ours.
_LLADA_RENAMES = {
    "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "n_layers": "num_hidden_layers",
    "mlp_hidden_size": "intermediate_size", "max_sequence_length": "max_position_embeddings",
    "weight_tying": "tie_word_embeddings", "include_qkv_bias": "qkv_bias",
}


def _llada_moe_fields(kwargs: dict) -> None:
    """inclusionAI/LLaDA-MoE-7B-A1B-*: model_type "llada" with OLMoE-style MoE keys.

    Its router (modeling_lladamoe.py) takes the softmax of the gate logits, adds
    ``expert_bias`` (when ``moe_router_enable_expert_bias``) and keeps the top-k of those sums,
    which are also the weights: no renormalisation and no scaling, whatever
    ``norm_topk_prob``/``routed_scaling_factor`` say. ``moe_layer_freq[i] == 0`` makes layer i
    dense (``dense_intermediate_size``); a shared expert sits beside the routed ones when
    ``shared_expert_intermediate_size`` is set. q/k RMSNorm is per head."""
    check_plain_rope_and_silu(kwargs)
    freq = kwargs.pop("moe_layer_freq", None) or []
    if freq and "moe_layers" not in kwargs:
        kwargs["moe_layers"] = [i for i, f in enumerate(freq) if f]
    for theirs, ours in (("dense_intermediate_size", "intermediate_size"),
                         ("expert_intermediate_size", "moe_intermediate_size"),
                         ("qk_layernorm", "qk_norm")):
        if theirs in kwargs:
            kwargs.setdefault(ours, kwargs.pop(theirs))
    bias = bool(kwargs.pop("attention_bias", False))
    kwargs.setdefault("qkv_bias", bias)
    kwargs.setdefault("o_bias", bias)
    if kwargs.pop("moe_router_enable_expert_bias", False):
        kwargs.setdefault("router_bias", "add")
    if (kwargs.get("partial_rotary_factor") or -1) <= 0:
        kwargs["partial_rotary_factor"] = 1.0        # the upstream class defaults to -1
    kwargs["norm_topk_prob"], kwargs["routed_scaling_factor"] = False, 1.0
    kwargs.setdefault("family", "llada_moe")
    pop_unused(kwargs, "moe_router_score_function", "router_num_group", "router_topk_group",
                "router_aux_loss_coef", "output_router_logits", "attention_dropout",
                "use_cache")


class LLaDAConfig(CelerisConfig):
    """GSAI-ML/LLaDA-8B-* configs (model_type "llada"), read with their own field names, and
    inclusionAI's LLaDA-MoE configs, which share the model_type (``_llada_moe_fields``).
    iLLaDA uses the dense layout; its mask id (5) comes from its config.json like LLaDA's."""

    model_type = "llada"

    def __init__(self, **kwargs) -> None:
        if "expert_intermediate_size" in kwargs or "moe_layer_freq" in kwargs:
            _llada_moe_fields(kwargs)
        for theirs, ours in _LLADA_RENAMES.items():
            if theirs in kwargs:
                value = kwargs.pop(theirs)
                kwargs.setdefault(ours, value)
        # The embedding matrix may be padded beyond the tokenizer's vocabulary.
        if kwargs.get("embedding_size"):
            kwargs["vocab_size"] = kwargs.pop("embedding_size")
        if kwargs.get("include_bias"):
            kwargs["qkv_bias"] = True
        if kwargs.get("mlp_ratio") and "intermediate_size" not in kwargs:
            kwargs["intermediate_size"] = kwargs["mlp_ratio"] * kwargs.get("hidden_size", 256)
        kwargs.setdefault("rope_theta", 500000.0)
        super().__init__(**kwargs)




class LLaDAMoEConfig(LLaDAConfig):
    """The dllm toolkit's spelling of a LLaDA-MoE config (model_type "lladamoe"): the same
    fields as inclusionAI's, read the same way."""

    model_type = "lladamoe"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("family", "llada_moe")
        super().__init__(**kwargs)


def _is_moe(raw: dict[str, Any]) -> bool:
    return raw.get("model_type") == "lladamoe" or \
        "expert_intermediate_size" in raw or "moe_layer_freq" in raw


_BLOCK = {
    "attn_norm": "input_layernorm", "ff_norm": "post_attention_layernorm",
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj", "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
}
_LAYER = r"^(model\.layers\.\d+)\."
# LLaDA's OLMo-style tensor names -> ours; then LLaDA-MoE's, whose shared expert hangs off the
# layer and expert bias off the MoE block (ours sit under the MoE block and its router)
RENAMES = (
    (r"^model\.transformer\.wte\.", "model.embed_tokens."),
    (r"^model\.transformer\.ln_f\.", "model.norm."),
    (r"^model\.transformer\.ff_out\.", "lm_head."),
) + tuple((rf"^model\.transformer\.blocks\.(\d+)\.{theirs}\.", rf"model.layers.\1.{ours}.")
          for theirs, ours in _BLOCK.items()) + (
    (_LAYER + r"shared_expert\.", r"\1.mlp.shared_experts."),
    (_LAYER + r"mlp\.expert_bias", r"\1.mlp.gate.expert_bias"),
)

LLADA = register(Family(
    name="llada", display="LLaDA", model_types=("llada",), config_class=LLaDAConfig,
    architectures=("LLaDAModelLM",), renames=RENAMES, experts=True, layout=CanvasLayout))

LLADA_MOE = register(Family(
    name="llada_moe", display="LLaDA-MoE", model_types=("llada", "lladamoe"),
    config_class=LLaDAMoEConfig, architectures=("LLaDAMoEModelLM",), claims=_is_moe,
    renames=RENAMES, experts=True, special_ids={"mask": 156895},   # its card: generate(mask_id=)
    layout=CanvasLayout))
