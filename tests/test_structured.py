"""Structured output in the engine (celeris/sampler/grammar.py): JSON schemas, regexes and
choice lists decoded the diffusion way, on both shipped models.

What must hold: a finished ("stop") answer validates against its schema / matches its regex /
is one of the choices; every streamed text is a prefix the grammar accepts; the grammar's
forced tokens are listed in the step's event; a constrained row alone and among unconstrained
ones gives the same tokens at temperature 0, and the unconstrained ones are untouched; what
cannot be honoured is refused naming the field.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

import celeris
from celeris import GenerationParams
from celeris.request_params import request_params

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Once upon a time"

SCHEMAS = {
    "enum_and_boolean": {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog", "bird"]}, "happy": {"type": "boolean"}},
        "required": ["kind", "happy"], "additionalProperties": False},
    "nested_object_and_array": {"type": "object", "properties": {
        "pet": {"type": "object", "properties": {
            "kind": {"enum": ["cat", "dog"]},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
            "required": ["kind", "legs"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 1,
                 "maxItems": 3}},
        "required": ["pet", "tags"], "additionalProperties": False},
    "number_and_optional_key": {"type": "object", "properties": {
        "n": {"type": "number", "minimum": 0, "maximum": 10},
        "opt": {"type": "string", "enum": ["a", "b"]}},
        "required": ["n"], "additionalProperties": False},
    "bounded_string": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}},
        "required": ["name"], "additionalProperties": False},
    "date_format": {"type": "object", "properties": {
        "date": {"type": "string", "format": "date"}},
        "required": ["date"], "additionalProperties": False},
}


@pytest.fixture(scope="module", params=["celeris-tiny-bd", "celeris-tiny"])
def engine(request):
    return celeris.Engine.from_pretrained(ROOT / "models" / request.param, device="cpu")


def _params(engine, structured, max_tokens=96, **fields):
    return request_params({"max_tokens": max_tokens, **fields}, engine.default_params()
                          ).replace(structured=structured)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_finished_json_answer_validates_against_its_schema(engine, name):
    schema = SCHEMAS[name]
    result = engine.generate(PROMPT, _params(engine, ("json", json.dumps(schema))))
    assert result.finish_reason == "stop", result.text
    jsonschema.validate(json.loads(result.text), schema)


def test_a_json_object_answer_is_a_json_object_or_a_cut_prefix(engine):
    result = engine.generate(PROMPT, _params(engine, ("json_object", ""), max_tokens=24))
    assert result.text.startswith("{")
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:                                   # the cap: "length", never reported as "stop"
        assert result.finish_reason == "length" and result.usage.completion_tokens == 24


def test_regex_and_choice_answers_match(engine):
    regex = r"(yes|no), [a-z]+\."
    result = engine.generate(PROMPT, _params(engine, ("regex", regex)))
    assert result.finish_reason == "stop" and re.fullmatch(regex, result.text), result.text
    choices = ["happy", "sad", "angry"]
    result = engine.generate(PROMPT, _params(engine, ("choice", json.dumps(choices))))
    assert result.finish_reason == "stop" and result.text in choices


def test_every_streamed_text_is_a_prefix_and_forced_cells_are_commits(engine):
    schema = SCHEMAS["nested_object_and_array"]
    items = list(engine.stream(PROMPT, _params(engine, ("json", json.dumps(schema)))))
    events, result = items[:-1], items[-1]
    assert all(result.text.startswith(ev.text) for ev in events)
    assert all(set(ev.forced) <= set(ev.committed) for ev in events)
    forced = sum(len(ev.forced) for ev in events)
    assert forced > 0                       # keys and braces written without a forward
    assert result.nfe < len(result.token_ids) - forced + 1 or forced > 0
    assert all(len(ev.committed) >= 1 for ev in events)      # the frontier every step


def test_a_constrained_row_alone_equals_it_in_a_mixed_batch(engine):
    schema = SCHEMAS["enum_and_boolean"]
    constrained = _params(engine, ("json", json.dumps(schema)), max_tokens=48)
    plain = _params(engine, None, max_tokens=48)
    prompts = [PROMPT, "The little dog", PROMPT]
    together = engine.generate_batch(prompts, [constrained, plain, plain.replace(seed=3)])
    alone = [engine.generate(p, q) for p, q in zip(prompts, [constrained, plain,
                                                              plain.replace(seed=3)])]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert together[0].finish_reason == "stop" and json.loads(together[0].text)


def test_an_unsupported_or_broken_spec_is_refused_naming_it(engine):
    with pytest.raises(ValueError, match="structured output: the JSON schema"):
        engine.generate(PROMPT, _params(engine, ("json", "{not json")))
    with pytest.raises(ValueError, match="structured output: the regex"):
        engine.generate(PROMPT, _params(engine, ("regex", "(unclosed")))
    with pytest.raises(ValueError, match="structured kind must be one of"):
        GenerationParams(structured=("yaml", ""))
    with pytest.raises(ValueError, match="suppress_eos cannot be combined"):
        GenerationParams(structured=("json_object", ""), suppress_eos=True)


def test_infill_and_diffusion_gemma_refuse_structured_output():
    engine = celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny", device="cpu")
    params = engine.default_params().replace(structured=("json_object", ""))
    with pytest.raises(ValueError, match="cannot be combined with infill"):
        engine.infill_text("Once upon a [MASK] time.", params)
    from celeris.families.gemma_layout import GemmaLayout
    layout = GemmaLayout(SimpleNamespace(canvas_length=8, vocab_size=16), 16)
    with pytest.raises(ValueError, match="structured must be unset for DiffusionGemma"):
        layout.check(GenerationParams(block_length=8, structured=("json_object", "")))


def test_real_world_schemas_are_accepted_where_xgrammar_compiles_them(engine):
    """The bench's corpus (celeris/bench/schemas.json) sent as response_format json_schema
    requests: at least 90% of the schemas xgrammar compiles are accepted, every accepted one
    has its compiled grammar, and every refusal is the request's 'not supported' error."""
    from celeris.bench.structured import corpus, schema_acceptance

    entries = corpus()
    assert len(entries) >= 40 and len({e["name"] for e in entries}) == len(entries)
    found = schema_acceptance(engine)
    assert found["schemas"] == len(entries) and found["compiled"] >= 40
    assert found["accepted"] / found["compiled"] >= 0.9
    accepted = [name for name, _, ours in found["outcomes"] if ours is None]
    assert len(accepted) == found["accepted"]
    assert all(native is None for _, native, ours in found["outcomes"] if ours is None)
    assert all(ours.startswith("structured output: the JSON schema is not supported: ")
               for _, _, ours in found["outcomes"] if ours is not None)
    schemas = {e["name"]: e["schema"] for e in entries}
    for name in accepted:                   # the grammar a request decodes under
        request = engine.prepare(PROMPT, _params(engine, ("json", json.dumps(schemas[name]))))
        assert request.grammar is not None and not request.grammar.done, name
