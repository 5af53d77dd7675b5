"""ARBaseline: the autoregressive twin run by transformers' own generate() (greedy, KV cache)."""

from __future__ import annotations

import pytest
import torch

from celeris import ARBaseline
from tests.test_bench_fixture import tiny_ar_dir, tiny_model_dir

PROMPTS = ["copy: 1 2 3", [{"role": "user", "content": "sort: 41 7 93 2 5 88"}]]


@pytest.fixture(scope="module")
def ar(tmp_path_factory):
    root = tmp_path_factory.mktemp("ar")
    return ARBaseline.from_pretrained(tiny_ar_dir(root / "ar", tiny_model_dir(root / "m")))


def _greedy_without_cache(ar: ARBaseline, prompt, n: int) -> list[int]:
    ids = torch.tensor([ar.encode(prompt)])
    out = []
    with torch.inference_mode():
        for _ in range(n):
            nxt = int(ar.model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_batch_with_left_padding_equals_plain_greedy_per_prompt(ar):
    results = ar.generate_batch(PROMPTS, max_new_tokens=6)
    for prompt, res in zip(PROMPTS, results):
        expected, finish = ar.answer(_greedy_without_cache(ar, prompt, 6))
        assert res["token_ids"] == expected
        assert res["completion_tokens"] == len(expected)
        assert res["finish_reason"] == finish
        assert res["elapsed_s"] > 0


def test_chat_messages_go_through_the_chat_template(ar):
    messages = PROMPTS[1]
    text = ar.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>")
    assert ar.encode(messages) == list(ar.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_generation_is_cut_before_the_first_stop_token(ar):
    free = ar.generate_batch([PROMPTS[0]], max_new_tokens=8)[0]
    stop_token = free["token_ids"][3]
    cut = free["token_ids"].index(stop_token)
    ar.stop_ids = (stop_token,)
    try:
        res = ar.generate_batch([PROMPTS[0]], max_new_tokens=8)[0]
    finally:
        ar.stop_ids = ar.__class__(ar.model, ar.tokenizer, ar.path).stop_ids
    assert res["token_ids"] == free["token_ids"][:cut]
    assert res["completion_tokens"] == cut and res["finish_reason"] == "stop"


def test_without_a_stop_token_every_new_token_counts(ar):
    res = ar.generate_batch([PROMPTS[0]], max_new_tokens=5)[0]
    if res["finish_reason"] == "length":
        assert res["completion_tokens"] == 5


def test_stream_yields_growing_prefixes_and_ends_like_generate(ar):
    events = list(ar.stream(PROMPTS[1], max_new_tokens=6))
    final = ar.generate_batch([PROMPTS[1]], max_new_tokens=6)[0]
    assert events[-1]["done"] and not any(e["done"] for e in events[:-1])
    assert events[-1]["text"] == final["text"]
    assert events[-1]["tokens"] == final["completion_tokens"]
    counts = [e["tokens"] for e in events]
    assert counts == sorted(counts) and len(events) >= 2
    elapsed = [e["elapsed"] for e in events]
    assert elapsed == sorted(elapsed)


def test_closing_the_stream_early_stops_the_worker(ar):
    it = ar.stream(PROMPTS[0], max_new_tokens=200)
    first = next(it)
    it.close()
    assert first["tokens"] >= 1 and not first["done"]


def test_bad_max_new_tokens_is_a_value_error(ar):
    with pytest.raises(ValueError, match="max_new_tokens"):
        ar.generate_batch(["x"], max_new_tokens=0)


def test_missing_model_names_the_path(tmp_path):
    from celeris import ModelLoadError

    with pytest.raises(ModelLoadError, match="no autoregressive model"):
        ARBaseline.from_pretrained(tmp_path / "nope")
