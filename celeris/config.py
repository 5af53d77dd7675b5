"""Engine-level configuration and the project's error types (stdlib only)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
                 "float": "float32"}
DEVICES = ("auto", "cpu", "cuda")
# EngineConfig fields of how the model is loaded (accelerate's placement of a big model, and
# weight quantization): one list for the CLI, server and bench
BIG_MODEL_FIELDS = ("device_map", "max_memory", "offload_folder", "quantize")
DEVICE_MAPS = ("auto",)
# --quantize: weight-only quantization of the linear layers (celeris/model/quantize.py)
QUANTIZE_MODES = ("int8", "int4", "fp8")
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


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


class NonFiniteLogitsError(RuntimeError):
    """The model produced NaN/inf logits for these requests (a broken checkpoint, or an
    overflow in a low-precision dtype); they fail instead of returning garbage."""

    def __init__(self, request_ids: Sequence[str]) -> None:
        self.request_ids = tuple(request_ids)
        super().__init__(f"the model produced non-finite (NaN/inf) logits for request(s) "
                         f"{', '.join(self.request_ids)}; the checkpoint or the dtype is broken "
                         "(try --dtype float32)")


class ContextLengthError(ValueError):
    """The prompt (plus the answer canvas) does not fit a token limit; carries the numbers."""

    def __init__(self, prompt_tokens: int, gen_length: int, limit: int) -> None:
        self.prompt_tokens, self.gen_length, self.limit = prompt_tokens, gen_length, limit
        if gen_length:
            message = (f"prompt ({prompt_tokens} tokens) + gen_length ({gen_length}) = "
                       f"{prompt_tokens + gen_length} tokens exceeds the model's context of "
                       f"{limit} tokens")
        else:
            message = f"prompt has {prompt_tokens} tokens; the limit is {limit}"
        super().__init__(message)


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


def normalize_quantize(mode: Any) -> str | None:
    """None (full width; also "none" or "") or one of QUANTIZE_MODES, or raise naming it."""
    if mode is None or str(mode).strip().lower() in ("", "none"):
        return None
    key = str(mode).strip().lower()
    if key not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)} (or none), "
                         f"got {mode!r}")
    return key


def normalize_max_memory(value: Any) -> dict[int | str, int] | None:
    """max_memory for device_map="auto": a dict or "0=20GiB,cpu=60GiB" (a GPU index, cuda:N
    or cpu, each with bytes or a size such as 500MB / 20GiB) -> {GPU index | "cpu": bytes}."""
    if value is None:
        return None
    if isinstance(value, str):
        pairs = [part.split("=", 1) for part in value.split(",") if part.strip()]
        if not pairs or any(len(p) != 2 for p in pairs):
            raise ValueError(f"max_memory must look like 0=20GiB,cpu=60GiB (device=size, "
                             f"comma-separated), got {value!r}")
        value = {k.strip(): v.strip() for k, v in pairs}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"max_memory must be a dict {{GPU index or 'cpu': size}} or a string "
                         f"like 0=20GiB,cpu=60GiB, got {value!r}")
    out: dict[int | str, int] = {}
    for key, size in value.items():
        out[_memory_device(key)] = _memory_size(key, size)
    return out


def _memory_device(key: Any) -> int | str:
    text = str(key).strip().lower()
    if text.startswith("cuda:"):
        text = text[5:]
    if text.isdigit():
        return int(text)
    if text == "cpu":
        return "cpu"
    raise ValueError(f"max_memory keys must be a GPU index (0, 1, ... or cuda:N) or 'cpu', "
                     f"got {key!r}")


def _memory_size(key: Any, size: Any) -> int:
    if isinstance(size, int) and not isinstance(size, bool):
        number = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
        unit = match and _SIZE_UNITS.get(match[2].lower())
        if not match or unit is None:
            raise ValueError(f"max_memory[{key!r}] must be bytes or a size like 500MB or "
                             f"20GiB, got {size!r}")
        number = int(float(match[1]) * unit)
    if number <= 0:
        raise ValueError(f"max_memory[{key!r}] must be > 0, got {size!r}")
    return number


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs, as opposed to how one request is decoded (GenerationParams).

    max_running: requests denoised together in one batch (step-level batching).
    max_queue:   requests waiting for a slot; beyond it new requests are refused at once.
    compile:     run the model forward under torch.compile (CUDA graphs on CUDA; see
                 celeris/model/compiled.py); where compiling fails, eager with one warning.
    device_map:  "auto": spread whole layers over the GPUs, then CPU memory, then disk
                 (accelerate; celeris/model/dispatch.py) for a model that does not fit one
                 device; max_memory caps each device ({0: "20GiB", "cpu": "60GiB"}),
                 offload_folder holds what goes to disk. None: one device (``device``).
    quantize:    "int8", "int4" or "fp8": weight-only quantization of the transformer
                 layers' linear weights after loading (torchao; celeris/model/quantize.py
                 says what each mode runs on which device and what it refuses). None: the
                 weights as loaded.
    """

    device: str = "auto"
    dtype: str = "auto"
    max_running: int = 32     # chosen by `bench --suite serve` (docs/BENCHMARKS.md, Serving)
    max_queue: int = 64
    max_prompt_tokens: int = 2048
    request_timeout_s: float = 600.0
    compile: bool = False
    device_map: str | None = None
    max_memory: Any = None
    offload_folder: str | None = None
    quantize: str | None = None

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
        object.__setattr__(self, "quantize", normalize_quantize(self.quantize))
        self._check_device_map()

    def _check_device_map(self) -> None:
        if self.device_map is not None and str(self.device_map).lower() not in DEVICE_MAPS:
            allowed = ", ".join(repr(m) for m in DEVICE_MAPS)
            raise ValueError(f"device_map must be {allowed} or None, got {self.device_map!r}")
        if self.device_map is None:
            for name in ("max_memory", "offload_folder"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} only applies with device_map='auto' "
                                     f"(--device-map auto)")
            return
        object.__setattr__(self, "device_map", str(self.device_map).lower())
        if self.device != "auto":
            raise ValueError(f"device_map='auto' places every layer itself (GPUs, then CPU "
                             f"memory, then disk): leave device at 'auto' (got "
                             f"device={self.device!r}); to keep it off a device, give "
                             f"max_memory only for the others")
        if self.compile:
            raise ValueError("compile cannot be combined with device_map='auto' (the "
                             "dispatched layers run through accelerate's hooks, eagerly)")
        if self.quantize is not None:
            raise ValueError(f"quantize={self.quantize!r} cannot be combined with "
                             f"device_map='auto': the weights are quantized in place on one "
                             f"device, and a dispatched model's layers are moved and "
                             f"offloaded by accelerate's hooks; quantize on one device "
                             f"instead (a quantized model may fit where the full-width one "
                             f"did not)")
        object.__setattr__(self, "max_memory", normalize_max_memory(self.max_memory))
        if self.offload_folder is not None:
            object.__setattr__(self, "offload_folder", str(self.offload_folder))
