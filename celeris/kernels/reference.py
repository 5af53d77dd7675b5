"""Pure-torch reference twin of the block-statistics kernel (the obviously correct path).

Given the logits of the active block, (..., V) (batch x block positions), return per row:

- ``x0``:          the chosen token: argmax of the logits, or with temperature T > 0 the
                   Gumbel-max sample argmax(l - T * log(-log u)) in float64 (LLaDA's
                   exp(l) / (-log u)^T in the log domain, which cannot overflow);
- ``p_x0``:        its probability under softmax(l) (low_confidence remasking);
- ``margin``:      top-1 minus top-2 probability (Dream's topk_margin);
- ``negentropy``:  sum p log p (Dream's entropy order; higher = surer).

This materialises the (N, V) probabilities; the Triton kernel computes the same in one pass
over the vocabulary without doing so.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class BlockStats(NamedTuple):
    x0: torch.Tensor          # (...) long
    p_x0: torch.Tensor        # (...) float32
    margin: torch.Tensor      # (...) float32
    negentropy: torch.Tensor  # (...) float32


def gumbel_scores(logits: torch.Tensor, temperature: torch.Tensor, uniform: torch.Tensor
                  ) -> torch.Tensor:
    """l - T log(-log u) in float64; rows with T = 0 keep their logits. (..., V); the
    temperature (...) or broadcastable to it."""
    t = temperature.to(torch.float64)[..., None]                                # (..., 1)
    noise = torch.log(-torch.log(uniform))                                      # (..., V)
    scores = logits.to(torch.float64) - t * noise
    return torch.where(t > 0, scores, logits.to(torch.float64))


ALL_STATS = ("margin", "negentropy")


def block_stats_reference(logits: torch.Tensor, temperature: torch.Tensor | None = None,
                          uniform: torch.Tensor | None = None,
                          need: tuple[str, ...] = ALL_STATS) -> BlockStats:
    """``need``: which of margin and negentropy to compute (the others come back None; a
    step whose requests only use low_confidence skips two passes over the vocabulary)."""
    probs = logits.softmax(-1, torch.float32)                                   # (..., V)
    if uniform is None or temperature is None:
        x0 = logits.argmax(dim=-1)
    else:
        x0 = gumbel_scores(logits, temperature, uniform).argmax(dim=-1)         # (...)
    p_x0 = probs.gather(-1, x0[..., None]).squeeze(-1)
    margin = negentropy = None
    if "margin" in need:
        top2 = probs.topk(2, dim=-1).values                                     # (..., 2)
        margin = top2[..., 0] - top2[..., 1]
    if "negentropy" in need:
        logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
        negentropy = (probs * logp).sum(-1)
    return BlockStats(x0, p_x0, margin, negentropy)
