"""The model forward under torch.compile: a decoding step as few launches as the compiler can make.

At batch 1 an 8B-shaped step on an H200 waited for the CPU to issue its kernels (docs/FINDINGS.md,
"An 8B-shaped batch-1 step on an H200 waits for the CPU"). ``CompiledForward`` wraps the model so
the runner calls it like the model: on CUDA with ``mode="reduce-overhead"`` (inductor's fused
kernels replayed as CUDA graphs, gpt-fast's recipe), elsewhere inductor's default mode. What
makes the step capturable:

- shapes are dynamic from the first call (``dynamic=True``): windows, batch and key lengths vary
  from step to step and would otherwise recompile after each change;
- the KV cache writes by index tensors inside the graph (``SlotView.prepare_index``), so which
  positions a step writes is data, not a constant baked into the graph; on CUDA the cache
  buffers are marked as static addresses, so CUDA graphs may write them in place;
- the packed CPU path and the Triton kernels step aside while tracing (the module path is what
  inductor compiles and fuses);
- a step with left-padded rows (windows of different widths in one batch) runs eagerly: its
  boolean-mask packing has data-dependent shapes that would split the graph at every layer.

``CELERIS_COMPILE_BACKEND`` names another torch.compile backend than inductor (``aot_eager``
tells a tracing problem from an inductor one; ``eager``, dynamo's capture alone, is what the
CPU smoke of the GPU bench uses).

If compiling fails (no C++ compiler for inductor on a CPU, an op inductor cannot lower), the
wrapper warns once and runs the eager model from then on: same tokens, eager speed. A failure
after the first successful compiled call that is not a compiler error is the step's own and is
raised.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

AUTO = "auto"


def compile_mode(device: torch.device) -> str | None:
    """reduce-overhead (CUDA graphs) on CUDA; inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def _compiler_error(exc: BaseException) -> bool:
    return isinstance(exc, torch._dynamo.exc.TorchDynamoException)


class CompiledForward:
    """Callable like the model it wraps (``config``, ``parameters()`` and every other attribute
    are the model's); ``fallback`` says why it runs eagerly, once it does."""

    def __init__(self, model: Any, mode: str | None = AUTO, backend: Any = None,
                 dynamic: bool = True) -> None:
        backend = backend or os.environ.get("CELERIS_COMPILE_BACKEND") or "inductor"
        self.model = model
        self.device = next(model.parameters()).device
        self.mode = compile_mode(self.device) if mode == AUTO else mode
        self.backend = backend
        self.compiled_calls = 0
        self.fallback: str | None = None
        self._static_key: tuple | None = None
        options = {"mode": self.mode} if backend == "inductor" else {}
        self._fn = torch.compile(model, backend=backend, dynamic=dynamic, **options)
        if backend == "inductor" and self.device.type == "cpu":
            self._check_cpu_compiler()

    def __getattr__(self, name: str) -> Any:
        if name == "model":               # not yet set: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.model, name)

    def parameters(self, *args: Any, **kwargs: Any):
        return self.model.parameters(*args, **kwargs)

    def __call__(self, *args: Any, kv: Any = None, **kwargs: Any) -> Any:
        if self.fallback is not None or getattr(kv, "query_mask", None) is not None:
            # left-padded rows are packed by a boolean mask, whose data-dependent shape would
            # break the graph in every layer: such a step runs eagerly
            return self.model(*args, kv=kv, **kwargs)
        if kv is not None:
            prepare = getattr(kv, "prepare_index", None)
            if prepare is not None:
                prepare()
            self._mark_static(kv)
        try:
            out = self._fn(*args, kv=kv, **kwargs)
        except Exception as exc:              # noqa: BLE001 - sorted below
            if self.compiled_calls and not _compiler_error(exc):
                raise
            self._fall_back(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            return self.model(*args, kv=kv, **kwargs)
        self.compiled_calls += 1
        return out

    def _fall_back(self, why: str) -> None:
        self.fallback = why
        warnings.warn(f"torch.compile is unavailable here ({why}); the model runs eagerly "
                      "(same tokens, eager speed)", RuntimeWarning, stacklevel=3)

    def _check_cpu_compiler(self) -> None:
        """Inductor on a CPU needs a C++ compiler: without one, fall back now rather than at
        the first step."""
        try:
            from torch._inductor import cpp_builder
            cpp_builder.get_cpp_compiler()
        except Exception as exc:              # noqa: BLE001 - any failure means no compiler
            self._fall_back(f"inductor found no C++ compiler: {exc}")

    def _mark_static(self, kv: Any) -> None:
        """CUDA graphs may write in place only into inputs at static addresses: mark the KV
        cache's buffers once per allocation (they are reallocated only when they grow)."""
        cache = getattr(kv, "cache", None)
        if self.mode != "reduce-overhead" or cache is None:
            return
        key = (id(cache), cache.capacity, cache.length)
        if key == self._static_key:
            return
        for buf in (*cache.k, *cache.v):
            torch._dynamo.mark_static_address(buf, guard=False)
        self._static_key = key

