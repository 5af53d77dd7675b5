"""The reliability checklist (items 14-21 of the hardening round), against real servers.

Each test names the behaviour a tester checks by hand: a real ``celeris serve`` subprocess or a
real uvicorn server on 127.0.0.1, and the batch CLI end to end. Item 15 (the playground honours
the API key) belongs to the playground's own tests, next to the Gradio app.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

import celeris
from celeris import cli
from celeris.server import create_app, state as server_state
from tests.live_server import free_port, live_server, slow_down
from tests.tiny_model import make_tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_FULL_ATTENTION = ROOT / "models" / "celeris-tiny"
CONTEXT = 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("reliability"),
                               max_position_embeddings=CONTEXT)


@pytest.fixture
def engine(model_dir):
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu")
    yield engine
    engine.stop()


def metric(url: str, line_start: str) -> float | None:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Fault:
    """A forward pre-hook that raises while ``on`` (at most ``times`` times when given)."""

    def __init__(self, engine, times: int | None = None) -> None:
        self.on, self.times, self.raised = True, times, 0
        self.handle = engine.model.register_forward_pre_hook(self)

    def __call__(self, *_):
        if self.on and (self.times is None or self.raised < self.times):
            self.raised += 1
            raise RuntimeError("the device fell off")


# ----------------------------------------------------------------------- 14
def _serve(model: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "celeris", "serve", "--model", str(model),
                             "--port", str(port), "--device", "cpu"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _streamed_texts(url: str, body: dict) -> list[str]:
    """The client's text after each SSE chunk of a streamed completion."""
    texts, text = [], ""
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            text += chunk["choices"][0]["text"] or ""
            texts.append(text)
    return texts


def test_a_streamed_answer_is_at_every_moment_a_prefix_of_the_capped_answer():
    port = free_port()
    proc = _serve(SHIPPED_FULL_ATTENTION, port)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _ready(url), 120), "the server did not become ready"
        for cap in (1, 5, 17):
            for prompt in ("Once upon a time", "def add(a, b):", "The cat"):
                body = {"prompt": prompt, "max_tokens": cap, "temperature": 0, "seed": 0}
                final = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
                answer = final["choices"][0]["text"]
                texts = _streamed_texts(url, body)
                for seen in texts:
                    assert answer.startswith(seen), (cap, prompt, seen, answer)
                assert texts[-1] == answer, (cap, prompt)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


# ----------------------------------------------------------------------- 16
def test_a_failed_warm_up_is_retried_with_backoff_and_the_server_becomes_ready(
        engine, monkeypatch):
    monkeypatch.setattr(server_state, "WARMUP_BACKOFF_S", 0.05)
    fault = Fault(engine, times=2)
    try:
        with live_server(create_app(engine), wait_ready=False) as url:
            assert wait_for(lambda: _ready(url)), httpx.get(f"{url}/ready").json()
            assert fault.raised == 2                       # two failed attempts, then a good one
            response = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4},
                                  timeout=30)
            assert response.status_code == 200
    finally:
        fault.handle.remove()


def test_a_warm_up_that_keeps_failing_reports_its_cause_and_serve_exits_non_zero(model_dir):
    script = textwrap.dedent(f"""
        import sys
        import celeris
        import celeris.server.state as state
        state.WARMUP_BACKOFF_S = 0.05
        def broken(*args, **kwargs):
            raise RuntimeError("the device fell off")
        celeris.Engine.generate = broken
        from celeris.cli import main
        sys.exit(main(["serve", "--model", {str(model_dir)!r}, "--port", "{free_port()}",
                       "--device", "cpu"]))
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode != 0, done.stderr
    assert "attempt 1 of 3" in done.stderr and "attempt 2 of 3" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the warm-up generation failed 3 times"), last
    assert "RuntimeError: the device fell off" in last


def test_after_a_failed_warm_up_ready_names_the_warm_up_and_a_probe_recovers(
        engine, monkeypatch):
    monkeypatch.setattr(server_state, "WARMUP_BACKOFF_S", 0.01)
    fault = Fault(engine)
    try:
        with live_server(create_app(engine), wait_ready=False) as url:   # app.py: no on_fatal
            assert wait_for(lambda: engine_failed(url))
            ready = httpx.get(f"{url}/ready").json()
            assert "warm-up generation failed 3 times (RuntimeError)" in ready["detail"]
            assert "could not be loaded" not in ready["detail"]
            refused = httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, timeout=30)
            assert refused.status_code == 503 and "warm-up" in refused.json()["error"]["message"]
            fault.on = False
            assert wait_for(lambda: _ready(url), 5)   # /ready's own probe step decides
    finally:
        fault.handle.remove()


def engine_failed(url: str) -> bool:
    return httpx.get(f"{url}/ready").json()["status"] == "failed"


# ----------------------------------------------------------------------- 17
def test_ready_recovers_while_idle_through_a_probe_step_without_any_request(engine):
    fault = Fault(engine)
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            for _ in range(server_state.UNHEALTHY_AFTER):
                assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 4},
                                  timeout=30).status_code == 500
            assert httpx.get(f"{url}/ready").json()["status"] == "unhealthy"
            fault.on = False                          # the fault passed; nobody sends requests
            assert wait_for(lambda: _ready(url), 5)
            assert metric(url, "celeris_consecutive_step_failures") == 0
    finally:
        fault.handle.remove()


# ----------------------------------------------------------------------- 18
def test_in_process_batch_records_a_line_that_fails_alone_and_goes_on(
        tmp_path, model_dir, monkeypatch, capsys):
    load = celeris.Engine.from_pretrained.__func__

    def with_fault(cls, *args, **kwargs):   # a forward over a long input fails
        engine = load(cls, *args, **kwargs)
        engine.model.register_forward_pre_hook(_refuse_long_inputs)
        return engine

    monkeypatch.setattr(celeris.Engine, "from_pretrained", classmethod(with_fault))
    lines = [{"id": "a", "prompt": "short"}, {"id": "b", "prompt": "long " * 40},
             {"id": "c", "prompt": "short too"}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    code = cli.main(["batch", str(src), "--output", str(out), "--errors", str(err),
                     "--model", str(model_dir), "--device", "cpu", "--concurrency", "1"])
    assert code == 1
    assert "completed 2, failed 1" in capsys.readouterr().out
    assert sorted(json.loads(x)["custom_id"] for x in out.read_text().splitlines()) == ["a", "c"]
    failed = [json.loads(x) for x in err.read_text().splitlines()]
    assert [r["custom_id"] for r in failed] == ["b"]
    assert "RuntimeError: input too long" in failed[0]["error"]["message"]


def _refuse_long_inputs(module, args):
    if args and args[0].shape[-1] > 40:
        raise RuntimeError("input too long")


# ----------------------------------------------------------------------- 19
def _batch_lines() -> list[dict]:
    return [{"custom_id": "greedy", "method": "POST", "url": "/v1/completions",
             "body": {"prompt": "x", "first_token": "greedy", "gen_length": 8}},
            {"id": "simple", "prompt": "y", "gen_length": 8, "block_length": 8}]


def test_a_batch_line_means_the_same_in_process_and_with_url(tmp_path, engine, model_dir,
                                                             capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in _batch_lines()))
    with live_server(create_app(engine, warmup=False)) as url:
        for name, where in (("local", ["--model", str(model_dir), "--device", "cpu"]),
                            ("remote", ["--url", url])):
            out = tmp_path / f"{name}.jsonl"
            assert cli.main(["batch", str(src), "--output", str(out), *where]) == 0, \
                capsys.readouterr()
            records = [json.loads(x) for x in out.read_text().splitlines()]
            assert {r["custom_id"] for r in records} == {"greedy", "simple"}
            assert all(r["response"]["status_code"] == 200 for r in records)


def test_batch_refuses_what_the_server_refuses_with_the_servers_words(tmp_path, model_dir,
                                                                      capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "t", "prompt": "x", "temprature": 0.5}) + "\n")
    assert cli.main(["batch", str(src), "--model", str(model_dir), "--device", "cpu"]) == 2
    assert "line 1: unknown parameter 'temprature': not supported by this server" in \
        capsys.readouterr().err


def test_context_errors_keep_the_servers_code_remotely_and_say_max_tokens_locally(
        tmp_path, engine, model_dir, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "big", "prompt": "the quick brown fox " * 20,
                               "max_tokens": 200}) + "\n")
    assert cli.main(["batch", str(src), "--model", str(model_dir), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "+ max_tokens (200) =" in err and "max_tokens can be at most" in err
    assert "gen_length" not in err
    errors = tmp_path / "err.jsonl"
    with live_server(create_app(engine, warmup=False)) as url:
        assert cli.main(["batch", str(src), "--url", url, "--output", str(tmp_path / "o.jsonl"),
                         "--errors", str(errors)]) == 1
    record = json.loads(errors.read_text().splitlines()[0])
    assert record["error"]["code"] == "context_length_exceeded"
    assert record["error"]["retryable"] is False


# ----------------------------------------------------------------------- 20
def test_a_client_that_disconnects_while_sending_the_body_is_not_an_internal_error(
        engine, caplog):
    with live_server(create_app(engine, warmup=False)) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                         b'{"prompt": "')
            time.sleep(0.2)
        counted = 'celeris_client_disconnects_total{stage="sending"}'
        assert wait_for(lambda: metric(url, counted) == 1.0, 5)
    assert "internal error" not in caplog.text
    assert "Traceback" not in caplog.text


def test_a_plain_request_that_disconnects_while_running_is_counted_as_running(engine):
    slow_down(engine, 0.02)
    with live_server(create_app(engine, warmup=False)) as url:
        body = {"prompt": "bye", "max_tokens": 200, "suppress_eos": True}   # ~4 s of steps
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
        counted = 'celeris_client_disconnects_total{stage="running"}'
        assert wait_for(lambda: metric(url, counted) == 1.0, 5)
        assert metric(url, 'celeris_client_disconnects_total{stage="waiting"}') is None


# ----------------------------------------------------------------------- 21
def test_temperature_above_2_is_refused_naming_the_range(engine):
    with live_server(create_app(engine, warmup=False)) as url:
        response = httpx.post(f"{url}/v1/completions",
                              json={"prompt": "x", "temperature": 2.5}, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "temperature"
    assert "temperature must be in [0.0, 2.0], got 2.5" in error["message"]


def test_a_foreign_host_header_gets_403_in_openais_error_shape(engine):
    with live_server(create_app(engine, warmup=False)) as url:
        response = httpx.get(f"{url}/v1/models", headers={"Host": "evil.example"})
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "permission_error" and error["code"] == "host_not_allowed"
    assert set(error) == {"message", "type", "param", "code"}


def test_prompt_plus_max_tokens_exactly_at_the_context_is_accepted_and_one_more_is_not(
        engine):
    with live_server(create_app(engine, warmup=False)) as url:
        prompt = [65] * (CONTEXT - 8)                         # token ids: an exact count
        probe = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1},
                           timeout=30).json()
        room = CONTEXT - probe["usage"]["prompt_tokens"]
        body = {"prompt": prompt, "max_tokens": room, "block_length": room}
        exact = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        over = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": room + 1},
                          timeout=60)
    assert exact.status_code == 200, exact.text
    assert over.status_code == 400
    message = over.json()["error"]["message"]
    assert f"max_tokens can be at most {room} for this prompt" in message
    assert "may equal the context" in message
