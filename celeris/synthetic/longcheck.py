"""Does a long story keep its hero and give what its request asked for? Numbers for long stories.

A long story (``corpus.long_story``) keeps one named hero from its first sentence to its last
paragraph. These checks read that off the text with ``storycheck``'s lexicon: who the first
sentence introduces (``hero_of``), whether every name the story uses was introduced, once
(``hero_kept``), whether it gives what its request asked for (``request_honoured``);
``long_score`` scores a batch (``celeris bench --suite stories`` scores a model with it).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from celeris.synthetic import corpus as C
from celeris.synthetic.corpus import paragraphs
from celeris.synthetic.storycheck import SENTENCE, lexicon, lexicon_pattern, score, sentences

ASK_KEYS = ("kind", "adj", "name", "place", "obj")


class Hero(NamedTuple):
    kind: str
    adj: str | None     # None when the introduction has no adjective ("an old man named Tom")
    name: str


@lru_cache(maxsize=1)
def _intro_patterns() -> tuple[re.Pattern, re.Pattern]:
    """The two ways a story introduces a named character: ``a ADJ KIND named|called NAME``
    anywhere, and ``NAME was a ADJ KIND who lived``. Each tag's alternation keeps the
    lexicon's longest-first order, so ``a curious old man named Oscar`` reads adj ``curious``,
    kind ``old man``."""
    alt: dict[str, list[str]] = {}
    for word, tag in lexicon():
        alt.setdefault(tag, []).append(re.escape(word))
    adj, kind, name = ("|".join(alt[t]) for t in ("ADJ", "KIND", "NAME"))
    edge, end = r"(?<![A-Za-z])", r"(?![A-Za-z])"
    named = re.compile(rf"{edge}an? (?:(?P<adj>{adj}) )?(?P<kind>{kind}) "
                       rf"(?:named|called) (?P<name>{name}){end}", re.IGNORECASE)
    lived = re.compile(rf"{edge}(?P<name>{name}) was an? (?:(?P<adj>{adj}) )?(?P<kind>{kind}) "
                       rf"who lived{end}", re.IGNORECASE)
    return named, lived


def _canonical_name(word: str) -> str:
    return {n.lower(): n for n in C.NAMES_SHE + C.NAMES_HE}[word.lower()]


def _hero_from(m: re.Match) -> Hero:
    adj = m.group("adj")
    return Hero(m.group("kind").lower(), adj.lower() if adj else None,
                _canonical_name(m.group("name")))


def hero_of(text: str) -> Hero | None:
    """The named character the story's first sentence introduces (the earliest introduction
    in it), or None when that sentence introduces nobody by name ("there was a little girl")."""
    done, tail = sentences(text)
    first = (done or [tail])[0]
    found = [m for pat in _intro_patterns() for m in pat.finditer(first)]
    return _hero_from(min(found, key=lambda m: m.start("name"))) if found else None


def _introductions(text: str) -> dict[int, Hero]:
    """Every named introduction in ``text``, keyed by where its name starts."""
    return {m.start("name"): _hero_from(m) for pat in _intro_patterns()
            for m in pat.finditer(text)}


def _names(text: str) -> list[re.Match]:
    pat, tags = lexicon_pattern()
    return [m for m in pat.finditer(text) if tags[m.group(0).lower()] == "NAME"]


def hero_kept(text: str, *, name_in_last: bool = False) -> tuple[bool, str]:
    """(True, "") when the story keeps one named hero; else (False, the first violation).

    The first sentence introduces a named hero; every name the story uses was introduced
    before (by that sentence or a later "named X"/"called X"); no name is introduced twice;
    the last paragraph names the hero, or (unless ``name_in_last``) nobody: the corpus ends a
    few stories with pronouns only, but one that names only others has drifted."""
    hero = hero_of(text)
    if hero is None:
        return False, "the first sentence introduces no named hero"
    intros = _introductions(text)
    all_intros = {h.name for h in intros.values()}
    declared: dict[str, str] = {}
    for m in _names(text):
        name = _canonical_name(m.group(0))
        intro = intros.get(m.start())
        if intro is None and name not in declared:
            when = "before it is introduced" if name in all_intros else "but never introduced"
            return False, f"{name} is named {when} (the hero is {hero.name})"
        if intro is not None and name in declared:
            if name == hero.name and intro.kind != declared[name]:
                return False, (f"the hero {name} ({C.article(declared[name])}) is introduced "
                               f"again as {C.article(intro.kind)}")
            return False, f"{name} is introduced twice"
        if intro is not None:
            declared[name] = intro.kind
    last = {_canonical_name(m.group(0)) for m in _names(paragraphs(text)[-1])}
    if hero.name not in last and (last or name_in_last):
        others = f" (it names {', '.join(sorted(last))})" if last else ""
        return False, f"the hero {hero.name} is not named in the last paragraph{others}"
    return True, ""


def request_misses(text: str, asks: dict) -> list[tuple[str, str]]:
    """Every field of ``asks`` the story does not give, as (field, why), in ``ASK_KEYS``
    order; [] when it honours the request. kind/adj/name are the hero's (``hero_of``); the
    place must occur in the text (case-insensitive), the object as a whole word ("cake" is
    not in "bake cakes")."""
    unknown = sorted(set(asks) - set(ASK_KEYS))
    if unknown:
        raise ValueError(f"asks: unknown key(s) {', '.join(unknown)}; known: {', '.join(ASK_KEYS)}")
    hero = hero_of(text)
    misses = []
    for key in (k for k in ASK_KEYS if k in asks):
        want = asks[key]
        if key in ("kind", "adj", "name"):
            if hero is None:
                misses.append((key, f"asked for {key} {want!r}, but no named hero is introduced"))
            elif getattr(hero, key) != want:
                misses.append((key, f"asked for {key} {want!r}, the hero's is "
                                    f"{getattr(hero, key)!r}"))
        elif key == "place" and want.lower() not in text.lower():
            misses.append((key, f"asked for the place {want!r}, which the story never mentions"))
        elif key == "obj" and not re.search(rf"(?<![A-Za-z]){re.escape(want)}(?![A-Za-z])",
                                            text, re.IGNORECASE):
            misses.append((key, f"asked for the object {want!r}, which the story never mentions"))
    return misses


def request_honoured(text: str, asks: dict) -> tuple[bool, str]:
    """(True, "") when the story gives what the request asked for; else (False, the first
    miss of ``request_misses``)."""
    return _verdict(request_misses(text, asks))


def _verdict(misses: list[tuple[str, str]]) -> tuple[bool, str]:
    return (False, misses[0][1]) if misses else (True, "")


def _field_counts(checked: list[tuple[dict, list[tuple[str, str]]]]) -> dict[str, dict[str, int]]:
    """For each field the requests ask for (``ASK_KEYS`` order), from (asks, request_misses)
    pairs: how many ask for it and how many of their stories give it, e.g.
    ``{"adj": {"asked": 10, "honoured": 0}}``: which part of the requests a model ignores."""
    out = {k: {"asked": 0, "honoured": 0} for k in ASK_KEYS}
    for a, misses in checked:
        missed = {k for k, _ in misses}
        for k in a:
            out[k]["asked"] += 1
            out[k]["honoured"] += k not in missed
    return {k: v for k, v in out.items() if v["asked"]}


def fields_line(fields: dict[str, dict[str, int]]) -> str:
    """``long_score``'s request_fields as one line: "kind 33/33, adj 0/10, place 0/6"."""
    return ", ".join(f"{k} {v['honoured']}/{v['asked']}" for k, v in fields.items())


@lru_cache(maxsize=1)
def _object_patterns() -> tuple[re.Pattern, re.Pattern]:
    """("found a [colour] OBJ", "the OBJ") over the corpus's objects, longest names first."""
    objs = "|".join(sorted(C.OBJECTS, key=len, reverse=True))
    colours = "|".join(C.COLORS)
    return (re.compile(rf"\bfound an? (?:(?:{colours}) )?({objs})\b", re.IGNORECASE),
            re.compile(rf"\bthe ({objs})\b", re.IGNORECASE))


def first_found_object(text: str) -> str | None:
    """The first object a story finds ("found a red coin" -> "coin"), lower case; None when
    it finds none of the corpus's objects."""
    m = _object_patterns()[0].search(text)
    return m.group(1).lower() if m else None


def objects_kept(text: str) -> tuple[bool, str]:
    """(True, "") when every object a story finds stays that object; else (False, the first
    switch): after "found a red coin" a drifting model writes "the pumpkin was new", which
    every sentence's grammar allows. Only object words after "found a/an [colour]" and
    "the ..." in the same paragraph are compared."""
    found, later = _object_patterns()
    for para in paragraphs(text):
        m = found.search(para)
        if m is None:
            continue
        obj = m.group(1).lower()
        for other in later.finditer(para, m.end()):
            if other.group(1).lower() != obj:
                return False, f"found {C.article(obj)}, then wrote of the {other.group(1).lower()}"
    return True, ""


def repeated_sentences(text: str) -> tuple[int, int]:
    """(sentences that repeat an earlier sentence of the same story word for word, all
    sentences): a model stuck in a loop repeats many."""
    seen: set[str] = set()
    repeats = 0
    done, _ = sentences(text)
    for sent in done:
        key = " ".join(sent.lower().split())
        repeats += key in seen
        seen.add(key)
    return repeats, len(done)


def without_repeats(text: str) -> str:
    """The story without the sentences ``repeated_sentences`` counts, spacing and paragraphs
    kept (a paragraph left empty goes): a looping model's answer made worth imitating."""
    seen: set[str] = set()
    out = []
    for para in paragraphs(text):
        parts = SENTENCE.findall(para)
        tail = para[sum(len(p) for p in parts):]
        kept = []
        for part in parts:
            key = " ".join(part.lower().split())
            if key in seen:
                continue
            seen.add(key)
            kept.append(part)
        body = ("".join(kept) + tail).strip()
        if body:
            out.append(body)
    return "\n\n".join(out)


def distinct_sentences(texts: list[str]) -> float:
    """Of all the sentences of ``texts``, the fraction that are distinct once every name is
    one placeholder: a model that answers every request with one story in which only the
    hero changes scores low however grammatical that story is."""
    pat, tags = lexicon_pattern()

    def key(sent: str) -> str:
        sent = pat.sub(lambda m: "NAME" if tags[m.group(0).lower()] == "NAME" else m.group(0),
                       sent)
        return " ".join(sent.lower().split())

    keys = [key(s) for text in texts for s in sentences(text)[0]]
    return len(set(keys)) / len(keys) if keys else 0.0


def finished(text: str) -> bool:
    """Does the text end with a complete sentence (a closing quote after it allowed)?"""
    return re.search(r"[.!?][\"']?\s*$", text) is not None


def long_score(texts: list[str], requests: list[C.StoryRequest] | None = None) -> dict:
    """Score long stories: ``score``'s grammatical fraction over all their sentences, the
    fractions that keep their hero, honour their request (``requests[i]`` asked for
    ``texts[i]``; None without requests; per field in ``request_fields``) and keep their
    found objects, the fraction of sentences that repeat an earlier one, the fraction of
    distinct sentences, the texts that stop mid-sentence and up to 5 failures with reasons."""
    if requests is not None and len(requests) != len(texts):
        raise ValueError(f"requests: expected one per text ({len(texts)}), got {len(requests)}")
    grammar = score(texts)
    kept = honoured = objects = repeats = total = 0
    failures: list[dict] = []
    checked: list[tuple[dict, list[tuple[str, str]]]] = []
    for i, text in enumerate(texts):
        checks = {"hero": hero_kept(text), "objects": objects_kept(text)}
        objects += checks["objects"][0]
        r, t = repeated_sentences(text)
        repeats, total = repeats + r, total + t
        if requests is not None:
            misses = request_misses(text, requests[i].asks)
            checked.append((requests[i].asks, misses))
            checks["request"] = _verdict(misses)
            honoured += checks["request"][0]
        kept += checks["hero"][0]
        failures += [{"index": i, "check": name, "reason": why}
                     for name, (ok, why) in checks.items() if not ok]
    n = len(texts)
    return {"texts": n, "sentences": grammar["sentences"],
            "grammatical": grammar["grammatical"], "examples_bad": grammar["examples_bad"],
            "hero_kept": kept / n if n else 0.0,
            "request_honoured": (honoured / n if n else 0.0) if requests is not None else None,
            "request_fields": _field_counts(checked) if requests is not None else None,
            "objects_kept": objects / n if n else 0.0,
            "repeated_sentences": repeats / total if total else 0.0,
            "distinct_sentences": distinct_sentences(texts),
            "unfinished": sum(not finished(t) for t in texts),
            "examples_failed": failures[:5]}


def long_params(default, max_new_tokens: int):
    """The model's default decoding with gen_length = ``max_new_tokens``; a fixed step count
    is rescaled to keep the default's steps per block (64 steps over 2 blocks of 32 becomes
    32 per block, so the long canvas keeps the schedule it was tuned with)."""
    longer = default.replace(gen_length=max_new_tokens, steps=None)
    if default.steps is None:
        return longer
    return longer.replace(steps=default.steps_per_block * longer.num_blocks)
