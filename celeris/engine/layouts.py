"""Family layouts: what differs between full-attention canvases and block-causal models.

A layout answers four questions about one request, and nothing else in the engine asks
whether a model is block-causal:

- ``start``: the sequence it begins with (prompt + masked answer) and its first unit;
- ``window``: which tokens this step forwards, from which position, and whether the first
  column is only a query (its keys are already cached);
- ``after_forward``: what the forward left final in the request's KV slot;
- ``advance``: the next unit once the current one has no masks left.

``CanvasLayout`` (full attention: LLaDA, Dream, celeris-tiny) denoises a fixed canvas of whole
blocks, left to right (Nie et al. 2025, semi-autoregressive remasking). Its cache policies are
Fast-dLLM's approximate block caches (Wu et al. 2025, sec. 3.2): a block's first step
recomputes the whole sequence (a refresh) and writes every key/value; later steps forward the
block and the masked suffix (``prefix``) or the block alone (``dual``) and read the rest from
the slot; ``none`` recomputes everything every step (the reference).

``BlockLayout`` (block-causal: Fast-dLLM v2, SDAR, celeris-tiny-bd) writes block after block
(Arriola et al. 2025, BD3-LM): a position sees earlier blocks and its own, so a finished
block's keys/values are exact and final. Blocks are aligned to absolute positions; the prompt's
partial last block is the pinned head of the first one; each step forwards the current block
(plus any finished tokens not yet cached) and commits inside one sub-block of
``params.block_length`` positions (Fast-dLLM v2's sub-blocks); the answer ends at a stop token
or ``gen_length`` (a cap, not a canvas). ``cache="none"`` recomputes the whole prefix.
"""

from __future__ import annotations

from typing import Any

from ..sampler.policies import linear_schedule
from .families import check_block_params, infill_refusal
from .gemma_layout import GemmaLayout
from .request import Request

Window = tuple[list[int], int, bool]   # (tokens, first position, first column query-only)


class CanvasLayout:
    block_causal, block_size = False, None
    caches = ("none", "prefix", "dual")
    strict_threshold = False             # Fast-dLLM v1's LLaDA code: confidence >= threshold

    def __init__(self, config: Any, mask: int) -> None:
        self.mask, self.shift = mask, 1 if getattr(config, "shift_logits", False) else 0
        self.context = int(config.max_position_embeddings)

    def stops_at_eos(self, req: Request) -> bool:
        return req.params.early_stop

    def start(self, req: Request) -> None:
        """The canvas is gen_length rounded up to whole blocks, but never past the context:
        a request that fits (prompt + gen_length <= context) gets a shorter last block."""
        p, mask = req.params, self.mask
        width = min(p.canvas_length, self.context - req.prompt_len)
        canvas = list(req.canvas) if req.canvas is not None else [mask] * width
        req.seq = list(req.prompt_ids) + canvas
        req.end, req.todo, req.unit = len(req.seq), canvas.count(mask), -1
        self._next_block(req)

    def _next_block(self, req: Request) -> None:
        """The next block that still has masks (an infill canvas may pin whole blocks)."""
        p, bl = req.params, req.params.block_length
        while req.unit + 1 < p.num_blocks:
            req.unit += 1
            req.lo = req.prompt_len + req.unit * bl
            req.hi = min(req.lo + bl, req.end)
            masked = req.seq[req.lo:req.hi].count(self.mask)
            if masked:
                req.fresh, req.blocks_done = True, req.unit
                req.schedule = [c for c in linear_schedule(masked, p.steps_per_block) if c]
                return
        req.lo = req.hi = req.end

    def window(self, req: Request) -> Window:
        cache = req.params.cache
        if cache == "none" or req.fresh:
            return req.seq, 0, False
        lo = req.lo - self.shift          # shifted logits read the state before the block
        return (req.seq[lo:] if cache == "prefix" else req.seq[lo:req.hi]), lo, False

    def key_end(self, req: Request, first: int, width: int) -> int:
        return len(req.seq)               # every position is a key (bidirectional)

    def after_forward(self, req: Request) -> None:
        req.fresh = False

    def check(self, params: Any, canvas: Any, model: str) -> None:
        if params.edits:
            raise ValueError("edit_threshold: token editing needs a block-causal model "
                             f"(LLaDA2.1, SDAR, celeris-tiny-bd); {model} denoises a "
                             "full-attention canvas")
        if canvas is not None and len(canvas) != params.canvas_length:
            raise ValueError(f"canvas has {len(canvas)} positions but gen_length "
                             f"{params.gen_length} needs {params.canvas_length}")

    def advance(self, req: Request) -> None:
        if self.mask not in req.seq[req.lo:req.hi]:
            self._next_block(req)


class BlockLayout:
    block_causal = True
    caches = ("none", "prefix")          # prefix = the exact block cache
    strict_threshold = True              # Fast-dLLM v2 and SDAR: confidence > threshold

    def __init__(self, config: Any, mask: int) -> None:
        self.mask, self.block_size = mask, int(config.block_size)
        self.shift = bool(getattr(config, "shift_logits", False))

    def stops_at_eos(self, req: Request) -> bool:
        return True

    def start(self, req: Request) -> None:
        P, bs = req.prompt_len, self.block_size
        req.block_start = P // bs * bs
        req.seq = list(req.prompt_ids) + [self.mask] * (req.block_start + bs - P)
        req.end, req.todo = P + req.params.gen_length, req.params.gen_length
        self._plan_sub_block(req)

    def _plan_sub_block(self, req: Request) -> None:
        """The first sub-block of the current block with positions to commit, and its
        schedule (steps per block, LLaDA's linear schedule, steps that commit none dropped)."""
        p, sb = req.params, req.params.block_length
        for sub in range(self.block_size // sb):
            lo = req.block_start + sub * sb
            hi = min(lo + sb, req.end)
            masked = req.seq[lo:hi].count(self.mask) if hi > lo else 0
            if masked:
                req.unit, req.lo, req.hi, req.post_edits = sub, lo, hi, 0
                req.schedule = [c for c in linear_schedule(masked, p.steps_per_block) if c]
                return
        req.unit, req.lo, req.hi = -1, req.block_start, req.block_start

    def window(self, req: Request) -> Window:
        end = req.block_start + self.block_size
        if req.params.cache == "none":
            return req.seq[:end], 0, False
        bs0 = req.block_start
        if req.cached < bs0 or not self.shift or bs0 == 0 or req.seq[bs0] != self.mask:
            return req.seq[req.cached:end], req.cached, False
        # shifted logits: the block's first position is predicted from the state before it,
        # whose key is cached; re-read that token as a query only, while the first position
        # is still masked (once committed its logits are never read again)
        return req.seq[bs0 - 1:end], bs0 - 1, True

    def key_end(self, req: Request, first: int, width: int) -> int:
        return first + width              # the block's end: later blocks are invisible

    def after_forward(self, req: Request) -> None:
        req.cached = req.block_start if req.params.cache != "none" else 0

    def advance(self, req: Request) -> None:
        if req.settling:                             # token editing: the unit again
            return
        bs0, end = req.block_start, min(req.block_start + self.block_size, req.end)
        if self.mask not in req.seq[bs0:end]:        # the block is done: open the next one
            req.block_start += self.block_size
            req.seq += [self.mask] * self.block_size
            req.blocks_done += 1
            self._plan_sub_block(req)
        elif self.mask not in req.seq[req.lo:req.hi]:
            self._plan_sub_block(req)

    def check(self, params: Any, canvas: Any = None, model: str = "this model") -> None:
        if canvas is not None:
            raise ValueError(infill_refusal(model))
        check_block_params(params, self.block_size)


def layout_for(config: Any, mask: int) -> CanvasLayout | BlockLayout | GemmaLayout:
    """The layout of a model, chosen once at load from its config's attention kind
    (DiffusionGemma's encoder/decoder canvases: ``gemma_layout.py``)."""
    if getattr(config, "model_type", None) == "diffusion_gemma":
        return GemmaLayout(config, mask)
    return BlockLayout(config, mask) if getattr(config, "block_causal", False) \
        else CanvasLayout(config, mask)
