"""How a denoising step obtains the logits of each row's active block.

``NoCacheForward`` runs the model over the whole canvas every step (exact; the reference).
``CachedForward`` refreshes the block KV cache with one full forward when a row starts a block
and otherwise runs only a window: the current block and the masked suffix (``prefix``) or the
current block alone (``dual``). Chosen once per batch by ``make_forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..cache import BlockKVCache


@dataclass
class ForwardInputs:
    x: torch.Tensor                    # (B, L) canvases, right-aligned
    key_mask: torch.Tensor | None      # (B, L) True = real token; None = no padding
    positions: torch.Tensor            # (B, L) RoPE positions (0 at each row's first token)
    idx: torch.Tensor                  # (B, bl) positions of each row's active block
    block_starts: list[int]            # host copy of idx[:, 0]
    refresh: list[bool]                # row starts a new block this step
    prompt_mask: torch.Tensor          # (B, L) prompt (and padding) positions
    cfg: torch.Tensor                  # (B,) classifier-free guidance scale
    any_cfg: bool


def _block_mask(cols: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(B, W) bool: which of the positions ``cols`` (B, W) lie in each row's block."""
    start, bl = idx[:, :1], idx.shape[1]
    return (cols >= start) & (cols < start + bl)


class NoCacheForward:
    def __init__(self, model: Any, mask_id: int) -> None:
        self.model, self.mask_id = model, mask_id

    def reset(self, kept: list[int], added: int, length: int) -> None:
        pass

    def __call__(self, fi: ForwardInputs) -> torch.Tensor:
        B, L = fi.x.shape
        bl = fi.idx.shape[1]
        cols = torch.arange(L, device=fi.x.device).expand(B, L)
        window = _block_mask(cols, fi.idx)                                      # (B, L)
        if not fi.any_cfg:
            out = self.model(fi.x, attention_mask=fi.key_mask, position_ids=fi.positions,
                             logits_mask=window)
            return out.logits.view(B, bl, -1)                                   # (B, bl, V)
        # Unsupervised classifier-free guidance (LLaDA, app. B.6): a second forward with the
        # prompt masked; logits = u + (s + 1)(c - u).
        uncond = torch.where(fi.prompt_mask, self.mask_id, fi.x)
        km = None if fi.key_mask is None else torch.cat([fi.key_mask, fi.key_mask])
        out = self.model(torch.cat([fi.x, uncond]), attention_mask=km,
                         position_ids=torch.cat([fi.positions, fi.positions]),
                         logits_mask=torch.cat([window, window]))
        cond, un = out.logits.view(2, B, bl, -1).unbind(0)
        s = fi.cfg[:, None, None].to(cond.dtype)
        return torch.where(s > 0, un + (s + 1) * (cond - un), cond)


class CachedForward:
    """shift: 1 for models whose logits at i come from position i-1 (Dream, celeris-tiny), so
    a window must include the position before the block."""

    def __init__(self, model: Any, mask_id: int, shift: int, dual: bool) -> None:
        self.model, self.mask_id, self.shift, self.dual = model, mask_id, shift, dual
        self.cache = BlockKVCache()
        self.stale: list[bool] = []

    def reset(self, kept: list[int], added: int, length: int) -> None:
        self.cache.relayout(kept, added, length)
        if not self.cache.allocated:
            self.stale = [True] * (len(kept) + added)
        else:
            self.stale = [self.stale[i] for i in kept] + [True] * added

    def __call__(self, fi: ForwardInputs) -> torch.Tensor:
        B, L = fi.x.shape
        bl = fi.idx.shape[1]
        dev = fi.x.device
        refresh = [r or s for r, s in zip(fi.refresh, self.stale)]
        lo = fi.idx[:, :1] - self.shift                                         # (B, 1)
        if any(refresh) or not self.cache.allocated:
            cols = torch.arange(L, device=dev).expand(B, L)                     # (B, L)
            fresh = None
            if not all(refresh):   # rows mid-block keep reading their cached positions
                hi = fi.idx[:, :1] + bl if self.dual else L
                inside = (cols >= lo) & (cols < hi)
                fresh = torch.tensor(refresh, device=dev)[:, None] | inside
            self.stale = [False] * B
        elif self.dual:
            cols = lo + torch.arange(bl + self.shift, device=dev)                # (B, bl+s)
            fresh = None
        else:
            start = min(fi.block_starts) - self.shift
            cols = torch.arange(start, L, device=dev).expand(B, L - start)      # (B, W)
            fresh = None if len(set(fi.block_starts)) == 1 else cols >= lo
        view = self.cache.bind(cols, fresh, fi.key_mask, L)
        out = self.model(fi.x.gather(1, cols), position_ids=fi.positions.gather(1, cols),
                         logits_mask=_block_mask(cols, fi.idx), kv=view)
        return out.logits.view(B, bl, -1)                                       # (B, bl, V)


def make_forward(cache: str, model: Any, mask_id: int, shift: int = 0):
    if cache == "none":
        return NoCacheForward(model, mask_id)
    if cache in ("prefix", "dual"):
        return CachedForward(model, mask_id, shift, dual=cache == "dual")
    raise ValueError(f"cache must be one of none, prefix, dual; got {cache!r}")
