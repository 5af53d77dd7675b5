"""Structured output through the API (celeris/server/structured.py) on a real ``create_app``
server with the default model: the openai SDK's ``parse()`` with a pydantic model, OpenAI's
``response_format``, vLLM's ``structured_outputs`` and ``guided_*`` extra body on both
endpoints, streaming, batch jobs, and a 400 naming the field for what cannot be honoured."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from celeris import Engine, GenerationParams
from celeris.batch.jobs import read_jobs
from celeris.server import create_app
from tests.live_server import live_server

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "Tell me about a pet."}]


class Pet(BaseModel):
    kind: Literal["cat", "dog", "bird"]
    happy: bool
    legs: int = Field(ge=0, le=8)


@pytest.fixture(scope="module")
def served():
    engine = Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd", device="cpu")
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            yield engine, url
    finally:
        engine.stop()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def test_the_sdk_parse_with_a_pydantic_model_returns_a_parsed_object(served):
    _, url = served
    completion = _client(url).chat.completions.parse(
        model="celeris-tiny-bd", messages=MESSAGES, response_format=Pet, max_tokens=64)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Pet)
    assert Pet.model_validate_json(choice.message.content) == choice.message.parsed


def test_response_format_json_object_gives_an_object_or_says_length(served):
    _, url = served
    out = _client(url).chat.completions.create(
        model="celeris-tiny-bd", messages=MESSAGES, max_tokens=32,
        response_format={"type": "json_object"})
    text, reason = out.choices[0].message.content, out.choices[0].finish_reason
    assert text.startswith("{")
    assert reason == "length" or isinstance(json.loads(text), dict)


@pytest.mark.parametrize("extra,check", [
    ({"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
     lambda t: t in ("yes", "no", "maybe")),
    ({"guided_choice": ["red", "blue"]}, lambda t: t in ("red", "blue")),
    ({"structured_outputs": {"regex": r"[a-z]+ and [a-z]+"}},
     lambda t: re.fullmatch(r"[a-z]+ and [a-z]+", t)),
    ({"guided_regex": r"\d{3}-\d{4}"}, lambda t: re.fullmatch(r"\d{3}-\d{4}", t)),
    ({"guided_json": Pet.model_json_schema()},
     lambda t: jsonschema.validate(json.loads(t), Pet.model_json_schema()) is None),
    ({"structured_outputs": {"grammar": 'root ::= "the " ("cat" | "dog") "."'}},
     lambda t: t in ("the cat.", "the dog.")),
])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_vllm_extra_body_constraints_hold_on_both_endpoints(served, extra, check, endpoint):
    _, url = served
    client = _client(url)
    if endpoint == "chat":
        out = client.chat.completions.create(model="celeris-tiny-bd", messages=MESSAGES,
                                             max_tokens=48, extra_body=extra)
        text = out.choices[0].message.content
    else:
        out = client.completions.create(model="celeris-tiny-bd", prompt="Once upon a time",
                                        max_tokens=48, extra_body=extra)
        text = out.choices[0].text
    assert out.choices[0].finish_reason == "stop", text
    assert check(text), text


def test_a_streamed_schema_answer_concatenates_to_the_non_streamed_one(served):
    _, url = served
    body = {"model": "celeris-tiny-bd", "messages": MESSAGES, "max_tokens": 64,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                "name": "Pet", "schema": Pet.model_json_schema(), "strict": True}}}
    full = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    text = full["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(x) for x in lines[:-1]]
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(deltas) == text and Pet.model_validate_json(text)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("body,param,words", [
    ({"guided_regex": "(unclosed"}, "guided_regex", "regex is not supported"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
     "exactly one"),
    ({"structured_outputs": {"yaml": "a: 1"}}, "structured_outputs.yaml", "not supported"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "must be 'text'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "JSON schema object"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "one structured"),
    ({"guided_regex": "a+", "suppress_eos": True}, "suppress_eos", "cannot be combined"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(served, body, param, words):
    _, url = served
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Once", "max_tokens": 8, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_batch_jobs_take_the_same_fields(tmp_path):
    line = {"custom_id": "j", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": MESSAGES, "max_tokens": 32,
                     "response_format": {"type": "json_schema", "json_schema": {
                         "name": "Pet", "schema": Pet.model_json_schema()}}}}
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(line) + "\n")
    jobs, invalid, _ = read_jobs(src, GenerationParams())
    assert invalid == [] and jobs[0].overrides["structured"][0] == "json"
    assert json.loads(jobs[0].overrides["structured"][1]) == Pet.model_json_schema()
