"""Layouts: how a family attends and decodes, asked through one protocol.

A family declares its layout (``registry.Family.layout``); the engine holds it as a ``Layout``
and asks it, and only it, every question whose answer depends on how the model attends: what
a request may ask (``check``), the defaults it needs, where a request starts and what unit it
commits in next (``start``, ``advance``), whether a stop token ends it, how a step's forward
is run (``run``) and which cache that needs (``new_cache``). Nothing else in the engine
branches on the attention kind; ``block_causal`` and ``block_size`` are descriptions for the
server, the bench and the UI.

Two layouts share the runner's window forward (``WindowLayout``: each row forwards a window of
its sequence against its KV slot, ``Runner.forward_windows``):

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

DiffusionGemma's encoder/decoder canvases have a layout of their own (``gemma_layout.py``)
with its own ``run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..cache import SlotKVCache, SlotPool
from ..model.dispatch import layer_devices, main_device
from ..sampler.policies import linear_schedule

if TYPE_CHECKING:                      # the engine's record; layouts only move its pointers
    from ..engine.request import Request

Window = tuple[list[int], int, bool]   # (tokens, first position, first column query-only)
MAX_CACHE_LEN = 8192      # cache positions per slot, at most (the model's context below)
INITIAL_CACHE_LEN = 1024  # positions a slot starts with; doubled when a request needs more


@runtime_checkable
class Layout(Protocol):
    """What the engine asks a family's layout (every method is called by the engine)."""

    block_causal: bool           # a description (server, bench, UI), never a branch
    block_size: int | None
    caches: tuple[str, ...]      # the cache policies it honours
    strict_threshold: bool       # threshold rules commit strictly above the threshold

    def check(self, params: Any, canvas: Any, model: str) -> None:
        """Refuse (ValueError naming the field) what this layout cannot honour."""

    def defaults(self) -> dict[str, Any]:
        """Request defaults this layout needs, under the family's and the checkpoint's."""

    def fit_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The merged defaults made valid for this layout."""

    def new_cache(self, model: Any, slots: int) -> SlotPool:
        """The slots (and storage) its requests use."""

    def start(self, req: "Request") -> None:
        """Set up a newly admitted request's sequence and first unit."""

    def stops_at_eos(self, req: "Request") -> bool:
        """Whether a committed stop token (with everything before it) ends the request."""

    def run(self, runner: Any, reqs: list["Request"]) -> None:
        """One step for the running requests: forward, choose, commit."""

    def advance(self, req: "Request") -> None:
        """Move an unfinished request to its next unit once the current one is done."""

    def release(self, req: "Request") -> None:
        """Forget a finished request's per-request state."""


def new_slot_cache(model: Any, slots: int = 4) -> SlotKVCache:
    """A KV cache for ``model``: up to its context + one block per slot, starting at
    ``INITIAL_CACHE_LEN`` positions (see ``SlotKVCache``)."""
    cfg = model.config
    param = next(model.parameters())
    length = min(cfg.max_position_embeddings, MAX_CACHE_LEN) + int(cfg.block_size or 0)
    return SlotKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, length,
                       param.dtype, main_device(model), slots,
                       length=min(length, INITIAL_CACHE_LEN),
                       layer_devices=layer_devices(model))   # device_map: each layer's own


def infill_refusal(model: str) -> str:
    """Why a model that writes left to right does not infill, and which model does."""
    return (f"{model} is a block-diffusion (block-causal) model: it writes left to right, "
            "block after block, so it cannot fill [MASK] spans between pinned text; infill "
            "with a full-attention model such as models/celeris-tiny "
            "(Engine.from_pretrained(\"models/celeris-tiny\"), or --model models/celeris-tiny)")


class WindowLayout:
    """What the two window layouts share: the runner's window forward and the slot cache."""

    block_causal: bool
    block_size: int | None

    def new_cache(self, model: Any, slots: int) -> SlotKVCache:
        return new_slot_cache(model, slots)

    def run(self, runner: Any, reqs: list["Request"]) -> None:
        runner.forward_windows(reqs)

    def release(self, req: "Request") -> None:
        pass                            # every per-request state is in the Request

    def first_only(self, req: "Request") -> bool:
        """Commit only the unit's first position this step (Fast-dLLM v2's greedy first
        token of a block)."""
        return False


class CanvasLayout(WindowLayout):
    block_causal, block_size = False, None
    caches = ("none", "prefix", "dual")
    strict_threshold = False             # Fast-dLLM v1's LLaDA code: confidence >= threshold

    def __init__(self, config: Any, mask: int) -> None:
        self.mask, self.shift = mask, 1 if getattr(config, "shift_logits", False) else 0
        self.context = int(config.max_position_embeddings)

    def defaults(self) -> dict[str, Any]:
        return {}

    def fit_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        return changes

    def stops_at_eos(self, req: "Request") -> bool:
        return req.params.early_stop

    def start(self, req: "Request") -> None:
        """The canvas is gen_length rounded up to whole blocks, but never past the context:
        a request that fits (prompt + gen_length <= context) gets a shorter last block."""
        p, mask = req.params, self.mask
        width = min(p.canvas_length, self.context - req.prompt_len)
        canvas = list(req.canvas) if req.canvas is not None else [mask] * width
        req.seq = list(req.prompt_ids) + canvas
        req.end, req.todo, req.unit = len(req.seq), canvas.count(mask), -1
        self._next_block(req)

    def _next_block(self, req: "Request") -> None:
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

    def window(self, req: "Request") -> Window:
        cache = req.params.cache
        if cache == "none" or req.fresh:
            return req.seq, 0, False
        lo = req.lo - self.shift          # shifted logits read the state before the block
        return (req.seq[lo:] if cache == "prefix" else req.seq[lo:req.hi]), lo, False

    def key_end(self, req: "Request", first: int, width: int) -> int:
        return len(req.seq)               # every position is a key (bidirectional)

    def after_forward(self, req: "Request") -> None:
        req.fresh = False

    def check(self, params: Any, canvas: Any, model: str) -> None:
        if params.edits:
            raise ValueError("edit_threshold: token editing needs a block-causal model "
                             f"(LLaDA2.1, SDAR, celeris-tiny-bd); {model} denoises a "
                             "full-attention canvas")
        if canvas is not None and len(canvas) != params.canvas_length:
            raise ValueError(f"canvas has {len(canvas)} positions but gen_length "
                             f"{params.gen_length} needs {params.canvas_length}")

    def advance(self, req: "Request") -> None:
        if self.mask not in req.seq[req.lo:req.hi]:
            self._next_block(req)


class BlockLayout(WindowLayout):
    block_causal = True
    caches = ("none", "prefix")          # prefix = the exact block cache
    strict_threshold = True              # Fast-dLLM v2 and SDAR: confidence > threshold

    def __init__(self, config: Any, mask: int) -> None:
        self.mask, self.block_size = mask, int(config.block_size)
        self.shift = bool(getattr(config, "shift_logits", False))

    def defaults(self) -> dict[str, Any]:
        """Sub-blocks of the model's block, the exact cache, the adaptive step count."""
        return {"block_length": self.block_size, "cache": "prefix", "steps": None}

    def fit_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        """A family's sub-block must divide the model's block: the largest that does."""
        bs = self.block_size
        want = changes.get("block_length", bs)
        return {**changes, "block_length": max(d for d in range(1, bs + 1)
                                               if bs % d == 0 and d <= want)}

    def stops_at_eos(self, req: "Request") -> bool:
        return True

    def first_only(self, req: "Request") -> bool:
        return (req.params.first_token == "greedy" and req.lo == req.block_start
                and req.seq[req.lo] == self.mask)

    def start(self, req: "Request") -> None:
        P, bs = req.prompt_len, self.block_size
        req.block_start = P // bs * bs
        req.seq = list(req.prompt_ids) + [self.mask] * (req.block_start + bs - P)
        req.end, req.todo = P + req.params.gen_length, req.params.gen_length
        self._plan_sub_block(req)

    def _plan_sub_block(self, req: "Request") -> None:
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

    def window(self, req: "Request") -> Window:
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

    def key_end(self, req: "Request", first: int, width: int) -> int:
        return first + width              # the block's end: later blocks are invisible

    def after_forward(self, req: "Request") -> None:
        req.cached = req.block_start if req.params.cache != "none" else 0

    def advance(self, req: "Request") -> None:
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
        bs = self.block_size
        if bs % params.block_length:
            divisors = [d for d in range(1, bs + 1) if bs % d == 0]
            raise ValueError(f"block_length must divide the model's block size {bs} "
                             f"(one of {', '.join(map(str, divisors))}), got "
                             f"{params.block_length}")
        if params.cfg_scale > 0:
            raise ValueError("cfg_scale > 0 is not supported for block-causal models")


def attention_layout(config: Any, mask: int) -> CanvasLayout | BlockLayout:
    """The layout of a model of ours, from its config's attention kind: the one place that
    asks it (a family with another decoder declares its own layout)."""
    return BlockLayout(config, mask) if config.block_causal else CanvasLayout(config, mask)
