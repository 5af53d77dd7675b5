"""Kernels with a pure-torch twin and one dispatch switch.

``block_stats`` runs the Triton kernel on CUDA tensors and the torch twin elsewhere; set
CELERIS_KERNELS=torch to force the twin (e.g. to compare on a GPU). The model's fused RMSNorm
and rotary embedding (``rms_norm``, ``rope_qk``) take the Triton kernels when
``fused_kernels(x)`` says so: inference on CUDA tensors, outside torch.compile (inductor fuses
the same ops itself); so does the KV cache's write (``write_kv``: every run of k and v in one
launch). CELERIS_KERNELS=triton forces them on any device, which on a CPU works
only under TRITON_INTERPRET=1 (the tests).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .kv_write_reference import write_kv_reference
from .norm_rope_reference import rms_norm_reference, rope_qk_reference
from .reference import ALL_STATS, BlockStats, block_stats_reference, gumbel_scores


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def fused_kernels(x: torch.Tensor) -> bool:
    """Whether a forward over activations like ``x`` runs the fused Triton RMSNorm / RoPE.
    Never with gradients (the kernels have no backward) or autocast (mixed dtypes), nor while
    torch.compile traces."""
    mode = os.environ.get("CELERIS_KERNELS", "auto")
    if (mode == "torch" or torch.is_grad_enabled() or torch.compiler.is_compiling()
            or torch.is_autocast_enabled(x.device.type) or not triton_available()):
        return False
    return mode == "triton" or x.is_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, fused: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual): the Triton kernel when ``fused``."""
    if fused:
        from .triton_norm_rope import rms_norm_triton
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_reference(x, weight, eps, residual)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None,
            eps: float = 1e-6, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated (after an optional per-head RMSNorm): one Triton launch when ``fused``."""
    if fused:
        from .triton_norm_rope import rope_qk_triton
        return rope_qk_triton(q, k, cos, sin, q_weight, k_weight, eps)
    return rope_qk_reference(q, k, cos, sin, q_weight, k_weight, eps)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_store: torch.Tensor, v_store: torch.Tensor,
             runs: list[tuple[int, int, int, int, int]], table: torch.Tensor | None = None,
             fused: bool = False) -> None:
    """Runs (row, column, slot, position, length) of k and v (B, Hkv, W, D) into the stores
    (slots, Hkv, L, D), in place: one Triton launch when ``fused`` (``table``: the runs as an
    (R, 5) int64 tensor on the stores' device), a slice copy per run otherwise."""
    if fused:
        from .triton_kv_write import write_kv_triton
        return write_kv_triton(k, v, k_store, v_store, table,
                               max((r[4] for r in runs), default=0))
    return write_kv_reference(k, v, k_store, v_store, runs)


def block_stats(logits: torch.Tensor, temperature: torch.Tensor | None = None,
                uniform: torch.Tensor | None = None,
                need: tuple[str, ...] = ALL_STATS) -> BlockStats:
    """Per row of (..., V) logits (temperature and uniform shaped alike): chosen token, its
    probability, margin and neg-entropy, each (...) (the torch twin computes only the
    ``need``ed ones; the kernel all in one pass, over (N, V) rows)."""
    if (logits.is_cuda and os.environ.get("CELERIS_KERNELS", "auto") != "torch"
            and triton_available()):
        from .triton_block_stats import block_stats_triton
        return over_rows(block_stats_triton, logits, temperature, uniform)
    return block_stats_reference(logits, temperature, uniform, need)


def over_rows(kernel: Any, logits: torch.Tensor, temperature: torch.Tensor | None,
              uniform: torch.Tensor | None) -> BlockStats:
    """A kernel over (N, V) rows applied to (..., V) logits, its statistics shaped (...)."""
    lead, V = logits.shape[:-1], logits.shape[-1]
    if temperature is not None and uniform is not None:
        temperature = temperature.expand(lead).reshape(-1)
        uniform = uniform.reshape(-1, V)
    stats = kernel(logits.reshape(-1, V), temperature, uniform)
    return BlockStats(*(None if t is None else t.view(lead) for t in stats))


__all__ = ["BlockStats", "block_stats", "block_stats_reference", "fused_kernels",
           "gumbel_scores", "rms_norm", "rms_norm_reference", "rope_qk", "rope_qk_reference",
           "triton_available", "write_kv", "write_kv_reference"]
