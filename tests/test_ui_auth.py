"""With an API key, the playground and every one of its Gradio endpoints need the key too
(Gradio's login: any user name, the key as password); without a login only the login page
answers (its HTML, scripts, styles, fonts, icons), and no other origin is allowed by CORS.

The endpoints are enumerated from the app's own Gradio config and route list (read after
logging in), so a listener or route added later is covered without touching this test."""

from __future__ import annotations

import contextlib
import re
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
        body = {"data": ["hello", False, *SETTINGS, "off", ""], "fn_index": next(
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


# ----------------------------------------------------------------------- only the login page
def logged_out_status(url: str, method: str, path: str) -> int:
    """The status of one unauthenticated request (a stream is closed after its headers)."""
    body = {} if method == "POST" else None
    with httpx.stream(method, url + path, json=body, timeout=10) as response:
        return response.status_code


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "x", path)


def test_without_a_login_only_the_login_page_answers(keyed):
    with login(keyed, KEY) as client:
        routes = client.get("/openapi.json").json()["paths"]   # every Gradio route
    assert "/gradio_api/heartbeat/{session_hash}" in routes and len(routes) > 40
    for path in ("/openapi.json", "/gradio_api/heartbeat/any", "/gradio_api/app_id",
                 "/gradio_api/user", "/gradio_api/token", "/gradio_api/runs",
                 "/gradio_api/startup-events"):
        assert logged_out_status(keyed, "GET", path) == 401, path
    for path, operations in routes.items():
        for method in operations:
            status = logged_out_status(keyed, method.upper(), concrete(path))
            if app.login_page(method.upper(), concrete(path)) or path in ("/login", "/login/"):
                assert status != 401, (method, path)
            else:
                assert status == 401, (method, path)


def test_the_login_page_and_its_files_answer_without_a_login(keyed):
    page = httpx.get(keyed + "/", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    files = re.findall(r"""(?:src|href)=["'](?:\./|/)?((?:assets|static)/[^"'?]+)""", page.text)
    assert any(f.endswith(".css") for f in files) and any(f.endswith(".js") for f in files)
    for path in ["theme.css", "favicon.ico", "manifest.json", *files]:
        assert httpx.get(f"{keyed}/{path}", timeout=10).status_code == 200, path


def test_a_logged_in_session_keeps_its_heartbeat(keyed):
    with login(keyed, KEY) as client:
        assert client.get("/gradio_api/app_id").status_code == 200
        with client.stream("GET", "/gradio_api/heartbeat/abc") as heartbeat:
            assert heartbeat.status_code == 200


@pytest.mark.parametrize("origin", ["http://localhost:1234", "http://127.0.0.1:9",
                                    "https://evil.example"])
def test_with_a_key_no_other_origin_is_allowed_by_cors(keyed, origin):
    with login(keyed, KEY) as client:
        for path in ("/", "/config", "/gradio_api/app_id"):
            answer = client.get(path, headers={"Origin": origin})
            assert "access-control-allow-origin" not in answer.headers, path
        preflight = client.options("/gradio_api/queue/join", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers


@pytest.mark.browser
def test_the_login_page_logs_in_in_a_browser(keyed):
    from playwright.sync_api import expect

    from tests.test_browser import chromium

    with chromium("/usr/bin/chromium", 60_000) as browser:
        page = browser.new_page()
        page.goto(keyed + "/")
        page.fill("input[type=text]", "anyone")
        page.fill("input[type=password]", KEY)
        page.keyboard.press("Enter")
        expect(page.locator("#pg-generate")).to_be_visible()


# ----------------------------------------------------------------------- malformed calls
SECRET = "SECRET PROMPT TEXT"


def generate_id(url: str) -> int:
    return next(d["id"] for d in endpoints(url) if d.get("api_name") == "generate")


def assert_quiet(caplog, capfd, refusals: int) -> None:
    """One log line per refused call, no traceback, and never the user's text."""
    lines = [r.getMessage() for r in caplog.records if "refused a call" in r.getMessage()]
    assert len(lines) == refusals, lines
    err = capfd.readouterr().err + caplog.text
    assert "Traceback" not in err and SECRET not in err


def test_a_call_with_the_wrong_number_of_inputs_is_a_422_with_a_plain_message(
        keyed, caplog, capfd):
    fn_index = generate_id(keyed)
    caplog.set_level("INFO")
    capfd.readouterr()
    with login(keyed, KEY) as client:
        calls = [("/gradio_api/run/generate", {"data": [SECRET]}),
                 ("/gradio_api/call/generate", {"data": [SECRET, False]}),
                 ("/gradio_api/queue/join", {"data": [SECRET], "fn_index": fn_index,
                                             "session_hash": "bad"})]
        for path, body in calls:
            refused = client.post(path, json=body)
            assert refused.status_code == 422, (path, refused.text)
            given = len(body["data"])
            message = refused.json()["error"]["message"]
            assert message.startswith(f"generate: {given} inputs given, it takes "), message
            assert "object at 0x" not in refused.text and "gradio." not in refused.text
    assert_quiet(caplog, capfd, len(calls))


def test_a_value_an_input_cannot_take_is_a_plain_error_and_one_log_line(keyed, caplog, capfd):
    caplog.set_level("INFO")
    capfd.readouterr()
    with login(keyed, KEY) as client:
        data = [SECRET, False, "not a number", *SETTINGS[1:], "off", ""]
        event = client.post("/gradio_api/call/generate", json={"data": data}).json()["event_id"]
        with client.stream("GET", f"/gradio_api/call/generate/{event}") as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert "generate: input 2 (a slider) cannot take the value given" in lines[-1]
    assert SECRET not in lines[-1] and "Could not preprocess" not in lines[-1]
    assert_quiet(caplog, capfd, 1)
