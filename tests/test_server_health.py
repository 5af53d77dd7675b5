"""Engine faults as the API shows them: repeated step failures turn /ready to 503 (and back
after a good step) and show in /metrics; while unhealthy, new requests get a 503 with
Retry-After and a background probe readmits them once a step succeeds; out of memory is a 503
with Retry-After, never a 500; requests are refused while the model warms up."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

import celeris
from celeris.server import create_app
from celeris.server.state import UNHEALTHY_AFTER
from tests.live_server import live_server
from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("h"))


@pytest.fixture
def engine(model_dir):   # one per test: a test's failed steps never make the next unhealthy
    engine = celeris.Engine.from_pretrained(model_dir, device="cpu")
    yield engine
    engine.stop()


class Fault:
    """A forward pre-hook that raises ``error`` while ``on``."""

    def __init__(self, engine, error: BaseException) -> None:
        self.error, self.on = error, True
        self.handle = engine.model.register_forward_pre_hook(self)

    def __call__(self, *_):
        if self.on:
            raise self.error


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def wait_until(condition, tries: int = 100, pause_s: float = 0.05) -> bool:
    for _ in range(tries):
        if condition():
            return True
        threading.Event().wait(pause_s)
    return False


def complete(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 8}, timeout=30)


def test_repeated_step_failures_turn_ready_to_503_until_a_step_succeeds(engine):
    fault = Fault(engine, RuntimeError("the device fell off"))
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            for i in range(UNHEALTHY_AFTER):
                assert httpx.get(f"{url}/ready").status_code == 200
                assert complete(url).status_code == 500
            ready = httpx.get(f"{url}/ready")   # idle and unhealthy: its probe step fails too
            assert ready.status_code == 503 and ready.json()["status"] == "unhealthy"
            assert metric(url, "celeris_step_failures_total") == UNHEALTHY_AFTER + 1
            assert metric(url, "celeris_consecutive_step_failures") == UNHEALTHY_AFTER + 1
            assert metric(url, "celeris_ready") == 0
            fault.on = False   # the next probe (at most one per PROBE_INTERVAL_S) passes
            assert wait_until(lambda: httpx.get(f"{url}/ready").status_code == 200)
            assert complete(url).status_code == 200
            assert metric(url, "celeris_consecutive_step_failures") == 0
            assert metric(url, "celeris_step_failures_total") == UNHEALTHY_AFTER + 1
    finally:
        fault.handle.remove()


def test_while_unhealthy_new_requests_get_503_with_retry_after_until_a_probe_passes(engine):
    fault = Fault(engine, RuntimeError("the device fell off"))
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8}
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            for _ in range(UNHEALTHY_AFTER):
                assert complete(url).status_code == 500
            for path, body in (("completions", {"prompt": "x", "max_tokens": 8}),
                               ("completions", {"prompt": "x", "max_tokens": 8, "stream": True}),
                               ("chat/completions", chat)):
                refused = httpx.post(f"{url}/v1/{path}", json=body, timeout=30)
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "engine_unhealthy"
                assert int(refused.headers["retry-after"]) >= 1
            fault.on = False   # no /ready call: the refusals' own probes readmit requests
            assert wait_until(lambda: complete(url).status_code == 200)
    finally:
        fault.handle.remove()


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                          "allocate 2.00 GiB"),
                                   MemoryError()])
def test_out_of_memory_is_503_with_retry_after(engine, error):
    fault = Fault(engine, error)
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            response = complete(url)
            stream = httpx.post(f"{url}/v1/completions", json={
                "prompt": "x", "max_tokens": 8, "stream": True}, timeout=30)
    finally:
        fault.handle.remove()
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert response.json()["error"]["code"] == "out_of_memory"
    assert "CUDA" not in response.text                 # no internals in the answer
    assert stream.status_code == 503 and '"out_of_memory"' in stream.text


def test_requests_are_refused_while_warming_up(engine):
    release = threading.Event()
    gate = engine.model.register_forward_pre_hook(lambda *_: release.wait(30) and None)
    try:
        with live_server(create_app(engine), wait_ready=False) as url:
            assert httpx.get(f"{url}/ready").json()["status"] == "loading"
            refused = complete(url)
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "model_loading"
            assert refused.headers["retry-after"] == "5"
            release.set()
            for _ in range(500):
                if httpx.get(f"{url}/ready").status_code == 200:
                    break
                threading.Event().wait(0.01)
            assert complete(url).status_code == 200
    finally:
        release.set()
        gate.remove()
