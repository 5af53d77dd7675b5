"""The native diffusion transformer and the mechanics of loading checkpoints onto it.

``CelerisForMaskedDiffusion`` is one Llama-style model for every native family (full-attention
and block-causal, dense and mixture-of-experts); ``weights.load_native`` streams a checkpoint's
tensors into it, renamed by the family's rule. What each family is (its config reading, tensor
names, special ids, sampler, layout) lives in ``celeris/families/``, which also registers the
families with transformers' Auto classes. DiffusionGemma is transformers' own model
(``diffusion_gemma.py`` wraps it for the engine).
"""

from .configuration import CelerisConfig
from .diffusion_gemma import DiffusionGemma, GemmaCache
from .modeling import CelerisForMaskedDiffusion, KVView
from .weights import load_native, read_config_json, resolve_device, resolve_dtype

__all__ = ["CelerisConfig", "CelerisForMaskedDiffusion", "DiffusionGemma", "GemmaCache",
           "KVView", "load_native", "read_config_json", "resolve_device", "resolve_dtype"]
