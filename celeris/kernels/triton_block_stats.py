"""Triton kernel: per-position decoding statistics of the active block in one vocabulary pass.

One program per row (a position of the active block). It streams the row's logits in chunks of
BLOCK_V and keeps running values only: the softmax max and normaliser (online softmax,
Milakov & Gimelshein 2018), sum(e^(l-m) * l) for the entropy, the top-2 logits with the index
of the first, and the Gumbel-max argmax when a temperature is set. The (N, V) probabilities are
never written. ``reference.py`` holds the torch twin these values are tested against.

Import only where Triton can launch: on CUDA, or on CPU with TRITON_INTERPRET=1 set before this
module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .reference import BlockStats


@triton.jit
def _block_stats_kernel(logits_ptr, stride_l, temp_ptr, u_ptr, stride_u,
                        x0_ptr, px0_ptr, margin_ptr, negent_ptr, V,
                        HAS_NOISE: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    m = tl.full((), neg_inf, tl.float32)     # running max
    s = tl.zeros((), tl.float32)             # sum e^(l - m)
    t = tl.zeros((), tl.float32)             # sum e^(l - m) * l
    t1 = tl.full((), neg_inf, tl.float32)
    t2 = tl.full((), neg_inf, tl.float32)
    i1 = tl.zeros((), tl.int64)
    best = tl.full((), neg_inf, tl.float64)
    bi = tl.zeros((), tl.int64)
    if HAS_NOISE:
        temp = tl.load(temp_ptr + row).to(tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        valid = offs < V
        lg = tl.load(logits_ptr + row * stride_l + offs, mask=valid, other=neg_inf).to(tl.float32)
        finite = lg != neg_inf
        # online softmax and entropy accumulators
        cm = tl.max(lg, axis=0)
        new_m = tl.maximum(m, cm)
        alpha = tl.where(new_m == neg_inf, 1.0, tl.exp(m - new_m))
        e = tl.where(finite, tl.exp(lg - new_m), 0.0)
        s = s * alpha + tl.sum(e, axis=0)
        t = t * alpha + tl.sum(e * tl.where(finite, lg, 0.0), axis=0)
        m = new_m
        # top-2 logits; on ties the earlier index wins (as torch.argmax)
        ci = tl.argmax(lg, axis=0).to(tl.int64) + start
        c2 = tl.max(tl.where(offs == ci, neg_inf, lg), axis=0)
        gt = cm > t1
        t2 = tl.where(gt, tl.maximum(t1, c2), tl.maximum(t2, cm))
        i1 = tl.where(gt, ci, i1)
        t1 = tl.where(gt, cm, t1)
        if HAS_NOISE:   # Gumbel-max in float64: l - T log(-log u)
            u = tl.load(u_ptr + row * stride_u + offs, mask=valid, other=0.5)
            sc = lg.to(tl.float64) - temp * tl.log(-tl.log(u))
            sc = tl.where(temp > 0, sc, lg.to(tl.float64))
            sc = tl.where(valid, sc, neg_inf)
            cb = tl.max(sc, axis=0)
            cbi = tl.argmax(sc, axis=0).to(tl.int64) + start
            g = cb > best
            bi = tl.where(g, cbi, bi)
            best = tl.where(g, cb, best)
    if HAS_NOISE:
        x0 = bi
    else:
        x0 = i1
    lx = tl.load(logits_ptr + row * stride_l + x0).to(tl.float32)
    tl.store(x0_ptr + row, x0)
    tl.store(px0_ptr + row, tl.exp(lx - m) / s)
    tl.store(margin_ptr + row, (tl.exp(t1 - m) - tl.exp(t2 - m)) / s)
    tl.store(negent_ptr + row, t / s - m - tl.log(s))


def block_stats_triton(logits: torch.Tensor, temperature: torch.Tensor | None = None,
                       uniform: torch.Tensor | None = None, block_v: int | None = None
                       ) -> BlockStats:
    """Launcher: checks shapes, dtypes, strides and devices before launching."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (N, V), got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits dtype must be float32/bfloat16/float16, got {logits.dtype}")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    N, V = logits.shape
    has_noise = uniform is not None and temperature is not None
    if has_noise:
        if uniform.shape != logits.shape or uniform.dtype != torch.float64:
            raise ValueError(f"uniform must be float64 of shape {(N, V)}, got "
                             f"{uniform.dtype} {tuple(uniform.shape)}")
        if temperature.shape != (N,):
            raise ValueError(f"temperature must have shape ({N},), got {tuple(temperature.shape)}")
        if uniform.device != logits.device or temperature.device != logits.device:
            raise ValueError("logits, uniform and temperature must be on one device")
        uniform = uniform if uniform.stride(1) == 1 else uniform.contiguous()
        temperature = temperature.to(torch.float64).contiguous()
    dev = logits.device
    x0 = torch.empty(N, dtype=torch.int64, device=dev)
    p_x0, margin, negent = (torch.empty(N, dtype=torch.float32, device=dev) for _ in range(3))
    if N == 0:
        return BlockStats(x0, p_x0, margin, negent)
    block = block_v or min(triton.next_power_of_2(V), 4096)
    _block_stats_kernel[(N,)](
        logits, logits.stride(0), temperature if has_noise else logits,
        uniform if has_noise else logits, uniform.stride(0) if has_noise else 0,
        x0, p_x0, margin, negent, V, HAS_NOISE=has_noise, BLOCK_V=block)
    return BlockStats(x0, p_x0, margin, negent)
