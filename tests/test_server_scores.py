"""Scores, samples and suffixes on the OpenAI endpoints: ``logprobs`` (both shapes), ``n`` and
``best_of``, batched prompts, ``echo`` (scoring a text), ``suffix``; driven by the official
``openai`` package over real HTTP against the shipped models."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

import celeris
from celeris.server import create_app
from tests.live_server import live_server

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Write a story about a cat named Luna."


@pytest.fixture(scope="module")
def engine():
    engine = celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd", device="cpu")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def url(engine):
    with live_server(create_app(engine)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=120)


# ----------------------------------------------------------------------- logprobs
def test_completion_logprobs_are_the_engines_in_openais_shape(client, engine):
    params = engine.default_params().replace(gen_length=24, seed=5, logprobs=2)
    want = engine.generate(PROMPT, params)
    got = client.completions.create(model=engine.model_dir.name, prompt=PROMPT, max_tokens=24,
                                    seed=5, logprobs=2, temperature=0)
    choice = got.choices[0]
    assert choice.text == want.text
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        len(lp.text_offset) == len(want.token_ids)
    assert lp.tokens == engine.token_strings(want.token_ids)
    assert lp.token_logprobs == pytest.approx([t.logprob for t in want.logprobs], abs=1e-4)
    for top, mine, entry in zip(lp.top_logprobs, lp.token_logprobs, want.logprobs):
        assert len(top) <= 2 and max(top.values()) >= mine - 1e-6
        assert sorted(top.values()) == pytest.approx(sorted(v for _, v in entry.top), abs=1e-4)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(v <= 0 for v in lp.token_logprobs)


def test_chat_logprobs_carry_tokens_bytes_and_top_lists(client, engine):
    got = client.chat.completions.create(
        model=engine.model_dir.name, messages=[{"role": "user", "content": PROMPT}],
        max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert content and "".join(t.token for t in content).strip() == \
        got.choices[0].message.content.strip()
    for t in content:
        assert t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.logprob - 1e-6
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True)


def test_logprobs_of_a_row_alone_equal_the_same_row_in_a_batch(engine):
    p = engine.default_params().replace(gen_length=24, logprobs=3)
    alone = engine.generate(PROMPT, p)
    batch = engine.generate_batch([PROMPT, "Tell me a tale of a dog.", "Write a poem."],
                                  [p, p.replace(logprobs=None), p.replace(temperature=0.7,
                                                                          seed=2)])
    assert batch[0].token_ids == alone.token_ids
    assert [t.token for t in batch[0].logprobs] == [t.token for t in alone.logprobs]
    assert [t.logprob for t in batch[0].logprobs] == pytest.approx(
        [t.logprob for t in alone.logprobs], abs=1e-4)
    assert [[i for i, _ in t.top] for t in batch[0].logprobs] == \
        [[i for i, _ in t.top] for t in alone.logprobs]
    assert batch[1].logprobs is None and alone.to_dict()["logprobs"][0]["token"] == \
        alone.token_ids[0]


# ----------------------------------------------------------------------- n, best_of, batches
def test_n_samples_are_distinct_seeded_and_summed_in_usage(client, engine):
    ask = dict(model=engine.model_dir.name, prompt=PROMPT, max_tokens=24, temperature=0.8,
               seed=11)
    got = client.completions.create(n=3, **ask)
    texts = [c.text for c in sorted(got.choices, key=lambda c: c.index)]
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert len(set(texts)) == 3
    again = client.completions.create(n=3, **ask)
    assert [c.text for c in again.choices] == texts          # sample i: seed + i
    singles = [client.completions.create(**{**ask, "seed": 11 + i}) for i in range(3)]
    assert [s.choices[0].text for s in singles] == texts
    assert got.usage.prompt_tokens == singles[0].usage.prompt_tokens      # counted once
    assert got.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_batched_prompts_give_one_choice_per_prompt_and_sample(client, engine):
    prompts = [PROMPT, "Tell me a tale of a dog."]
    got = client.completions.create(model=engine.model_dir.name, prompt=prompts, n=2,
                                    max_tokens=16, temperature=0)
    assert sorted(c.index for c in got.choices) == [0, 1, 2, 3]
    by = {c.index: c.text for c in got.choices}
    for p, prompt in enumerate(prompts):
        alone = client.completions.create(model=engine.model_dir.name, prompt=prompt,
                                          max_tokens=16, temperature=0)
        assert by[2 * p] == by[2 * p + 1] == alone.choices[0].text     # T = 0: greedy
    ids = [engine.tokenizer.encode(p) for p in prompts]
    as_ids = client.completions.create(model=engine.model_dir.name, prompt=ids, max_tokens=16,
                                       temperature=0)
    assert [c.text for c in sorted(as_ids.choices, key=lambda c: c.index)] == [by[0], by[2]]
    single = sum(client.completions.create(model=engine.model_dir.name, prompt=p,
                                           max_tokens=1).usage.prompt_tokens for p in prompts)
    assert got.usage.prompt_tokens == single


def test_best_of_keeps_the_sample_with_the_best_mean_logprob(client, engine):
    ask = dict(model=engine.model_dir.name, prompt=PROMPT, max_tokens=24, temperature=1.0,
               seed=3)
    every = client.completions.create(n=3, logprobs=0, **ask)
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs)
             for c in every.choices]
    best = client.completions.create(best_of=3, **ask)
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    assert best.choices[0].text == every.choices[means.index(max(means))].text
    assert best.usage.completion_tokens == every.usage.completion_tokens


def test_streamed_choices_reassemble_to_the_same_answers(url, client, engine):
    ask = dict(model=engine.model_dir.name, prompt=PROMPT, max_tokens=24, temperature=0.8,
               seed=21, n=2)
    whole = client.completions.create(**ask)
    parts, finish, logprobs = {0: "", 1: ""}, {}, {}
    for chunk in client.completions.create(stream=True, logprobs=1, **ask):
        for c in chunk.choices:
            parts[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
                logprobs[c.index] = c.logprobs
    assert parts == {c.index: c.text for c in whole.choices}
    assert set(finish) == {0, 1}
    for i in (0, 1):
        assert "".join(logprobs[i].tokens) == parts[i]


# ----------------------------------------------------------------------- echo: scoring a text
def test_echo_scores_the_prompt_as_the_engine_does(client, engine):
    text = "Luna was a shy cat who lived in the garden."
    got = client.completions.create(model=engine.model_dir.name, prompt=text, max_tokens=0,
                                    echo=True, logprobs=1)
    choice = got.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    ids = engine.prompt_ids(text)
    want = engine.score(ids, top=1)
    lp = choice.logprobs
    assert lp.tokens == engine.token_strings(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([w.logprob for w in want[1:]], abs=1e-5)
    assert got.usage.prompt_tokens == len(ids) and got.usage.completion_tokens == 0


def test_echo_with_one_token_scores_the_prompt_then_the_answer(client, engine):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 1."""
    ids = engine.prompt_ids("Mia found a red kite")
    got = client.completions.create(model=engine.model_dir.name, prompt=ids, max_tokens=1,
                                    echo=True, logprobs=1, temperature=0)
    lp = got.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1
    assert got.choices[0].text.startswith(engine.tokenizer.decode(ids))
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(
        [w.logprob for w in engine.score(ids)[1:]], abs=1e-5)


def test_a_likelier_text_scores_higher(client, engine):
    def total(text):
        got = client.completions.create(model=engine.model_dir.name, prompt=text,
                                        max_tokens=0, echo=True, logprobs=0)
        return sum(got.choices[0].logprobs.token_logprobs[1:])
    assert total("Luna was a shy cat.") > total("cat shy a was Luna.")


# ----------------------------------------------------------------------- suffix
def test_suffix_fills_the_gap_and_is_not_repeated(engine):
    canvas = celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny", device="cpu")
    try:
        with live_server(create_app(canvas)) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
            suffix = " She was happy."
            got = client.completions.create(model=canvas.model_dir.name,
                                            prompt="Luna was a shy cat.", suffix=suffix,
                                            max_tokens=12, temperature=0)
            text = got.choices[0].text
            assert text.strip() and suffix.strip() not in text
            assert len(canvas.tokenizer.encode(text, add_special_tokens=False)) <= 12
            want = canvas.infill_text("Luna was a shy cat.[MASK]" + suffix, span=12)
            assert want.startswith("Luna was a shy cat." + text.rstrip())
    finally:
        canvas.stop()


def test_a_block_causal_model_refuses_suffix_by_name(url):
    r = post(url, "/v1/completions", {"prompt": "Luna", "suffix": " end.", "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "left to right" in r.json()["error"]["message"] or \
        "block" in r.json()["error"]["message"]


# ----------------------------------------------------------------------- refusals
@pytest.mark.parametrize("path,body,param,fragment", [
    ("/v1/completions", {"n": 0}, "n", "n must be in [1, 64], got 0"),
    ("/v1/completions", {"n": 65}, "n", "n must be in [1, 64], got 65"),
    ("/v1/completions", {"n": 3, "best_of": 2}, "best_of", "best_of must be in [3, 64]"),
    ("/v1/completions", {"logprobs": 21}, "logprobs", "logprobs must be in [0, 20]"),
    ("/v1/completions", {"best_of": 2, "stream": True}, "best_of", "cannot be streamed"),
    ("/v1/completions", {"echo": True, "max_tokens": 0, "stream": True}, "max_tokens",
     "cannot be streamed"),
    ("/v1/completions", {"echo": True, "suffix": "x"}, "suffix", "echo"),
    ("/v1/completions", {"prompt": ["a"] * 65, "n": 2}, "n", "at most 128"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs",
     "[0, 20]"),
])
def test_out_of_range_requests_name_the_field(url, path, body, param, fragment):
    base = {"prompt": "Luna"} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": "Luna"}]}
    r = post(url, path, {**base, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and fragment in error["message"], error
    assert "Traceback" not in r.text


def test_the_api_tabs_logprobs_snippet_runs_against_the_server(url, engine, capsys):
    from ui.api_tab import snippets

    code = snippets(url, engine.model_dir.name, key_required=False)["logprobs"]
    exec(compile(code, "snippet", "exec"), {})               # the copy-paste example, as is
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("total: -") and float(lines[-1].split()[1]) < 0
    assert len(lines) >= 2 and all("[" in line for line in lines[:-1])


def test_the_canvas_confidences_are_the_logprobs_the_api_returns(engine):
    """The playground draws each committed cell's confidence from the step's StepEvent: for
    the default remasking (low_confidence) it is exp(logprob) of the same token."""
    import math

    params = engine.default_params().replace(gen_length=24, logprobs=0)
    confidence, result = {}, None
    for item in engine.stream(PROMPT, params):
        if isinstance(item, celeris.GenerationResult):
            result = item
        else:
            confidence.update(zip(item.committed, item.confidences))
    assert params.remasking == "low_confidence" and result.logprobs
    for i, entry in enumerate(result.logprobs):
        assert math.exp(entry.logprob) == pytest.approx(confidence[i], abs=1e-5), i
