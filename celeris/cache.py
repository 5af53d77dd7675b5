"""The KV cache: one static buffer per layer with a slot per running request.

Both attention kinds use it. A block-causal model's finished blocks are exact and written once
(an append-only cache, like an autoregressive one); a full-attention model's slot holds the
keys/values of its last refresh (Fast-dLLM's approximate prefix/dual caches), overwritten
wherever a forward recomputes them.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import torch

from .kernels import fused_kernels, write_kv


class SlotPool:
    """Slot numbers for the running requests, lowest first, so that a small batch uses a
    contiguous range; a layout whose requests keep their state elsewhere (DiffusionGemma's
    per-request encoder cache) needs only this. ``SlotKVCache`` adds the storage."""

    def __init__(self, slots: int = 4) -> None:
        self.free: list[int] = []
        self._grow(slots)

    @property
    def capacity(self) -> int:
        return self._capacity

    def _grow(self, slots: int) -> None:
        old = getattr(self, "_capacity", 0)
        self.free = sorted(self.free + list(range(old, slots)), reverse=True)
        self._capacity = slots

    def take(self) -> int:
        """A free slot (the lowest)."""
        if not self.free:
            self._grow(2 * self.capacity)
        return self.free.pop()

    def give_back(self, slot: int) -> None:
        self.free.append(slot)
        self.free.sort(reverse=True)


class SlotKVCache(SlotPool):
    """The exact, append-only KV cache of block-causal models (Arriola et al. 2025, BD3-LM;
    SDAR; Fast-dLLM v2): once a block is finished its keys/values never change, so they are
    written once and read by every later step, like an autoregressive cache.

    Storage is (slots, Hkv, length, D) per layer, with a slot per running request; requests
    joining or leaving only take or return a slot number. It grows, by doubling, only when more
    requests run at once than ever before (slots) or a request reaches a position past every
    earlier one (length, up to ``max_len``, the model's context): a slot starts at ``length``
    positions rather than the whole context, since a slot sized by the context costs 2.2 GB
    for an 8B model in bf16 at 4096 positions (81 GiB at batch 32 on the first GPU run) while
    most requests use a few hundred. ``bind`` describes one forward: each row's slot, how far
    its keys reach, and which window columns write their keys/values where. A finished block
    (or the prompt's whole blocks at the first step) is written for good; the current block's
    positions are written as scratch, read by this forward only and overwritten by the next.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device, slots: int = 4,
                 length: int | None = None,
                 layer_devices: list[torch.device] | None = None) -> None:
        if length is not None and length < 1:
            raise ValueError(f"length must be >= 1, got {length!r}")
        self.max_len = max_len
        self.shape = (num_kv_heads, min(max_len, length or max_len), head_dim)
        self.num_layers, self.dtype, self.device = num_layers, dtype, device
        # a model spread over devices (device_map): each layer's keys/values on its device
        self.devices = list(layer_devices) if layer_devices else [device] * num_layers
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._columns: dict[torch.device, torch.Tensor] = {}
        super().__init__(slots)

    def columns(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """arange(n) as a slice of one tensor per device, made once: a forward needs three,
        and a fresh arange costs several times a slice on a CPU (host time per step)."""
        device = device or self.device
        cols = self._columns.get(device)
        if cols is None or len(cols) < n:
            cols = self._columns[device] = torch.arange(max(n, self.max_len + 1),
                                                        device=device)
        return cols[:n]

    def _grow(self, slots: int) -> None:
        old = self.capacity if self.k else 0
        for buffers in (self.k, self.v):
            for layer in range(self.num_layers):
                new = torch.zeros(slots, *self.shape, dtype=self.dtype,
                                  device=self.devices[layer])
                if old:
                    new[:old] = buffers[layer]
                    buffers[layer] = new
                else:
                    buffers.append(new)
        super()._grow(slots)

    @property
    def length(self) -> int:
        """Positions each slot holds now (grows on demand up to ``max_len``)."""
        return self.shape[1]

    def _ensure_length(self, needed: int) -> None:
        if needed <= self.length:
            return
        if needed > self.max_len:
            raise ValueError(f"KV cache position {needed - 1} is past the model's context "
                             f"({self.max_len} positions)")
        old = self.length
        new_len = min(self.max_len, max(needed, 2 * old))
        for buffers in (self.k, self.v):
            for layer, buf in enumerate(buffers):
                new = torch.zeros(buf.shape[0], buf.shape[1], new_len, buf.shape[3],
                                  dtype=self.dtype, device=buf.device)
                new[:, :, :old] = buf
                buffers[layer] = new
        self.shape = (self.shape[0], new_len, self.shape[2])

    def move(self, slot: int) -> int:
        """Copy ``slot``'s keys/values into the lowest free slot, free ``slot``, and return
        the new slot number. The runner moves the highest running slots into the holes that
        finished requests leave, so that a batch's slots stay consecutive and attention reads
        one view of the cache (``SlotView``) rather than a gather of every row in every layer
        and step: one slot copied once against B rows copied per layer per step."""
        new = self.free.pop()
        for buffers in (self.k, self.v):
            for buf in buffers:
                buf[new] = buf[slot]
        self.give_back(slot)
        return new

    def bind(self, slots: list[int], ends: list[int],
             runs: list[tuple[int, int, int, int, int]],
             real: torch.Tensor | None = None) -> "SlotView":
        """A KVView for one forward. ends: each row attends to its slot's positions
        [0, end) once this forward's writes are in; runs: (row, column, slot, position,
        length), consecutive window columns whose keys/values this forward computes into
        consecutive positions of a slot (finished blocks, and the current block as scratch
        that later steps overwrite); real: the window's non-padding columns (B, W) when rows
        are left-padded (``KVView.query_mask``)."""
        self._ensure_length(max([*ends, *(r[3] + r[4] for r in runs)], default=0))
        return SlotView(self, slots, ends, runs, real)


def long_tensor(values: Iterable[int], device: torch.device) -> torch.Tensor:
    """A 1-D int64 tensor of ``values``, built from a packed buffer (a third of the host time
    of ``torch.tensor`` on a Python list, a cost the step pays several times)."""
    buffer = array("q", values)
    if not buffer:
        return torch.empty(0, dtype=torch.int64, device=device)
    return torch.frombuffer(buffer, dtype=torch.int64).to(device)


MAX_SLICE_RUNS = 4        # write runs per forward copied as slices; more go by index


class SlotView:
    """One forward's access to a SlotKVCache (see ``celeris.model.KVView``).

    The window's keys/values are written into the slots first and attention reads the slots in
    place, (B, Hkv, Lk, D) with Lk the longest row's end: no per-layer copy of the cached
    prefix. Keys past a row's end (another request's leftovers, a longer row's positions) are
    masked; a block-causal model's own mask hides a row's positions after its current block.

    The write is in place, in one of three ways chosen per forward: on CUDA at inference one
    Triton launch a layer writes every run of k and v (``kernels.write_kv``); elsewhere a slice
    copy per run (a few runs) or an indexed copy per tensor (many); inside torch.compile always
    the indexed copy, whose index tensors keep a run's numbers out of the traced graph.
    """

    def __init__(self, cache: SlotKVCache, slots: list[int], ends: list[int],
                 runs: list[tuple[int, int, int, int, int]],
                 real: torch.Tensor | None = None, device: torch.device | None = None) -> None:
        dev = device or cache.device
        self.cache, self.B, self.query_mask, self.device = cache, len(slots), real, dev
        self._args = slots, ends, runs
        self._elsewhere: dict[torch.device, SlotView] = {}   # layers on other devices
        self.keys = max(ends, default=0)                          # Lk
        first = slots[0] if slots else 0
        self._rows = (slice(first, first + len(slots)) if slots == list(
            range(first, first + len(slots))) else torch.tensor(slots, device=dev))
        col = cache.columns(self.keys, dev)
        # None when every row reaches Lk (always at batch 1): no mask to build or apply
        self.key_mask = None if min(ends, default=0) == self.keys else \
            col[None, :] < torch.tensor(ends, device=dev)[:, None]             # (B, Lk)
        self.key_positions = col.expand(self.B, -1)
        # a few runs (batch 1-2): a slice copy each; many: one gather/scatter by index, which
        # keeps the kernel count of a large batch on a GPU flat
        self._runs = runs
        self._index = None
        if len(runs) > MAX_SLICE_RUNS:
            self._index = run_index(runs, dev)
        self._fused: bool | None = None          # decided at the first layer's write
        self._table: torch.Tensor | None = None  # the run table of the fused write

    def prepare_index(self) -> None:
        """Build the index tensors now (torch.compile traces the indexed write only)."""
        if self._index is None:
            self._index = run_index(self._runs, self.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the marked columns of k/v (B, Hkv, W, D) into their slots; return the slots'
        first Lk positions, (B, Hkv, Lk, D) (a view when the slots are consecutive)."""
        k_store, v_store = self.cache.k[layer], self.cache.v[layer]
        if k_store.device != self.device:      # device_map: this view on the layer's device
            other = self._elsewhere.get(k_store.device)
            if other is None:
                other = self._elsewhere[k_store.device] = SlotView(
                    self.cache, *self._args, device=k_store.device)
            return other.update(layer, k, v)
        if self._index is None and torch.compiler.is_compiling():
            self.prepare_index()
        if self._index is not None:
            row, col, slot, pos = self._index
            for store, new in ((k_store, k), (v_store, v)):
                store[slot, :, pos] = new[row, :, col].to(store.dtype)          # (N, Hkv, D)
        else:
            if self._fused is None:
                self._fused = fused_kernels(k)
            if self._fused and self._table is None:
                self._table = torch.tensor(self._runs, dtype=torch.int64,
                                           device=k.device).view(-1, 5)        # (R, 5)
            write_kv(k, v, k_store, v_store, self._runs, self._table, fused=self._fused)
        return (k_store[self._rows, :, :self.keys].to(k.dtype),
                v_store[self._rows, :, :self.keys].to(v.dtype))


def run_index(runs: list[tuple[int, int, int, int, int]], device: torch.device
              ) -> tuple[torch.Tensor, ...]:
    """The (row, column, slot, position) index tensors, (N,) each, of every write in
    ``runs``, built with tensor operations (no loop over positions): write i belongs to the
    first run ending after it, whose column and position, counted from its first write,
    advance with i."""
    base, ends, first = [], [], 0
    for row, col, slot, pos, n in runs:
        base += (row, col - first, slot, pos - first)
        first += n
        ends.append(first)
    i = torch.arange(first, device=device)                                      # (N,)
    which = torch.searchsorted(long_tensor(ends, device), i, right=True)
    each = long_tensor(base, device).view(-1, 4)[which]                         # (N, 4)
    each[:, 1::2] += i[:, None]
    return tuple(each.unbind(1))
