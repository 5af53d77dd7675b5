"""The denoising loop: a batch of requests advanced one step (one forward) at a time.

A ``DenoiseBatch`` holds the canvases of its requests right-aligned in one (B, L) tensor (left
padding), so every row's answer ends at column L. Each request keeps its own block, schedule,
knobs and noise generator; rows may join (``add``) and leave (``remove``, or when finished)
between steps, which is what step-level batching in the scheduler builds on.

One ``step()`` = one forward (two with classifier-free guidance) and exactly one host sync,
which returns the committed tokens and confidences of every row's active block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from ..params import GenerationParams
from .choose import RowKnobs
from .forward import ForwardInputs, make_forward
from .policies import linear_schedule


class MaskPredictor(Protocol):
    """What the sampler needs from a model: ``model(ids, attention_mask=..., ...) -> .logits``."""

    def __call__(self, input_ids: torch.Tensor, **kwargs) -> object: ...


class NonFiniteLogitsError(RuntimeError):
    """The model produced NaN/inf logits for these requests (a broken checkpoint, or an
    overflow in a low-precision dtype); they fail instead of returning garbage."""

    def __init__(self, request_ids: Sequence[str]) -> None:
        self.request_ids = tuple(request_ids)
        super().__init__(f"the model produced non-finite (NaN/inf) logits for request(s) "
                         f"{', '.join(self.request_ids)}; the checkpoint or the dtype is broken "
                         "(try --dtype float32)")


@dataclass(frozen=True)
class SpecialTokens:
    mask: int
    pad: int
    stop: tuple[int, ...]      # EOS and end-of-turn


@dataclass(frozen=True)
class SamplerRequest:
    """canvas: an initial answer canvas (gen_length ids) for infilling; positions holding the
    mask id are generated, the others stay pinned. None = all masked."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: GenerationParams
    seed: int
    canvas: tuple[int, ...] | None = None


@dataclass(frozen=True)
class StepOutput:
    request_id: str
    step: int
    block: int
    canvas: tuple[int, ...]
    committed: tuple[int, ...]
    confidences: tuple[float, ...]
    nfe: int
    finish: str | None = None     # "stop" | "length" once done; "error": non-finite logits


class _Row:
    """Host-side state of one request; the host canvas mirrors the device one exactly."""

    def __init__(self, req: SamplerRequest, special: SpecialTokens, device: torch.device):
        p = req.params
        self.req, self.p, self.special = req, p, special
        self.canvas = (list(req.canvas) if req.canvas is not None
                       else [special.mask] * p.canvas_length)
        if len(self.canvas) != p.canvas_length:
            raise ValueError(f"canvas has {len(self.canvas)} positions but gen_length "
                             f"{p.gen_length} needs {p.canvas_length}")
        self.needs_rng = p.temperature > 0 or p.remasking == "random"
        self.generator = (torch.Generator(device=device).manual_seed(req.seed)
                          if self.needs_rng else None)
        self.block, self.step, self.nfe = -1, 0, 0
        self.fresh_block = True         # the next step is the first of its block
        self.schedule: list[int] = []
        self.prefix = 0                 # length of the contiguous committed prefix
        self.stopped = False            # a stop token lies inside that prefix
        self.finish: str | None = None
        self._next_block()

    @property
    def total_len(self) -> int:
        return len(self.req.prompt_ids) + self.p.canvas_length

    def block_slice(self) -> range:
        bl = self.p.block_length
        return range(self.block * bl, (self.block + 1) * bl)

    def _next_block(self) -> None:
        """Advance to the next block that still has masks; finish when there is none."""
        mask = self.special.mask
        while True:
            self.block += 1
            if self.block >= self.p.num_blocks:
                self.finish = "stop" if self.stopped or self._has_stop() else "length"
                return
            masked = sum(1 for i in self.block_slice() if self.canvas[i] == mask)
            if masked:
                self.fresh_block = True
                counts = linear_schedule(masked, self.p.steps_per_block)
                self.schedule = [c for c in counts if c]    # a step that commits nothing is skipped
                return

    def _has_stop(self) -> bool:
        return any(t in self.special.stop for t in self.canvas)

    def commit(self, block_ids: list[float], transfer: list[float], conf: list[float],
               nfe: int) -> StepOutput:
        base = self.block * self.p.block_length
        committed, confs = [], []
        for j, (tok, t, c) in enumerate(zip(block_ids, transfer, conf)):
            if t:
                self.canvas[base + j] = int(tok)
                committed.append(base + j)
                confs.append(float(c))
        self.step += 1
        self.nfe += nfe
        self.fresh_block = False
        if self.schedule:
            self.schedule.pop(0)
        self._advance_prefix()
        if self.p.early_stop and self.stopped:
            self.finish = "stop"
        elif all(self.canvas[i] != self.special.mask for i in self.block_slice()):
            self._next_block()
        return StepOutput(self.req.request_id, self.step, self.block if self.finish is None
                          else self.p.num_blocks - 1, tuple(self.canvas), tuple(committed),
                          tuple(confs), self.nfe, self.finish)

    def fail(self) -> StepOutput:
        """The row's logits were not finite: it leaves with finish "error"."""
        self.finish = "error"
        return StepOutput(self.req.request_id, self.step, max(self.block, 0),
                          tuple(self.canvas), (), (), self.nfe, "error")

    def _advance_prefix(self) -> None:
        """Once a stop token sits in the committed prefix, the text can no longer change:
        committed tokens are never remasked and the text ends at the first stop token."""
        mask, stop = self.special.mask, self.special.stop
        while self.prefix < len(self.canvas) and self.canvas[self.prefix] != mask:
            if self.canvas[self.prefix] in stop:
                self.stopped = True
                return
            self.prefix += 1


class RowBatch:
    """What every batch kind shares: its rows, one per request (``row.req``)."""

    rows: list

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def request_ids(self) -> list[str]:
        return [r.req.request_id for r in self.rows]


class DenoiseBatch(RowBatch):
    def __init__(self, model: MaskPredictor, special: SpecialTokens, device: torch.device,
                 cache: str = "none", shift: int = 0) -> None:
        """shift: 1 when the model reads position i's logits from position i-1 (Dream)."""
        self.model, self.special, self.device = model, special, device
        self.rows: list[_Row] = []
        self.forward = make_forward(cache, model, special.mask, shift)
        self.cache = cache
        self.forward_s = 0.0              # the last step's time inside the model forward
        self.x = torch.empty(0, 0, dtype=torch.long, device=device)

    # ------------------------------------------------------------ membership
    def add(self, requests: Sequence[SamplerRequest]) -> None:
        for req in requests:
            if req.params.cache != self.cache:
                raise ValueError(f"request {req.request_id} uses cache {req.params.cache!r} but "
                                 f"this batch uses {self.cache!r}")
        new = [_Row(r, self.special, self.device) for r in requests]
        keep = list(range(len(self.rows)))
        self.rows.extend(new)
        self._rebuild(keep, len(new))

    def remove(self, request_ids: Sequence[str]) -> None:
        drop = set(request_ids)
        keep = [i for i, r in enumerate(self.rows) if r.req.request_id not in drop]
        if len(keep) != len(self.rows):
            self.rows = [self.rows[i] for i in keep]
            self._rebuild(keep, 0)

    def _rebuild(self, kept: list[int], added: int) -> None:
        """Re-lay the device tensors from the host rows (the host canvases are authoritative)."""
        rows = self.rows
        if not rows:
            self.x = torch.empty(0, 0, dtype=torch.long, device=self.device)
            self.forward.reset(kept, 0, 0)
            return
        L = max(r.total_len for r in rows)
        pad = self.special.pad
        x = [[pad] * (L - r.total_len) + list(r.req.prompt_ids) + r.canvas for r in rows]
        self.x = torch.tensor(x, dtype=torch.long, device=self.device)             # (B, L)
        lens = torch.tensor([r.total_len for r in rows], device=self.device)
        col = torch.arange(L, device=self.device)
        real = col[None, :] >= (L - lens)[:, None]                                  # (B, L)
        self.key_mask = None if all(r.total_len == L for r in rows) else real
        self.positions = (real.long().cumsum(-1) - 1).clamp(min=0)                  # (B, L)
        gen = torch.tensor([r.p.canvas_length for r in rows], device=self.device)
        self.prompt_mask = col[None, :] < (L - gen)[:, None]                        # (B, L)
        self.knobs = RowKnobs([r.p for r in rows], [r.generator for r in rows],
                              self.special.mask, self.special.stop, self.device)
        self.block_length = rows[0].p.block_length
        if any(r.p.block_length != self.block_length for r in rows):
            raise ValueError("all requests in one batch must share block_length")
        self.forward.reset(kept, added, L)

    # ------------------------------------------------------------ the step
    def step(self) -> list[StepOutput]:
        """One denoising step for every row; returns one StepOutput per row (finished rows
        carry ``finish`` and leave the batch)."""
        rows = self.rows
        if not rows:
            return []
        L, bl = self.x.shape[1], self.block_length
        starts = [L - r.p.canvas_length + r.block * bl for r in rows]
        bstart = torch.tensor(starts, device=self.device)
        idx = bstart[:, None] + torch.arange(bl, device=self.device)                # (B, bl)
        k = torch.tensor([r.schedule[0] if r.schedule else 0 for r in rows], device=self.device)
        knobs = self.knobs
        start = time.perf_counter()
        logits = self.forward(ForwardInputs(
            x=self.x, key_mask=self.key_mask, positions=self.positions, idx=idx,
            block_starts=starts, prompt_mask=self.prompt_mask, cfg=knobs.cfg,
            any_cfg=knobs.any_cfg,
            refresh=[r.fresh_block for r in rows]))                                 # (B, bl, V)
        self.forward_s = time.perf_counter() - start
        xb = self.x.gather(1, idx)                                                  # (B, bl)
        masked = xb == self.special.mask
        x0, conf, bad = knobs.choose(logits, masked)
        transfer = knobs.select(conf, masked, k)
        new_xb = torch.where(transfer, x0, xb)
        self.x.scatter_(1, idx, new_xb)
        conf = torch.where(masked, conf, 0.0)
        packed = torch.cat([new_xb.double(), transfer.double(), conf.double(),
                            bad.double()[:, None]], dim=1).tolist()                 # one sync
        failed = [row[-1] > 0 for row in packed]
        packed = [(row[:bl], row[bl:2 * bl], row[2 * bl:3 * bl]) for row in packed]
        nfe = 2 if knobs.any_cfg else 1
        outs = [row.fail() if failed[b] else row.commit(*packed[b], nfe=nfe)
                for b, row in enumerate(rows)]
        done = [o.request_id for o in outs if o.finish is not None]
        if done:
            self.remove(done)
        return outs
