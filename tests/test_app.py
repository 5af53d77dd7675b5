"""app.py end to end: one port serves the playground (driven by gradio_client), /health and /v1.

The model is a random tiny directory (tests/tiny_model.py); the autoregressive twin for the
race is a random tiny Llama next to the same tokenizer.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

import app
from tests.live_server import free_port
from tests.tiny_model import make_tiny_model_dir
from ui.render import parse_cell

PROMPT = "Once upon a time"
SHIPPED_BD = Path(__file__).resolve().parents[1] / "models" / "celeris-tiny-bd"
# prompt, as_chat, steps, temperature, gen_length, block_length, threshold, decoding,
# remasking, cache, seed
SETTINGS = (0, 0.0, 32, 8, 0.9, "fixed", "low_confidence", "none", 5)


def make_ar_dir(path: Path, tokenizer_from: Path) -> Path:
    """A random tiny Llama (the autoregressive twin) sharing the diffusion model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_from.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, path / f.name)
    tok = AutoTokenizer.from_pretrained(str(path))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    return path


@contextlib.contextmanager
def running_app(engine: Any, **build_options: Any) -> Iterator[str]:
    """Serve ``app.build_app(engine, ...)`` with uvicorn in a thread; yields the base URL."""
    port = free_port()
    server = app.make_server(app.build_app(engine, **build_options), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the app did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ui-models")
    model = make_tiny_model_dir(root / "tiny", generation_defaults={
        "gen_length": 32, "block_length": 8, "decoding": "fixed", "cache": "none"})
    return Path(model), make_ar_dir(root / "tiny-ar", Path(model))


@pytest.fixture(scope="module")
def engine(model_dirs):
    engine, error = app.load_engine(str(model_dirs[0]), device="cpu")
    assert error is None, error
    yield engine
    app.stop_engine(engine)


@pytest.fixture(scope="module")
def served(engine, model_dirs) -> Iterator[str]:
    with running_app(engine, ar_path=str(model_dirs[1]), frame_interval=0.0) as url:
        yield url


@pytest.fixture(scope="module")
def client(served):
    from gradio_client import Client

    return Client(served + "/", verbose=False)


# ---------------------------------------------------------------------- the generate API
def test_generate_streams_intermediate_steps_then_the_final_text(client, engine):
    job = client.submit(PROMPT, False, *SETTINGS, api_name="/generate")
    updates = [out for out in job]
    canvases = [[parse_cell(c) for c in u[0]] for u in updates]
    assert len(updates) >= 10                               # one per denoising step
    assert all(c["k"].startswith("mask") for c in canvases[0])
    masked = [sum(c["k"].startswith("mask") for c in canvas) for canvas in canvases]
    assert masked[0] == 32 and masked[-1] == 0
    assert any(0 < m < 32 for m in masked)                  # partly denoised frames arrived
    final_text, gauges = updates[-1][1], updates[-1][2]
    expected = engine.generate(PROMPT, engine.default_params().replace(seed=5))
    assert final_text == expected.text
    assert gauges["state"] == "done" and gauges["nfe"] == str(expected.nfe)
    assert float(gauges["tps"]) > 0 and gauges["mem_label"] in ("RSS (CPU)", "GPU memory")


def test_invalid_settings_are_a_clear_error_and_the_app_keeps_working(client):
    from gradio_client.exceptions import AppError

    bad = list(SETTINGS)
    bad[0] = 5         # steps 5 over the 4 blocks of 8 in gen_length 32
    with pytest.raises(AppError, match=r"steps must be 0 \(one token a step\) or a multiple of "
                                      r"the number of blocks \(4 = gen_length 32"):
        client.predict(PROMPT, False, *bad, api_name="/generate")
    with pytest.raises(AppError, match="Type a prompt first"):
        client.predict("   ", False, *SETTINGS, api_name="/generate")
    out = client.predict(PROMPT, True, *SETTINGS, api_name="/generate")
    assert out[2]["state"] == "done"


def test_a_prompt_over_the_context_is_refused_before_painting_with_status_error(client):
    from gradio_client.exceptions import AppError

    job = client.submit("Once upon a time " * 200, False, *SETTINGS, api_name="/generate")
    with pytest.raises(AppError, match="exceeds the model's context"):
        job.result()
    updates = job.outputs()
    assert updates and all(u[0] == [] for u in updates)        # no canvas of masks
    assert updates[-1][2]["state"] == "error"
    assert "exceeds the model's context" in updates[-1][3]


def test_the_api_tabs_gradio_client_snippet_runs_against_the_live_app(served, capsys):
    from ui.api_tab import snippets

    code = snippets(served, "tiny", key_required=False)["gradio_client"]
    exec(compile(code, "snippet", "exec"), {})               # the copy-paste example, as is
    # one "<nfe> <state> <text>" line per update (the random model's text may hold newlines)
    updates = re.findall(r"^(\d+) (running|done) ", capsys.readouterr().out, re.M)
    assert len(updates) >= 2 and updates[-1][1] == "done" and int(updates[-1][0]) > 0


def test_cancelled_run_frees_the_engine(client):
    settings = list(SETTINGS)
    settings[2], settings[3] = 192, 8          # long enough to cancel midway, and it fits
    job = client.submit(PROMPT, False, *settings, api_name="/generate")   # the context (256)
    for i, _ in enumerate(job):
        if i == 3:
            job.cancel()
            break
    assert i == 3                              # it ran (a refused run would end at once)
    start = time.monotonic()
    out = client.predict(PROMPT, False, *SETTINGS, api_name="/generate")
    assert out[2]["state"] == "done" and time.monotonic() - start < 30


def test_infill_keeps_the_pinned_words(client):
    out = client.predict("Once upon a [MASK] there was a <b>fox</b>.", 3, "fixed",
                         api_name="/infill")
    cells, filled = [parse_cell(c) for c in out[0]], out[1]
    pinned = "".join(c["t"] for c in cells if c["k"].startswith("pin"))
    assert "&lt;b&gt;fox&lt;/b&gt;" in pinned and "<b>" not in pinned
    # the space before [MASK] travels with the span (words carry their leading space)
    assert filled.startswith("Once upon a") and filled.endswith(" there was a <b>fox</b>.")
    assert not any(c["k"].startswith("mask") for c in cells)


def test_race_runs_fast_reference_and_autoregressive(client):
    """A full-attention model: main = its fast configuration, canvas = its reference sampler
    (outputs 0-6 as before: body and stats per column, the summary; 7-9: the titles)."""
    job = client.submit(PROMPT, False, 32, 8, 0.9, api_name="/race")
    outputs = [out for out in job]
    main, canvas, ar = outputs[-1][1], outputs[-1][3], outputs[-1][5]
    assert main["state"] == canvas["state"] == "done"
    assert 0 < int(main["nfe"]) <= 32 and 0 < int(canvas["nfe"]) <= 32
    assert ar["state"] == "done" and float(ar["tps"]) > 0
    assert "**fast vs reference**" in outputs[-1][6]
    assert "**fast vs autoregressive**" in outputs[-1][6]
    titles = outputs[-1][7:]
    assert "Fast configuration · tiny" in titles[0] and "Reference sampler · tiny" in titles[1]
    assert "Autoregressive twin" in titles[2]


# ---------------------------------------------------------------------- one port
def test_health_and_v1_answer_on_the_playground_port(served):
    health = httpx.get(served + "/health", timeout=10)
    assert health.status_code == 200
    assert httpx.get(served + "/", timeout=10).status_code == 200
    models = httpx.get(served + "/v1/models", timeout=10)
    assert models.status_code == 200
    assert models.json()["data"][0]["id"] == "tiny"


def test_api_key_guards_v1_when_given(engine):
    with running_app(engine, api_key="sekrit") as url:
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        ok = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekrit"},
                       timeout=10)
        assert ok.status_code == 200


def test_without_a_model_the_playground_still_starts(tmp_path):
    with running_app(None, error="the shipped model is missing") as url:
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        ready = httpx.get(url + "/ready", timeout=10)
        assert ready.status_code == 503 and ready.json()["status"] == "no_model"
        models = httpx.get(url + "/v1/models", timeout=10)
        assert models.status_code == 503 and "shipped model is missing" in models.text
        from gradio_client import Client
        from gradio_client.exceptions import AppError

        with pytest.raises(AppError, match="shipped model is missing"):
            Client(url + "/", verbose=False).predict(PROMPT, False, *SETTINGS,
                                                     api_name="/generate")


# ---------------------------------------------------------------------- main()
def test_port_in_use_is_one_line_naming_the_option(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert app.main(["--port", str(port), "--host", "127.0.0.1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"port {port}" in err and "--port" in err


def test_missing_model_given_explicitly_exits_2(capsys, tmp_path):
    assert app.main(["--model", str(tmp_path / "nope"), "--port", str(free_port())]) == 2
    assert "error:" in capsys.readouterr().err


def test_args_honour_gradio_and_key_environment(monkeypatch):
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9999")
    monkeypatch.setenv("CELERIS_API_KEY", "k")
    args = app.parse_args([])
    assert (args.host, args.port, args.api_key, args.model, args.share) == \
        ("0.0.0.0", 9999, "k", None, False)
    monkeypatch.delenv("GRADIO_SERVER_NAME")
    monkeypatch.delenv("GRADIO_SERVER_PORT")
    args = app.parse_args(["--port", "7000"])
    assert (args.host, args.port) == ("127.0.0.1", 7000)
    assert app.public_url("0.0.0.0", 7860) == "http://localhost:7860"


# ---------------------------------------------------------------------- the models offered
def test_app_offers_the_shipped_models_by_default_and_checks_the_models_flag(tmp_path):
    import app

    models, why = app.offered_models(None)
    assert why is None and [Path(m).name for m in models] == ["celeris-tiny-bd",
                                                              "celeris-tiny"]
    models, why = app.offered_models(f"{SHIPPED_BD}, {tmp_path}")
    assert models == [] and str(tmp_path) in why and "not a model directory" in why
    args = app.parse_args(["--models", "a,b", "--allow-model-paths"])
    assert (args.models, args.allow_model_paths) == ("a,b", True)
    assert app.parse_args([]).allow_model_paths is False


def test_the_app_refuses_a_models_flag_naming_no_model(tmp_path, capsys):
    import app

    assert app.main(["--models", str(tmp_path), "--port", "1"]) == 2
    assert "not a model directory" in capsys.readouterr().err
