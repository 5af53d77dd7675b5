"""The model runner: one forward for the whole running batch, the tokens chosen, one host sync.

Every running request contributes one row (two with classifier-free guidance: its twin with
the prompt masked, LLaDA app. B.6): the window its family layout asks for, left-padded to the
widest. Each row reads and writes its own KV slot (``SlotView``), so rows at different blocks,
prompt lengths, cache policies and knobs share the forward; padding columns are skipped by the
projections and MLPs (``query_mask``). The logits of each row's unit only are computed, and
every knob is a per-row tensor (``RowKnobs``). The inputs are built with tensor operations
from the windows; the step's one host sync returns the committed tokens and confidences.
"""

from __future__ import annotations

import math
import time
from itertools import chain
from typing import Any, Sequence

import torch

from ..cache import long_tensor
from ..config import NonFiniteLogitsError
from ..families import Layout
from ..sampler.choose import RowKnobs
from .request import Request


class Runner:
    def __init__(self, model: Any, layout: Layout, special: Any, device: torch.device,
                 slots: int = 4) -> None:
        self.model, self.layout, self.special, self.device = model, layout, special, device
        self.kv = layout.new_cache(model, slots)
        self.forward_s = 0.0                 # the last step's time inside the model forward
        self._knobs: tuple[tuple[Request, ...], RowKnobs] | None = None

    # ------------------------------------------------------------ membership
    def admit(self, req: Request) -> None:
        self.layout.start(req)
        req.start(self.device)
        req.slot = self.kv.take()
        if req.params.cfg_scale > 0:
            req.uncond_slot = self.kv.take()

    def release(self, req: Request) -> None:
        self.layout.release(req)
        for slot in (req.slot, req.uncond_slot):
            if slot >= 0:
                self.kv.give_back(slot)
        req.slot = req.uncond_slot = -1

    def _compact(self, reqs: Sequence[Request]) -> None:
        """Move the running requests' slots past the first len(slots) into the free ones
        below: the holes finished requests leave are filled from the top (``kv.move``)."""
        n = sum(1 + (r.uncond_slot >= 0) for r in reqs)
        for r in reqs:
            while self.kv.free and self.kv.free[-1] < n and max(r.slot, r.uncond_slot) >= n:
                if r.slot >= n:
                    r.slot = self.kv.move(r.slot)
                else:
                    r.uncond_slot = self.kv.move(r.uncond_slot)

    def knobs(self, reqs: Sequence[Request]) -> RowKnobs:
        """The batch's per-row knobs, rebuilt only when its membership changes, and then
        only its generators when every row asks what the previous batch's row did (a run of
        short requests with the same knobs, one after another)."""
        key = tuple(reqs)          # the requests themselves: an id() can be reused
        if self._knobs is not None and len(key) == len(self._knobs[0]):
            last, knobs = self._knobs
            if all(a is b for a, b in zip(key, last)):
                return knobs
            if all(a.params is b.params or a.params == b.params for a, b in zip(key, last)):
                self._knobs = key, knobs.with_generators([r.generator for r in reqs])
                return self._knobs[1]
        sp = self.special
        self._knobs = key, RowKnobs([r.params for r in reqs], [r.generator for r in reqs],
                                    sp.mask, sp.stop, self.device, self.layout.strict_threshold)
        return self._knobs[1]

    # ------------------------------------------------------------ the step
    def run(self, reqs: list[Request]) -> None:
        """Forward, choose, commit: every request in ``reqs`` advances one step, as its
        layout runs it (the window forward below, or a decoder of the layout's own)."""
        self.layout.run(self, reqs)

    def forward_windows(self, reqs: list[Request]) -> None:
        """The window layouts' step: one forward of every row's window, choose, commit."""
        # rows in slot order, slots 0..B-1: consecutive slots are read as one view of the
        # cache instead of a gather copying every row's keys in every layer
        self._compact(reqs)
        reqs = sorted(reqs, key=lambda r: r.slot)
        mask, dev = self.special.mask, self.device
        rows = [(r, *self.layout.window(r), r.slot) for r in reqs]
        twins = [r for r in reqs if r.uncond_slot >= 0]
        rows += [(r, [mask] * r.prompt_len + r.seq[r.prompt_len:], 0, False, r.uncond_slot)
                 for r in twins]                     # CFG: cache "none", the whole sequence
        ids, pos, view, cols, widths, width, k = self._inputs(rows)
        start = time.perf_counter()
        logits = self.model(ids, position_ids=pos, kv=view, logits_index=cols).logits
        self.forward_s = time.perf_counter() - start                             # (R, U, V)
        logits = self._guide(logits, reqs, twins)                                # (B, U, V)
        B, U = len(reqs), logits.shape[1]
        unit_cols = cols
        if twins:                        # the CFG twins' rows commit nothing themselves
            unit_cols, width, k = cols[:B], width[:B], k[:B]
        unit = ids.gather(1, unit_cols)                                          # (B, U)
        active = (unit == mask) & (self.kv.columns(U, dev) < width)              # (B, U)
        knobs = self.knobs(reqs)
        fronts = {b: r.seq.index(mask, r.lo, r.hi) - r.lo
                  for b, r in enumerate(reqs) if r.grammar is not None}
        counts = self._counts(reqs, logits.shape[-1]) if knobs.any_penalty else None
        constrain = (lambda lg: self._constrain(lg, reqs, fronts)) if fronts else None
        x0, conf, p_x0, check = knobs.choose(logits, widths[:B], constrain, counts)
        take = self._greedy_first(reqs, knobs.select(conf, active, k), active)
        if knobs.any_edit:         # committed answer tokens of the unit may be replaced
            first = torch.tensor([max(r.prompt_len - r.lo, 0) for r in reqs], device=dev)
            col = self.kv.columns(U, dev)
            editable = ~active & (col < width) & (col >= first[:, None])
            edit = knobs.edit(x0, p_x0, unit, editable)
            take, conf = take | edit, torch.where(edit, p_x0, conf)
        # one sync; commits read a position's token and confidence only where it is taken
        # (cat promotes to conf's float32, which holds every token id below 2**24 exactly)
        host = torch.cat([x0, take, conf, check[:, None]], 1).tolist()
        tops = knobs.tops.tolist() if knobs.any_logprobs else None      # only if asked
        asking = {b: m for m, b in enumerate(
            b for b, r in enumerate(reqs) if r.params.logprobs is not None)}
        for b, (r, row, w) in enumerate(zip(reqs, host, widths)):
            self.layout.after_forward(r)
            if not math.isfinite(row[-1]):
                r.failure = NonFiniteLogitsError([r.request_id])
                continue
            r.nfe += 2 if r.uncond_slot >= 0 else 1
            picks = row[:w], row[U:U + w], row[2 * U:2 * U + w]
            if r.grammar is not None:      # the grammar keeps its valid run, adds what it forces
                masked = [t == mask for t in r.seq[r.lo:r.lo + w]]
                *picks, forced = r.grammar.settle(*picks, fronts[b], masked)
                r.forced = tuple(r.lo + j - r.prompt_len for j in forced)
            r.commit(*picks, mask, self.special.stop)
            if r.params.logprobs is not None:
                m = asking[b]
                r.note_logprobs(tops[m])

    def _counts(self, reqs: list[Request], vocab: int) -> torch.Tensor:
        """(B, V) float32: how often each token occurs among a row's committed answer tokens
        (not the prompt, not masks), for the presence/frequency penalties; zero for the
        rows without one."""
        mask = self.special.mask
        flat = long_tensor((b * vocab + t for b, r in enumerate(reqs)
                            if r.params.presence_penalty or r.params.frequency_penalty
                            for t in r.seq[r.prompt_len:] if t != mask), self.device)
        counts = torch.bincount(flat, minlength=len(reqs) * vocab)
        return counts.view(len(reqs), vocab).float()

    @staticmethod
    def _constrain(logits: torch.Tensor, reqs: list[Request], fronts: dict[int, int]) -> None:
        """Each constrained row's frontier column keeps only what its grammar allows."""
        for b, col in fronts.items():
            reqs[b].grammar.mask_logits(logits[b, col])

    def _inputs(self, rows: list[tuple]):
        """Left-padded ids and positions (R, W), the KV view, the unit columns (R, U), each
        row's unit width (a list, and (R, 1)) and this step's commit count (R, 1)."""
        dev, lens = self.device, [len(row[1]) for row in rows]
        W, R = max(lens), len(rows)
        widths = [r.hi - r.lo for r, *_ in rows]
        U = max(widths)
        # per row, one tensor: leading padding, position of column 0, the unit's first
        # column, its width, the step's commit count
        numbers = zip(*[(W - m, f - W + m, W - m + r.lo - f, r.hi - r.lo,
                         r.schedule[0] if r.schedule else 0)
                        for (r, _, f, _, _), m in zip(rows, lens)])
        lead, pos0, start, width, k = long_tensor(chain.from_iterable(numbers), dev).view(
            5, R, 1)                                                             # (R, 1) each
        col = self.kv.columns(W, dev)
        real = None
        flat = long_tensor(chain.from_iterable(row[1] for row in rows), dev)
        if min(lens) == W:                                                       # no padding
            ids = flat.view(R, W)
            pos = pos0 + col                                                     # (R, W)
        else:
            real = col >= lead                                                   # (R, W)
            ids = torch.full((R, W), self.special.pad, dtype=torch.long, device=dev)
            ids[real] = flat
            pos = (pos0 + col).clamp_min(0)                                      # (R, W)
        cols = start + col[:U]                                                   # (R, U)
        if min(widths) < U:        # a narrower unit's columns may run past its window
            cols = cols.clamp_max(W - 1)
        runs = [(b, W - m + q, slot, f + q, m - q)
                for b, ((_, _, f, q, slot), m) in enumerate(zip(rows, lens))]
        ends = [self.layout.key_end(r, f, m) for (r, _, f, _, _), m in zip(rows, lens)]
        view = self.kv.bind([row[4] for row in rows], ends, runs, real)
        return ids, pos, view, cols, widths, width, k

    def _guide(self, logits: torch.Tensor, reqs: list[Request], twins: list[Request]
               ) -> torch.Tensor:
        """Unsupervised classifier-free guidance: u + (s + 1)(c - u) for the rows that ask."""
        if not twins:
            return logits
        B = len(reqs)
        at = torch.tensor([reqs.index(r) for r in twins], device=self.device)
        s = torch.tensor([r.params.cfg_scale for r in twins], device=self.device)
        s = s[:, None, None].to(logits.dtype)
        cond, un = logits[at], logits[B:]
        out = logits[:B].clone()
        out[at] = un + (s + 1) * (cond - un)
        return out

    def _greedy_first(self, reqs: list[Request], take: torch.Tensor, active: torch.Tensor
                      ) -> torch.Tensor:
        """Fast-dLLM v2's first token (``first_token="greedy"``): a fresh block's first
        position is committed alone, by argmax, before the rest of the block."""
        greedy = [self.layout.first_only(r) for r in reqs]
        if not any(greedy):
            return take
        only_first = torch.zeros_like(take)
        only_first[:, 0] = active[:, 0]
        return torch.where(torch.tensor(greedy, device=self.device)[:, None], only_first, take)
