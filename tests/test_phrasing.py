"""Free phrasing (issue 52, item 1): ``celeris/synthetic/phrasing.py`` builds story requests the
ways people ask, and its held-out parts never reach training (the stream, the distill prompts),
so the held-out figure measures phrasings a model never trained on."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path

import pytest

from celeris.synthetic import corpus, longcheck, phrasing
from celeris.synthetic.phrasing import PARTS, free_request, heldout_free_requests
from celeris.synthetic.world import _literal_words, known_words, unknown_words
from celeris.train import selfgen, stream

HELD = {p.id for p in PARTS if p.held_out}


def _parts(request) -> set[str]:
    return set(request.form.split("+"))


def test_part_ids_are_unique_and_every_kind_of_part_has_held_out_ones():
    assert len({p.id for p in PARTS}) == len(PARTS)
    for group in (phrasing.OPENINGS, phrasing.HEROES, phrasing.PLACE_DETAILS,
                  phrasing.OBJECT_DETAILS, phrasing.BOTH_DETAILS, phrasing.ADJ_SENTENCES,
                  phrasing.NAME_SENTENCES):
        assert any(p.held_out for p in group) and any(not p.held_out for p in group)


def test_held_out_requests_are_fixed_distinct_and_each_holds_a_held_out_part():
    held = heldout_free_requests(120)
    assert [r.text for r in held] == [r.text for r in heldout_free_requests(120)]
    assert len({r.text for r in held}) == 120
    assert all(_parts(r) & HELD for r in held)
    # they are rich: most ask for three details or more, every field is asked often
    assert sum(len(r.asks) >= 3 for r in held) >= 0.6 * len(held)
    asked = {k: sum(k in r.asks for r in held) for k in ("kind", "adj", "name", "place", "obj")}
    assert min(asked.values()) >= 20, asked


def test_held_out_parts_never_reach_training():
    held_texts = {r.text for r in heldout_free_requests(200)}
    rng = random.Random(0)
    train = [free_request(rng, "train") for _ in range(1500)]
    assert not any(_parts(r) & HELD for r in train)
    assert not {r.text for r in train} & held_texts
    assert all(corpus.request_split(r.text) == "train" for r in train)
    # the training stream with every long request phrased freely
    s = stream.Stream(seed=3, mix=replace(stream.Mix.from_weights({"longreq": 1, "reqhead": 1}),
                                          free_share=1.0))
    texts = [s.item(src).messages[0][1] for src in ("longreq", "reqhead") for _ in range(300)]
    assert not set(texts) & held_texts
    # the self-distillation prompts
    prompts = selfgen.prompts(300, 0, seed=1, free=1.0)
    assert all(not _parts(spec) & HELD for _, _, spec in prompts)
    assert not {text for _, text, _ in prompts} & held_texts


def test_held_out_parts_use_only_words_training_requests_or_stories_use():
    def words(parts):
        return {w.lower() for p in parts for w in re.findall(r"[A-Za-z]+",
                                                             re.sub(r"\{\w+\}", "", p.text))}
    train_words = words(p for p in PARTS if not p.held_out)
    corpus_words = _literal_words(Path(corpus.__file__).read_text(encoding="utf-8"))
    assert words(p for p in PARTS if p.held_out) <= corpus_words | train_words
    assert train_words <= known_words()
    assert all(unknown_words(r.text) == [] for r in heldout_free_requests(100))


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_request_names_what_it_asks_and_its_story_honours_it(split):
    rng = random.Random(7)
    for _ in range(80):
        r = free_request(rng, split)
        low = r.text.lower()
        for field, value in r.asks.items():
            assert value.lower() in low, (field, value, r.text)
        assert longcheck.request_honoured(r.story, r.asks) == (True, ""), r.text
        assert corpus.story_split(r.story) == split


def test_requests_read_as_sentences():
    rng = random.Random(11)
    for _ in range(300):
        text = free_request(rng, "train").text
        assert "  " not in text and " ," not in text and "who who" not in text
        assert not re.search(r"\bwho \w+ [^.?!]* who ", text), text    # "and" joins clauses
        if text.lower().startswith(("can you", "could you")):
            assert text.split(". ")[0].rstrip(".").endswith("?") or "?" in text


def test_a_split_outside_train_and_eval_is_refused():
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        free_request(random.Random(0), "test")


def test_the_free_setting_is_a_share_and_relabelling_leaves_free_requests_alone():
    assert stream.check_free(None) == 0.0 and stream.check_free(0.5) == 0.5
    for bad in (1.5, -0.1, True, "half"):
        with pytest.raises(ValueError, match=r"free must be a share in \[0, 1\]"):
            stream.check_free(bad)
    r = free_request(random.Random(2), "train")
    assert selfgen.relabel(r.story, r) is None          # its form names parts, not a sentence
    old = corpus.long_request(random.Random(2), "train")
    assert selfgen.relabel(old.story, old) is not None


def test_the_stream_draws_free_requests_only_when_asked():
    def corpus_form(text):
        return any(re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", re.escape(f)), text)
                   for _, f in corpus.LONG_REQUEST_FORMS)
    mix = stream.Mix.from_weights({"longreq": 1})
    assert stream.Mix().free_share == 0.0
    s = stream.Stream(seed=5, mix=mix)
    assert all(corpus_form(s.item("longreq").messages[0][1]) for _ in range(50))
    s = stream.Stream(seed=5, mix=replace(mix, free_share=1.0))
    free = [s.item("longreq").messages[0][1] for _ in range(50)]
    assert len(set(free)) >= 45 and sum(map(corpus_form, free)) <= 10
