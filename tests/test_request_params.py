"""max_tokens is a cap with OpenAI's meaning, mapped by one function for /v1, batch and bench.

The two end-to-end tests at the bottom need the engine to accept a gen_length that is not a
multiple of block_length (the canvas rounded up to whole blocks inside the engine, the answer
cut at gen_length with finish_reason "length").
"""

from __future__ import annotations

import json

import httpx
import pytest

import celeris
from celeris import GenerationParams, cli
from celeris.batch.jobs import resolve_params
from celeris.request_params import max_tokens, request_params, scaled_steps
from celeris.server import create_app
from celeris.server.bodies import generation_params
from celeris.server.protocol import ChatCompletionRequest, CompletionRequest
from tests.live_server import live_server
from tests.tiny_model import make_tiny_model_dir

CAPPED = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0,
          "suppress_eos": True}
DEFAULTS = GenerationParams(gen_length=64, block_length=32, steps=64)


def test_max_tokens_becomes_gen_length_unrounded():
    assert request_params({"max_tokens": 96}, DEFAULTS).gen_length == 96
    assert request_params({"max_completion_tokens": 32}, DEFAULTS).gen_length == 32
    assert request_params({}, DEFAULTS) == DEFAULTS


def test_the_two_spellings_must_agree():
    assert max_tokens({"max_tokens": 8, "max_completion_tokens": 8}) == 8
    with pytest.raises(ValueError, match=r"max_completion_tokens \(16\) differs from "
                                         r"max_tokens \(8\)"):
        request_params({"max_tokens": 8, "max_completion_tokens": 16}, DEFAULTS)
    with pytest.raises(ValueError, match=r"max_tokens must be in \[1, 4096\], got 0; prompt \+ "
                                         r"max_tokens must also fit the model.s context"):
        request_params({"max_tokens": 0}, DEFAULTS)
    with pytest.raises(ValueError, match="max_completion_tokens must be an integer"):
        request_params({"max_completion_tokens": 2.5}, DEFAULTS)


def test_default_steps_scale_with_the_cap_and_fit_whole_blocks():
    assert request_params({"max_tokens": 128}, DEFAULTS).steps == 128     # one token a step
    half = GenerationParams(gen_length=64, block_length=32, steps=32)
    assert request_params({"max_tokens": 128}, half).steps == 64          # two tokens a step
    assert scaled_steps(DEFAULTS, 5, 32) == 5                             # 1 block, <= 5
    assert scaled_steps(half, 100, 32) == 48                              # 4 blocks x 12
    assert scaled_steps(GenerationParams(), 100, 32) is None              # defaults: none
    assert request_params({"max_tokens": 64, "steps": 2}, DEFAULTS).steps == 2


def test_server_batch_and_bench_map_a_request_identically():
    bodies = [{"max_tokens": 96, "temperature": 0.5, "seed": 3},
              {"max_tokens": 32, "block_length": 8, "stop": "x", "seed": 1},
              {"seed": 2, "decoding": "threshold", "threshold": 0.8}]
    for body in bodies:
        server = generation_params(CompletionRequest.model_validate({"prompt": "p", **body}),
                                   DEFAULTS)
        batch = resolve_params(body, DEFAULTS, "id")
        bench = request_params(body, DEFAULTS)
        assert server == batch == bench
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "p"}], "max_completion_tokens": 96})
    assert generation_params(chat, DEFAULTS).gen_length == 96


# ----------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("cap"))   # block_length 8


def test_max_tokens_5_gives_exactly_5_tokens_over_http(model_dir):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu")
    try:
        with live_server(create_app(engine)) as url:
            out = httpx.post(f"{url}/v1/completions", json=CAPPED, timeout=60)
    finally:
        engine.stop()
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def test_max_tokens_5_gives_exactly_5_tokens_in_a_batch_job(model_dir, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "cap", **CAPPED}) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["batch", str(src), "--output", str(out), "--model", str(model_dir),
                     "--device", "cpu"]) == 0
    body = json.loads(out.read_text())["response"]["body"]
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def test_block_causal_steps_are_per_block_and_refused_in_those_terms():
    from celeris.request_params import request_params
    base = GenerationParams(gen_length=256, block_length=4, steps=None)
    p = request_params({"steps": 2}, base, block_causal=True)
    assert p.steps == 2 * 64 and p.steps_per_block == 2          # 64 sub-blocks of 4 under the cap
    assert request_params({"steps": 4, "max_tokens": 10}, base, True).steps_per_block == 4
    with pytest.raises(ValueError, match=r"steps is per block for a block-causal model: it "
                                         r"must be in \[1, 4\] \(the block_length\), got 8"):
        request_params({"steps": 8}, base, block_causal=True)
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        request_params({"steps": 4}, base)                         # full attention: total steps


def test_the_server_takes_steps_per_block_from_a_block_model(tmp_path):
    model = make_tiny_model_dir(tmp_path / "bd", attention="block_causal", block_size=4,
                                generation_defaults={"gen_length": 64})
    engine = celeris.Engine.from_pretrained(model, device="cpu")
    with live_server(create_app(engine, warmup=False)) as url:
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "steps": 4,
                                                        "max_tokens": 12, "suppress_eos": True})
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "steps": 5})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 12
    assert bad.status_code == 400 and "steps is per block" in bad.json()["error"]["message"]
