"""Free phrasing: story requests written the many ways people ask for a story.

``corpus.LONG_REQUEST_FORMS`` holds ten fixed request sentences; visitors write "Can you make
up a tale about a shy cat called Luna who finds a key in a castle?". This grammar builds a
request from parts, each a way of saying one thing:

- an opening ("Tell me {story}", "Can you write {story}?", "I want {story}", terse "{story}"),
- a story noun ("a story", "a short tale", "a bedtime story"),
- a hero phrase naming some of kind, adjective and name, in any of their orders and forms
  ("about a brave fox named Pip", "about Pip the brave fox", "about a fox whose name is Pip"),
- details: a place or an object as a relative clause on the hero ("who lives in the forest",
  "who finds a key", both in one clause), as a phrase of the story ("set in the forest",
  "with a key in it"), before or after the hero,
- a second sentence that adds a detail ("Make the fox brave.", "The fox is called Pip."),
- polite and terse surface forms (", please", no final stop, a lower-case first letter).

Every part is either a training part or a held-out one (``Part.held_out``). Training requests
(``free_request(rng, "train")``) are built from training parts only; held-out requests
(``heldout_free_requests``) hold at least one held-out part, so the figure they give measures
how a model understands phrasings it never trained on, not new texts of old sentences. Every
word of a held-out part is a word training requests or stories use (a test holds that), so a
held-out request is new phrasing, not new vocabulary.

Each request asks for what its text names (``asks``: kind, adj, name, place, obj) and carries
a long story (``corpus.long_story``) that honours it, as ``corpus.long_request`` does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import corpus as C


@dataclass(frozen=True)
class Part:
    """One way of saying one thing: ``text`` with {fields}, the request fields it asks for
    and where it attaches ("hero": a relative clause on the hero; "story": a phrase of the
    story, before or after the hero; "sentence": a sentence of its own after the request)."""

    id: str
    text: str
    held_out: bool = False
    attach: str = "story"


# "{story}" is the story noun; a question ends with "?"
OPENINGS = (
    Part("tell", "Tell me {story}"),
    Part("write", "Write {story}"),
    Part("write_me", "Write me {story}"),
    Part("can_tell", "Can you tell me {story}?"),
    Part("can_write", "Can you write {story}?"),
    Part("could_write", "Could you write me {story}?"),
    Part("want", "I want {story}"),
    Part("make_up", "Make up {story}"),
    Part("give", "Give me {story}"),
    Part("please_tell", "Please tell me {story}"),
    Part("want_to_hear", "I want to hear {story}"),
    Part("terse", "{story}"),
    Part("could_tell", "Could you tell me {story}?", held_out=True),
    Part("can_make_up", "Can you make up {story}?", held_out=True),
    Part("please_write_me", "Please write me {story}", held_out=True),
    Part("want_you", "I want you to tell me {story}", held_out=True),
)
STORY_NOUNS = ("a story", "a short story", "a long story", "a tale", "a little story",
               "a bedtime story", "a short tale")

# hero phrases: {a_kind} "a fox", {a_adj_kind} "a brave fox", {kind}, {adj}, {name}
HEROES = (
    Part("a_kind", "about {a_kind}"),
    Part("a_adj_kind", "about {a_adj_kind}"),
    Part("named", "about {a_kind} named {name}"),
    Part("called", "about {a_kind} called {name}"),
    Part("adj_named", "about {a_adj_kind} named {name}"),
    Part("adj_called", "about {a_adj_kind} called {name}"),
    Part("name_the", "about {name} the {kind}"),
    Part("name_the_adj", "about {name} the {adj} {kind}"),
    Part("name", "about {name}"),
    Part("whose_name", "about {a_kind} whose name is {name}"),
    Part("of_kind", "of {a_adj_kind}"),
    Part("adj_whose_name", "about {a_adj_kind} whose name is {name}", held_out=True),
    Part("name_comma", "about {name}, {a_adj_kind}", held_out=True),
    Part("named_who_is", "about {a_kind} named {name} who is {adj}", held_out=True),
    Part("with_hero", "with {a_adj_kind} called {name}", held_out=True),
)

# details: {place} "in the forest", {a_obj} "a key"
PLACE_DETAILS = (
    Part("lives", "who lives {place}", attach="hero"),
    Part("bare_place", "{place}"),
    Part("set", "set {place}"),
    Part("happens", "that happens {place}"),
    Part("who_is_place", "who is {place}", held_out=True, attach="hero"),
    Part("set_that", "that is set {place}", held_out=True),
)
OBJECT_DETAILS = (
    Part("finds", "who finds {a_obj}", attach="hero"),
    Part("with_obj", "with {a_obj}", attach="hero"),
    Part("and_obj", "and {a_obj}", attach="hero"),
    Part("in_it", "with {a_obj} in it"),
    Part("found", "who found {a_obj}", held_out=True, attach="hero"),
    Part("got", "who got {a_obj}", held_out=True, attach="hero"),
)
# a place and an object in one relative clause
BOTH_DETAILS = (
    Part("lives_finds", "who lives {place} and finds {a_obj}", attach="hero"),
    Part("finds_place", "who finds {a_obj} {place}", held_out=True, attach="hero"),
)
# second sentences: an adjective for a hero with a kind and none, a name for one without
ADJ_SENTENCES = (
    Part("make_adj", "Make the {kind} {adj}.", attach="sentence"),
    Part("should_be", "The {kind} should be {adj}.", attach="sentence"),
    Part("kind_is_adj", "The {kind} is very {adj}.", held_out=True, attach="sentence"),
)
NAME_SENTENCES = (
    Part("is_called", "The {kind} is called {name}.", attach="sentence"),
    Part("name_of", "The name of the {kind} is {name}.", held_out=True, attach="sentence"),
)
PARTS = OPENINGS + HEROES + PLACE_DETAILS + OBJECT_DETAILS + BOTH_DETAILS + ADJ_SENTENCES \
    + NAME_SENTENCES

# which request fields each placeholder asks for
_FIELDS = {"{a_kind}": ("kind",), "{kind}": ("kind",), "{a_adj_kind}": ("kind", "adj"),
           "{adj}": ("adj",), "{name}": ("name",), "{place}": ("place",), "{a_obj}": ("obj",)}
HELD_OUT_SHARE = 0.5        # a held-out request draws each part from the held-out ones this often


def fields(part: Part) -> tuple[str, ...]:
    """The request fields ``part`` names, in ``ASK`` order."""
    named = {f for ph, fs in _FIELDS.items() if ph in part.text for f in fs}
    return tuple(f for f in ("kind", "adj", "name", "place", "obj") if f in named)


def _pick(rng: random.Random, parts: tuple[Part, ...], held: bool, ok=lambda p: True) -> Part:
    """A part of ``parts`` that ``ok`` accepts: for a training request a training part; for a
    held-out one, a held-out part with probability ``HELD_OUT_SHARE`` when there is one."""
    train = [p for p in parts if not p.held_out and ok(p)]
    if held:
        out = [p for p in parts if p.held_out and ok(p)]
        if out and (not train or rng.random() < HELD_OUT_SHARE):
            return rng.choice(out)
    return rng.choice(train)


def _values(rng: random.Random) -> dict[str, str]:
    kind = rng.choice(C.KINDS)
    pron = C.PEOPLE.get(kind) or rng.choice(("he", "she"))
    adj = rng.choice([a for a in C.ADJECTIVES if not kind.startswith(a + " ")])
    return {"kind": kind, "adj": adj,
            "name": rng.choice(C.NAMES_HE if pron == "he" else C.NAMES_SHE),
            "place": rng.choice(C.PLACES), "obj": rng.choice(C.OBJECTS)}


def _fill(text: str, v: dict[str, str]) -> str:
    return text.format(a_kind=C.article(v["kind"]), a_adj_kind=C.article(f"{v['adj']} {v['kind']}"),
                       kind=v["kind"], adj=v["adj"], name=v["name"], place=v["place"],
                       a_obj=C.article(v["obj"]))


def _draw(rng: random.Random, held: bool) -> tuple[list[Part], list[Part], list[Part],
                                                    Part | None, Part]:
    """(the details before the hero, after it, the second sentences, the hero or None, the
    opening) of one request."""
    opening = _pick(rng, OPENINGS, held)
    hero = _pick(rng, HEROES, held) if rng.random() < 0.9 else None
    has = set(fields(hero)) if hero else set()
    rel_ok = (lambda p: True) if hero else (lambda p: p.attach != "hero")
    details: list[Part] = []
    want_place, want_obj = rng.random() < 0.45, rng.random() < 0.45
    if want_place and want_obj and hero and rng.random() < 0.35:
        details.append(_pick(rng, BOTH_DETAILS, held))
    else:
        if want_obj:
            details.append(_pick(rng, OBJECT_DETAILS, held, rel_ok))
        if want_place:      # "about a fox and a key" takes no clause after it
            story_only = details and details[0].id == "and_obj"
            details.append(_pick(rng, PLACE_DETAILS, held,
                                 (lambda p: p.attach == "story") if story_only else rel_ok))
    if hero and hero.id == "named_who_is":      # "who is brave" ends the hero phrase
        details = [d for d in details if d.attach != "hero"]
    rng.shuffle(details)
    # story phrases may come before the hero ("a story set in the forest about a fox"), and
    # do when the hero has a clause ("... who finds a key that is set ..." reads wrong)
    clause = any(d.attach == "hero" for d in details)
    before = [d for d in details
              if d.attach == "story" and hero and (clause or rng.random() < 0.3)]
    after = [d for d in details if d not in before]
    after.sort(key=lambda d: d.attach != "hero")      # relative clauses right after the hero
    sentences: list[Part] = []
    if "kind" in has and "adj" not in has and rng.random() < 0.3:
        sentences.append(_pick(rng, ADJ_SENTENCES, held))
    if "kind" in has and "name" not in has and rng.random() < 0.2:
        sentences.append(_pick(rng, NAME_SENTENCES, held))
    return before, after, sentences, hero, opening


def _join(phrases: list[str]) -> str:
    """The phrases in order, a second relative clause joined by "and" ("who lives in the
    forest and finds a key", not "... who finds a key")."""
    out: list[str] = []
    for p in phrases:
        if out and p.startswith("who ") and out[-1].startswith(("who ", "and ")):
            p = "and " + p[4:]
        out.append(p)
    return " ".join(out)


def template(parts: list[Part]) -> str:
    """A request's template: its parts' ids in order ("tell+named+lives")."""
    return "+".join(p.id for p in parts)


def free_request(rng: random.Random, split: str = "train") -> C.StoryRequest:
    """A freely phrased story request and a long story that honours it. ``split`` "train"
    uses training parts only; "eval" holds at least one held-out part. The request's text
    and its story fall in ``split`` (``corpus.request_split`` / ``story_split``)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    held = split == "eval"
    while True:
        before, after, sentences, hero, opening = _draw(rng, held)
        parts = [opening, *before, *([hero] if hero else []), *after, *sentences]
        if held != any(p.held_out for p in parts):
            continue
        v = _values(rng)
        noun = rng.choice(STORY_NOUNS)
        middle = _join([_fill(p.text, v) for p in [*before, *([hero] if hero else []), *after]])
        body = f"{noun} {middle}".strip()
        question = opening.text.endswith("?")
        head = opening.text.rstrip("?").format(story=body)
        if opening.id == "terse":
            head = head[:1].upper() + head[1:]
        if not question and "please" not in head.lower() and rng.random() < 0.12:
            head += ", please"
        end = "?" if question else rng.choices((".", "!", ""), (0.8, 0.1, 0.1))[0]
        text = " ".join([head + end] + [_fill(s.text, v) for s in sentences])
        if rng.random() < 0.08:
            text = text[:1].lower() + text[1:]
        asks = {f: v[f] for p in parts for f in fields(p)}
        if C.request_split(text) == split or held:
            break
    return C.StoryRequest(text, asks, C.random_long_story(rng, split, **asks), template(parts))


_BY_ID = {p.id: p for p in PARTS}
# the hero phrase for the picked (adjective?, name?) of a hero with a kind
_HERO_FOR = {(True, True): "adj_named", (False, True): "named", (True, False): "a_adj_kind",
             (False, False): "a_kind"}


def compose(values: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(a request in training parts naming the given values, what it asks): "Tell me a story
    about a brave fox named Pip who lives in the forest and finds a key." for every field; a
    name without a kind is the hero "about Pip", an adjective without a kind is left out (no
    training part says one alone), a place or object without a hero is a phrase of the story
    ("set in the forest", "with a key in it"). No values: "Tell me a story."."""
    has = {k for k, v in values.items() if v}
    hero = (_HERO_FOR["adj" in has, "name" in has] if "kind" in has
            else "name" if "name" in has else None)
    if hero is not None:
        details = ["lives_finds"] if {"place", "obj"} <= has else \
            ["lives"] if "place" in has else ["finds"] if "obj" in has else []
    else:
        details = [d for d, f in (("set", "place"), ("in_it", "obj")) if f in has]
    parts = [_BY_ID[i] for i in ([hero] if hero else []) + details]
    v = {f: values.get(f) or "x" for f in ("kind", "adj", "name", "place", "obj")}
    text = _join(["Tell me a story"] + [_fill(p.text, v) for p in parts]) + "."
    return text, {f: values[f] for p in parts for f in fields(p)}


def heldout_free_requests(n: int = 40, seed: int = C.STORY_EVAL_SEED) -> list[C.StoryRequest]:
    """Fixed held-out free-phrased requests (every one holds a part no training request
    uses), distinct texts, deterministic for ``seed``."""
    rng = random.Random(f"celeris-free-request:{seed}:eval")
    return C._distinct(lambda: free_request(rng, "eval"), n, key=lambda r: r.text)
