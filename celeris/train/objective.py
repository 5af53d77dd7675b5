"""The masked-diffusion training objective (LLaDA) and the held-out masked loss.

Forward process: per sequence t ~ U(eps, 1); every *maskable* token is replaced by the mask id
with probability t. Loss (LLaDA eq. 3 / SFT eq. 5): cross-entropy on the masked positions,
weighted by 1/t, divided by the number of maskable tokens of the sequence, averaged over the
batch. Positions that are not maskable (chat prompts, left padding, a kept story prefix) are
never masked and never scored. ``forced`` positions (the later blocks of a semi-autoregressive
row) are always masked and never scored.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F

EPS = 1e-3


def bf16_is_fast(device: str) -> bool:
    """bf16 autocast pays on GPUs and on CPUs with native bf16 (avx512_bf16, AMX); on a plain
    AVX2 CPU it is emulated and ~10x slower than float32 (measured on an AVX2 EPYC VM).
    CELERIS_TRAIN_BF16=0/1 overrides."""
    forced = os.environ.get("CELERIS_TRAIN_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if not device.startswith("cpu"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def bf16_autocast(device: str, enabled: bool | None = None):
    """bf16 autocast on ``device`` (default: when ``bf16_is_fast``)."""
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                          enabled=bf16_is_fast(device) if enabled is None else enabled)


@contextmanager
def evaluating(model) -> Iterator[None]:
    """``model`` in eval mode for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def mask_batch(input_ids: torch.Tensor, maskable: torch.Tensor, mask_id: int,
               generator: torch.Generator, eps: float = EPS,
               forced: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply the forward process. Returns (noisy ids, masked (B, L) bool, t (B,)); ``masked``
    are the scored positions. ``forced`` (B, L) bool positions are masked in the noisy ids too,
    but are not in ``masked`` (not scored); the random draws do not depend on it.

    Every row with at least one maskable position gets at least one masked position (the
    maskable position with the smallest uniform draw), so no row is silently skipped.
    """
    B, L = input_ids.shape
    t = torch.rand(B, generator=generator) * (1.0 - eps) + eps                  # (B,)
    u = torch.rand(B, L, generator=generator)                                   # (B, L)
    masked = (u < t[:, None]) & maskable
    empty = ~masked.any(dim=1) & maskable.any(dim=1)
    if bool(empty.any()):
        first = torch.where(maskable, u, torch.full_like(u, 2.0)).argmin(dim=1)   # (B,)
        fix = torch.zeros_like(masked)
        fix[torch.arange(B), first] = True
        masked = masked | (fix & empty[:, None])
    hidden = masked if forced is None else masked | forced
    noisy = torch.where(hidden, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, t


def diffusion_loss(logits: torch.Tensor, input_ids: torch.Tensor, masked: torch.Tensor,
                   maskable: torch.Tensor, t: torch.Tensor,
                   row_mean: torch.Tensor | None = None) -> torch.Tensor:
    """LLaDA loss from logits of the masked positions only, (N, V) in row-major order of
    ``masked`` (what ``model(..., logits_mask=masked)`` returns).

    ``row_mean`` (B,) bool: rows scored by their plain mean cross-entropy over the masked
    positions instead of the 1/t-weighted sum. For a short block (semi-autoregressive rows,
    1-32 maskable positions) the 1/t weight is unbounded: at small t the one position masked
    to keep the row scored would carry weight up to 1/eps and swamp the batch."""
    targets = input_ids[masked]                                                 # (N,)
    ce = F.cross_entropy(logits.float(), targets, reduction="none")            # (N,)
    rows = masked.nonzero(as_tuple=True)[0]                                     # (N,)
    n_maskable = maskable.sum(dim=1).clamp(min=1).to(ce.dtype)                  # (B,)
    weight = 1.0 / (t.to(ce.dtype)[rows] * n_maskable[rows])
    if row_mean is not None:
        n_masked = masked.sum(dim=1).clamp(min=1).to(ce.dtype)                  # (B,)
        weight = torch.where(row_mean[rows], 1.0 / n_masked[rows], weight)
    return (ce * weight).sum() / input_ids.shape[0]


def right_pad(chunk: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, real): sequences right-padded to one length, and which positions are real."""
    L = max(len(s) for s in chunk)
    ids = torch.full((len(chunk), L), pad_id, dtype=torch.long)
    real = torch.zeros((len(chunk), L), dtype=torch.bool)
    for j, s in enumerate(chunk):
        ids[j, :len(s)] = torch.tensor(s)
        real[j, :len(s)] = True
    return ids, real


@torch.no_grad()
def masked_eval_loss(model, sequences: list[list[int]], mask_id: int, pad_id: int,
                     ratios: tuple[float, ...] = (0.15, 0.5, 0.85), seed: int = 0,
                     batch_size: int = 32, device: str = "cpu",
                     autocast: bool | None = None, skip_first: int = 0) -> dict:
    """Masked-token cross-entropy (plain mean over masked tokens, no 1/t weight) at fixed
    masking ratios, with a fixed seed: comparable across checkpoints. ``sequences`` are
    right-padded with ``pad_id`` (never masked, not attended to); the first ``skip_first``
    positions (a BOS) are never masked; ``autocast`` defaults to ``bf16_is_fast``. Returns
    {"masked_loss": mean over ratios, "by_ratio": {r: loss}}."""
    g = torch.Generator().manual_seed(seed)
    by_ratio: dict[str, float] = {}
    with evaluating(model):
        for r in ratios:
            total, count = 0.0, 0
            for i in range(0, len(sequences), batch_size):
                ids, real = right_pad(sequences[i:i + batch_size], pad_id)
                maskable = real.clone()
                maskable[:, :skip_first] = False
                u = torch.rand(ids.shape, generator=g)
                masked = (u < r) & maskable
                if not bool(masked.any()):
                    continue
                noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
                attn = None if bool(real.all()) else real.long().to(device)
                with bf16_autocast(device, autocast):
                    logits = model(noisy.to(device), attention_mask=attn,
                                   logits_mask=masked.to(device)).logits
                ce = F.cross_entropy(logits.float(), ids.to(device)[masked.to(device)],
                                     reduction="sum")
                total += float(ce)
                count += int(masked.sum())
            by_ratio[f"{r:g}"] = total / max(count, 1)
    return {"masked_loss": sum(by_ratio.values()) / max(len(by_ratio), 1),
            "by_ratio": by_ratio}


@torch.no_grad()
def ar_eval_loss(model, sequences: list[list[int]], pad_id: int, batch_size: int = 32,
                 device: str = "cpu", autocast: bool | None = None) -> dict:
    """Next-token cross-entropy (mean per predicted token) of a causal LM on ``sequences``."""
    total, count = 0.0, 0
    with evaluating(model):
        for i in range(0, len(sequences), batch_size):
            ids, real = right_pad(sequences[i:i + batch_size], pad_id)
            attn = real.long()
            with bf16_autocast(device, autocast):
                logits = model(ids.to(device), attention_mask=attn.to(device)).logits
            tgt = ids[:, 1:].to(device)
            keep = attn[:, 1:].bool().to(device)
            ce = F.cross_entropy(logits[:, :-1][keep].float(), tgt[keep], reduction="sum")
            total += float(ce)
            count += int(keep.sum())
    return {"ar_loss": total / max(count, 1)}

