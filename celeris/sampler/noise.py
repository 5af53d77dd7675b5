"""Logit processing before a token is chosen: filtering, and the uniform draws behind the
Gumbel-max noise (applied in celeris.kernels).

Noise is drawn per request from its own ``torch.Generator`` so that a request's tokens do not
depend on what else shares its batch. Temperature works as in LLaDA (Nie et al. 2025, app.
B.3): Gumbel noise in float64, since low-precision Gumbel noise lowers the effective
temperature.
"""

from __future__ import annotations

import torch


def uniform_noise(shape: torch.Size, generator: torch.Generator, device: torch.device
                  ) -> torch.Tensor:
    """The per-request uniform draw that the Gumbel noise is made from (float64)."""
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def padded_draws(generators: list[torch.Generator | None], widths: list[int],
                 shape: tuple[int, ...], fill: float, device: torch.device) -> torch.Tensor:
    """(B, W, *shape) float64: row b's first ``widths[b]`` entries drawn from its own
    generator (so a draw never depends on the batch), ``fill`` elsewhere and where a row has
    no generator."""
    W = max(widths)
    out = torch.full((len(widths), W, *shape), fill, dtype=torch.float64, device=device)
    for b, (g, w) in enumerate(zip(generators, widths)):
        if g is not None:
            out[b, :w] = uniform_noise((w, *shape), g, device)
    return out


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
    probs = sorted_logits.float().softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs          # mass strictly before each entry
    drop = (rank >= k) | (before >= top_p.to(probs.dtype)[:, None, None])      # (B, W, V)
    drop[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
