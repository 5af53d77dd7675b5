"""Scoring a text: each token's log-probability given the tokens before it.

A masked diffusion model has no left-to-right factorisation of its own, but any order is one
it can score, and the left-to-right chain is the one a harness compares across models: token
i is scored as log p(x_i | x_<i) read at position i with position i and everything after it
masked. That is exact and deterministic (no sampling), and how far "everything after it"
reaches is the model's own structure:

- full attention (LLaDA, Dream, celeris-tiny): the rest of the text is masked, so token i is
  read from the text's length with x_<i clean: one forward of the whole length per token,
  rows batched in chunks whose size bounds memory;
- block-causal (Fast-dLLM v2, SDAR, celeris-tiny-bd): nothing after i's block is seen, so
  token i is read from its block with the block's positions from i on masked and the blocks
  before it clean, as the model decodes. All tokens at one offset j inside their blocks are
  scored by one forward of 2L positions: the text with every block's offsets >= j masked,
  beside the clean text, each masked block seeing itself and the clean blocks before it
  (block diffusion's training layout). A model with blocks of b tokens needs b forwards.

Shifted models (Dream, Fast-dLLM v2: the logits for i come from position i - 1) read the
first token of a block from the clean previous block's last position, as they decode.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, Iterator, Sequence

import torch

from ..outputs import LOGPROB_FLOOR, TokenLogprob

CHUNK_TOKENS = 16_384     # positions per scoring forward (rows x length)


def can_score(model: Any) -> str | None:
    """None when ``model`` can be scored here, else why not (a sentence)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "mask_token_id", None) is None or not hasattr(cfg, "block_causal") \
            or not hasattr(model, "pack_for_inference"):
        name = type(model).__name__
        return (f"scoring (echo with logprobs) is not available for {name}: it needs a "
                f"masked diffusion model whose positions can be masked one by one")
    return None


def score_tokens(model: Any, ids: Sequence[int], mask_id: int, top: int = 0,
                 device: torch.device | None = None,
                 lock: Callable[[], Any] | None = None) -> list[TokenLogprob | None]:
    """Each token's log p(x_i | x_<i) (the first None: nothing precedes it), with its
    ``top`` most likely alternatives. ``lock()`` is entered around each forward (the engine
    passes its model lock, so scoring interleaves with denoising steps)."""
    ids = list(ids)
    L = len(ids)
    out: list[TokenLogprob | None] = [None] * L
    if L < 2:
        return out
    device = device or next(model.parameters()).device
    cfg = model.config
    chunks = _block_chunks(ids, mask_id, cfg.block_size, bool(cfg.shift_logits)) \
        if cfg.block_causal else _full_chunks(ids, mask_id)
    for inputs, positions, attn, read, targets in chunks:
        with (lock() if lock is not None else nullcontext()), torch.inference_mode():
            kwargs = {} if attn is None else {"attn_mask": attn.to(device)}
            logits = model(torch.tensor(inputs, device=device),
                           position_ids=torch.tensor(positions, device=device),
                           logits_index=torch.tensor(read, device=device), **kwargs).logits
            logits[..., mask_id] = float("-inf")            # a mask is never a prediction
            logp = logits.log_softmax(-1, torch.float32)                          # (R, N, V)
            tok = torch.tensor([[ids[i] for i in row] for row in targets], device=device)
            chosen = logp.gather(-1, tok[..., None]).squeeze(-1).tolist()         # (R, N)
            values, top_ids = (logp.topk(top, dim=-1) if top else (None, None))
            values = values.tolist() if top else None
            top_ids = top_ids.tolist() if top else None
        for r, row in enumerate(targets):
            for n, i in enumerate(row):
                alts = () if not top else tuple(
                    (int(t), max(float(v), LOGPROB_FLOOR))
                    for t, v in zip(top_ids[r][n], values[r][n]))
                out[i] = TokenLogprob(ids[i], max(float(chosen[r][n]), LOGPROB_FLOOR), alts)
    return out


def _full_chunks(ids: list[int], mask_id: int) -> Iterator[tuple]:
    """Full attention: row i is x_<i and L - i masks, read at position i."""
    L = len(ids)
    rows_per = max(1, CHUNK_TOKENS // L)
    targets = list(range(1, L))
    for k in range(0, len(targets), rows_per):
        part = targets[k:k + rows_per]
        inputs = [ids[:i] + [mask_id] * (L - i) for i in part]
        positions = [list(range(L))] * len(part)
        yield inputs, positions, None, [[i] for i in part], [[i] for i in part]


def _block_chunks(ids: list[int], mask_id: int, bs: int, shift: bool) -> Iterator[tuple]:
    """Block-causal: row j is [the text with each block's offsets >= j masked ; the clean
    text], read at every masked copy's offset-j position (see the module docstring)."""
    L = len(ids)
    pos = torch.arange(L)
    block = pos // bs
    # (2L, 2L) keys visible to each query: noisy t sees noisy keys of its block and clean
    # keys of earlier blocks; clean t sees clean keys of its block and earlier ones
    same = block[:, None] == block[None, :]
    earlier = block[None, :] < block[:, None]
    upto = block[None, :] <= block[:, None]
    no = torch.zeros(L, L, dtype=torch.bool)
    attn = torch.cat([torch.cat([same, earlier], 1), torch.cat([no, upto], 1)], 0)
    rows_per = max(1, CHUNK_TOKENS // (2 * L))
    offsets = [j for j in range(bs) if any(i % bs == j for i in range(1, L))]
    for k in range(0, len(offsets), rows_per):
        part = offsets[k:k + rows_per]
        inputs, reads, targets = [], [], []
        for j in part:
            noisy = [t if i % bs < j else mask_id for i, t in enumerate(ids)]
            inputs.append(noisy + ids)
            rows = [i for i in range(1, L) if i % bs == j]
            targets.append(rows)
            reads.append(rows)
        # where each read happens in the 2L input: at the masked copy; a shifted model
        # reads i from i - 1 (the model subtracts the 1), so a block's first token from the
        # clean copy's previous position, as it decodes
        width = max(len(r) for r in reads)
        # rows read different numbers of positions: pad by repeating a row's last one
        reads = [r + [r[-1]] * (width - len(r)) for r in reads]
        targets = [t + [t[-1]] * (width - len(t)) for t in targets]
        positions = [list(range(L)) * 2] * len(part)
        yield inputs, positions, attn[None, None].expand(len(part), 1, 2 * L, 2 * L), \
            [[L + i if shift and i % bs == 0 else i for i in r] for r in reads], targets

