"""Block KV cache (Fast-dLLM, Wu et al. 2025, sec. 3.2).

In a masked diffusion LM every position attends to every other, so nothing can be cached
exactly. But within a block the keys and values of positions outside it change little from step
to step, so they are computed once per block (a *refresh*: one full forward) and reused:

- ``prefix``: the prompt and finished blocks come from the cache; the current block and the
  masked suffix are recomputed every step.
- ``dual``:   only the current block is recomputed; prefix and suffix both come from the cache.

The buffers are allocated once per batch layout with fixed shapes, (B, Hkv, L, D) per layer,
and the fresh keys/values of each forward are written into them in place; the model reads the
whole buffer. A position is only written where it is *fresh* for its row, so rows at different
blocks share one forward without disturbing each other's cached state.
"""

from __future__ import annotations

import torch


class BlockKVCache:
    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.key_mask: torch.Tensor | None = None
        self._idx: torch.Tensor | None = None       # (B, W) positions of this forward
        self._fresh: torch.Tensor | None = None     # (B, W) bool, None = all fresh
        self._length = 0

    @property
    def allocated(self) -> bool:
        return bool(self.k)

    def clear(self) -> None:
        self.k, self.v = [], []

    def relayout(self, kept: list[int], added: int, length: int) -> None:
        """Follow a batch change: keep the rows in ``kept`` (their canvases end at the right
        edge, so a longer batch only pads on the left), append ``added`` empty rows."""
        if not self.k:
            return
        if not kept:
            self.clear()
            return
        rows = torch.tensor(kept, device=self.k[0].device)
        for buffers in (self.k, self.v):
            for i, buf in enumerate(buffers):
                buf = buf.index_select(0, rows)                                    # (B', H, L, D)
                B, H, L, D = buf.shape
                out = buf.new_zeros(B + added, H, length, D)
                keep = min(L, length)
                out[:B, :, length - keep:] = buf[:, :, L - keep:]
                buffers[i] = out

    def bind(self, idx: torch.Tensor, fresh: torch.Tensor | None,
             key_mask: torch.Tensor | None, length: int) -> "BlockKVCache":
        """Set what the next forward covers: positions ``idx`` (B, W) of a canvas of
        ``length``, of which ``fresh`` (B, W) are recomputed (None = all); the rest are read
        from the cache."""
        self._idx, self._fresh, self.key_mask, self._length = idx, fresh, key_mask, length
        return self

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """KVView: write this forward's fresh keys/values (B, H, W, D); return the full
        buffers (B, H, L, D) to attend to."""
        B, H, W, D = k.shape
        if layer == len(self.k):     # first forward of this layout: allocate once
            self.k.append(k.new_zeros(B, H, self._length, D))
            self.v.append(v.new_zeros(B, H, self._length, D))
        idx = self._idx[:, None, :, None].expand(B, H, W, D)
        for buf, new in ((self.k[layer], k), (self.v[layer], v)):
            if self._fresh is not None:
                keep = ~self._fresh[:, None, :, None]
                new = torch.where(keep, buf.gather(2, idx), new)
            buf.scatter_(2, idx, new.to(buf.dtype))
        return self.k[layer], self.v[layer]
