"""Pure-torch twins of the fused RMSNorm and rotary-embedding kernels (``triton_norm_rope.py``).

They compute what the kernels compute, the obvious way: RMSNorm as ``F.rms_norm`` of the
residual sum rounded to the activations' dtype (statistics in float32); the rotation in float32
and rounded once, after the per-head norm (rounded to the dtype, as the module path rounds
it). In float32 they equal the model's module path (``modeling.apply_rope``); in bfloat16 the
rotation rounds once where the module path rounds three times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); the sum is x alone without a residual."""
    total = x if residual is None else x + residual
    return F.rms_norm(total, (x.shape[-1],), weight, eps), total


def rope_qk_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      q_weight: torch.Tensor | None = None,
                      k_weight: torch.Tensor | None = None, eps: float = 1e-6
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """q (..., H, D), k (..., Hkv, D); cos/sin (..., R) or (..., 1, R), rotate-half on the
    first R dims; an optional per-head RMSNorm (weights (D,)) first."""
    if q_weight is not None:
        q = F.rms_norm(q, (q.shape[-1],), q_weight, eps)
        k = F.rms_norm(k, (k.shape[-1],), k_weight, eps)
    c = cos.reshape(*q.shape[:-2], 1, cos.shape[-1]).float()           # (..., 1, R)
    s = sin.reshape(*q.shape[:-2], 1, sin.shape[-1]).float()
    return _rotate(q, c, s), _rotate(k, c, s)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    R, half = cos.shape[-1], cos.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:R]
    out = torch.cat([x1 * cos[..., :half] - x2 * sin[..., :half],
                     x2 * cos[..., half:] + x1 * sin[..., half:], xf[..., R:]], dim=-1)
    return out.to(x.dtype)
