"""Pure-torch twin of the KV-cache write kernel (``triton_kv_write.py``): a slice copy per run
of columns and per tensor, in place."""

from __future__ import annotations

import torch


def write_kv_reference(k: torch.Tensor, v: torch.Tensor, k_store: torch.Tensor,
                       v_store: torch.Tensor,
                       runs: list[tuple[int, int, int, int, int]]) -> None:
    """For each run (row, column, slot, position, length): the window's columns
    [column, column + length) of row ``row`` of k and v (B, Hkv, W, D) go to positions
    [position, position + length) of slot ``slot`` of the stores (slots, Hkv, L, D)."""
    for store, new in ((k_store, k), (v_store, v)):
        for row, col, slot, pos, n in runs:
            store[slot, :, pos:pos + n] = new[row, :, col:col + n]            # (Hkv, n, D)
