"""One request as a client sees it, over real HTTP (celeris/server): a streamed answer is at
every moment a prefix of the final one; a client that goes away while sending or while its
request runs is counted by stage, never an internal error; a temperature out of range, a
foreign Host header and a prompt one token past the context are refused with the range, in
OpenAI's error shape."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import celeris
from celeris.server import create_app
from tests.live_server import free_port, live_server, slow_down
from tests.server_fixtures import CONTEXT, engine, metric, model_dir, wait_for  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_FULL_ATTENTION = ROOT / "models" / "celeris-tiny"






def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


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
