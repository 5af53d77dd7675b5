"""Choosing tokens from a step's logits.

``RowKnobs`` holds every row's decoding knobs as (B,)-shaped device tensors, built once when the
running batch changes, so requests with different temperatures, filters, thresholds, decoding
rules and remasking share one forward; ``choose`` turns each row's unit logits into a candidate
token and a confidence per position (and flags rows whose logits are not finite), ``select``
applies each row's unmask schedule. No host sync happens here: the runner syncs once per step.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..kernels import block_stats
from ..params import GenerationParams
from .noise import filter_logits, padded_draws
from .policies import CONFIDENCES, DEFERRED, SELECTORS


class RowKnobs:
    """The per-row knobs of one batch layout, as (B,)-shaped device tensors."""

    def __init__(self, params: Sequence[GenerationParams],
                 generators: Sequence[torch.Generator | None], mask_id: int,
                 stop_ids: Sequence[int], device: torch.device,
                 strict_threshold: bool = False) -> None:
        """strict_threshold: commit at confidence > threshold (Fast-dLLM v2 and SDAR's
        rule) instead of >= (Fast-dLLM v1's LLaDA code): at threshold 1.0 a probability that
        rounds to 1.0 in float32 then commits nothing beyond the step's one position."""
        self.params, self.generators = list(params), list(generators)
        self.mask_id, self.device = mask_id, device

        def f(name, dt):
            return torch.tensor([getattr(p, name) for p in params], dtype=dt, device=device)
        self.temperature, self.cfg = f("temperature", torch.float64), f("cfg_scale", torch.float32)
        self.top_k, self.top_p = f("top_k", torch.long), f("top_p", torch.float32)
        self.threshold, self.factor = f("threshold", torch.float32), f("factor", torch.float32)
        if strict_threshold:      # conf >= nextafter(t) is conf > t
            self.threshold = torch.nextafter(self.threshold, torch.full_like(self.threshold, 2))
        self.suppress = f("suppress_eos", torch.bool)[:, None, None]
        self.defer = f("defer_eos", torch.bool)[:, None]
        self.any_cfg = any(p.cfg_scale > 0 for p in params)
        self.any_filter = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
        self.any_suppress = any(p.suppress_eos for p in params)
        self.any_defer = any(p.defer_eos for p in params)
        self.any_random = any(p.remasking == "random" for p in params)
        self.any_edit = any(p.edits for p in params)
        self.edit_threshold = torch.tensor([p.edit_threshold if p.edits else 2.0
                                            for p in params], device=device)
        self.stop_ids = torch.tensor(tuple(stop_ids), device=device)
        self.need = tuple(sorted({CONFIDENCES[p.remasking].stat for p in params
                                  if p.remasking in ("margin", "entropy")}))
        self.groups: dict[str, list] = {}
        for attr, table in (("remasking", CONFIDENCES), ("decoding", SELECTORS)):
            for name in {getattr(p, attr) for p in params}:
                rows = torch.tensor([getattr(p, attr) == name for p in params], device=device)
                self.groups.setdefault(attr, []).append((table[name], rows[:, None]))

    def choose(self, logits: torch.Tensor, active: torch.Tensor, widths: list[int]
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x0 (B, W), confidence (B, W), x0's probability (B, W) and a (B,) flag for rows
        whose logits at an active position are not finite, from logits (B, W, V); row b's
        unit is its first ``widths[b]`` columns (its noise is drawn for those only).

        The mask token itself is never a prediction: a committed [MASK] would stay masked.
        """
        # a NaN or inf logit makes its row's sum non-finite: one reduction over the
        # vocabulary instead of a (B, W, V) mask (38% of a step at a 157k vocabulary)
        finite = torch.isfinite(logits.sum(-1, dtype=torch.float32))             # (B, W)
        bad = (~finite & active).any(-1)                                          # (B,)
        logits[..., self.mask_id] = float("-inf")
        if self.any_suppress:
            stop_logits = logits[..., self.stop_ids]
            logits[..., self.stop_ids] = torch.where(self.suppress, float("-inf"), stop_logits)
        if self.any_filter:
            logits = filter_logits(logits, self.top_k, self.top_p)
        B, W, V = logits.shape
        gens = [g if p.temperature > 0 else None for g, p in zip(self.generators, self.params)]
        uniform = None
        if any(g is not None for g in gens):
            uniform = padded_draws(gens, widths, (V,), 0.5, self.device).view(B * W, V)
        stats = block_stats(logits.reshape(B * W, V), self.temperature.repeat_interleave(W),
                            uniform, self.need)                             # (B*W,) each
        stats = type(stats)(*(None if t is None else t.view(B, W) for t in stats))
        order = None
        if self.any_random:
            gens = [g if p.remasking == "random" else None
                    for g, p in zip(self.generators, self.params)]
            order = padded_draws(gens, widths, (), 0.0, self.device).float()     # (B, W)
        conf = torch.zeros(stats.x0.shape, dtype=torch.float32, device=self.device)
        for measure, rows in self.groups["remasking"]:
            conf = torch.where(rows, measure(stats, order).float(), conf)
        if self.any_defer:
            is_stop = torch.isin(stats.x0, self.stop_ids)
            conf = torch.where(self.defer & is_stop, conf + DEFERRED, conf)
        return stats.x0, conf, stats.p_x0, bad

    def edit(self, x0: torch.Tensor, p_x0: torch.Tensor, tokens: torch.Tensor,
             editable: torch.Tensor) -> torch.Tensor:
        """(B, W) bool: token editing (LLaDA2.1's token-to-token rule). An editable committed
        position takes the model's choice when it differs from its token and its probability
        is strictly above the row's edit threshold."""
        return editable & (x0 != tokens) & (p_x0 > self.edit_threshold[:, None])

    def select(self, conf: torch.Tensor, active: torch.Tensor, k: torch.Tensor
               ) -> torch.Tensor:
        """(B, W) bool: the active positions each row's unmask schedule commits this step."""
        conf = torch.where(active, conf, float("-inf"))
        transfer = torch.zeros_like(active)
        for selector, rows in self.groups["decoding"]:
            chosen = selector(conf, active, k, self.threshold, self.factor)
            transfer = torch.where(rows, chosen, transfer)
        return transfer
