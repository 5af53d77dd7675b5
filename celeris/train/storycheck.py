"""Is a generated story sentence one the story grammar can produce? A number for story quality.

Exact match cannot score free text, so this checks *shape*: every lexicon word or phrase of
``celeris.train.corpus`` is replaced by its category (``NAME``, ``KIND``, ``ADJ``, ``OBJ``,
``PLACE`` ...), and a sentence counts as grammatical when its category template occurs among the
templates of a large sample of generated stories. ``a curious old named Oscar.`` becomes
``a ADJ ADJ named NAME.``, which the grammar never writes (it always has a ``KIND`` there).

The same lexicon reads the characters of a long story (``corpus.long_story``): ``hero_of``,
``hero_kept`` and ``request_honoured`` check that one named hero runs from the first sentence to
the last paragraph and that the story gives what its request asked for (``long_score``).

It is a recogniser for this one grammar, not a general grammar checker: a fluent sentence the
grammar cannot produce counts as a miss, and a sentence can mix a valid shape with odd word
choices (``the fox baked cakes in the snow``) and still count.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import NamedTuple

from celeris.train import corpus as C

SAMPLE_STORIES = 20000        # stories whose sentence templates define "grammatical"
SAMPLE_LONG_STORIES = 3000    # long stories added to them (their arcs combine more freely)


def _lexicon() -> list[tuple[str, str]]:
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
def _pattern() -> tuple[re.Pattern, dict[str, str]]:
    pairs = _lexicon()
    alternation = "|".join(re.escape(w) for w, _ in pairs)
    # Case-insensitive so sentence-initial capitals ("Tom", "The fox") map like the rest.
    return (re.compile(rf"(?<![A-Za-z])(?:{alternation})(?![A-Za-z])", re.IGNORECASE),
            {w.lower(): t for w, t in pairs})


def template(sentence: str) -> str:
    """The category template of one sentence (articles a/an folded into ``a``)."""
    pat, tags = _pattern()
    out = pat.sub(lambda m: tags[m.group(0).lower()], sentence.strip())
    out = re.sub(r"(?<![A-Za-z])[Aa]n?(?![A-Za-z])", "a", out)
    return re.sub(r"\s+", " ", out)


def sentences(text: str) -> tuple[list[str], str]:
    """(complete sentences, unfinished tail): a sentence ends with '.', '!' or '?'."""
    parts = re.findall(r"[^.!?]*[.!?]", text)
    tail = text[sum(len(p) for p in parts):].strip()
    return [p.strip() for p in parts if p.strip()], tail


@lru_cache(maxsize=1)
def known_templates(n: int = SAMPLE_STORIES,
                    n_long: int = SAMPLE_LONG_STORIES) -> frozenset[str]:
    """Templates of every sentence in ``n`` short and ``n_long`` long training-split stories
    (both seeded, so the set is fixed). Long stories are built from the same arcs, but put
    them side by side more often (a friend met in one paragraph helps find a lost thing in
    the next), so a few of their sentence shapes are rare among short stories."""
    rng = random.Random("celeris-storycheck-long:0")
    long_stories = [C.random_long_story(rng, "train") for _ in range(n_long)]
    out: set[str] = set()
    for story in C.stories(n, seed=0, split="train") + long_stories:
        out.update(template(s) for s in sentences(story)[0])
    return frozenset(out)


def score(texts: list[str], prefixes: list[str] | None = None) -> dict:
    """Fraction of complete sentences whose template the grammar produces.

    ``prefixes`` (the prompts) are glued in front of each text first, so a continuation that
    completes the prompt's sentence is judged as that whole sentence. An unfinished tail (no
    final punctuation, e.g. cut by the length limit) is counted apart, not scored.
    """
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
    """(context, sentence with one ``[MASK]``, the word it hides) for ``n`` held-out stories.

    The hidden word of item ``i`` is drawn from the lexicon words (names, kinds, adjectives,
    objects, places, activities) of held-out story ``i`` with a seeded RNG, so the list is
    fixed. ``context`` is the story's text before that sentence ("" for its first sentence):
    a mid-story sentence such as ``That night, [MASK] had sweet dreams.`` names someone the
    story introduced earlier."""
    if not isinstance(n, int) or not 1 <= n <= 200:
        raise ValueError(f"n must be an integer in [1, 200], got {n!r}")
    pat, tags = _pattern()
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
    decoding; the span is the hidden word's own token count, so length is not the test) and
    score the filled sentence like a story sentence.

    context=True: the model sees the story before the sentence (pinned) and the sentence;
    only the filled sentence is scored. context=False: the sentence alone, a harder test,
    since the model learned whole stories and never saw one start mid-story. ``exact``
    counts fills equal to the hidden word (many other words are just as right, so it is a
    floor, not the metric)."""
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


# ----------------------------------------------------------------------------- long stories
# A long story (``corpus.long_story``) keeps one named hero from its first sentence to its last
# paragraph. These checks read that off the text with the same lexicon as ``template``: who the
# first sentence introduces, which names the story introduces later ("met a shy cat named
# Mia"), and whether every name it uses was introduced, once.
LONG_REQUESTS = 40            # held-out long-story requests a model answers
LONG_NEW_TOKENS = 448         # the longest corpus story is ~400 tokens
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
    for word, tag in _lexicon():
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
    pat, tags = _pattern()
    return [m for m in pat.finditer(text) if tags[m.group(0).lower()] == "NAME"]


def paragraphs(text: str) -> list[str]:
    """The story's paragraphs (blank-line separated), stripped, empty ones dropped."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def hero_kept(text: str, *, name_in_last: bool = False) -> tuple[bool, str]:
    """(True, "") when the story keeps one named hero; else (False, the first violation).

    The first sentence introduces a named hero; every name the story uses was introduced
    before (by that sentence or by a later "named X"/"called X"); no name is introduced twice
    (the hero's with another kind would be a new hero); the last paragraph names the hero, or
    names nobody. The corpus itself ends ~5% of its long stories with pronouns only ("He felt
    angry. And they all lived happily ever after."), so a name-less last paragraph passes
    unless ``name_in_last``; one that names only others (the story drifted) never does."""
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


def request_honoured(text: str, asks: dict) -> tuple[bool, str]:
    """(True, "") when the story gives what the request asked for; else (False, the first
    miss). kind/adj/name are the hero's (``hero_of``); the place must occur in the text
    (case-insensitive), the object as a whole word ("cake" is not in "bake cakes")."""
    unknown = sorted(set(asks) - set(ASK_KEYS))
    if unknown:
        raise ValueError(f"asks: unknown key(s) {', '.join(unknown)}; known: {', '.join(ASK_KEYS)}")
    hero = hero_of(text)
    for key in (k for k in ASK_KEYS if k in asks):
        want = asks[key]
        if key in ("kind", "adj", "name"):
            if hero is None:
                return False, f"asked for {key} {want!r}, but no named hero is introduced"
            if getattr(hero, key) != want:
                return False, f"asked for {key} {want!r}, the hero's is {getattr(hero, key)!r}"
        elif key == "place" and want.lower() not in text.lower():
            return False, f"asked for the place {want!r}, which the story never mentions"
        elif key == "obj" and not re.search(rf"(?<![A-Za-z]){re.escape(want)}(?![A-Za-z])",
                                            text, re.IGNORECASE):
            return False, f"asked for the object {want!r}, which the story never mentions"
    return True, ""


def finished(text: str) -> bool:
    """Does the text end with a complete sentence (a closing quote after it allowed)?"""
    return re.search(r"[.!?][\"']?\s*$", text) is not None


def long_score(texts: list[str], requests: list[C.StoryRequest] | None = None) -> dict:
    """Score long stories: ``score``'s grammatical fraction over all their sentences, the
    fraction that keep their hero, the fraction that honour their request (``requests[i]``
    asked for ``texts[i]``; None when no requests are given), and up to 5 failures with the
    reason. ``unfinished`` counts texts that stop mid-sentence (e.g. cut by the length cap)."""
    if requests is not None and len(requests) != len(texts):
        raise ValueError(f"requests: expected one per text ({len(texts)}), got {len(requests)}")
    grammar = score(texts)
    kept = honoured = 0
    failures: list[dict] = []
    for i, text in enumerate(texts):
        checks = {"hero": hero_kept(text)}
        if requests is not None:
            checks["request"] = request_honoured(text, requests[i].asks)
            honoured += checks["request"][0]
        kept += checks["hero"][0]
        failures += [{"index": i, "check": name, "reason": why}
                     for name, (ok, why) in checks.items() if not ok]
    n = len(texts)
    return {"texts": n, "sentences": grammar["sentences"],
            "grammatical": grammar["grammatical"], "examples_bad": grammar["examples_bad"],
            "hero_kept": kept / n if n else 0.0,
            "request_honoured": (honoured / n if n else 0.0) if requests is not None else None,
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


def measure_long(model_dir: str, kind: str = "diffusion", *, n: int = LONG_REQUESTS,
                 max_new_tokens: int = LONG_NEW_TOKENS) -> dict:
    """Answer ``n`` held-out long-story requests (chat messages, one at a time) and score the
    answers with ``long_score``.

    Diffusion: ``Engine.generate`` with the model's default decoding at gen_length =
    ``max_new_tokens`` (``long_params``); ``forwards`` is the summed NFE, so
    ``tokens_per_forward`` is comparable to bench figures. AR: ``ARBaseline`` greedy with a KV
    cache, one forward per token, so ``forwards`` is None."""
    from celeris import ARBaseline, Engine

    if kind not in ("diffusion", "ar"):
        raise ValueError(f"kind must be 'diffusion' or 'ar', got {kind!r}")
    requests = C.heldout_long_requests(n)
    chats = [[{"role": "user", "content": r.text}] for r in requests]
    if kind == "ar":
        ar = ARBaseline.from_pretrained(str(model_dir), device="cpu")
        results = [ar.generate_batch([chat], max_new_tokens)[0] for chat in chats]
        texts = [r["text"] for r in results]
        tokens, forwards = sum(r["completion_tokens"] for r in results), None
        finish = [r["finish_reason"] for r in results]
        decoding = f"greedy generate, {max_new_tokens} new tokens at most"
    else:
        engine = Engine.from_pretrained(model_dir, device="cpu")
        params = long_params(engine.default_params(), max_new_tokens)
        results = [engine.generate(chat, params) for chat in chats]
        texts = [r.text for r in results]
        tokens = sum(r.usage.completion_tokens for r in results)
        forwards = sum(r.nfe for r in results)
        finish = [str(r.finish_reason) for r in results]
        decoding = (f"{params.decoding}, gen {params.gen_length}, block {params.block_length}, "
                    f"steps {params.steps}, temperature {params.temperature:g}")
    return {**long_score(texts, requests), "requests": n, "decoding": decoding,
            "generated_tokens": tokens, "forwards": forwards,
            "tokens_per_forward": tokens / forwards if forwards else None,
            "finish_reasons": {f: finish.count(f) for f in sorted(set(finish))},
            "samples": texts[:3]}
