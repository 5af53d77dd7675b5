"""SDAR (JetLM/SDAR-*) and SDAR-MoE (JetLM/SDAR-*-A*B): Qwen3 / Qwen3-MoE block diffusion.

Block-causal, logits not shifted. Their published sampler (``generate.py``):
``low_confidence_dynamic`` at 0.85 (``decoding="dynamic"``; its sampling temperature 1.0 is
not taken: greedy stays the default). SDAR-MoE's mask token (``<|MASK|>``) is given in its
model card. Their chat template is Qwen3's, whose tool calls are
``<tool_call>{json}</tool_call>``.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig, check_plain_rope_and_silu, pop_unused
from .layouts import BlockLayout
from .registry import Family, register
from .tool_calls import QWEN


class SDARConfig(CelerisConfig):
    """JetLM/SDAR-* configs (model_type "sdar"): Qwen3 blocks (per-head q/k RMSNorm, no
    biases unless ``attention_bias``), block-causal, logits not shifted. The checkpoints do not
    record their block length; SDAR's chat models were trained with blocks of 4, which is the
    default here (``block_length``/``block_size`` in config.json override it)."""

    model_type = "sdar"

    def __init__(self, qk_norm: bool = True, **kwargs) -> None:
        kwargs["qkv_bias"] = kwargs.pop("attention_bias", kwargs.get("qkv_bias", False))
        kwargs.setdefault("attention", "block_causal")
        if kwargs.get("block_size") is None:
            kwargs["block_size"] = kwargs.pop("block_length", None) or 4
        kwargs.setdefault("rms_norm_eps", 1e-6)
        kwargs.setdefault("family", "sdar")
        super().__init__(qk_norm=qk_norm, **kwargs)


class SDARMoeConfig(SDARConfig):
    """JetLM/SDAR-*-A*B configs (model_type "sdar_moe"): SDAR's block-causal Qwen3 attention
    with Qwen3-MoE's mixture of experts and its keys. A layer is sparse unless listed in
    ``mlp_only_layers``, when (i + 1) is a multiple of ``decoder_sparse_step``; the router is
    a softmax over the experts, top-k, renormalised when ``norm_topk_prob``; no shared
    experts."""

    model_type = "sdar_moe"

    def __init__(self, **kwargs) -> None:
        check_plain_rope_and_silu(kwargs)
        step = kwargs.pop("decoder_sparse_step", 1) or 1
        dense = set(kwargs.pop("mlp_only_layers", None) or ())
        layers = kwargs.get("num_hidden_layers", 0)
        if kwargs.get("num_experts") and "moe_layers" not in kwargs:
            kwargs["moe_layers"] = [i for i in range(layers)
                                    if i not in dense and (i + 1) % step == 0]
        kwargs.setdefault("family", "sdar_moe")
        pop_unused(kwargs, "router_aux_loss_coef", "output_router_logits", "use_cache",
                    "attention_dropout", "use_sliding_window", "sliding_window",
                    "max_window_layers")
        super().__init__(**kwargs)


SAMPLER = {"decoding": "dynamic", "threshold": 0.85}

SDAR = register(Family(
    name="sdar", display="SDAR", model_types=("sdar",), config_class=SDARConfig,
    architectures=("SDARModel",), causal_lm=True, sampler=SAMPLER, layout=BlockLayout,
    tool_calls=QWEN))

SDAR_MOE = register(Family(
    name="sdar_moe", display="SDAR-MoE", model_types=("sdar_moe",), config_class=SDARMoeConfig,
    architectures=("SDARMoeForCausalLM",), causal_lm=True, experts=True,
    special_ids={"mask": 151669}, sampler=SAMPLER, layout=BlockLayout, tool_calls=QWEN))
