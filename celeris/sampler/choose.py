"""Choosing tokens from a step's logits.

``RowKnobs`` holds every row's decoding knobs as (B,)-shaped device tensors, built once when the
running batch changes, so requests with different temperatures, filters, thresholds, decoding
rules, remasking, logit biases and penalties share one forward; ``choose`` turns each row's
unit logits into a candidate token and a confidence per position (and flags rows whose
logits are not finite), ``select`` applies each row's unmask schedule. No host sync happens
here: the runner syncs once per step.

Confidences are float32 by default. Rows with ``confidence_dtype="model"`` take them as the
upstream samplers do on bfloat16/float16 logits (Fast-dLLM v2's and Dream's ``softmax(logits)``
on the model's logits, compared as ``probs > threshold`` with a Python float): probabilities
rounded to the logits' dtype and thresholds rounded the way PyTorch casts a Python scalar to
a tensor's dtype (via float32), so that such a row commits what upstream commits.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch

from ..kernels import block_stats
from ..params import GenerationParams
from .noise import filter_logits, padded_draws
from .policies import CONFIDENCES, DEFERRED, SELECTORS

ENTROPY_EPS = 1e-10       # Dream's sample_tokens: log(p + 1e-10), in the model's dtype


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
        # a knob no row uses is not built (a batch's knobs are rebuilt whenever it changes)
        self.any_filter = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
        self.any_suppress = any(p.suppress_eos for p in params)
        self.any_defer = any(p.defer_eos for p in params)
        self.temperature = f("temperature", torch.float64)
        self.top_k = f("top_k", torch.long) if self.any_filter else None
        self.top_p = f("top_p", torch.float32) if self.any_filter else None
        self.factor = f("factor", torch.float32) if any(
            p.decoding == "factor" for p in params) else None
        self.strict = strict_threshold
        threshold = f("threshold", torch.float32)
        self.threshold = self._comparable(threshold)
        self.suppress = f("suppress_eos", torch.bool)[:, None, None] if self.any_suppress \
            else None
        self.defer = f("defer_eos", torch.bool)[:, None] if self.any_defer else None
        # OpenAI's logit_bias and presence/frequency penalties, built only when a row asks
        biased = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
        self.bias_entries = None if not biased else tuple(      # rows, ids, biases: (N,) each
            torch.tensor(x, dtype=dt, device=device)
            for x, dt in zip(zip(*biased), (torch.long, torch.long, torch.float32)))
        self._bias: torch.Tensor | None = None      # (B, V), made from them at the first step
        self.any_penalty = any(p.presence_penalty or p.frequency_penalty for p in params)
        self.presence = f("presence_penalty", torch.float32)[:, None] if self.any_penalty \
            else None
        self.frequency = f("frequency_penalty", torch.float32)[:, None] if self.any_penalty \
            else None
        self.any_random = any(p.remasking == "random" for p in params)
        self.any_edit = any(p.edits for p in params)
        self.edit_threshold = torch.tensor([p.edit_threshold if p.edits else 2.0
                                            for p in params], device=device)
        self._model_dtype_rows(params, threshold, device)
        self.stop_ids = torch.tensor(tuple(stop_ids), device=device)
        self.need = tuple(sorted({CONFIDENCES[p.remasking].stat for p in params
                                  if p.remasking in ("margin", "entropy")}))
        self.groups: dict[str, list] = {}
        for attr, table in (("remasking", CONFIDENCES), ("decoding", SELECTORS)):
            for i, name in enumerate(sorted({getattr(p, attr) for p in params})):
                rows = None if i == 0 else torch.tensor(      # the first rule: every other row
                    [getattr(p, attr) == name for p in params], device=device)[:, None]
                self.groups.setdefault(attr, []).append((table[name], rows))
        # noise only for the rows that sample: the T = 0 rows' temperatures are never read
        self.sampling = any(p.temperature > 0 for p in params)
        # log-probabilities only for the rows that ask (``logprobs``): their index, the
        # widest top list, and the last step's top lists (set by ``choose``)
        asking = [i for i, p in enumerate(params) if p.logprobs is not None]
        self.logprob_rows = torch.tensor(asking, dtype=torch.long, device=device)
        self.any_logprobs = bool(asking)
        self.top_logprobs = max((params[i].logprobs for i in asking), default=0)
        self.tops: torch.Tensor | None = None

    def with_generators(self, generators: Sequence[torch.Generator | None]) -> "RowKnobs":
        """These knobs for a batch whose rows ask the same, with its own rows' generators."""
        knobs = copy.copy(self)
        knobs.generators = list(generators)
        return knobs

    def _comparable(self, threshold: torch.Tensor) -> torch.Tensor:
        """The thresholds that ``conf >= t`` compares with: strictly above for a strict
        layout (conf >= nextafter(t) is conf > t)."""
        if not self.strict:
            return threshold
        return torch.nextafter(threshold, torch.full_like(threshold, 2))

    def _model_dtype_rows(self, params: Sequence[GenerationParams], threshold: torch.Tensor,
                          device: torch.device) -> None:
        """The rows whose confidences are taken in the model's dtype, as an index tensor
        built once (choose needs no host sync to find them), and the thresholds as given."""
        rows = [i for i, p in enumerate(params) if p.confidence_dtype == "model"]
        self.model_rows = torch.tensor(rows, dtype=torch.long, device=device)     # (M,)
        self.any_model = bool(rows)
        self.model_greedy = self.temperature[self.model_rows] == 0 if rows else None  # (M,)
        self.model_need = {getattr(CONFIDENCES[params[i].remasking], "stat", None)
                           for i in rows}
        self._as_given = threshold, self.edit_threshold
        self._rounded: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _thresholds_in(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(threshold, edit threshold) per row: the model rows' rounded to ``dtype`` as
        ``probs > 0.9`` rounds 0.9 (float32, then the tensor's dtype: 0.8984375 in
        bfloat16), the others as they are. Built once per dtype."""
        if dtype not in self._rounded:
            threshold, edit = self._as_given
            rows = torch.zeros_like(threshold, dtype=torch.bool)
            rows[self.model_rows] = True
            t = torch.where(rows, threshold.to(dtype).float(), threshold)
            e = torch.where(rows, edit.to(dtype).float(), edit)
            self._rounded[dtype] = self._comparable(t), e
        return self._rounded[dtype]

    def _in_model_dtype(self, logits: torch.Tensor, stats):
        """``stats`` (each (B, W)) with the model rows' x0, p_x0, margin and negentropy
        recomputed from ``softmax(logits)`` in the logits' own dtype, as Fast-dLLM v2's
        ``sample_with_top_p`` and Dream's ``sample_tokens`` compute them: at T = 0 the token
        is the argmax of those rounded probabilities (the lowest id where they tie), at
        T > 0 the sampled one; margin = top1 - top2 and negentropy = sum p log(p + 1e-10),
        both in that dtype. (LLaDA's generate() and Fast-dLLM v2's greedy first token take
        the argmax of the logits instead: the two differ only where the two best tokens'
        probabilities tie in that dtype.)"""
        idx = self.model_rows                                                   # (M,)
        probs = logits[idx].softmax(dim=-1)                                     # (M, W, V)
        x0 = torch.where(self.model_greedy[:, None], probs.argmax(dim=-1), stats.x0[idx])
        p_x0 = probs.gather(-1, x0[..., None]).squeeze(-1)                      # (M, W)
        new = {"x0": stats.x0.index_copy(0, idx, x0),
               "p_x0": stats.p_x0.index_copy(0, idx, p_x0.float())}
        if "margin" in self.model_need:
            top2 = probs.topk(2, dim=-1).values                                 # (M, W, 2)
            margin = (top2[..., 0] - top2[..., 1]).float()
            new["margin"] = stats.margin.index_copy(0, idx, margin)
        if "negentropy" in self.model_need:
            negentropy = (probs * torch.log(probs + ENTROPY_EPS)).sum(-1).float()
            new["negentropy"] = stats.negentropy.index_copy(0, idx, negentropy)
        return stats._replace(**new)

    def choose(self, logits: torch.Tensor, widths: list[int],
               constrain: Callable[[torch.Tensor], None] | None = None,
               counts: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x0 (B, W), confidence (B, W), x0's probability (B, W) and a (B,) check, not
        finite exactly for the rows whose logits are not, from logits (B, W, V); row b's
        unit is its first ``widths[b]`` columns (its noise is drawn for those only).

        The mask token itself is never a prediction: a committed [MASK] would stay masked.
        With model-dtype rows and bfloat16/float16 logits, this also sets ``threshold`` and
        ``edit_threshold`` to those rows' thresholds in that dtype, for ``select`` and ``edit``.
        ``constrain`` masks the logits of grammar-constrained rows in place (after the check).
        Before it, every position of a row gets the row's ``logit_bias`` and, with ``counts``
        ((B, V): each row's committed answer tokens counted; the runner passes them when
        ``any_penalty``), minus its presence and frequency penalties, in place; a row that
        asks for neither gets zeros (its logits unchanged), a batch where none asks nothing.
        """
        # a NaN or inf logit makes its row's sum non-finite: one reduction instead of a
        # (B, W, V) mask (38% of a step at a 157k vocabulary)
        check = logits.sum((1, 2), dtype=torch.float32)                           # (B,)
        logits[..., self.mask_id] = float("-inf")
        penalise = counts is not None and self.any_penalty
        if self.bias_entries is not None or penalise:
            logits += self._adjustment(counts if penalise else None, logits.shape[-1])[:, None]
        if constrain is not None:
            constrain(logits)
        if self.any_suppress:
            stop_logits = logits[..., self.stop_ids]
            logits[..., self.stop_ids] = torch.where(self.suppress, float("-inf"), stop_logits)
        if self.any_filter:
            logits = filter_logits(logits, self.top_k, self.top_p)
        B, W, V = logits.shape
        uniform = temperature = None
        if self.sampling:
            gens = [g if p.temperature > 0 else None
                    for g, p in zip(self.generators, self.params)]
            uniform = padded_draws(gens, widths, (V,), 0.5, self.device)          # (B, W, V)
            temperature = self.temperature[:, None]                               # (B, 1)
        stats = block_stats(logits, temperature, uniform, self.need)              # (B, W) each
        if self.any_model and logits.dtype in (torch.bfloat16, torch.float16):
            self.threshold, self.edit_threshold = self._thresholds_in(logits.dtype)
            stats = self._in_model_dtype(logits, stats)
        if self.any_logprobs:
            self.tops = self._tops(logits, stats.x0)
        order = None
        if self.any_random:
            gens = [g if p.remasking == "random" else None
                    for g, p in zip(self.generators, self.params)]
            order = padded_draws(gens, widths, (), 0.0, self.device).float()     # (B, W)
        conf = by_rows(self.groups["remasking"], lambda measure: measure(stats, order))
        if self.any_defer:
            is_stop = torch.isin(stats.x0, self.stop_ids)
            conf = torch.where(self.defer & is_stop, conf + DEFERRED, conf)
        return stats.x0, conf, stats.p_x0, check

    def _tops(self, logits: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """(M, W, 1 + 2k) for the asking rows: each position's chosen token's log-probability,
        then its k most likely tokens' log-probabilities and ids (as floats: exact below
        2**24), from the distribution their confidence is read from (temperature 1, after the
        filters: p_x0 = exp(logprob)). One tensor, so the runner reads it in one transfer."""
        idx = self.logprob_rows
        logp = logits[idx].log_softmax(-1, torch.float32)                        # (M, W, V)
        chosen = logp.gather(-1, x0[idx][..., None])                             # (M, W, 1)
        if not self.top_logprobs:
            return chosen
        values, ids = logp.topk(self.top_logprobs, dim=-1)                       # (M, W, k)
        return torch.cat([chosen, values, ids.float()], -1)

    def _adjustment(self, counts: torch.Tensor | None, vocab: int) -> torch.Tensor:
        """(B, V) float32 added to every position of a row: its logit biases (dense, built
        once per batch layout) minus (presence * (count > 0) + frequency * count)."""
        if self.bias_entries is not None and (self._bias is None
                                              or self._bias.shape[1] != vocab):
            rows, ids, biases = self.bias_entries
            self._bias = torch.zeros(len(self.params), vocab, device=self.device).index_put_(
                (rows, ids), biases)
        if counts is None:
            return self._bias
        penalty = self.presence * (counts > 0) + self.frequency * counts
        return -penalty if self._bias is None else self._bias - penalty

    def edit(self, x0: torch.Tensor, p_x0: torch.Tensor, tokens: torch.Tensor,
             editable: torch.Tensor) -> torch.Tensor:
        """(B, W) bool: token editing (LLaDA2.1's token-to-token rule). An editable committed
        position takes the model's choice when it differs from its token and its probability
        is strictly above the row's edit threshold."""
        return editable & (x0 != tokens) & (p_x0 > self.edit_threshold[:, None])

    def select(self, conf: torch.Tensor, active: torch.Tensor, k: torch.Tensor
               ) -> torch.Tensor:
        """(B, W) bool: the active positions each row's unmask schedule commits this step."""
        return by_rows(self.groups["decoding"],
                       lambda selector: selector(conf, active, k, self.threshold, self.factor))


def by_rows(groups: list[tuple[object, torch.Tensor | None]], compute) -> torch.Tensor:
    """``compute(rule)`` for each rule of a batch, each row taking its own rule's result
    (``groups``: (rule, (B, 1) rows) pairs; every row is in exactly one; the first rule's rows,
    None, are those no other rule takes). One rule: its result as it is, the common case."""
    (rule, _), *others = groups
    out = compute(rule)
    for rule, rows in others:
        out = torch.where(rows, compute(rule), out)
    return out
