"""Block diffusion decoding: block-causal models, one block of masks at a time, exact KV cache.

In a block-causal model (SDAR, Fast-dLLM v2, celeris-tiny-bd) a position sees every earlier
block and its own block both ways, so the keys/values of a finished block never change. A
request therefore runs like an autoregressive one whose unit is a block (Arriola et al. 2025,
BD3-LM; Cheng et al. 2025, SDAR; Wu et al. 2025, Fast-dLLM v2 sec. 3):

- blocks are aligned to absolute positions (the model was trained so): the prompt's whole
  blocks are the cached prefix, its partial last block is the pinned head of the first block;
- each step forwards only the current block against the cache and commits masked positions
  by the request's unmask schedule (fixed / threshold / factor), restricted to the active
  sub-block of ``params.block_length`` positions (Fast-dLLM v2's sub-blocks);
- a finished block's final keys/values are written to the cache in the next step's forward:
  the window is [finished block, new block], so no extra forward is spent; the current
  block's keys/values go to its own slot positions as scratch that every step overwrites, so
  attention reads the slot in place instead of copying the cached prefix each layer;
- generation ends at a stop token (once everything before it is committed) or after
  ``params.gen_length`` tokens: a cap, not a canvas.

Rows at different blocks and prompt lengths share one forward: each row's window is
left-padded to the widest. ``exact_cache=False`` recomputes the whole prefix every step (no
cache at all): the reference the cached path must equal token for token.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..cache import SlotKVCache
from .choose import RowKnobs
from .denoise import RowBatch, SamplerRequest, SpecialTokens, StepOutput
from .policies import linear_schedule


class BlockRow:
    """One request: its committed tokens, its current block, its cache slot and schedule."""

    def __init__(self, req: SamplerRequest, special: SpecialTokens, block_size: int,
                 device: torch.device) -> None:
        p = self.p = req.params
        self.req, self.special, self.bs = req, special, block_size
        P = self.prompt_len = len(req.prompt_ids)
        self.block_start = P // block_size * block_size
        self.tokens = list(req.prompt_ids[:self.block_start])    # everything before the block
        head = list(req.prompt_ids[self.block_start:])           # the prompt's partial block
        self.block = head + [special.mask] * (block_size - len(head))
        self.cached = 0                   # leading positions of ``tokens`` in the cache
        self.slot = -1
        self.generator = (torch.Generator(device=device).manual_seed(req.seed)
                          if p.temperature > 0 or p.remasking == "random" else None)
        self.step = self.nfe = self.blocks_done = 0
        self.schedule: list[int] = []
        self.finish: str | None = None
        self._plan_sub_block()

    # ------------------------------------------------------------ where we are
    def gen_index(self, j: int) -> int:
        """Index in the answer of block position j (negative: a prompt position)."""
        return self.block_start + j - self.prompt_len

    def active(self) -> list[bool]:
        """Positions this step may commit: masked, under the cap, in the active sub-block."""
        sb = self.p.block_length
        lo = self._sub * sb
        return [lo <= j < lo + sb and t == self.special.mask and self.gen_index(j) < self.p.gen_length
                for j, t in enumerate(self.block)]

    def _plan_sub_block(self) -> None:
        """Move to the first sub-block that still has positions to commit; plan its schedule."""
        sb, mask = self.p.block_length, self.special.mask
        for sub in range(self.bs // sb):
            todo = sum(1 for j in range(sub * sb, (sub + 1) * sb)
                       if self.block[j] == mask and self.gen_index(j) < self.p.gen_length)
            if todo:
                self._sub = sub
                self.schedule = [c for c in linear_schedule(todo, self.p.steps_per_block) if c]
                return
        self._sub = -1                    # nothing left in this block

    # ------------------------------------------------------------ the window
    def window(self, exact_cache: bool, shift: bool) -> tuple[list[int], int, bool]:
        """(tokens, first position, whether the first column is a query-only re-read) for
        this step's forward. With the cache every other column writes its keys/values."""
        if not exact_cache:               # recompute everything: nothing is cached
            return self.tokens + self.block, 0, False
        pending = self.tokens[self.cached:]
        if pending or not shift or not self.tokens or self.block[0] != self.special.mask:
            return pending + self.block, self.cached, False
        # shifted logits: the block's first position is predicted from the state before it,
        # which is in the cache; re-read that token as a query only (its key is the cached one).
        # Only while that position is still masked: once it is committed (usually in the
        # block's first step) its logits are never read, and the window is one column less.
        return self.tokens[-1:] + self.block, self.block_start - 1, True

    # ------------------------------------------------------------ after the forward
    def commit(self, block_ids: list[float], transfer: list[float], conf: list[float],
               nfe: int) -> StepOutput:
        committed, confs = [], []
        for j, (tok, t, c) in enumerate(zip(block_ids, transfer, conf)):
            if t:
                self.block[j] = int(tok)
                committed.append(self.gen_index(j))
                confs.append(float(c))
        self.step += 1
        self.nfe += nfe
        if self.schedule:
            self.schedule.pop(0)
        self.finish = self._finished()
        canvas = self.canvas()
        if self.finish is None and self.special.mask not in self.block[:self._end()]:
            self._next_block()
        elif self.finish is None and self._sub >= 0 and not any(self.active()):
            self._plan_sub_block()
        return StepOutput(self.req.request_id, self.step, self.blocks_done, canvas,
                          tuple(committed), tuple(confs), self.nfe, self.finish)

    def fail(self) -> StepOutput:
        self.finish = "error"
        return StepOutput(self.req.request_id, self.step, self.blocks_done, self.canvas(),
                          (), (), self.nfe, "error")

    def canvas(self) -> tuple[int, ...]:
        """The answer so far: committed blocks, then the current block (masks included),
        never past the cap."""
        gen = self.tokens[self.prompt_len:] + self.block[max(0, self.prompt_len - self.block_start):]
        return tuple(gen[:self.p.gen_length])

    def _end(self) -> int:
        """Block positions that count: up to the cap."""
        return min(self.bs, self.prompt_len + self.p.gen_length - self.block_start)

    def _finished(self) -> str | None:
        mask, stop = self.special.mask, self.special.stop
        first = max(0, self.prompt_len - self.block_start)
        for j in range(first, self._end()):
            t = self.block[j]
            if t == mask:
                return None               # the answer before any later stop is still open
            if t in stop:
                return "stop"
        if self._end() < self.bs or self.gen_index(self.bs) >= self.p.gen_length:
            return "length"               # every position under the cap is committed
        return None

    def _next_block(self) -> None:
        self.tokens += self.block
        self.block_start += self.bs
        self.block = [self.special.mask] * self.bs
        self.blocks_done += 1
        self._plan_sub_block()


class BlockBatch(RowBatch):
    """Block-causal requests advanced one step (one forward) at a time; same interface as
    ``DenoiseBatch`` (add / remove / step)."""

    def __init__(self, model: Any, special: SpecialTokens, device: torch.device,
                 kv: SlotKVCache | None, shift: bool) -> None:
        self.model, self.special, self.device = model, special, device
        self.kv, self.shift = kv, shift
        self.exact_cache = kv is not None
        self.block_size = model.config.block_size
        self.rows: list[BlockRow] = []
        self.forward_s = 0.0              # the last step's time inside the model forward

    def add(self, requests: Sequence[SamplerRequest]) -> None:
        new = [BlockRow(r, self.special, self.block_size, self.device) for r in requests]
        for row in new:
            bad = self.block_size % row.p.block_length
            if bad:
                raise ValueError(f"block_length ({row.p.block_length}) must divide the model's "
                                 f"block size ({self.block_size})")
        if self.kv is not None:
            for row in new:
                row.slot = self.kv.take()
        self.rows.extend(new)
        self._knobs()

    def remove(self, request_ids: Sequence[str]) -> None:
        drop = set(request_ids)
        gone = [r for r in self.rows if r.req.request_id in drop]
        if gone:
            for r in gone:
                if self.kv is not None:
                    self.kv.give_back(r.slot)
            self.rows = [r for r in self.rows if r.req.request_id not in drop]
            self._knobs()

    def _knobs(self) -> None:
        self.knobs = RowKnobs([r.p for r in self.rows], [r.generator for r in self.rows],
                              self.special.mask, self.special.stop, self.device)

    # ------------------------------------------------------------ the step
    def step(self) -> list[StepOutput]:
        rows = self.rows
        if not rows:
            return []
        bs, dev = self.block_size, self.device
        x, pos, visible, writes, ends, real, W = self._layout()
        view = None
        if self.exact_cache:
            view = self.kv.bind([r.slot for r in rows], ends, writes, real)
        elif real is not None:
            view = _NoCacheView(pos, visible, real)
        cols = torch.arange(W - bs, W, device=dev).expand(len(rows), bs)            # (B, bs)
        start = time.perf_counter()
        logits = self.model(x, position_ids=pos, kv=view, logits_index=cols).logits  # (B, bs, V)
        self.forward_s = time.perf_counter() - start
        for r in rows:
            r.cached = r.block_start if self.exact_cache else 0
        block = x[:, W - bs:]                                                        # (B, bs)
        active = torch.tensor([r.active() for r in rows], device=dev)                # (B, bs)
        k = torch.tensor([r.schedule[0] if r.schedule else 0 for r in rows], device=dev)
        x0, conf, bad = self.knobs.choose(logits, active)
        transfer = self.knobs.select(conf, active, k)
        greedy = [r.p.first_token == "greedy" and r.block[0] == self.special.mask for r in rows]
        if any(greedy):   # Fast-dLLM v2: a fresh block's first token alone, by argmax
            only_first = torch.zeros_like(transfer)
            only_first[:, 0] = active[:, 0]
            transfer = torch.where(torch.tensor(greedy, device=dev)[:, None], only_first,
                                   transfer)
        new_block = torch.where(transfer, x0, block)
        conf = torch.where(active, conf, 0.0)
        packed = torch.cat([new_block.double(), transfer.double(), conf.double(),
                            bad.double()[:, None]], dim=1).tolist()                  # one sync
        outs = [r.fail() if p[-1] > 0 else r.commit(p[:bs], p[bs:2 * bs], p[2 * bs:3 * bs], 1)
                for r, p in zip(rows, packed)]
        done = [o.request_id for o in outs if o.finish is not None]
        if done:
            self.remove(done)
        return outs

    def _layout(self):
        """Left-padded windows of every row: ids, positions, key visibility (B, W), the cache
        writes (row, column, slot, position), each row's key end and the real (non-padding)
        columns, (B, W) bool, or None when no row is padded."""
        wins = [r.window(self.exact_cache, self.shift) for r in self.rows]
        W = max(len(w[0]) for w in wins)
        pad = self.special.pad
        ids, pos, vis, writes, ends = [], [], [], [], []
        for b, (row, (toks, first, query_only)) in enumerate(zip(self.rows, wins)):
            lead = W - len(toks)
            ids.append([pad] * lead + toks)
            pos.append([0] * lead + list(range(first, first + len(toks))))
            vis.append([False] * lead + [not query_only] + [True] * (len(toks) - 1))
            if self.exact_cache:
                writes += [(b, lead + i, row.slot, first + i)
                           for i in range(int(query_only), len(toks))]
            ends.append(first + len(toks))
        dev = self.device
        real = None
        if any(len(w[0]) < W for w in wins):
            real = torch.tensor([[i >= W - len(w[0]) for i in range(W)] for w in wins],
                                device=dev)
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev),
                torch.tensor(vis, device=dev), writes, ends, real, W)


class _NoCacheView:
    """Key visibility for a cache-less forward whose rows are padded."""

    def __init__(self, positions: torch.Tensor, visible: torch.Tensor,
                 real: torch.Tensor) -> None:
        self.key_mask, self.key_positions, self.query_mask = visible, positions, real

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        return k, v
