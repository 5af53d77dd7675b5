"""Celeris: a fast inference engine and playground for masked diffusion language models."""

import logging as _logging


class _ExpectedImportNoise(_logging.Filter):
    """torchao (requirements-quant.txt: --quantize) is imported by transformers at startup
    whenever it is installed. It then logs a warning for each of its CUDA-only kernel
    libraries a CPU build of torch cannot load (none of them is used by --quantize), and
    torch logs a deprecation for each of its enums registered with pytree. Those records are
    dropped; every other record of both loggers passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (("Failed to load" in text and "torchao/_C" in text.replace("\\", "/"))
                    or "register_constant() on Enum subclasses is deprecated" in text)


for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).addFilter(_ExpectedImportNoise())

from .config import (CelerisError, EngineBusyError, EngineClosedError, EngineConfig,
                     EngineOutOfMemoryError, ModelLoadError)
from .model import CelerisConfig, CelerisForMaskedDiffusion
from .families import (EXAMPLE_TOOLS, DreamConfig, Family, FastDLLMQwenConfig, LLaDA2MoeConfig, LLaDAConfig,
                       SDARConfig, SDARMoeConfig, load_model, register_family)
from .families.loading import config_weight_bytes
from .model.quantize import QuantizeError, quantize_model, tensor_bytes, weight_bytes
from .outputs import FinishReason, GenerationResult, StepEvent, StepTiming, Timings, Usage
from .params import GenerationParams

__version__ = "0.1.0"
from .engine import (AsyncEngine, ContextLengthError, Engine, cut_at_stop, memory_info,
                     split_infill)
from .ar_baseline import ARBaseline
# the demo world, for the playground's story builder and unknown-word notice
from .synthetic.world import builder_request, prompt_unknown_words, world, world_markdown

__all__ = ["Engine", "EngineConfig", "GenerationParams", "GenerationResult", "StepEvent",
           "FinishReason", "Timings", "Usage", "CelerisError", "ModelLoadError",
           "EngineBusyError", "EngineClosedError", "EngineOutOfMemoryError", "CelerisConfig",
           "CelerisForMaskedDiffusion", "LLaDAConfig", "DreamConfig", "FastDLLMQwenConfig",
           "SDARConfig", "SDARMoeConfig", "LLaDA2MoeConfig", "StepTiming", "load_model", "cut_at_stop", "memory_info",
           "AsyncEngine", "ContextLengthError", "split_infill", "Family", "register_family",
           "EXAMPLE_TOOLS", "QuantizeError", "quantize_model", "tensor_bytes", "weight_bytes",
           "config_weight_bytes", "builder_request", "prompt_unknown_words", "world",
           "world_markdown"]
