"""Kernels with a pure-torch twin and one dispatch switch.

``block_stats`` runs the Triton kernel on CUDA tensors and the torch twin elsewhere; set
CELERIS_KERNELS=torch to force the twin (e.g. to compare on a GPU).
"""

from __future__ import annotations

import os

import torch

from .reference import ALL_STATS, BlockStats, block_stats_reference, gumbel_scores


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def block_stats(logits: torch.Tensor, temperature: torch.Tensor | None = None,
                uniform: torch.Tensor | None = None,
                need: tuple[str, ...] = ALL_STATS) -> BlockStats:
    """Per row of (N, V) logits: chosen token, its probability, margin and neg-entropy
    (the torch twin computes only the ``need``ed ones; the kernel all in one pass)."""
    if (logits.is_cuda and os.environ.get("CELERIS_KERNELS", "auto") != "torch"
            and triton_available()):
        from .triton_block_stats import block_stats_triton
        return block_stats_triton(logits, temperature, uniform)
    return block_stats_reference(logits, temperature, uniform, need)


__all__ = ["BlockStats", "block_stats", "block_stats_reference", "gumbel_scores",
           "triton_available"]
