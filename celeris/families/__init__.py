"""Model families: one module each, found through one registry.

Importing this package registers the built-in families (and, through them, their configs and
models with transformers' Auto classes, so ``AutoModel.from_pretrained(path)`` reads their
checkpoints without ``trust_remote_code``). A new family is one module that builds a
``Family`` and calls ``register`` (docs/ADDING_A_FAMILY.md).
"""

import importlib
import pkgutil

from .layouts import BlockLayout, CanvasLayout, Layout, attention_layout, infill_refusal
from .loading import load, load_model, native_class, read_config
from .tool_calls import EXAMPLE_TOOLS
from .registry import (Family, by_name, family_of, find, register, registered,
                       supported_model_types, unregister)

register_family = register    # the public name (``celeris.register_family``)


def _import_family_modules() -> None:
    """Import every module of this package: each family module registers itself, so a new
    family is a new file here and nothing else (the order is irrelevant: a model_type shared
    by two families is told apart by their ``claims``)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_import_family_modules()
# the config classes of the built-in families are public names (``celeris.LLaDAConfig``, ...)
from .diffusion_gemma import DiffusionGemmaConfig  # noqa: E402
from .dream import DreamConfig  # noqa: E402
from .fast_dllm_v2 import FastDLLMQwenConfig  # noqa: E402
from .llada import LLaDAConfig, LLaDAMoEConfig  # noqa: E402
from .llada2 import LLaDA2MoeConfig  # noqa: E402
from .llama_twin import LlamaAsBlockConfig  # noqa: E402
from .sdar import SDARConfig, SDARMoeConfig  # noqa: E402

__all__ = ["EXAMPLE_TOOLS", "Family", "Layout", "BlockLayout", "CanvasLayout", "attention_layout",
           "infill_refusal", "register", "register_family", "unregister", "registered",
           "by_name", "family_of", "find", "supported_model_types", "load", "load_model", "native_class", "read_config",
           "DiffusionGemmaConfig", "DreamConfig", "FastDLLMQwenConfig", "LLaDAConfig",
           "LLaDAMoEConfig", "LLaDA2MoeConfig", "LlamaAsBlockConfig", "SDARConfig",
           "SDARMoeConfig"]
