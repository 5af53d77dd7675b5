"""Is a generated story sentence one the story grammar can produce? A number for story quality.

Exact match cannot score free text, so this checks *shape*: every lexicon word or phrase of
``corpus`` is replaced by its category (``NAME``, ``KIND``, ``ADJ``, ``OBJ``, ``PLACE`` ...),
and a sentence counts as grammatical when its category template occurs among the templates of
a large sample of generated stories: ``a curious old named Oscar.`` becomes ``a ADJ ADJ named
NAME.``, which the grammar never writes. It recognises this one grammar: a fluent sentence the
grammar cannot produce is a miss, and a valid shape with odd words still counts.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from celeris.synthetic import corpus as C

SAMPLE_STORIES = 20000        # stories whose sentence templates define "grammatical"
SAMPLE_LONG_STORIES = 3000    # long stories added to them (their arcs combine more freely)


def lexicon() -> list[tuple[str, str]]:
    """(phrase, tag) pairs, longest phrase first so ``old man`` wins over ``old``."""
    cats: dict[str, tuple[str, ...]] = {
        "NAME": C.NAMES_SHE + C.NAMES_HE,
        "KIND": C.KINDS,
        "ADJ": C.ADJECTIVES + C.COLORS + C.FEELINGS
        + tuple(w for group in C.OBJECT_TRAITS for w in group),
        "OBJ": C.OBJECTS,
        "PLACE": C.PLACES,
        "SPOT": C.FIND_SPOTS,
        "ACT": tuple(C.ACTIVITIES) + tuple(C.ACTIVITIES_PAST.values()),
        "GOAL": C.GOALS,
        "TIME": C.TIMES,
        "WEATHER": C.WEATHER,
        "LESSON": C.LESSONS,
    }
    pairs: dict[str, str] = {}
    for tag, words in cats.items():
        for w in words:
            pairs.setdefault(w, tag)
    return sorted(pairs.items(), key=lambda p: (-len(p[0]), p[0]))


@lru_cache(maxsize=1)
def lexicon_pattern() -> tuple[re.Pattern, dict[str, str]]:
    """A regex matching any lexicon phrase as a whole word, and lower-cased phrase -> tag."""
    pairs = lexicon()
    alternation = "|".join(re.escape(w) for w, _ in pairs)
    # Case-insensitive so sentence-initial capitals ("Tom", "The fox") map like the rest.
    return (re.compile(rf"(?<![A-Za-z])(?:{alternation})(?![A-Za-z])", re.IGNORECASE),
            {w.lower(): t for w, t in pairs})


def template(sentence: str) -> str:
    """The category template of one sentence (articles a/an folded into ``a``)."""
    pat, tags = lexicon_pattern()
    out = pat.sub(lambda m: tags[m.group(0).lower()], sentence.strip())
    out = re.sub(r"(?<![A-Za-z])[Aa]n?(?![A-Za-z])", "a", out)
    return re.sub(r"\s+", " ", out)


SENTENCE = re.compile(r"[^.!?]*[.!?]")      # a sentence ends with '.', '!' or '?'


def sentences(text: str) -> tuple[list[str], str]:
    """(complete sentences, unfinished tail): a sentence ends with '.', '!' or '?'."""
    parts = SENTENCE.findall(text)
    tail = text[sum(len(p) for p in parts):].strip()
    return [p.strip() for p in parts if p.strip()], tail


@lru_cache(maxsize=1)
def known_templates(n: int = SAMPLE_STORIES,
                    n_long: int = SAMPLE_LONG_STORIES) -> frozenset[str]:
    """Templates of every sentence in ``n`` short and ``n_long`` long training-split stories
    (seeded, so the set is fixed; long stories combine the arcs more freely)."""
    rng = random.Random("celeris-storycheck-long:0")
    long_stories = [C.random_long_story(rng, "train") for _ in range(n_long)]
    out: set[str] = set()
    for story in C.stories(n, seed=0, split="train") + long_stories:
        out.update(template(s) for s in sentences(story)[0])
    return frozenset(out)


def score(texts: list[str], prefixes: list[str] | None = None) -> dict:
    """Fraction of complete sentences whose template the grammar produces. ``prefixes`` (the
    prompts) are glued in front of each text first, so a continuation is judged with the
    sentence it completes; an unfinished tail is counted apart, not scored."""
    known = known_templates()
    ok = total = unfinished = 0
    bad: list[str] = []
    for i, text in enumerate(texts):
        full = (prefixes[i] if prefixes else "") + text
        done, tail = sentences(full)
        unfinished += bool(tail)
        for s in done:
            total += 1
            if template(s) in known:
                ok += 1
            elif len(bad) < 5:
                bad.append(s)
    return {"grammatical": ok / total if total else 0.0, "sentences": total,
            "unfinished": unfinished, "examples_bad": bad}
