"""The server's warm-up and /ready (celeris/server/state.py), against real servers: a failed
warm-up is retried with backoff; one that keeps failing names its cause and ``celeris serve``
exits non-zero; /ready names a failed warm-up, and a probe step brings it back once the fault
has passed, with no request needed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

import celeris
from celeris.server import create_app, state as server_state
from tests.live_server import free_port, live_server
from tests.server_fixtures import CONTEXT, engine, metric, model_dir, wait_for  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]






class Fault:
    """A forward pre-hook that raises while ``on`` (at most ``times`` times when given)."""

    def __init__(self, engine, times: int | None = None) -> None:
        self.on, self.times, self.raised = True, times, 0
        self.handle = engine.model.register_forward_pre_hook(self)

    def __call__(self, *_):
        if self.on and (self.times is None or self.raised < self.times):
            self.raised += 1
            raise RuntimeError("the device fell off")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


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
