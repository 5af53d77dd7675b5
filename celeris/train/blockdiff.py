"""The block-diffusion training objective (BD3-LM, Arriola et al. 2025; Fast-dLLM v2, Wu et al.
2025, sec. 3.2): teach a block-causal model to denoise one block given the clean blocks
before it, in a single forward over [noisy sequence, clean sequence].

Layout, for a row of L tokens cut into blocks of ``block_size`` positions (counted from each
row's first real token, as the engine counts them):

- the noisy half (columns 0..L-1): each block's scored positions are masked at that block's
  own rate t ~ U(eps, 1); a noisy position sees its own noisy block both ways and the *clean*
  earlier blocks;
- the clean half (columns L..2L-1): the clean tokens, block-causal among themselves; this is
  the exact prefix state that the engine's KV cache holds at inference.

Token shift (as in Fast-dLLM v2, adapted from an AR model): the token at position j is
predicted from the state at j-1. For the first position of a block that state belongs to the
previous block, finished and clean at inference (the engine re-reads it from the cache), so it
is taken from the clean half; every other position reads its noisy left neighbour.

Scored positions are the AR twin's targets (a story and its first EOS; a chat answer and its
EoT): the prompt stays clean in both halves; positions after the targets are always masked in
the noisy half and never scored, so the model never sees where padding begins. Every row's
last block is whole: where the batch ends inside it (the longest row's end, a cropped answer)
masked columns are appended, as the engine's block always holds ``block_size`` positions,
masks past the answer (without them the block's last targets read a narrower block than the
engine shows them: logits off by up to 1.8 at 0.7% of stage 7's targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from celeris.train.data import IGNORE, Batch, positions
from celeris.train.objective import EPS, bf16_autocast, evaluating, right_pad


@dataclass
class BlockInputs:
    ids: torch.Tensor          # (B, 2L) noisy then clean tokens
    positions: torch.Tensor    # (B, 2L) positions, the same in both halves
    attn: torch.Tensor         # (B, 1, 2L, 2L) bool: who sees whom
    index: torch.Tensor        # (B, N) column whose (shifted) logits predict each target
    targets: torch.Tensor      # (B, N) token ids, IGNORE where a row has fewer targets
    masked_frac: float         # fraction of scored positions masked (for logs)


def trim_to_targets(batch: Batch) -> Batch:
    """Drop the columns right of every row's last target: a chat batch is padded to the
    full-attention model's canvas (up to 256 positions for a 3-token answer), which block
    diffusion, ending at EOS, never needs."""
    scored = _targets(batch.labels)
    cols = scored.any(dim=0).nonzero()
    end = int(cols.max()) + 1 if len(cols) else batch.input_ids.shape[1]
    if end == batch.input_ids.shape[1]:
        return batch

    def cut(t):
        return None if t is None else t[:, :end]
    return Batch(cut(batch.input_ids), cut(batch.attention_mask), cut(batch.maskable),
                 cut(batch.labels), batch.source, end, cut(batch.forced))


MASKINGS = ("random", "suffix")


def block_inputs(batch: Batch, block_size: int, mask_id: int, gen: torch.Generator,
                 masking: str = "random") -> BlockInputs:
    """A training batch in the [noisy, clean] layout. ``masking="random"``: each block's
    scored positions masked at its own rate t ~ U(eps, 1). ``masking="suffix"``: each block
    masks its scored positions from a place k ~ U{0..block_size-1} on, a clean prefix and a
    masked rest, the only states left-to-right decoding (``decoding="ltr"``) shows the model."""
    if masking not in MASKINGS:
        raise ValueError(f"masking must be one of {', '.join(MASKINGS)}, got {masking!r}")
    batch = trim_to_targets(batch)
    B, L = batch.input_ids.shape
    pos = positions(batch.attention_mask, batch.input_ids)                      # (B, L)
    blk = pos // block_size                                                     # (B, L)
    if masking == "suffix":
        k = torch.randint(block_size, (B, int(blk.max()) + 1), generator=gen)    # (B, nblocks)
        hidden = pos % block_size >= k.gather(1, blk)
    else:
        t = torch.rand(B, int(blk.max()) + 1, generator=gen) * (1 - EPS) + EPS  # (B, nblocks)
        hidden = torch.rand(B, L, generator=gen) < t.gather(1, blk)
    return layout_inputs(batch, hidden, block_size, mask_id)


def layout_inputs(batch: Batch, hidden: torch.Tensor, block_size: int, mask_id: int
                  ) -> BlockInputs:
    """The [noisy, clean] layout of ``batch`` with the scored positions of ``hidden`` (B, L)
    bool masked (``block_inputs`` draws it; a test or probe may choose it), every row's last
    block made whole first."""
    batch, hidden = whole_last_blocks(batch, hidden, block_size, mask_id)
    ids, labels = batch.input_ids, batch.labels                                 # (B, L)
    B, L = ids.shape
    pos = positions(batch.attention_mask, ids)                                  # (B, L)
    blk = pos // block_size                                                     # (B, L)
    real = _real(batch)
    scored = _targets(labels)                                                   # (B, L)
    masked = hidden & scored
    after = _after_targets(scored) & real
    noisy = torch.where(masked | after, torch.full_like(ids, mask_id), ids)
    attn = _attention(blk, real)
    # the token at j comes from the state at j-1 (the model shifts by one column itself, so
    # column c's logits are read from state c-1): the noisy neighbour, or for a block's first
    # position the clean previous block
    first = pos % block_size == 0
    column = torch.arange(L).expand(B, L) + torch.where(first, L, 0)            # (B, L)
    order, targets = _chosen_targets(ids, masked)                              # (B, N)
    index = column.gather(1, order)
    frac = float(masked.sum()) / max(1, int(scored.sum()))
    return BlockInputs(torch.cat([noisy, ids], 1), torch.cat([pos, pos], 1), attn, index,
                       targets, frac)


def whole_last_blocks(batch: Batch, hidden: torch.Tensor, block_size: int, fill: int
                      ) -> tuple[Batch, torch.Tensor]:
    """(batch, hidden) with columns appended (token ``fill``, real, unscored, not hidden) until
    the block of every row's last target ends inside the batch: a noisy position sees its
    whole block, and the engine's block always has ``block_size`` positions (masks past the
    answer). Unchanged when no row's last block is cut."""
    ids = batch.input_ids
    B, L = ids.shape
    scored = _targets(batch.labels)
    if not bool(scored.any()):
        return batch, hidden
    pos = positions(batch.attention_mask, ids)
    col = torch.arange(L).expand(B, L)
    last = torch.where(scored, col, -1).max(dim=1).values                      # (B,)
    has = last >= 0
    last_pos = pos.gather(1, last.clamp(min=0)[:, None])[:, 0]
    ends = last + block_size - last_pos % block_size                            # (B,) exclusive
    extra = int(torch.where(has, ends, 0).max()) - L
    if extra <= 0:
        return batch, hidden

    def widen(t, value):
        if t is None:
            return None
        return torch.cat([t, torch.full((B, extra), value, dtype=t.dtype)], dim=1)
    wide = Batch(widen(ids, fill), widen(batch.attention_mask, 1), widen(batch.maskable, False),
                 widen(batch.labels, IGNORE), batch.source, batch.length,
                 widen(batch.forced, True))
    return wide, widen(hidden, False)


def _real(batch: Batch) -> torch.Tensor:
    """(B, L) bool: the positions that are not padding."""
    if batch.attention_mask is None:
        return torch.ones_like(batch.input_ids, dtype=torch.bool)
    return batch.attention_mask.bool()


def _chosen_targets(ids: torch.Tensor, chosen: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, targets), each (B, N) with N the most ``chosen`` positions of a row: the chosen
    columns of each row first, in column order, and their tokens (IGNORE past a row's own)."""
    n = max(1, int(chosen.sum(1).max()))
    order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :n]  # chosen first
    targets = torch.where(chosen.gather(1, order), ids.gather(1, order),
                          torch.full_like(order, IGNORE))
    return order, targets


def _targets(labels: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: positions whose token the AR twin is trained to predict. ``labels`` holds
    the target of position j at j (the twin shifts them itself)."""
    return labels != IGNORE


def _after_targets(scored: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: positions right of a row's last target."""
    L = scored.shape[1]
    col = torch.arange(L)
    last = torch.where(scored, col, -1).max(dim=1).values                      # (B,)
    return col[None, :] > last[:, None]


def _attention(blk: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, 1, 2L, 2L) bool mask of the [noisy, clean] layout (see the module docstring)."""
    bq, bk = blk[:, :, None], blk[:, None, :]                                   # (B, L, 1/L)
    key = real[:, None, :]
    noisy_noisy = (bq == bk) & key
    noisy_clean = (bk < bq) & key
    clean_clean = (bk <= bq) & key
    clean_noisy = torch.zeros_like(noisy_noisy)
    top = torch.cat([noisy_noisy, noisy_clean], dim=2)
    bottom = torch.cat([clean_noisy, clean_clean], dim=2)
    mask = torch.cat([top, bottom], dim=1)[:, None]                             # (B, 1, 2L, 2L)
    return mask | ~mask.any(-1, keepdim=True)      # padding rows see everything (no NaN)


def block_loss(model, inputs: BlockInputs, device: str, certainty: float = 0.0
               ) -> torch.Tensor:
    """Mean cross-entropy over the masked targets, plus ``certainty`` x the mean entropy of
    the predictions that are already right (argmax = target): the confidence objective of
    dParallel's certainty-forcing distillation and LLaDA2.0's CAP. Cross-entropy alone
    leaves a right prediction below the threshold, so threshold decoding waits another
    forward for it; wrong predictions are left to the cross-entropy (sharpening them would
    make confident mistakes)."""
    logits = model(inputs.ids.to(device), position_ids=inputs.positions.to(device),
                   attn_mask=inputs.attn.to(device),
                   logits_index=inputs.index.to(device)).logits                  # (B, N, V)
    logits = logits.float().flatten(0, 1)                                       # (B*N, V)
    targets = inputs.targets.to(device).flatten()
    loss = F.cross_entropy(logits, targets, ignore_index=IGNORE)
    if certainty > 0:
        loss = loss + certainty * right_entropy(logits, targets)
    return loss


def right_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the rows of ``logits`` (N, V) whose argmax equals their target;
    0 when there is none (ignored targets never count)."""
    right = (logits.argmax(-1) == targets) & (targets != IGNORE)
    if not bool(right.any()):
        return logits.sum() * 0.0
    logp = F.log_softmax(logits[right], dim=-1)
    return -(logp.exp() * logp).sum(-1).mean()


@torch.no_grad()
def block_eval_loss(model, sequences: list[list[int]], block_size: int, mask_id: int,
                    pad_id: int, seed: int = 0, batch_size: int = 32, device: str = "cpu"
                    ) -> dict:
    """Held-out block-diffusion loss with a fixed seed (comparable across checkpoints): every
    position but the first is a target, masked at a per-block rate as in training."""
    g = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    with evaluating(model):
        for i in range(0, len(sequences), batch_size):
            ids, real = right_pad(sequences[i:i + batch_size], pad_id)
            labels = torch.where(real, ids, IGNORE)
            labels[:, 0] = IGNORE
            batch = Batch(ids, None if bool(real.all()) else real.long(), real, labels, "eval",
                          ids.shape[1])
            inputs = block_inputs(batch, block_size, mask_id, g)
            n = int((inputs.targets != IGNORE).sum())
            with bf16_autocast(device):
                total += float(block_loss(model, inputs, device)) * n
            count += n
    return {"masked_loss": total / max(count, 1)}
