"""What the server and batch reliability tests share: a tiny random model with a short
context (so a long request fails on purpose), an engine per test, and polling helpers."""

from __future__ import annotations

import time

import httpx
import pytest

import celeris
from tests.tiny_model import make_tiny_model_dir

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
    """The value of a Prometheus line of /metrics, or None when absent."""
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
