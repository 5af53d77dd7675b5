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


STEPS_5_OVER_3_BLOCKS = ("steps must be 0 (one token a step) or a multiple of the number of "
                         "blocks (3 = gen_length 12 / block_length 4, rounded up) and at most "
                         "12: it counts denoising steps over the whole answer; got 5")


def test_steps_mean_steps_over_the_answer_for_a_block_causal_model_too():
    base = GenerationParams(gen_length=256, block_length=4, steps=None)
    p = request_params({"steps": 128}, base)
    assert p.steps == 128 and p.steps_per_block == 2             # 64 sub-blocks of 4
    assert request_params({"steps": 0}, base).steps is None      # 0 = one token a step
    with pytest.raises(ValueError) as exc:
        request_params({"steps": 5, "max_tokens": 12}, base)
    assert str(exc.value) == STEPS_5_OVER_3_BLOCKS


def test_steps_read_and_refuse_the_same_on_api_cli_and_batch(tmp_path, capsys):
    """One meaning and one message for steps on a block-causal model: the API, a real CLI
    subprocess and a batch line refuse steps 5 over 3 blocks with the same sentence, and take
    0 (one token a step) and 6 (two a step)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model = make_tiny_model_dir(tmp_path / "bd", attention="block_causal", block_size=4,
                                generation_defaults={"gen_length": 64, "block_length": 4})
    engine = celeris.Engine.from_pretrained(model, device="cpu")
    ask = {"prompt": "x", "max_tokens": 12, "suppress_eos": True}
    with live_server(create_app(engine, warmup=False)) as url:
        answers = {s: httpx.post(f"{url}/v1/completions", json={**ask, "steps": s})
                   for s in (0, 6, 5)}
    assert answers[0].status_code == answers[6].status_code == 200, answers[0].text
    assert answers[0].json()["usage"]["completion_tokens"] == 12
    bad = answers[5]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "steps"
    assert bad.json()["error"]["message"] == STEPS_5_OVER_3_BLOCKS

    root = Path(__file__).resolve().parents[1]
    run = [sys.executable, "-m", "celeris", "generate", "--model", str(model), "--device",
           "cpu", "--prompt", "x", "--gen-length", "12", "--block-length", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    cli_bad = subprocess.run([*run, "--steps", "5"], cwd=root, env=env, capture_output=True,
                             text=True, timeout=120)
    cli_ok = subprocess.run([*run, "--steps", "0", "--json"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=120)
    assert cli_bad.returncode == 2 and STEPS_5_OVER_3_BLOCKS in cli_bad.stderr
    assert "Traceback" not in cli_bad.stderr
    assert cli_ok.returncode == 0, cli_ok.stderr
    done = json.loads(cli_ok.stdout)
    assert done["steps"] >= 1 and len(done["token_ids"]) <= 12

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", **ask, "steps": 5}) + "\n")
    assert cli.main(["batch", str(src), "--output", str(tmp_path / "out.jsonl"),
                     "--model", str(model), "--device", "cpu"]) != 0
    assert STEPS_5_OVER_3_BLOCKS in capsys.readouterr().err
