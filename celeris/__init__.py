"""Celeris: a fast inference engine and playground for masked diffusion language models."""

from .config import (CelerisError, EngineBusyError, EngineClosedError, EngineConfig,
                     EngineOutOfMemoryError, ModelLoadError)
from .model import CelerisConfig, CelerisForMaskedDiffusion
from .families import (EXAMPLE_TOOLS, DreamConfig, Family, FastDLLMQwenConfig, LLaDA2MoeConfig, LLaDAConfig,
                       SDARConfig, SDARMoeConfig, load_model, register_family)
from .outputs import FinishReason, GenerationResult, StepEvent, StepTiming, Timings, Usage
from .params import GenerationParams

__version__ = "0.1.0"
from .engine import (AsyncEngine, ContextLengthError, Engine, cut_at_stop, memory_info,
                     split_infill)
from .ar_baseline import ARBaseline

__all__ = ["Engine", "EngineConfig", "GenerationParams", "GenerationResult", "StepEvent",
           "FinishReason", "Timings", "Usage", "CelerisError", "ModelLoadError",
           "EngineBusyError", "EngineClosedError", "EngineOutOfMemoryError", "CelerisConfig",
           "CelerisForMaskedDiffusion", "LLaDAConfig", "DreamConfig", "FastDLLMQwenConfig",
           "SDARConfig", "SDARMoeConfig", "LLaDA2MoeConfig", "StepTiming", "load_model", "cut_at_stop", "memory_info",
           "AsyncEngine", "ContextLengthError", "split_infill", "Family", "register_family",
           "EXAMPLE_TOOLS"]
