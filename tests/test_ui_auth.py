"""Issue 34, item 15: with an API key, the playground and every one of its Gradio endpoints
need the key too (Gradio's login: any user name, the key as password). Before, /v1 answered
401 while gradio_client generated through /generate, and the Model tab's loader was open.

The endpoints are enumerated from the app's own Gradio config (read after logging in), so a
listener added later is covered without touching this test."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import httpx
import pytest

import app
from tests.test_app import running_app
from tests.tiny_model import make_tiny_model_dir

KEY = "sekrit-key"
SETTINGS = (0, 0.0, 16, 8, 0.9, "fixed", "low_confidence", "none", 5)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    model = make_tiny_model_dir(tmp_path_factory.mktemp("auth") / "tiny")
    engine, error = app.load_engine(str(model), device="cpu")
    assert error is None, error
    with running_app(engine, api_key=KEY, models=[]) as url:
        yield url
    app.stop_engine(engine)


@contextlib.contextmanager
def login(url: str, password: str) -> Iterator[httpx.Client]:
    """An HTTP client that tried Gradio's login form with ``password``."""
    with httpx.Client(base_url=url, timeout=30) as client:
        client.post("/login", data={"username": "anyone", "password": password})
        yield client


def endpoints(url: str) -> list[dict]:
    """Every listener of the playground (public, undocumented and private alike)."""
    with login(url, KEY) as client:
        config = client.get("/config")
        assert config.status_code == 200
        return config.json()["dependencies"]


def test_every_gradio_endpoint_is_refused_without_the_key(keyed):
    deps = endpoints(keyed)
    assert len(deps) > 20 and {"generate", "race", "infill"} <= {d.get("api_name")
                                                                 for d in deps}
    for path in ("/config", "/gradio_api/info", "/gradio_api/openapi.json"):
        assert httpx.get(keyed + path, timeout=10).status_code == 401, path
    with login(keyed, "wrong") as stranger:
        for dep in deps:
            body = {"data": [], "fn_index": dep["id"], "session_hash": "probe",
                    "event_data": None, "trigger_id": None}
            for client in (httpx, stranger):
                refused = client.post(f"{keyed}/gradio_api/queue/join", json=body, timeout=10)
                assert refused.status_code == 401, (dep["id"], dep.get("api_name"))
            if dep.get("api_name"):
                call = httpx.post(f"{keyed}/gradio_api/call/{dep['api_name']}",
                                  json={"data": []}, timeout=10)
                assert call.status_code == 401, dep["api_name"]


def test_with_the_key_the_playground_answers(keyed):
    from gradio_client import Client

    with login(keyed, KEY) as client:
        assert client.get("/config").status_code == 200
        body = {"data": ["hello", False, *SETTINGS], "fn_index": next(
            d["id"] for d in endpoints(keyed) if d.get("api_name") == "generate"),
            "session_hash": "ok", "event_data": None, "trigger_id": None}
        assert client.post("/gradio_api/queue/join", json=body).status_code == 200
    out = Client(keyed + "/", auth=("anyone", KEY), verbose=False).predict(
        "hello", False, *SETTINGS, api_name="/generate")
    assert out[2]["state"] == "done"


def test_gradio_client_without_the_key_cannot_generate(keyed):
    from gradio_client import Client

    with pytest.raises(Exception):
        Client(keyed + "/", verbose=False).predict("hello", False, *SETTINGS,
                                                   api_name="/generate")
    with pytest.raises(Exception):
        Client(keyed + "/", auth=("anyone", "wrong"), verbose=False)


def test_the_login_checks_the_key_and_v1_still_wants_the_bearer(keyed):
    assert httpx.get(keyed + "/gradio_api/login_check", timeout=10).status_code == 401
    with login(keyed, KEY) as client:
        assert client.get("/gradio_api/login_check").status_code == 200
    assert httpx.get(keyed + "/v1/models", timeout=10).status_code == 401
    ok = httpx.get(keyed + "/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                   timeout=10)
    assert ok.status_code == 200


def test_without_a_key_the_playground_stays_open(tmp_path):
    engine, error = app.load_engine(str(make_tiny_model_dir(Path(tmp_path) / "m")),
                                    device="cpu")
    assert error is None
    try:
        with running_app(engine, models=[]) as url:
            assert httpx.get(url + "/config", timeout=10).status_code == 200
    finally:
        app.stop_engine(engine)
