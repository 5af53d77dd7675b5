"""Infill: a text with [MASK] spans becomes a prompt and a canvas with pinned tokens.

Only a full-attention model fills spans between pinned text (it sees both sides); the canvas
holds ``span`` masked positions per marker, the pinned pieces between them, and EOS padding to
whole blocks, so the model writes only the spans.
"""

from __future__ import annotations

from typing import Any

from ..params import GenerationParams


def infill_canvas(tokenizer: Any, text: str, params: GenerationParams, span: int,
                  marker: str, max_span: int = 64
                  ) -> tuple[list[int], list[int], GenerationParams]:
    """(prompt ids, canvas, params): the text before the first span is the prompt."""
    if not isinstance(span, int) or not 1 <= span <= max_span:
        raise ValueError(f"span must be an integer in [1, {max_span}], got {span!r}")
    parts = split_infill(text, marker)
    if len(parts) < 2:
        raise ValueError(f"infill text must contain at least one {marker} span")
    special = tokenizer.special
    ids = tokenizer.encode(parts[0]) if parts[0] else []
    canvas: list[int] = []
    for part in parts[1:]:
        # pinned text inside the canvas: no BOS in the middle of the sequence
        canvas += [special.mask] * span + (tokenizer.encode(part, add_special_tokens=False)
                                           if part else [])
    if not ids:   # a leading span: the first pinned token becomes the prompt
        ids = [special.pad]
    bl = min(params.block_length, 32)
    gen = -(-len(canvas) // bl) * bl
    canvas += [special.stop[0]] * (gen - len(canvas))       # pinned end of text
    return ids, canvas, params.replace(gen_length=gen, block_length=bl, steps=None)


def split_infill(text: str, marker: str = "[MASK]") -> list[str]:
    """The pinned pieces of an infill text around its ``marker`` spans.

    A space right before a span moves into the span: byte-level BPE and SentencePiece
    vocabularies spell a word with its leading space (``" cat"``), so ``"a [MASK]"`` must
    become ``"a"`` + masked positions, not ``"a "`` + a lone space token the model never saw
    in training followed by space-less words.
    """
    parts = text.split(marker)
    return [p[:-1] if i < len(parts) - 1 and p.endswith(" ") else p
            for i, p in enumerate(parts)]
