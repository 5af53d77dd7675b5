"""Tool calls: the family's syntax (celeris/families/tool_calls.py) and /v1/chat/completions
with ``tools`` (celeris/server/tools.py) on real servers: each tool_choice, parallel calls,
streamed deltas that reassemble to the non-streamed call, history with tool turns, the openai
SDK's round trip (call -> tool message -> answer), both layouts, and 400s naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from celeris import Engine
from celeris.families import by_name
from celeris.families.tool_calls import GENERIC, QWEN, CallStream, ToolRequestError, ToolSyntax
from celeris.server import create_app
from celeris.tokenizer import Tokenizer
from tests.live_server import live_server

ROOT = Path(__file__).resolve().parents[1]
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"]}}}
NOTE = {"type": "function", "function": {
    "name": "note", "parameters": {"type": "object", "properties": {
        "text": {"type": "string", "maxLength": 12}, "urgent": {"type": "boolean"}},
        "required": ["text"]}}}
TOOLS = [WEATHER, ADD]     # the shipped models' context (512) holds two listed tools
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (*TOOLS, NOTE)}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid(call: dict) -> None:
    fn = call["function"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])


# ----------------------------------------------------------------------- the syntax
def test_parse_reads_calls_keeps_other_text_and_a_cut_call():
    text = ('Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
            '</tool_call>\n<tool_call>\n{"name": "note", "arguments": {"text": "hi"}}\n'
            '</tool_call>')
    content, calls = QWEN.parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("add", {"a": 1, "b": 2}), ("note", {"text": "hi"})]
    assert len({c.id for c in calls}) == 2
    bad = "<tool_call>\n{\"oops\": 1}\n</tool_call> plain"
    assert QWEN.parse(bad) == (bad, [])                      # not a call: it is the text
    cut = '<tool_call>\n{"name": "add", "arguments": {"a": 1'   # the length cap hit it
    content, calls = QWEN.parse(cut)
    assert content is None and calls[0].name == "add" and calls[0].arguments == '{"a": 1'


def test_stream_deltas_reassemble_to_what_parse_reads():
    text = ('Sure <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": {"c": "}"}}}\n'
            '</tool_call>\n<tool_call>\n{"name": "note", "arguments": {"text": "x"}}\n'
            '</tool_call>')
    stream = CallStream(QWEN)
    content, calls = "", {}
    for end in range(1, len(text) + 1):                      # one character a step
        new, deltas = stream.feed(text[:end], final=end == len(text))
        content += new
        for d in deltas:
            call = calls.setdefault(d["index"], {"name": None, "arguments": ""})
            if "id" in d:
                assert call["name"] is None                  # id and name come once
                call["name"] = d["function"]["name"]
            call["arguments"] += d["function"]["arguments"]
    want_content, want = QWEN.parse(text)
    assert content == want_content == "Sure"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(c.name, c.arguments) for c in want]


def test_constraints_per_tool_choice_and_refusals():
    tools = [WEATHER, ADD]
    assert QWEN.constraint(tools, "none", True) is None
    kinds = {choice: json.loads(QWEN.constraint(tools, choice, True)[1])["format"]
             for choice in ("auto", "required", "add")}
    assert kinds["auto"]["type"] == "triggered_tags" and kinds["auto"]["triggers"] == ["<tool_call>"]
    assert kinds["required"]["type"] == "tags_with_separator"
    assert kinds["required"]["at_least_one"] and len(kinds["required"]["tags"]) == 2
    assert [t["begin"] for t in kinds["add"]["tags"]] == \
        ['<tool_call>\n{"name": "add", "arguments": ']
    assert json.loads(QWEN.constraint(tools, "required", False)[1])["format"]["stop_after_first"]
    with pytest.raises(ToolRequestError, match="names 'nope', which is not in tools") as exc:
        QWEN.constraint(tools, "nope", True)
    assert exc.value.param == "tool_choice"
    gemma = by_name("diffusion_gemma").tool_calls
    assert gemma.constraint(tools, "auto", True) is None      # read from the finished text
    with pytest.raises(ToolRequestError, match="needs constrained decoding"):
        gemma.constraint(tools, "required", True)


def test_families_declare_their_syntax():
    assert by_name("fast_dllm_v2").tool_calls is QWEN and by_name("sdar").tool_calls is QWEN
    assert by_name("celeris").tool_calls is GENERIC and by_name("llada").tool_calls is GENERIC


def test_generic_rendering_lists_tools_and_writes_history_in_the_syntax():
    history = [{"role": "system", "content": "Be brief."}, *ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather",
                                 "arguments": '{"city": "Paris", "unit": "c"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    out = GENERIC.generic_messages(history, [WEATHER["function"]])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\nFunctions:\n")
    assert '{"name":"get_weather","parameters":{"type":"object"' in out[0]["content"]
    assert out[2]["content"] == ('<tool_call>\n{"name": "get_weather", "arguments": '
                                 '{"city": "Paris", "unit": "c"}}\n</tool_call>')
    assert out[3]["content"] == "<tool_response>\n18 C, sunny\n</tool_response>"


def test_a_template_that_renders_tools_gets_them(tmp_path):
    """A Qwen-style template receives ``tools`` and the calls' arguments as objects."""
    hf = Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd", device="cpu").tokenizer.hf
    hf.chat_template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>"
        "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.name }}:{{ c.function.arguments.a }}]"
        "{% endfor %}{% endfor %}<assistant>")
    tok = Tokenizer(hf, Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd",
                                               device="cpu").special)
    assert tok.renders_tools
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 7}'}}]}]
    ids = QWEN.prompt(tok, history, [WEATHER, ADD])
    assert hf.decode(ids) == ("<tools>get_weather;add;</tools><user>What is the weather in "
                              "Paris?<assistant>[add:7]<assistant>")


# ----------------------------------------------------------------------- the API
@pytest.fixture(scope="module", params=["celeris-tiny-bd", "celeris-tiny"])
def served(request):
    engine = Engine.from_pretrained(ROOT / "models" / request.param, device="cpu")
    try:
        with live_server(create_app(engine, warmup=False)) as url:
            yield request.param, url
    finally:
        engine.stop()


def _chat(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions",
                      json={"messages": ASK, "tools": TOOLS, "max_tokens": 96, "seed": 3,
                            **body}, timeout=300)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}},
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_choices_give_calls_that_validate(served, choice):
    _, url = served
    for seed in (1, 2):
        r = _chat(url, tool_choice=choice, seed=seed)
        assert r.status_code == 200, r.text
        out = r.json()["choices"][0]
        assert out["finish_reason"] == "tool_calls", out
        calls = out["message"]["tool_calls"]
        assert calls and out["message"]["content"] is None
        for call in calls:
            _valid(call)
        if isinstance(choice, dict):
            assert {c["function"]["name"] for c in calls} == {choice["function"]["name"]}


def test_parallel_tool_calls_false_gives_exactly_one_call(served):
    _, url = served
    for seed in (1, 2, 3):
        out = _chat(url, tool_choice="required", parallel_tool_calls=False,
                    seed=seed).json()["choices"][0]
        assert out["finish_reason"] == "tool_calls" and len(out["message"]["tool_calls"]) == 1


def test_auto_and_none_answer_text_or_calls(served):
    _, url = served
    none = _chat(url, tool_choice="none").json()["choices"][0]
    assert "tool_calls" not in none["message"] and none["finish_reason"] in ("stop", "length")
    auto = _chat(url, tool_choice="auto").json()["choices"][0]
    for call in auto["message"].get("tool_calls") or []:
        _valid(call)
    assert auto["finish_reason"] == ("tool_calls" if auto["message"].get("tool_calls")
                                     else auto["finish_reason"])


def test_streamed_calls_reassemble_to_the_non_streamed_answer(served):
    _, url = served
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 96,
            "seed": 5, "temperature": 0}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    calls: dict[int, dict] = {}
    finish, content = None, ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
            for d in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
                call["name"] += d["function"].get("name") or ""
                call["arguments"] += d["function"]["arguments"]
    want = whole["choices"][0]
    assert finish == want["finish_reason"] == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in want["message"]["tool_calls"]]


def test_the_sdk_round_trip_call_then_tool_message_then_answer(served):
    name, url = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    first = client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,
                                           tool_choice="required", max_tokens=96, seed=1)
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    call = msg.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    history = [*ASK, msg.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model=name, messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=32, seed=1)
    assert second.choices[0].finish_reason in ("stop", "length")
    assert second.choices[0].message.tool_calls is None
    alone = client.chat.completions.create(model=name, messages=ASK, tools=TOOLS,
                                           tool_choice="none", max_tokens=8, seed=1)
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 20   # the history was read


@pytest.mark.parametrize("body,param,message", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "names 'nope', which is not in tools"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", "must be 'none', 'auto', 'required'"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "distinct function names"),
    ({"response_format": {"type": "json_object"}}, "tools", "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}}],
      "tool_choice": "required"}, "tools", "structural tag is not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "tools[0].type"),
])
def test_tool_requests_that_cannot_be_honoured_are_400s_naming_the_field(served, body, param,
                                                                          message):
    _, url = served
    r = _chat(url, **body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"]


def test_constrained_syntax_refused_by_name_where_the_sampler_takes_no_grammar():
    plain = ToolSyntax("generic", constrained=False)
    assert plain.constraint([ADD], None, True) is None
    with pytest.raises(ToolRequestError, match="tool_choice 'add' needs constrained decoding"):
        plain.constraint([ADD], "add", True)
