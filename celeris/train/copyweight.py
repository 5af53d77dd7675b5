"""A loss weight on the answer tokens that a story request asks for (``--copy-weight``).

Why: trained on the same batches, the AR twin learns to copy the requested adjective, object
and place from the prompt into its story, and the block model does not (docs/BENCHMARKS.md,
"Hindsight correction": p(requested adjective) 0.52-0.91 for the twin against 0.03 for the
block model after 4,500 steps). Those words are a handful of the ~150 scored tokens of a story,
so the mean cross-entropy gives them almost no say against the story's other words, which the
block model learns first. Weighting them puts the request back in the loss.

Which tokens: the *first* occurrence in the answer of a token that also occurs in the row's
prompt, unless the token is part of the request templates themselves (the chat markers,
"Write", "story", "about", "."): those are the tokens found in more than ``share`` (5%) of a sample
of training requests (``template_tokens``). Every slot value (the kind, adjective, name,
place words, object) is far rarer than that: 26 adjectives, 38 objects, dozens of names. Later
mentions of the hero copy the story itself, which the block model already does (hero kept
100%), so they keep weight 1.
"""

from __future__ import annotations

import random
from typing import Callable

import torch

from celeris.train import corpus as _corpus

SOURCES = ("request", "longreq", "reqhead")     # the chat sources whose answer honours a request
MAX_WEIGHT = 50.0


def check_weight(weight) -> float:
    if not (isinstance(weight, (int, float)) and 1.0 <= weight <= MAX_WEIGHT):
        raise ValueError(f"copy_weight must be in [1, {MAX_WEIGHT:g}] (1 = off), got {weight!r}")
    return float(weight)


def template_tokens(encode_prompt: Callable[[str], list[int]], vocab_size: int, n: int = 2000,
                    share: float = 0.05, seed: int = 0) -> torch.Tensor:
    """(V,) bool: the token ids found in more than ``share`` of ``n`` training story requests,
    each rendered as a prompt by ``encode_prompt`` (fixed for a seed)."""
    rng = random.Random(f"celeris-copy-template:{seed}")
    counts = torch.zeros(vocab_size)
    for _ in range(n):
        ids = torch.tensor(sorted(set(encode_prompt(_corpus.long_request(rng, "train").text))))
        counts[ids] += 1
    return counts > share * n


def copy_targets(ids: torch.Tensor, scored: torch.Tensor, real: torch.Tensor,
                 template: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: scored positions holding the first answer occurrence of a token that the
    row's prompt holds too, template tokens excepted. ``ids``, ``scored``, ``real``: (B, L);
    the prompt is the real, unscored positions left of a row's first scored one."""
    B, L = ids.shape
    col = torch.arange(L)
    first = torch.where(scored, col, L).min(dim=1).values                      # (B,)
    prompt = real & ~scored & (col[None, :] < first[:, None])                  # (B, L)
    same = ids[:, :, None] == ids[:, None, :]                                  # (B, L, L)
    in_prompt = (same & prompt[:, None, :]).any(-1)                            # (B, L)
    earlier = col[None, :] < col[:, None]                                      # (L, L) i<j
    seen_before = (same & (scored[:, None, :] & earlier[None])).any(-1)        # (B, L)
    return scored & in_prompt & ~seen_before & ~template[ids]


def weights_for(ids: torch.Tensor, scored: torch.Tensor, real: torch.Tensor, source: str,
                template: torch.Tensor | None, weight: float) -> torch.Tensor | None:
    """(B, L) float loss weights (``weight`` on the copy targets, 1 elsewhere), or None when
    nothing is weighted (weight 1, no template, or a source without a request)."""
    if template is None or weight == 1.0 or source not in SOURCES:
        return None
    copy = copy_targets(ids, scored, real, template)
    return torch.where(copy, torch.tensor(weight), torch.tensor(1.0))
