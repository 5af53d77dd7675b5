"""Server lifecycle: SIGTERM drains and exits 0, disconnects abort, timeouts, mounting a UI
at "/" after the routes, and the serve benchmark hook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.responses import PlainTextResponse

import celeris
from celeris.bench.load import bench_serve
from celeris.server import create_app
from tests.live_server import free_port, live_server, slow_down, wait_until_ready
from tests.tiny_model import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), max_position_embeddings=1024)


@pytest.fixture
def engine(model_dir):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu")
    yield engine
    engine.stop()


def wait_for(condition, timeout_s=5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_sigterm_drains_running_requests_refuses_new_ones_and_exits_0(model_dir):
    port, key = free_port(), "lifecycle-key"
    env = {**os.environ, "CELERIS_API_KEY": key, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "celeris", "serve", "--model", str(model_dir),
                             "--port", str(port), "--device", "cpu"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"}
    try:
        wait_until_ready(url, 90)
        assert httpx.get(f"{url}/v1/models?api_key={key}").status_code == 401
        body = {"prompt": "drain me", "max_tokens": 512, "block_length": 32, "steps": 256,
                "suppress_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=auth,
                          timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")        # the request is running
            proc.send_signal(signal.SIGTERM)
            assert wait_for(lambda: httpx.get(f"{url}/ready").status_code == 503)
            refused = httpx.post(f"{url}/v1/completions", json={"prompt": "late"},
                                 headers=auth)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "draining"
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert key not in output


def _serve(model_dir, port, *flags, key=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    if key:
        env["CELERIS_API_KEY"] = key
    return subprocess.Popen([sys.executable, "-m", "celeris", "serve", "--model", str(model_dir),
                             "--port", str(port), "--device", "cpu", *flags], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _start_long_stream(url):
    """A streamed request that runs for many seconds (one token a step over 900 tokens)."""
    body = {"prompt": "long", "max_tokens": 896, "block_length": 32, "steps": 896,
            "suppress_eos": True, "stream": True}
    stream = httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60)
    response = stream.__enter__()
    lines = response.iter_lines()
    assert next(lines).startswith("data: ")
    return stream, lines


def test_a_second_sigterm_exits_at_once_non_zero_without_tracebacks(model_dir):
    port = free_port()
    proc = _serve(model_dir, port, "--drain-timeout", "60")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, 90)
        stream, _ = _start_long_stream(url)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: httpx.get(f"{url}/ready").status_code == 503)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)                     # not the 60 s drain
        stream.__exit__(None, None, None)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert code == 128 + signal.SIGTERM, output
    assert "Traceback" not in output and "Abort" not in output, output


def test_drain_timeout_aborts_what_is_still_running_and_exits_0(model_dir):
    port = free_port()
    proc = _serve(model_dir, port, "--drain-timeout", "0.5")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, 90)
        stream, lines = _start_long_stream(url)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data: ")]
        stream.__exit__(None, None, None)
        code = proc.wait(timeout=20)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert code == 0, output
    assert took < 10                                     # 0.5 s drain, not the whole answer
    assert json.loads(rest[-2][6:])["error"]["code"] == "draining"
    assert "drain timeout" in output


def test_client_disconnect_aborts_streaming_and_plain_requests(engine):
    slow_down(engine, 0.02)
    with live_server(create_app(engine)) as url:
        body = {"prompt": "bye", "max_tokens": 256, "suppress_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
            next(r.iter_lines())
            assert engine.stats()["running"] == 1
        assert wait_for(lambda: engine.stats()["running"] == 0, 2.0)   # not 256 x 20 ms
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=0.5)
        assert wait_for(lambda: engine.stats()["running"] == 0, 2.0)
        metrics = httpx.get(f"{url}/metrics").text
    assert 'celeris_client_disconnects_total{stage="streaming"} 1.0' in metrics
    assert 'celeris_client_disconnects_total{stage="running"} 1.0' in metrics  # not "waiting"
    assert 'celeris_client_disconnects_total{stage="waiting"}' not in metrics


def test_requests_past_the_deadline_fail_with_504(model_dir):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu", request_timeout_s=0.3)
    slow_down(engine, 0.02)
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            body = {"prompt": "slow", "max_tokens": 128, "suppress_eos": True}
            error = httpx.post(f"{url}/v1/completions", json=body).json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "timeout")
            with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}
                              ) as r:
                data = [line for line in r.iter_lines() if line.startswith("data: ")]
            assert data[-1] == "data: [DONE]"
            assert json.loads(data[-2][6:])["error"]["code"] == "timeout"
    finally:
        engine.stop()


def test_routes_work_beside_an_app_mounted_at_root(engine):
    app = create_app(engine, warmup=False)
    app.mount("/", PlainTextResponse("the playground"))   # what app.py does with Gradio
    with live_server(app) as url:
        assert httpx.get(f"{url}/").text == "the playground"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == engine.model_dir.name
        assert httpx.post(f"{url}/v1/completions", json={"prompt": "x"}).status_code == 200
        assert httpx.get(f"{url}/", headers={"Host": "evil.example"}).status_code == 403


def test_bench_serve_reports_each_concurrency_against_sequential(engine):
    report = bench_serve(engine, concurrencies=(1, 2), n_requests=4, max_tokens=8,
                         temperature=0.5)
    assert [row["concurrency"] for row in report["levels"]] == [1, 2]
    assert report["sequential"]["speedup_vs_sequential"] == 1.0
    for row in report["levels"]:
        assert row["requests"] == 4 and row["tokens"] > 0 and row["tokens_per_s"] > 0
        assert row["e2e_p50_s"] > 0 and row["first_block_p50_s"] is not None
    with live_server(create_app(engine, warmup=False)) as url:
        remote = bench_serve(url, concurrencies=(2,), n_requests=2, max_tokens=8)
    assert [row["concurrency"] for row in remote["levels"]] == [1, 2]
    assert remote["levels"][1]["tokens"] > 0


def test_serve_with_a_missing_model_exits_2_with_one_line(tmp_path, capsys):
    from celeris.cli import main

    code = main(["serve", "--model", str(tmp_path), "--port", str(free_port()),   # no model
                 "--device", "cpu"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("error: loading the model failed: ")
    assert "config.json" in err.splitlines()[-1]
    assert "Traceback" not in err
