"""The autoregressive twin read by the diffusion engine (model_type "llama").

``celeris-tiny-ar`` is a plain Llama checkpoint; transformers' ``generate()`` is its own path
(``ar_baseline.py``). Read here as a block-causal model with blocks of one position and
shifted logits, the block engine decodes it as greedy autoregression with the same kernels,
cache and host loop as a diffusion model: the bench's same-engine control. Only Celeris's
loader reads it this way; ``AutoConfig`` keeps transformers' own Llama.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig
from .layouts import BlockLayout
from .registry import Family, register


class LlamaAsBlockConfig(CelerisConfig):
    """An autoregressive Llama checkpoint (model_type "llama", e.g. models/celeris-tiny-ar) read
    as a block-causal model with blocks of one position and shifted logits: position i sees
    positions <= i and the token at i is predicted from the state at i-1, which is exactly
    causal next-token prediction. Decoding it with the block engine is then greedy
    autoregressive decoding with the same kernels, cache and host loop as a diffusion model:
    the bench's same-engine control for the AR twin (``transformers``' ``generate()`` stays the
    twin's own path). Only Celeris's loader reads this; ``AutoConfig`` keeps transformers'
    own Llama."""

    model_type = "llama"

    def __init__(self, **kwargs) -> None:
        rope = kwargs.pop("rope_parameters", None) or kwargs.pop("rope_scaling", None) or {}
        if rope.get("rope_type", "default") not in ("default", None):
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported "
                             "(only plain RoPE)")
        if "rope_theta" in rope:
            kwargs.setdefault("rope_theta", rope["rope_theta"])
        if kwargs.pop("mlp_bias", False):
            raise ValueError("mlp_bias=true is not supported")
        act = kwargs.pop("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be silu (SwiGLU), got {act!r}")
        kwargs["qkv_bias"] = kwargs.pop("attention_bias", False)
        for unused in ("attention_dropout", "pretraining_tp", "use_cache"):
            kwargs.pop(unused, None)
        kwargs.update(attention="block_causal", block_size=1, shift_logits=True)
        super().__init__(**kwargs)


LLAMA = register(Family(
    name="llama", display="Llama (autoregressive)", model_types=("llama",),
    config_class=LlamaAsBlockConfig, architectures=("LlamaForCausalLM",), auto=False,
    layout=BlockLayout))
