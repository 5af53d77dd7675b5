"""Logit processing before a token is chosen: filtering and Gumbel-max noise.

Noise is drawn per request from its own ``torch.Generator`` so that a request's tokens do not
depend on what else shares its batch.
"""

from __future__ import annotations

import torch


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor,
                  generators: list[torch.Generator | None]) -> torch.Tensor:
    """Sample x0 ~ softmax(logits / T) per row by the Gumbel-max trick.

    logits (B, W, V); temperature (B,) float; generators[b] seeds row b.
    Computed in float64 as in LLaDA's ``add_gumbel_noise``: exp(l) / (-log u)^T. The paper
    (Nie et al. 2025, app. B.3) notes that low-precision Gumbel noise lowers the effective
    temperature and hurts quality. Rows with T = 0 take the plain argmax.
    """
    x0 = logits.argmax(dim=-1)                                                   # (B, W)
    hot = [b for b, g in enumerate(generators) if g is not None]
    if not hot:
        return x0
    rows = torch.tensor(hot, device=logits.device)
    sub = logits[rows].to(torch.float64)                                         # (b, W, V)
    u = torch.stack([uniform_noise(sub.shape[1:], generators[b], logits.device) for b in hot])
    t = temperature[rows].to(torch.float64)[:, None, None]
    noisy = sub.exp() / (-torch.log(u)) ** t                                     # (b, W, V)
    x0[rows] = noisy.argmax(dim=-1)
    return x0


def uniform_noise(shape: torch.Size, generator: torch.Generator, device: torch.device
                  ) -> torch.Tensor:
    """The per-request uniform draw that the Gumbel noise is made from (float64)."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
                  ) -> torch.Tensor:
    """Top-k then nucleus (top-p) filtering per row; filtered entries become -inf.

    logits (B, W, V); top_k (B,) int (0 = off); top_p (B,) float (1.0 = off). The most likely
    token always survives, so a row never ends up with nothing to sample.
    """
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)                 # (B, W, V)
    rank = torch.arange(V, device=logits.device)                                # (V,)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))[:, None, None]
    drop = rank >= k                                                            # (B, W, V)
    probs = sorted_logits.float().softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs          # mass strictly before each entry
    drop |= before >= top_p.to(probs.dtype)[:, None, None]
    drop[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
