"""Model families: one module each, found through one registry.

Importing this package registers the built-in families (and, through them, their configs and
models with transformers' Auto classes, so ``AutoModel.from_pretrained(path)`` reads their
checkpoints without ``trust_remote_code``). A new family is one module that builds a
``Family`` and calls ``register`` (docs/ADDING_A_FAMILY.md).
"""

from .layouts import BlockLayout, CanvasLayout, Layout, attention_layout, infill_refusal
from .registry import (Family, by_name, family_of, find, register, registered,
                       supported_model_types, unregister)
register_family = register    # the public name (``celeris.register_family``)
from .loading import load, load_model, native_class, read_config

# the built-in families, each registering itself on import (the order is irrelevant: a
# model_type shared by two families is told apart by their ``claims``)
from . import celeris_tiny, diffusion_gemma, dream, fast_dllm_v2, llada, llada2  # noqa: E402
from . import llama_twin, sdar  # noqa: E402
from .diffusion_gemma import DiffusionGemmaConfig  # noqa: E402
from .dream import DreamConfig  # noqa: E402
from .fast_dllm_v2 import FastDLLMQwenConfig  # noqa: E402
from .llada import LLaDAConfig, LLaDAMoEConfig  # noqa: E402
from .llada2 import LLaDA2MoeConfig  # noqa: E402
from .llama_twin import LlamaAsBlockConfig  # noqa: E402
from .sdar import SDARConfig, SDARMoeConfig  # noqa: E402

__all__ = ["Family", "Layout", "BlockLayout", "CanvasLayout", "attention_layout",
           "infill_refusal", "register", "register_family", "unregister", "registered", "by_name", "family_of", "find",
           "supported_model_types", "load", "load_model", "native_class", "read_config",
           "DiffusionGemmaConfig", "DreamConfig", "FastDLLMQwenConfig", "LLaDAConfig",
           "LLaDAMoEConfig", "LLaDA2MoeConfig", "LlamaAsBlockConfig", "SDARConfig",
           "SDARMoeConfig"]
