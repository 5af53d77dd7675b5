"""Triton kernel: write one forward's fresh keys and values into the KV cache in one launch.

A forward computes keys/values for a window (B, Hkv, W, D) and each row writes some of its
columns into its slot of the static cache, (slots, Hkv, L, D) per layer. In torch that is a
slice copy per run of columns and per tensor (2-4 launches a layer at batch 1), or a gather
and a scatter per tensor for a large batch (4 a layer). This kernel copies every run of k and
of v in one launch a layer, straight from the window into the slots, in place; the run table
is built once per forward. One program per (run, head, chunk of columns).

``kv_write_reference.py`` holds the torch twin (the slice copies); ``cache.SlotView`` picks
this kernel on CUDA at inference.

Import only where Triton can launch: on CUDA, or on CPU with TRITON_INTERPRET=1 set before this
module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_W = 16


@triton.jit
def _kv_write_kernel(k_ptr, v_ptr, ks_ptr, vs_ptr, runs_ptr,
                     sk_b, sk_h, sk_w, sv_b, sv_h, sv_w, st_s, st_h, st_l, D,
                     BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    row = tl.load(runs_ptr + r * 5)
    col = tl.load(runs_ptr + r * 5 + 1)
    slot = tl.load(runs_ptr + r * 5 + 2)
    pos = tl.load(runs_ptr + r * 5 + 3)
    n = tl.load(runs_ptr + r * 5 + 4)
    j = tl.program_id(2).to(tl.int64) * BLOCK_W + tl.arange(0, BLOCK_W)       # columns
    d = tl.arange(0, BLOCK_D)
    m = (j < n)[:, None] & (d < D)[None, :]
    dst = slot * st_s + h * st_h + (pos + j)[:, None] * st_l + d[None, :]
    src = row * sk_b + h * sk_h + (col + j)[:, None] * sk_w + d[None, :]
    ty = ks_ptr.dtype.element_ty
    tl.store(ks_ptr + dst, tl.load(k_ptr + src, mask=m).to(ty), mask=m)
    src = row * sv_b + h * sv_h + (col + j)[:, None] * sv_w + d[None, :]
    tl.store(vs_ptr + dst, tl.load(v_ptr + src, mask=m).to(ty), mask=m)


def run_table(runs: list[tuple[int, int, int, int, int]], device: torch.device
              ) -> torch.Tensor:
    """The (R, 5) int64 table of runs (row, column, slot, position, length) on ``device``."""
    return torch.tensor(runs, dtype=torch.int64, device=device).view(-1, 5)


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, k_store: torch.Tensor,
                    v_store: torch.Tensor, table: torch.Tensor, max_len: int) -> None:
    """k, v (B, Hkv, W, D), any strides with a unit last one; stores (slots, Hkv, L, D) of one
    shape and strides; table from ``run_table``; ``max_len``: the longest run."""
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"k and v must be (B, Hkv, W, D) of one shape, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if k_store.shape != v_store.shape or k_store.stride() != v_store.stride() \
            or k_store.dim() != 4 or k_store.shape[1] != k.shape[1] \
            or k_store.shape[3] != k.shape[3] or k_store.stride(3) != 1:
        raise ValueError(f"stores must share a (slots, {k.shape[1]}, L, {k.shape[3]}) layout "
                         f"with a unit last stride, got {tuple(k_store.shape)} and "
                         f"{tuple(v_store.shape)}")
    if table.dtype != torch.int64 or table.dim() != 2 or table.shape[1] != 5:
        raise ValueError(f"table must be int64 (R, 5), got {table.dtype} {tuple(table.shape)}")
    if len({k.device, v.device, k_store.device, v_store.device, table.device}) != 1:
        raise ValueError("k, v, the stores and the table must be on one device")
    k = k if k.stride(3) == 1 else k.contiguous()
    v = v if v.stride(3) == 1 else v.contiguous()
    R, Hkv, D = table.shape[0], k.shape[1], k.shape[3]
    if R == 0 or max_len == 0:
        return
    grid = (R, Hkv, triton.cdiv(max_len, BLOCK_W))
    _kv_write_kernel[grid](k, v, k_store, v_store, table, k.stride(0), k.stride(1), k.stride(2),
                           v.stride(0), v.stride(1), v.stride(2), k_store.stride(0),
                           k_store.stride(1), k_store.stride(2), D, BLOCK_W=BLOCK_W,
                           BLOCK_D=triton.next_power_of_2(D))
