"""A model's stories, measured: continuations of held-out story openings and masked words
filled in held-out story sentences, each scored by ``celeris.synthetic.storycheck`` (is the
sentence's word-category shape one the story grammar writes?). The model cards quote these
figures (``celeris eval --card``).
"""

from __future__ import annotations

import random
from typing import NamedTuple

from celeris.synthetic import corpus as C
from celeris.synthetic.storycheck import lexicon_pattern, score, sentences


# ----------------------------------------------------------------------------- measuring a model
STORY_OPENINGS = 20           # held-out stories whose first words are the prompts
NEW_TOKENS = 64


def openings(n: int = STORY_OPENINGS) -> list[str]:
    """The first four words of ``n`` held-out stories (``Once upon a time,``, ``Milo was a
    brave``): prompts that the grammar can complete in many ways."""
    if not isinstance(n, int) or not 1 <= n <= 200:
        raise ValueError(f"n must be an integer in [1, 200], got {n!r}")
    return [" ".join(s.split()[:4]) for s in C.heldout_stories(n)]


def story_blocks(default_block: int) -> tuple[int, ...]:
    """Block lengths stories are shown and scored at: the model's default, the wide block 32
    and one token at a time (1), each once."""
    return tuple(dict.fromkeys((default_block, 32, 1)))


def measure(model_dir: str, kind: str = "diffusion", *, n: int = STORY_OPENINGS,
            block_lengths: tuple[int, ...] | None = None) -> list[dict]:
    """Continue ``n`` story openings greedily with ``NEW_TOKENS`` tokens and score them.

    AR: one result, transformers ``generate`` (greedy, KV cache). Diffusion: one result per
    block length (default: ``story_blocks`` of the model's default), the model's defaults
    with gen_length = steps = NEW_TOKENS (one model load)."""
    from celeris import ARBaseline, Engine

    prompts = openings(n)
    if kind == "ar":
        ar = ARBaseline.from_pretrained(str(model_dir), device="cpu")
        texts = [ar.generate_batch([p], NEW_TOKENS)[0]["text"] for p in prompts]
        return [{**score(texts, prompts), "prompts": n,
                 "decoding": f"greedy generate, {NEW_TOKENS} new tokens"}]
    engine = Engine.from_pretrained(model_dir, device="cpu")
    out = []
    for block in block_lengths or story_blocks(engine.default_params().block_length):
        params = engine.default_params().replace(gen_length=NEW_TOKENS, steps=NEW_TOKENS,
                                                 block_length=block)
        texts = [engine.generate(p, params).text for p in prompts]
        out.append({**score(texts, prompts), "prompts": n,
                    "decoding": f"{params.decoding}, gen {NEW_TOKENS}, steps {NEW_TOKENS}, "
                                f"block {block}, temperature {params.temperature:g}"})
    return out


# ----------------------------------------------------------------------------- infilling
INFILL_ITEMS = 40             # held-out sentences, one lexicon word masked in each
INFILL_TAGS = ("NAME", "KIND", "ADJ", "OBJ", "PLACE", "ACT")


class InfillItem(NamedTuple):
    context: str        # the story before the sentence ("" for its first sentence)
    text: str           # the sentence with one [MASK]
    word: str           # the word the [MASK] hides


def infill_items(n: int = INFILL_ITEMS) -> list[InfillItem]:
    """(context, sentence with one ``[MASK]``, the word it hides) for ``n`` held-out stories:
    the hidden word of item ``i`` is one of the ``INFILL_TAGS`` words of held-out story ``i``
    (seeded, so the list is fixed); ``context`` is the story before that sentence."""
    if not isinstance(n, int) or not 1 <= n <= 200:
        raise ValueError(f"n must be an integer in [1, 200], got {n!r}")
    pat, tags = lexicon_pattern()
    out: list[InfillItem] = []
    for i, story in enumerate(C.heldout_stories(n)):
        rng = random.Random(f"celeris-infill:{i}")
        done = sentences(story)[0]
        choices = [(j, m) for j, sent in enumerate(done) for m in pat.finditer(sent)
                   if tags[m.group(0).lower()] in INFILL_TAGS and m.start() > 0
                   and sent[m.start() - 1] == " "]
        j, m = rng.choice(choices)
        sent = done[j]
        out.append(InfillItem(" ".join(done[:j]),
                              sent[:m.start()] + "[MASK]" + sent[m.end():], m.group(0)))
    return out


def measure_infill(model_dir: str, *, n: int = INFILL_ITEMS, context: bool = True) -> dict:
    """Fill the masked word of ``infill_items(n)`` with a diffusion model (its default
    decoding, the hidden word's own token count as span) and score the filled sentence like
    a story sentence, with the story before it pinned (``context``) or the sentence alone.
    ``exact`` counts fills equal to the hidden word (a floor: other words are as right)."""
    from celeris import Engine

    engine = Engine.from_pretrained(model_dir, device="cpu")
    params = engine.default_params()
    filled, exact = [], 0
    for item in infill_items(n):
        filled.append(fill_item(engine, item, params, context=context))
        exact += filled[-1].strip() == item.text.replace("[MASK]", item.word).strip()
    return {**score(filled), "items": n, "exact": exact / n, "context": context,
            "decoding": f"{params.decoding}, block {min(params.block_length, 32)}, "
                        f"temperature {params.temperature:g}, span = the hidden word's tokens"}


def fill_item(engine, item: InfillItem, params, *, context: bool = True) -> str:
    """The sentence of one ``infill_items`` item with its [MASK] filled by ``engine`` (span =
    the hidden word's token count); with ``context`` the story before it is pinned in front."""
    lead = item.context + " " if context and item.context else ""
    span = len(engine.tokenizer.encode(" " + item.word, add_special_tokens=False))
    full = engine.infill_text(lead + item.text, params, span=span)
    if not full.startswith(lead):               # the context is pinned; this cannot happen
        raise RuntimeError(f"infill changed its pinned context: {full!r}")
    return full[len(lead):]

