"""Triton kernels: RMSNorm with the residual add, and rotary embedding of q and k in one launch.

A decoding step of a large model at batch 1 is bound by how many kernels the CPU can issue,
not by the GPU: the module path runs RMSNorm, the residual add and the rotate-half RoPE of q
and k as separate small kernels in every layer. These two kernels do each group in one launch:

- ``rms_norm_triton``: one program per row; optionally adds a residual first (the sum, rounded
  to the activations' dtype, is written out and is what gets normalised, exactly as
  ``F.rms_norm(x + r)``), statistics in float32 (Zhang & Sennrich 2019);
- ``rope_qk_triton``: one program per (token, head) over q's heads then k's, rotate-half
  convention (Su et al. 2021) with an optional partial width R < D, and optionally Qwen3's
  per-head RMSNorm of q and k before the rotation, so a qk-norm layer runs one kernel instead
  of five. Arithmetic in float32, rounded once to the input dtype.

``norm_rope_reference.py`` holds the torch twins these are tested against.

Import only where Triton can launch: on CUDA, or on CPU with TRITON_INTERPRET=1 set before this
module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_ROW = 65536          # widest row one program normalises (hidden sizes are far below)


@triton.jit
def _round(x, ty: tl.constexpr):
    """float32 x to ``ty``, to nearest even. For bfloat16 the rounding is done on the bits
    (add 0x7FFF plus the lowest kept bit, drop 16 bits: NaN and inf stay as they are), so
    Triton's CPU interpreter, whose own cast truncates, rounds as a GPU does."""
    if ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(ty)


@triton.jit
def _rms_norm_kernel(x_ptr, stride_x, r_ptr, stride_r, w_ptr, y_ptr, stride_y, s_ptr,
                     stride_s, C, eps, HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    valid = offs < C
    x = tl.load(x_ptr + row * stride_x + offs, mask=valid, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + offs, mask=valid, other=0.0).to(tl.float32)
        s = _round(x + r, s_ptr.dtype.element_ty)     # rounded as the torch add rounds it
        tl.store(s_ptr + row * stride_s + offs, s, mask=valid)
        x = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    w = tl.load(w_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, _round(x * inv * w, y_ptr.dtype.element_ty),
             mask=valid)


def _warps(block: int) -> int:
    return 4 if block <= 1024 else (8 if block <= 4096 else 16)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., C) as (N, C) rows with a unit inner stride (a view where possible)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    residual: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x + residual) * weight over the last dim, and the sum x + residual (x itself
    without a residual). Outputs have x's shape and dtype."""
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES:
        raise ValueError(f"x and weight must be float32/bfloat16/float16, got {x.dtype} and "
                         f"{weight.dtype}")
    C = x.shape[-1]
    if weight.shape != (C,):
        raise ValueError(f"weight must have shape ({C},), got {tuple(weight.shape)}")
    if C > MAX_ROW:
        raise ValueError(f"rows of {C} values are past the kernel's {MAX_ROW}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x ({x.dtype} {tuple(x.shape)}), got "
                         f"{residual.dtype} {tuple(residual.shape)}")
    devices = {x.device, weight.device} | ({residual.device} if residual is not None else set())
    if len(devices) != 1:
        raise ValueError(f"x, weight and residual must be on one device, got {devices}")
    xs = _rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = y.view(-1, C)
    if residual is None:
        rs = s = xs
        total = x
    else:
        rs = _rows(residual)
        total = torch.empty_like(y)
        s = total.view(-1, C)
    if xs.shape[0]:
        block = triton.next_power_of_2(C)
        _rms_norm_kernel[(xs.shape[0],)](
            xs, xs.stride(0), rs, rs.stride(0), weight.contiguous(), out, out.stride(0),
            s, s.stride(0), C, float(eps), HAS_RESIDUAL=residual is not None, BLOCK_C=block,
            num_warps=_warps(block))
    return y, total


@triton.jit
def _load_half(ptr, base, lo, n, offs):
    return tl.load(ptr + base + lo + offs, mask=offs < n, other=0.0).to(tl.float32)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                 sq_t, sq_h, sk_t, sk_h, sqo_t, sqo_h, sko_t, sko_h, sc_t, ss_t,
                 H, D, HALF, eps, HAS_NORM: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BLOCK_TAIL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    is_q = h < H
    # q's heads first, then k's; both share one dtype, so one pointer type serves both
    if is_q:
        src = q_ptr + t * sq_t + h * sq_h
        dst = qo_ptr + t * sqo_t + h * sqo_h
        w_ptr = qw_ptr
    else:
        src = k_ptr + t * sk_t + (h - H) * sk_h
        dst = ko_ptr + t * sko_t + (h - H) * sko_h
        w_ptr = kw_ptr
    offs = tl.arange(0, BLOCK_HALF)
    tail = tl.arange(0, BLOCK_TAIL)
    R = 2 * HALF
    hv = offs < HALF
    tv = tail < D - R
    x1 = tl.load(src + offs, mask=hv, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=hv, other=0.0).to(tl.float32)
    xt = tl.load(src + R + tail, mask=tv, other=0.0).to(tl.float32)
    if HAS_NORM:        # per-head RMSNorm over all D, rounded as the module path rounds it
        ms = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0) + tl.sum(xt * xt, axis=0)) / D
        inv = 1.0 / tl.sqrt(ms + eps)
        ty = qo_ptr.dtype.element_ty
        x1 = _round(x1 * inv * tl.load(w_ptr + offs, mask=hv, other=0.0).to(tl.float32), ty)
        x2 = _round(x2 * inv * tl.load(w_ptr + HALF + offs, mask=hv, other=0.0).to(tl.float32),
                    ty)
        xt = _round(xt * inv * tl.load(w_ptr + R + tail, mask=tv, other=0.0).to(tl.float32), ty)
        x1, x2, xt = x1.to(tl.float32), x2.to(tl.float32), xt.to(tl.float32)
    c1 = _load_half(cos_ptr, t * sc_t, 0, HALF, offs)
    c2 = _load_half(cos_ptr, t * sc_t, HALF, HALF, offs)
    s1 = _load_half(sin_ptr, t * ss_t, 0, HALF, offs)
    s2 = _load_half(sin_ptr, t * ss_t, HALF, HALF, offs)
    ty = qo_ptr.dtype.element_ty
    tl.store(dst + offs, _round(x1 * c1 - x2 * s1, ty), mask=hv)
    tl.store(dst + HALF + offs, _round(x2 * c2 + x1 * s2, ty), mask=hv)
    tl.store(dst + R + tail, _round(xt, ty), mask=tv)


def _heads(t: torch.Tensor) -> torch.Tensor:
    """(..., heads, D) as (T, heads, D) with a unit inner stride (a view where possible)."""
    t = t.reshape(-1, *t.shape[-2:])
    return t if t.stride(-1) == 1 else t.contiguous()


def rope_qk_triton(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None,
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """q (..., H, D) and k (..., Hkv, D) rotated by cos/sin (..., R) tables, R <= D even (the
    first R dims turn, the rest pass), after a per-head RMSNorm when ``q_weight`` and
    ``k_weight`` (D,) are given. Tables broadcast over heads: (..., 1, R) is accepted. Returns
    new contiguous tensors shaped and typed like q and k."""
    if q.dtype not in _DTYPES or k.dtype != q.dtype:
        raise ValueError(f"q and k must share a float32/bfloat16/float16 dtype, got {q.dtype} "
                         f"and {k.dtype}")
    D, R = q.shape[-1], cos.shape[-1]
    if k.shape[-1] != D or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree but for heads")
    if sin.shape != cos.shape or R % 2 or not 0 < R <= D:
        raise ValueError(f"cos/sin must share a shape with an even last dim <= {D}, got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if (q_weight is None) != (k_weight is None) or (
            q_weight is not None and (q_weight.shape != (D,) or k_weight.shape != (D,))):
        raise ValueError(f"q_weight and k_weight must both be given, each of shape ({D},)")
    if q_weight is not None and q_weight.dtype != k_weight.dtype:
        raise ValueError(f"q_weight and k_weight must share a dtype, got {q_weight.dtype} "
                         f"and {k_weight.dtype}")
    if len({q.device, k.device, cos.device, sin.device}) != 1:
        raise ValueError("q, k, cos and sin must be on one device")
    qs, ks = _heads(q), _heads(k)
    T, H, Hkv = qs.shape[0], qs.shape[1], ks.shape[1]
    cs, ss = _rows(cos), _rows(sin)
    if cs.shape[0] != T:
        raise ValueError(f"cos/sin have {cs.shape[0]} rows of positions for {T} tokens")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    qo, ko = q_out.view(T, H, D), k_out.view(T, Hkv, D)
    norm = q_weight is not None
    qw = q_weight.contiguous() if norm else qs
    kw = k_weight.contiguous() if norm else ks
    if T:
        half = R // 2
        _rope_kernel[(T, H + Hkv)](
            qs, ks, qo, ko, cs, ss, qw, kw, qs.stride(0), qs.stride(1), ks.stride(0),
            ks.stride(1), qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
            cs.stride(0), ss.stride(0), H, D, half, float(eps), HAS_NORM=norm,
            BLOCK_HALF=triton.next_power_of_2(half),
            BLOCK_TAIL=triton.next_power_of_2(max(D - R, 1)))
    return q_out, k_out
