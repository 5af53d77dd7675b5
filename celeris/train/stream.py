"""The training stream: which sources a batch is drawn from (``Mix``), one training document
(``Item``), and the infinite, seeded, resumable ``Stream`` of them: stories, story requests
and long stories from ``corpus``, checkable problems from ``tasks``, and answers a model wrote
itself (``load_pool``, a ``celeris distill-data`` file).
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from celeris.synthetic import tasks as _tasks
from celeris.synthetic.phrasing import free_request
from celeris.synthetic.corpus import (ACTIVITIES, ADJECTIVES, KINDS, NAMES_HE, NAMES_SHE,
                                      OBJECTS, PLACES, STORY_EVAL_BUCKETS, long_request,
                                      random_long_story, random_story, story_request)


@dataclass(frozen=True)
class Mix:
    """What the training stream is made of (weights are per batch: a batch is one source).

    story:   plain stories (pre-training style; all positions maskable).
    task:    chat examples of the checkable tasks (SFT; only the answer canvas is maskable).
    request: chat story requests ("Tell me a story about a cat.") answered with a story.
    long:    plain long stories (150-400 tokens, one named hero; ``corpus.long_story``).
    longreq: chat requests for a long story, honoured by it (``corpus.long_request``).
    reqhead: the same requests answered by the first tokens of their story only (cropped to
             the canvas, no end of turn): ~5x more requests per token than ``longreq``, for
             learning to honour a request (the opening names the hero and usually the place).

    ``ask_share`` of the ``longreq``/``reqhead`` requests ask for at least one of
    ``ask_fields`` (redrawn until one does; the training setting ``asks``): the corpus's forms
    ask an adjective, a place or an object rarely, too rarely for a model to learn to copy it.
    ``free_share`` of them are phrased freely (``phrasing.free_request``, its training parts;
    the training setting ``free``) instead of by the corpus's ten request sentences.
    """

    story: float = 0.20
    task: float = 0.65
    request: float = 0.15
    long: float = 0.0
    longreq: float = 0.0
    reqhead: float = 0.0
    task_weights: tuple[tuple[str, float], ...] = (("copy", 0.5), ("reverse", 1.25),
                                                   ("sort", 1.5), ("add", 3.0), ("max", 0.25),
                                                   ("count", 0.25))
    ask_share: float = 0.0
    ask_fields: tuple[str, ...] = ()
    free_share: float = 0.0

    def sources(self) -> tuple[tuple[str, float], ...]:
        return (("story", self.story), ("task", self.task), ("request", self.request),
                ("long", self.long), ("longreq", self.longreq), ("reqhead", self.reqhead))

    @classmethod
    def from_weights(cls, weights: "dict[str, float] | str | None") -> "Mix":
        """A mix with the given source weights (the rest default), from a dict or from text
        such as ``"story=0.4,task=0.45,request=0.15"``. Weights are relative (normalised when
        drawn); each must be >= 0 and at least one > 0."""
        if weights is None:
            return cls()
        known = tuple(name for name, _ in cls().sources())
        if isinstance(weights, str):
            parsed: dict[str, float] = {}
            for part in filter(None, (p.strip() for p in weights.split(","))):
                name, sep, value = part.partition("=")
                try:
                    if not sep:
                        raise ValueError
                    parsed[name.strip()] = float(value)
                except ValueError:
                    raise ValueError(f"mix: expected NAME=WEIGHT items separated by commas "
                                     f"(names: {', '.join(known)}), got {part!r}") from None
            weights = parsed
        unknown = sorted(set(weights) - set(known))
        if unknown:
            raise ValueError(f"mix: unknown source(s) {', '.join(unknown)}; "
                             f"known: {', '.join(known)}")
        for name, value in weights.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"mix: {name} must be a finite weight >= 0, got {value!r}")
        mix = cls(**{k: float(v) for k, v in weights.items()})
        if not sum(w for _, w in mix.sources()) > 0:
            raise ValueError(f"mix: at least one of {', '.join(known)} must be > 0")
        return mix

    def to_dict(self) -> dict:
        return {**dict(self.sources()), "task_weights": dict(self.task_weights)}


@dataclass(frozen=True)
class Item:
    """One training document: ``text`` (plain sources), or ``messages`` (the user turn, never
    masked) and ``answer`` (the reply, the maskable canvas)."""

    source: str
    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    answer: str = ""

    def chat(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


def _task_item(rng: random.Random, mix: Mix) -> Item:
    names, weights = zip(*mix.task_weights)
    ex = _tasks.random_example(rng.choices(names, weights)[0], rng, "train")
    return Item("task", messages=(("user", ex.prompt),), answer=ex.answer)


def _request_item(rng: random.Random, mix: Mix) -> Item:
    q, s = story_request(rng)
    return Item("request", messages=(("user", q),), answer=s)


def _long_request_item(rng: random.Random, mix: Mix, source: str = "longreq") -> Item:
    fields = set(mix.ask_fields) if mix.ask_share and rng.random() < mix.ask_share else set()
    free = bool(mix.free_share) and rng.random() < mix.free_share
    draw = free_request if free else long_request
    r = draw(rng)
    while fields and not fields & set(r.asks):
        r = draw(rng)
    return Item(source, messages=(("user", r.text),), answer=r.story)


# source name -> builder(rng, mix) of one training item of that source
ITEM_BUILDERS = {
    "story": lambda rng, mix: Item("story", text=random_story(rng)),
    "task": _task_item,
    "request": _request_item,
    "long": lambda rng, mix: Item("long", text=random_long_story(rng)),
    "longreq": _long_request_item,
    "reqhead": lambda rng, mix: _long_request_item(rng, mix, "reqhead"),
}


def check_asks(asks: "dict | None") -> "dict | None":
    """The ``asks`` training setting, ``{"share": P, "fields": [...]}`` (see ``Mix``),
    validated; None leaves the corpus's own request forms."""
    if asks is None:
        return None
    if not isinstance(asks, dict) or set(asks) != {"share", "fields"}:
        raise ValueError(f"asks must be {{share = P, fields = [...]}}, got {asks!r}")
    share, fields = asks["share"], asks["fields"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"asks.share must be in (0, 1], got {share!r}")
    if (not isinstance(fields, (list, tuple)) or not fields
            or not set(fields) <= set(ASKABLE)):
        raise ValueError(f"asks.fields must list some of {', '.join(ASKABLE)}, got {fields!r}")
    return {"share": float(share), "fields": list(dict.fromkeys(fields))}


def check_free(free: "float | None") -> float:
    """The ``free`` training setting: the share in [0, 1] of long requests phrased freely."""
    if free is None:
        return 0.0
    if isinstance(free, bool) or not isinstance(free, (int, float)) or not 0 <= free <= 1:
        raise ValueError(f"free must be a share in [0, 1], got {free!r}")
    return float(free)


# the request fields a long request can ask for (``corpus.LONG_REQUEST_FORMS``)
ASKABLE = ("kind", "adj", "name", "place", "obj")


class Stream:
    """The infinite, seeded training stream; ``state()``/``set_state()`` make it resumable.

    ``pool``: items a model wrote itself (``celeris distill-data``), by source ("task",
    "longreq"); an item of such a source comes from the pool with probability ``pool_prob``
    (self-distillation), else from the generator."""

    def __init__(self, seed: int = 0, mix: Mix | None = None,
                 pool: "dict[str, list[Item]] | None" = None, pool_prob: float = 0.0) -> None:
        if not 0.0 <= pool_prob <= 1.0:
            raise ValueError(f"selfgen_prob must be in [0, 1], got {pool_prob!r}")
        self.mix = mix or Mix()
        self.rng = random.Random(f"celeris-stream:{seed}")
        self.pool = {k: v for k, v in (pool or {}).items() if v}
        self.pool_prob = pool_prob if self.pool else 0.0

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)

    def pick_source(self) -> str:
        names, weights = zip(*self.mix.sources())
        return self.rng.choices(names, weights)[0]

    def item(self, source: str) -> Item:
        rng = self.rng
        if self.pool_prob and source in self.pool and rng.random() < self.pool_prob:
            return rng.choice(self.pool[source])
        build = ITEM_BUILDERS.get(source)
        if build is not None:
            return build(rng, self.mix)
        raise ValueError(f"unknown source {source!r}")

    def __iter__(self) -> Iterator[Item]:
        while True:
            yield self.item(self.pick_source())


def load_pool(path: "str | os.PathLike") -> dict[str, list[Item]]:
    """The self-generated items of a ``celeris distill-data`` JSONL file, by source. Each line:
    {"source": "task"|"longreq", "prompt": user text, "answer": the model's reply}."""
    pool: dict[str, list[Item]] = {}
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"selfgen: no such file {p}")
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if "done" in rec:                    # a progress marker, not an answer
                continue
            item = Item(rec["source"], messages=(("user", rec["prompt"]),),
                        answer=rec["answer"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"selfgen: {p} line {n} is not a distill-data record ({exc})"
                             ) from None
        pool.setdefault(item.source, []).append(item)
    if not pool:
        raise ValueError(f"selfgen: {p} holds no records")
    return pool


def tokenizer_corpus(n: int = 20000, seed: int = 0, mix: Mix | None = None) -> list[str]:
    """Texts to train the BPE on: a sample of the stream in the proportions of ``mix``."""
    stream = Stream(seed=seed + 7919, mix=mix)
    out: list[str] = []
    for _ in range(n):
        it = stream.item(stream.pick_source())
        if it.source in ("story", "long"):
            out.append(it.text)
        else:
            out.extend(c for _, c in it.messages)
            out.append(it.answer)
    return out


def describe(mix: Mix | None = None) -> dict:
    """A JSON-able description of the training stream (for the train log and model card)."""
    mix = mix or Mix()
    return {
        "sources": mix.to_dict(),
        "story_grammar": {"kinds": len(KINDS), "names": len(NAMES_HE) + len(NAMES_SHE),
                          "adjectives": len(ADJECTIVES), "objects": len(OBJECTS),
                          "places": len(PLACES), "activities": len(ACTIVITIES),
                          "sentences": [2, 6], "eval_fraction": 1 / STORY_EVAL_BUCKETS},
        "tasks": list(_tasks.TASKS),
        "task_sizes": {"list_length": [_tasks.LIST_MIN, _tasks.LIST_MAX],
                       "list_items": [0, _tasks.ITEM_MAX],
                       "addend_digits": [1, _tasks.ADD_DIGITS]},
        "task_eval_fraction": 1 / _tasks.EVAL_BUCKETS,
        "licence": "generated by celeris.synthetic.corpus (project licence); no third-party text",
    }
