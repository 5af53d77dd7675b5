"""Unmask schedules (how many positions a step commits) and confidence measures (which ones).

Each policy is a tiny object behind one interface, resolved once per request from its
GenerationParams; the denoising step never compares strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

NEG_INF = float("-inf")
# Confidence given to EOS/EoT candidates when they are deferred: below every real confidence
# (probabilities, margins, negative entropies >= -log V) yet finite, so a fixed schedule that
# must commit them still can.
DEFERRED = -1.0e4


def linear_schedule(masked: int, steps: int) -> list[int]:
    """Tokens to commit at each of ``steps`` steps so that ``masked`` are done at the end.

    LLaDA's linear noise schedule makes the expected number of tokens unmasked per step
    constant (Nie et al. 2025, sec. 2.4): masked // steps each, the remainder spread over the
    first steps.
    """
    base, extra = divmod(masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


# ---------------------------------------------------------------- confidence measures
@dataclass(frozen=True)
class StatConfidence:
    """A confidence read off the block statistics (celeris.kernels.BlockStats):
    p_x0 = low_confidence (LLaDA; Dream's maskgit_plus), margin = top1 - top2 probability
    (Dream's topk_margin), negentropy (Dream's entropy)."""
    stat: str

    def __call__(self, stats, uniform: torch.Tensor | None) -> torch.Tensor:
        return getattr(stats, self.stat)


@dataclass(frozen=True)
class RandomOrder:
    """random remasking: a uniform draw per position (LLaDA; Dream's origin)."""

    def __call__(self, stats, uniform: torch.Tensor | None) -> torch.Tensor:
        return uniform


CONFIDENCES = {"low_confidence": StatConfidence("p_x0"), "margin": StatConfidence("margin"),
               "entropy": StatConfidence("negentropy"), "random": RandomOrder()}


# ---------------------------------------------------------------- unmask schedules
class Selector(Protocol):
    def __call__(self, conf: torch.Tensor, masked: torch.Tensor, k: torch.Tensor,
                 threshold: torch.Tensor, factor: torch.Tensor) -> torch.Tensor: ...


def _ranks(conf: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Rank of each position by descending confidence within its row (0 = most confident),
    the masked positions first."""
    conf = torch.where(masked, conf, NEG_INF)
    order = conf.argsort(dim=-1, descending=True, stable=True)                  # (B, W)
    return torch.empty_like(order).scatter_(-1, order, torch.arange(
        conf.shape[-1], device=conf.device).expand_as(order))


class FixedCount:
    """The reference schedule: commit exactly k[b] positions, the most confident ones."""

    def __call__(self, conf, masked, k, threshold, factor):
        return (_ranks(conf, masked) < k.view(-1, 1)) & masked


class ConfidenceThreshold:
    """Fast-dLLM's parallel decoding (Wu et al. 2025, sec. 3.3): commit every masked
    position whose confidence >= threshold, and at least the most confident one."""

    def __call__(self, conf, masked, k, threshold, factor):
        # the most confident masked position: argmax takes the first of equal maxima, as
        # a stable ranking does, at a fraction of a sort's cost
        best = torch.where(masked, conf, NEG_INF).argmax(-1, keepdim=True)     # (B, 1)
        chosen = (conf >= threshold[:, None]) & masked
        return chosen.scatter(-1, best, masked.any(-1, keepdim=True))


class ConfidenceFactor:
    """Fast-dLLM's factor rule: with confidences sorted c_1 >= c_2 >= ..., commit the top n
    for the largest n with (n + 1) * (1 - c_n) < factor, and at least one."""

    def __call__(self, conf, masked, k, threshold, factor):
        rank = _ranks(conf, masked)                                             # (B, W)
        ok = ((rank + 2) * (1.0 - conf) < factor[:, None]) & masked
        # (n+1)(1-c_n) grows with n, so the admissible set is a prefix of the ranking
        n = ok.sum(-1, keepdim=True).clamp_min(1)
        return (rank < n) & masked


class LeftToRightThreshold:
    """decoding="ltr" (left-to-right threshold): commit the leftmost masked position, then
    each following masked position while its confidence >= threshold, stopping at the first
    one below it.

    Plain threshold decoding may commit a position several places right of the last committed
    one while the positions between stay masked; a model trained left to right (an AR twin
    adapted to blocks) is often confident about such a word (``named`` three places ahead)
    without the words before it agreeing, and a story comes out as ``a quiet old named lived
    a tall named named Oscar``. Committing only a confident run from the left keeps every
    commit next to committed context, as Jacobi decoding and speculative acceptance do; where
    the run is long (formulaic text, copies) a forward still commits many tokens."""

    def __call__(self, conf, masked, k, threshold, factor):
        below = masked & (conf < threshold[:, None])
        run = masked & (below.cumsum(-1) == 0)          # masked, before the first miss
        first = masked & (masked.cumsum(-1) == 1)       # the leftmost masked position
        return run | first


class ThresholdOrCount:
    """decoding="dynamic": SDAR's ``low_confidence_dynamic`` remasking (JetAstra/SDAR's
    generate(); lmdeploy and JetEngine decode SDAR the same way): when at least k[b] masked
    positions are above the threshold, commit all of them, else the k[b] most confident
    masked ones (all of them when fewer are left). Every position above the threshold ranks
    before every one below it, so that is the union of the two sets: the threshold rule with
    the schedule's count as its floor instead of one; the fixed schedule, allowed to run ahead
    where the model is sure. "Above" is the batch's comparison (RowKnobs makes it strict for
    block-causal layouts, as SDAR's ``confidence > threshold``)."""

    def __call__(self, conf, masked, k, threshold, factor):
        above = conf >= threshold[:, None]                                     # (B, W)
        top_k = _ranks(conf, masked) < k.view(-1, 1)                           # (B, W)
        return (above | top_k) & masked


SELECTORS = {"fixed": FixedCount(), "threshold": ConfidenceThreshold(),
             "factor": ConfidenceFactor(), "ltr": LeftToRightThreshold(),
             "dynamic": ThresholdOrCount()}
