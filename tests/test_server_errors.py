"""Every error case of the API: status, OpenAI error shape (type, param, code), no leaks;
and access control (API key on every route but /health and /ready, Host checks, CORS)."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

import celeris
from celeris.server import create_app
from celeris.server.routes import PUBLIC_PATHS
from tests.live_server import live_server
from tests.tiny_model import make_tiny_model_dir

KEY = "s3cret-key-for-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = celeris.Engine.from_pretrained(
        make_tiny_model_dir(tmp_path_factory.mktemp("tiny")), device="cpu")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def app(engine):
    return create_app(engine, api_key=KEY, max_body_bytes=10_000)


@pytest.fixture(scope="module")
def url(app):
    with live_server(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def post(url, path, body, headers=None):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, timeout=30,
                      headers={**AUTH, "Content-Type": "application/json", **(headers or {})})


def assert_error(response, status, type_, param, code=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == (type_, param), error
    if code is not None:
        assert error["code"] == code, error
    for leak in ("Traceback", 'File "', "/work/", ".py", KEY):
        assert leak not in response.text
    return error


# ----------------------------------------------------------------------- 400
@pytest.mark.parametrize("raw,param", [
    (b'{"prompt": "x", "temperature": NaN}', "temperature"),
    (b'{"prompt": "x", "top_p": Infinity}', "top_p"),
    (b'{"prompt": "x", "threshold": -Infinity}', "threshold"),
    (b'{"prompt": "x", "cfg_scale": 1e999}', "cfg_scale"),
])
def test_non_finite_numbers_are_rejected_with_the_params_message(url, raw, param):
    error = assert_error(post(url, "/v1/completions", raw), 400, "invalid_request_error", param)
    assert "finite" in error["message"]


@pytest.mark.parametrize("body,param,fragment", [
    ({"temperature": 2.5}, "temperature", "temperature must be in [0.0, 2.0], got 2.5"),
    ({"top_k": -1}, "top_k", "top_k must be in [0, 1000000]"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be in [1, 255] for this model"),
    ({"max_tokens": 5000}, "max_tokens", "max_tokens must be in [1, 255] for this model"),
    ({"seed": -5}, "seed", "seed must be in"),
    ({"steps": 3, "max_tokens": 16}, "steps", "or a multiple of the number of blocks"),
    ({"decoding": "magic"}, "decoding", "decoding must be one of"),
    ({"cache": "prefix", "cfg_scale": 1.0}, "cfg_scale", "cfg_scale > 0 needs cache 'none'"),
])
def test_out_of_range_values_reuse_the_params_validation(url, body, param, fragment):
    error = assert_error(post(url, "/v1/completions", {"prompt": "x", **body}), 400,
                         "invalid_request_error", param)
    assert fragment in error["message"]


def test_sdk_raises_bad_request_for_invalid_values(client, engine):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=engine.model_dir.name, prompt="x", temperature=3)
    assert exc.value.status_code == 400 and exc.value.body["param"] == "temperature"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": ["a", ""]}, "prompt[1]"),
    ("/v1/completions", {"prompt": [[5, 6], []]}, "prompt[1]"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x"}]},
     "messages"),
])
def test_empty_or_unusable_prompts_are_rejected(url, path, body, param):
    assert_error(post(url, path, body), 400, "invalid_request_error", param)


def test_prompt_plus_max_tokens_over_the_context_names_both_numbers(url, engine):
    prompt = "the quick brown fox " * 20
    n = len(engine.tokenizer.encode(prompt))
    error = assert_error(post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 200}),
                         400, "invalid_request_error", "prompt", "context_length_exceeded")
    assert f"prompt ({n} tokens) + max_tokens (200)" in error["message"]
    assert "256 tokens" in error["message"]


@pytest.mark.parametrize("body,param,code", [
    ({"temprature": 0.5}, "temprature", "unknown_parameter"),
    ({"chat_template": "{{ x }}"}, "chat_template", "unknown_parameter"),
    ({"trust_remote_code": True}, "trust_remote_code", "unknown_parameter"),
    ({"model_path": "/etc/passwd"}, "model_path", "unknown_parameter"),
])
def test_fields_that_would_change_the_output_are_refused(url, body, param, code):
    assert_error(post(url, "/v1/completions", {"prompt": "x", **body}), 400,
                 "invalid_request_error", param, code)


def test_inert_openai_fields_are_accepted(url):
    response = post(url, "/v1/completions", {"prompt": "x", "user": "u1", "n": 1,
                                             "presence_penalty": 0, "logprobs": None})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "max_tokens": "16"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 16.5}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": [1]}, "stop"),
    ("/v1/completions", {}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
])
def test_wrong_types_name_the_parameter(url, path, body, param):
    assert_error(post(url, path, body), 400, "invalid_request_error", param)


@pytest.mark.parametrize("raw,code", [
    (b'{"prompt": "x"', "invalid_json"),
    (b"", "invalid_json"),
    (b'["prompt"]', "invalid_json"),
    (b'{"prompt": "\xff\xfe"}', "invalid_utf8"),
    (b'{"prompt": "\\ud800"}', "invalid_json"),       # a lone surrogate is not text
    (b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", "invalid_json"),
])
def test_malformed_bodies_are_rejected(url, raw, code):
    assert_error(post(url, "/v1/completions", raw), 400, "invalid_request_error", None, code)


# ----------------------------------------------------------------------- 401 / 404 / 413
def test_missing_or_wrong_api_key_is_401(url, engine):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.get(f"{url}/v1/models", headers=headers)
        assert_error(response, 401, "authentication_error", None, "invalid_api_key")
        assert response.headers["www-authenticate"] == "Bearer"
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=engine.model_dir.name, prompt="x")


def test_unknown_model_is_404(url, client):
    assert_error(post(url, "/v1/completions", {"prompt": "x", "model": "gpt-9"}), 404,
                 "not_found_error", "model", "model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="/etc/passwd",
                                       messages=[{"role": "user", "content": "x"}])
    assert_error(httpx.get(f"{url}/v1/models/gpt-9", headers=AUTH), 404, "not_found_error",
                 "model")
    assert_error(httpx.get(f"{url}/v2/nothing", headers=AUTH), 404, "not_found_error", None)


def test_body_over_the_limit_is_413(url):
    big = {"prompt": "x" * 20_000}
    assert_error(post(url, "/v1/completions", big), 413, "invalid_request_error", None,
                 "request_too_large")

    def chunked():   # no Content-Length: the limit holds while reading
        yield b'{"prompt": "'
        for _ in range(30):
            yield b"y" * 1000
        yield b'"}'

    response = httpx.post(f"{url}/v1/completions", content=chunked(),
                          headers={**AUTH, "Content-Type": "application/json"})
    assert_error(response, 413, "invalid_request_error", None, "request_too_large")


# ----------------------------------------------------------------------- 503 / stream errors
def test_loading_model_is_503_until_ready(engine):
    import threading

    release = threading.Event()

    def loader():
        release.wait(10)
        return engine

    app = create_app(loader, api_key=KEY)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").json()["status"] == "loading"
        response = http.post("/v1/completions", json={"prompt": "x"}, headers=AUTH)
        assert_error(response, 503, "server_error", None, "model_loading")
        assert response.headers["retry-after"] == "5"
        release.set()
        for _ in range(500):
            if http.get("/ready").status_code == 200:
                break
            threading.Event().wait(0.01)
        assert http.post("/v1/completions", json={"prompt": "x"},
                         headers=AUTH).status_code == 200


def test_draining_server_answers_503(engine):
    app = create_app(engine, api_key=KEY, warmup=False)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        app.state.celeris.draining = True
        assert http.get("/ready").status_code == 503
        assert_error(http.post("/v1/completions", json={"prompt": "x"}, headers=AUTH), 503,
                     "server_error", None, "draining")


def test_an_error_after_streaming_started_is_a_final_sse_event(url, client, engine):
    calls = {"n": 0}

    def fail_later(*_):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("GPU fell off /secret/path.py")

    handle = engine.model.register_forward_pre_hook(fail_later)
    try:
        with httpx.stream("POST", f"{url}/v1/completions", headers=AUTH, json={
                "prompt": "x", "max_tokens": 16, "stream": True, "suppress_eos": True}) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        calls["n"] = 0
        with pytest.raises(openai.APIError, match="internal server error"):
            for _ in client.completions.create(model=engine.model_dir.name, prompt="x",
                                               max_tokens=16, stream=True,
                                               extra_body={"suppress_eos": True}):
                pass
    finally:
        handle.remove()
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][6:])["error"]
    assert error == {"message": "internal server error", "type": "server_error",
                     "param": None, "code": "internal_error"}
    assert "secret" not in "".join(lines)


# ----------------------------------------------------------------------- access control
def test_every_route_except_health_and_ready_requires_the_key(app):
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} >= {"/v1/models", "/v1/completions",
                                        "/v1/chat/completions", "/metrics"}
    with TestClient(app, base_url="http://127.0.0.1") as http:
        for route in routes:
            path = route.path.replace("{model_id:path}", "some-model")
            for method in route.methods:
                response = http.request(method, path, json={"prompt": "x"})
                if route.path in PUBLIC_PATHS:
                    assert response.status_code in (200, 503), route.path
                else:
                    assert_error(response, 401, "authentication_error", None)
    assert PUBLIC_PATHS == {"/health", "/ready"}


@pytest.mark.parametrize("host", ["evil.example", "attacker.com:8000", "127.0.0.1.nip.io",
                                  "192.168.1.5"])
def test_loopback_server_refuses_foreign_host_headers(url, host):
    for path in ("/health", "/v1/models"):
        response = httpx.get(f"{url}{path}", headers={**AUTH, "Host": host})
        error = assert_error(response, 403, "permission_error", None, "host_not_allowed")
        assert "loopback" in error["message"]


def test_loopback_names_are_accepted(url):
    port = url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "LOCALHOST"):
        assert httpx.get(f"{url}/health", headers={"Host": host}).status_code == 200


def test_public_bind_without_key_warns_and_skips_the_host_check(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="celeris.server"):
        app = create_app(engine, host="0.0.0.0", warmup=False)
    assert "without an API key" in caplog.text
    with TestClient(app, base_url="http://my-space.hf.space") as http:
        assert http.get("/health").status_code == 200
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celeris.server"):
        create_app(engine, host="0.0.0.0", api_key=KEY, warmup=False)
    assert "without an API key" not in caplog.text


def test_no_cors_by_default_and_only_named_origins_when_configured(app, engine):
    with TestClient(app, base_url="http://127.0.0.1") as http:
        plain = http.get("/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in plain.headers
        preflight = http.options("/v1/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers
    allowed = create_app(engine, api_key=KEY, cors_origins=["http://ok.example"], warmup=False)
    with TestClient(allowed, base_url="http://127.0.0.1") as http:
        ok = http.get("/health", headers={"Origin": "http://ok.example"})
        assert ok.headers["access-control-allow-origin"] == "http://ok.example"
        other = http.get("/health", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_the_key_never_appears_in_logs_or_metrics(url, caplog):
    with caplog.at_level(logging.DEBUG):
        post(url, "/v1/completions", {"prompt": "x", "max_tokens": 8})
        httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}x"})
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert KEY not in caplog.text and KEY not in metrics
    assert 'celeris_requests_total{route="/v1/models",status="401"}' in metrics
    assert "celeris_generated_tokens_total" in metrics


# ----------------------------------------------------------------------- request hygiene
@pytest.mark.parametrize("body,param,fragment", [
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
    ({"stream": False, "stream_options": {}}, "stream_options", "only allowed with stream"),
])
def test_stream_options_without_stream_is_refused(url, body, param, fragment):
    error = assert_error(post(url, "/v1/completions", {"prompt": "x", **body}), 400,
                         "invalid_request_error", param)
    assert fragment in error["message"]


def test_max_completion_tokens_must_agree_with_max_tokens(url):
    chat = {"messages": [{"role": "user", "content": "x"}]}
    error = assert_error(post(url, "/v1/chat/completions",
                              {**chat, "max_tokens": 8, "max_completion_tokens": 16}),
                         400, "invalid_request_error", "max_completion_tokens")
    assert "max_completion_tokens (16) differs from max_tokens (8)" in error["message"]
    same = post(url, "/v1/chat/completions", {**chat, "max_tokens": 8,
                                              "max_completion_tokens": 8})
    assert same.status_code == 200 and same.json()["usage"]["completion_tokens"] <= 8


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          None])
def test_a_body_that_is_not_declared_json_is_refused(url, content_type):
    headers = {**AUTH} if content_type is None else {**AUTH, "Content-Type": content_type}
    response = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "x"}', headers=headers)
    error = assert_error(response, 400, "invalid_request_error", "Content-Type",
                         "invalid_content_type")
    assert "application/json" in error["message"]
    ok = post(url, "/v1/completions", {"prompt": "x", "max_tokens": 8},
              {"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_too_many_or_too_large_headers_are_refused_with_431(url):
    many = {f"x-extra-{i}": "1" for i in range(80)}
    response = httpx.get(f"{url}/v1/models", headers={**AUTH, **many})
    assert_error(response, 431, "invalid_request_error", None, "headers_too_large")
    big = {"x-big": "y" * 17_000}
    response = httpx.post(f"{url}/v1/completions", headers={**AUTH, **big}, json={"prompt": "x"})
    assert_error(response, 431, "invalid_request_error", None, "headers_too_large")
    assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200


def test_access_log_never_records_query_strings():
    from celeris.server.serve import strip_query_strings

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET",
                                                           f"/v1/models?api_key={KEY}", "1.1",
                                                           401), None)
    assert strip_query_strings(record)
    assert record.getMessage() == '127.0.0.1:5 - "GET /v1/models HTTP/1.1" 401'
