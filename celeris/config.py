"""Engine-level configuration and the project's error types (stdlib only)."""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "float": "float32"}
DEVICES = ("auto", "cpu", "cuda")


class CelerisError(Exception):
    """Base class for errors that carry a message meant for the user (no traceback needed)."""


class ModelLoadError(CelerisError):
    """A checkpoint could not be found, read or mapped onto a native architecture."""


class EngineBusyError(CelerisError):
    """The scheduler is at capacity; try again later."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineOutOfMemoryError(CelerisError):
    """A step ran out of device or host memory: a capacity problem; retry later."""

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineClosedError(CelerisError):
    """The engine is shutting down (draining) and takes no new requests."""


def normalize_dtype(name: str) -> str:
    """Map a user-facing dtype name onto one of DTYPES, or raise naming the field."""
    key = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (or fp32/bf16/fp16), "
                         f"got {name!r}")
    return key


def normalize_device(name: str) -> str:
    key = str(name).lower()
    if key not in DEVICES and not key.startswith("cuda:"):
        raise ValueError(f"device must be one of {', '.join(DEVICES)} or cuda:N, got {name!r}")
    return key


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs, as opposed to how one request is decoded (GenerationParams).

    max_running: requests denoised together in one batch (step-level batching).
    max_queue:   requests waiting for a slot; beyond it new requests are refused at once.
    compile:     run the model forward under torch.compile (CUDA graphs on CUDA; see
                 celeris/model/compiled.py); where compiling fails, eager with one warning.
    """

    device: str = "auto"
    dtype: str = "auto"
    max_running: int = 32     # chosen by `bench --suite serve` (docs/BENCHMARKS.md, Serving)
    max_queue: int = 64
    max_prompt_tokens: int = 2048
    request_timeout_s: float = 600.0
    compile: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", normalize_device(self.device))
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        for name, lo in (("max_running", 1), ("max_queue", 0), ("max_prompt_tokens", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
