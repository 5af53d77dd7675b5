"""The demo world made visible (issue 52, item 5): ``celeris/synthetic/world.py``'s
description, story builder and unknown-word detector, and the server's
``celeris.unknown_words`` field (present for a shipped celeris model, absent for another
family)."""

from __future__ import annotations

import random

import httpx
import pytest

import celeris
from celeris.server import create_app
from celeris.synthetic import corpus, phrasing, tasks
from celeris.synthetic.world import (builder_request, known_words, prompt_unknown_words,
                                     unknown_words, world, world_markdown)
from tests.live_server import live_server
from tests.test_families import write_family


def test_world_lists_the_grammar_tables_themselves():
    w = world()
    assert w["kinds"] == list(corpus.KINDS) and w["objects"] == list(corpus.OBJECTS)
    assert w["names_she"] + w["names_he"] == list(corpus.NAMES_SHE + corpus.NAMES_HE)
    assert w["places"] == list(corpus.PLACES) and w["tasks"] == list(tasks.TASKS)
    text = world_markdown()
    assert "**kinds**: girl, boy" in text and "in the forest" in text and "Luna" in text


def test_builder_writes_every_picked_detail_in_training_parts():
    assert builder_request("fox", "Tom") == "Tell me a story about a fox named Tom."
    assert builder_request("cat", "Luna", "shy") == "Tell me a story about a shy cat named Luna."
    assert builder_request("owl", place="in the forest") == \
        "Tell me a story about an owl who lives in the forest."
    assert builder_request("dog", obj="kite") == "Tell me a story about a dog who finds a kite."
    assert builder_request(name="Mia") == "Tell me a story about Mia."
    assert builder_request(place="in the forest", obj="key") == \
        "Tell me a story set in the forest with a key in it."
    assert builder_request() == builder_request(adj="shy") == "Tell me a story."
    text = builder_request("fox", "Tom", "brave", "key", "by the sea")
    assert text == ("Tell me a story about a brave fox named Tom who lives by the sea and "
                    "finds a key.")
    assert unknown_words(text) == []
    # every request the builder writes is one the free-phrasing grammar trains on: its
    # parts are training parts, and what it asks is what was picked
    picks = {"kind": "fox", "name": "Tom", "adj": "brave", "obj": "key", "place": "by the sea"}
    text, asks = phrasing.compose(picks)
    assert asks == picks and text == builder_request(**picks)
    training = {p.text for p in phrasing.PARTS if not p.held_out}
    assert {"about {a_adj_kind} named {name}", "who lives {place} and finds {a_obj}"} <= training


def test_every_word_the_grammar_and_the_tasks_write_is_known():
    rng = random.Random(7)
    texts = [corpus.story(rng) for _ in range(200)]
    texts += [" ".join(corpus.story_request(rng)) for _ in range(100)]
    texts += [corpus.long_request(rng).story for _ in range(10)]
    texts += [tasks.random_prompt(t, rng) for t in tasks.TASKS for _ in range(5)]
    assert [w for t in texts for w in unknown_words(t)] == []
    assert {"fox", "luna", "castle", "kite", "sort", "add", "tell", "story"} <= known_words()


def test_invented_words_emoji_and_non_ascii_are_named_once_in_order():
    text = "Tell me a STORY about a brave owl named Pip who spots a zorblax 🦉 at the café, zorblax!"
    assert unknown_words(text) == ["spots", "zorblax", "🦉", "café", "é"]
    assert unknown_words("Can you make up a tale about an owl who finds a key?") == []
    assert unknown_words("Fox, fox! sort: 4 1 9 2 (add: 47 + 85)") == []
    assert unknown_words("mail me @ once #1") == ["mail", "@", "#"]
    assert unknown_words("") == []
    chat = [{"role": "system", "content": "be kind"},
            {"role": "assistant", "content": "qwerty"},     # the model's own words: not read
            {"role": "user", "content": "Tell me about a unicorn"}]
    assert prompt_unknown_words(chat) == ["unicorn"]
    assert prompt_unknown_words([1, 2, 3]) == []


# ------------------------------------------------------------------------------ the server
def _post(base: str, body: dict) -> dict:
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_server_names_unknown_words_for_the_shipped_model_only(tmp_path):
    from celeris.engine import DEFAULT_MODEL

    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.skip(f"needs the shipped model at {DEFAULT_MODEL}")
    shipped = celeris.Engine.from_pretrained(None, device="cpu")
    try:
        with live_server(create_app(shipped)) as base:
            body = {"messages": [{"role": "user", "content": "Tell me a story about a "
                                  "unicorn named Zed 🦄"}], "max_tokens": 8}
            out = _post(base, body)
            assert out["celeris"]["unknown_words"] == ["unicorn", "zed", "🦄"]
            assert out["celeris"]["nfe"] >= 1                       # the stats stay
            body["messages"][0]["content"] = "Tell me a story about a fox named Tom."
            assert _post(base, body)["celeris"]["unknown_words"] == []
            r = httpx.post(f"{base}/v1/completions", timeout=60,
                           json={"prompt": "Once upon a time a grumpy yeti", "max_tokens": 8})
            assert r.json()["celeris"]["unknown_words"] == ["yeti"]
    finally:
        shipped.stop()
    other = celeris.Engine.from_pretrained(write_family(tmp_path / "llada2", "llada2"),
                                           device="cpu")
    assert other.family.name != "celeris"
    try:
        with live_server(create_app(other)) as base:
            r = httpx.post(f"{base}/v1/completions", timeout=60,
                           json={"prompt": "a unicorn 🦄", "max_tokens": 4, "temperature": 0.0})
            assert r.status_code == 200, r.text
            out = r.json()
            assert "unknown_words" not in out["celeris"] and "nfe" in out["celeris"]
    finally:
        other.stop()
