"""The OpenAI-compatible server, driven by the official ``openai`` package over real HTTP."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import celeris
from celeris.server import create_app
from tests.live_server import live_server, slow_down
from tests.tiny_model import make_tiny_model_dir

KEY = "test-key-123"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), shift_logits=True)


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def url(engine):
    with live_server(create_app(engine, api_key=KEY)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def name(engine):
    return engine.model_dir.name


def sse_lines(url, body):
    """(event, data) pairs of a raw streamed completion."""
    out, event = [], None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, line[6:]))
                event = None
    return out


def test_models_lists_the_served_model(client, name, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [name]
    card = client.models.retrieve(name)
    assert card.id == name and card.context_length == 256


def test_completion_equals_the_engine_result(client, name, engine):
    out = client.completions.create(model=name, prompt="hello there", max_tokens=16,
                                    temperature=0.7, seed=3)
    expected = engine.generate("hello there", engine.default_params().replace(
        gen_length=16, temperature=0.7, seed=3))
    assert out.object == "text_completion"
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == str(expected.finish_reason)
    assert out.usage.completion_tokens == expected.usage.completion_tokens
    assert out.usage.prompt_tokens == expected.usage.prompt_tokens


def test_chat_completion_goes_through_the_chat_template(client, name, engine):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    out = client.chat.completions.create(model=name, messages=messages, max_tokens=8, seed=1,
                                         temperature=0.5)
    expected = engine.generate(messages, engine.default_params().replace(
        gen_length=8, block_length=8, temperature=0.5, seed=1))
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens == len(engine.tokenizer.encode_chat(messages))


def test_streamed_chat_concatenates_to_the_full_text_and_reports_usage(client, name):
    kwargs = dict(model=name, messages=[{"role": "user", "content": "tell me"}],
                  max_tokens=24, temperature=0.9, seed=11,
                  extra_body={"block_length": 8, "suppress_eos": True})
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_deltas_are_append_only_and_never_split_a_character(url, engine):
    body = {"prompt": "café λ 日本語", "max_tokens": 48, "temperature": 1.0, "seed": 5,
            "stream": True, "suppress_eos": True, "block_length": 8, "stop": ["xx"]}
    events = sse_lines(url, body)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    deltas = [c["choices"][0]["text"] for c in chunks]
    full = httpx.post(f"{url}/v1/completions", json={**body, "stream": False},
                      headers={"Authorization": f"Bearer {KEY}"}).json()
    assert "".join(deltas) == full["choices"][0]["text"]
    assert all(not d.endswith("\ufffd") for d in deltas[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_extra_body_knobs_reach_the_sampler(client, name, engine):
    knobs = {"steps": 4, "block_length": 8, "decoding": "fixed", "remasking": "margin",
             "cache": "prefix", "suppress_eos": True}
    out = client.completions.create(model=name, prompt="knobs", max_tokens=16, seed=2,
                                    temperature=0.4, extra_body=knobs)
    assert out.model_extra["celeris"]["nfe"] == 4
    expected = engine.generate("knobs", engine.default_params().replace(
        gen_length=16, seed=2, temperature=0.4, **knobs))
    assert out.choices[0].text == expected.text


def test_denoise_events_stream_canvas_snapshots_when_asked(url):
    body = {"prompt": "draw", "max_tokens": 16, "stream": True, "block_length": 8,
            "celeris_denoise_events": True, "suppress_eos": True}
    events = sse_lines(url, body)
    snaps = [json.loads(d) for e, d in events if e == "celeris.denoise"]
    assert len(snaps) == 16 and [s["step"] for s in snaps] == list(range(1, 17))
    assert all(len(s["canvas"]) == 16 and s["choices"] == [] for s in snaps)
    assert snaps[-1]["canvas"].count(snaps[-1]["mask_id"]) == 0
    assert snaps[0]["canvas"].count(snaps[0]["mask_id"]) == 15
    plain = sse_lines(url, {**body, "celeris_denoise_events": False})
    assert not [e for e, _ in plain if e]


def test_sixteen_concurrent_requests_each_equal_their_solo_run(client, name):
    def ask(seed):
        out = client.completions.create(model=name, prompt=f"story {seed % 3}", max_tokens=8,
                                        temperature=0.9, seed=seed)
        return out.choices[0].text, out.usage.completion_tokens

    alone = [ask(seed) for seed in range(16)]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, range(16)))
    assert together == alone
    assert len(set(alone)) > 1   # the seeds matter


def test_overload_refuses_exactly_the_excess_with_429_and_metrics_stay_within_caps(
        model_dir, name):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu", max_running=2,
                                            max_queue=2)
    slow_down(engine, 0.01)
    try:
        with live_server(create_app(engine)) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
            peaks, stop = {"celeris_running_requests": 0, "celeris_queue_depth": 0}, \
                threading.Event()

            def watch():
                while not stop.is_set():
                    for line in httpx.get(f"{base}/metrics").text.splitlines():
                        key, _, value = line.partition(" ")
                        if key in peaks:
                            peaks[key] = max(peaks[key], float(value))
                    time.sleep(0.01)

            def ask(i):
                start = time.perf_counter()
                try:
                    out = client.completions.create(
                        model=name, prompt=f"p{i}", max_tokens=32, seed=i,
                        extra_body={"suppress_eos": True, "block_length": 8})
                    return "ok", out.usage.completion_tokens, time.perf_counter() - start
                except openai.RateLimitError as exc:
                    assert exc.response.headers["retry-after"].isdigit()
                    assert exc.body["code"] == "engine_overloaded"
                    return "429", 0, time.perf_counter() - start

            watcher = threading.Thread(target=watch)
            watcher.start()
            with ThreadPoolExecutor(10) as pool:
                outcomes = list(pool.map(ask, range(10)))
            stop.set()
            watcher.join()
    finally:
        engine.stop()
    refused = [o for o in outcomes if o[0] == "429"]
    served = [o for o in outcomes if o[0] == "ok"]
    assert len(refused) == 6 and len(served) == 4
    assert all(o[1] == 32 for o in served)
    assert max(o[2] for o in refused) < min(o[2] for o in served)   # refused at once
    assert 0 < peaks["celeris_running_requests"] <= 2
    assert peaks["celeris_queue_depth"] <= 2


# ---------------------------------------------------------------------- the default model
def test_the_default_block_diffusion_model_serves_completions_and_chat():
    """No --model: the shipped block-diffusion model; its id is its folder name, max_tokens a
    cap (not a multiple of its block), and a block length that does not divide its block size
    is refused with 400 naming it. Answers equal the engine's own (greedy defaults)."""
    from celeris.engine import DEFAULT_MODEL

    if not (DEFAULT_MODEL / "config.json").is_file():
        pytest.skip(f"needs the shipped model at {DEFAULT_MODEL}")
    engine = celeris.Engine.from_pretrained(None, device="cpu")
    assert engine.block_causal
    size, defaults = engine.block_size, engine.default_params()
    try:
        with live_server(create_app(engine)) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
            assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL.name]
            cap = size + 3
            out = client.completions.create(model=DEFAULT_MODEL.name, prompt="Once upon a time",
                                            max_tokens=cap)
            expected = engine.generate("Once upon a time", defaults.replace(gen_length=cap))
            assert out.choices[0].text == expected.text
            assert out.usage.completion_tokens == expected.usage.completion_tokens <= cap
            messages = [{"role": "user", "content": "sort: 3 1 2"}]
            chat = client.chat.completions.create(model=DEFAULT_MODEL.name, messages=messages,
                                                  max_tokens=16)
            expected = engine.generate(messages, defaults.replace(gen_length=16))
            assert chat.choices[0].message.content == expected.text
            with pytest.raises(openai.BadRequestError, match=f"block size {size}"):
                client.completions.create(model=DEFAULT_MODEL.name, prompt="hi", max_tokens=8,
                                          extra_body={"block_length": 2 * size})
    finally:
        engine.stop()
