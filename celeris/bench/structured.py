"""The structured suite: constrained vs unconstrained decoding, side by side in one run.

A fixed set of JSON schemas (enums, booleans, nested objects, arrays, number ranges, an
optional key, a bounded string, a date format), a regex and a choice list is sent to the
loaded model as structured requests and, interleaved with them, as the same prompts without a
constraint, at batch 1 and batch 16. Reported per batch size: tokens/s of each and their
ratio, the share of constrained requests that finish with "stop" within the cap, and the share
of those whose answer validates (JSON parsed and checked against its schema with jsonschema,
the regex matched, the choice found).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from .common import BenchContext, section

PROMPT = "Tell me about a pet."
_PET = {"kind": {"enum": ["cat", "dog", "bird"]}, "happy": {"type": "boolean"}}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": _PET, "required": ["kind", "happy"],
     "additionalProperties": False},
    {"type": "object", "properties": {
        "pet": {"type": "object", "properties": {**_PET, "legs": {
            "type": "integer", "minimum": 0, "maximum": 8}},
            "required": ["kind", "legs"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["red", "blue", "small"]},
                 "minItems": 1, "maxItems": 3}},
     "required": ["pet", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0,
                                                "maximum": 10},
                                      "note": {"enum": ["good", "bad"]}},
     "required": ["score"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 1,
                                              "maximum": 20}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string", "format": "date"}},
     "required": ["date"], "additionalProperties": False},
    {"type": "object", "properties": {"pets": {"type": "array", "items": {
        "type": "object", "properties": _PET, "required": ["kind", "happy"],
        "additionalProperties": False}, "minItems": 1, "maxItems": 2}},
     "required": ["pets"], "additionalProperties": False},
]
REGEX = r"(yes|no), [a-z]+( [a-z]+)?\."
CHOICES = ["happy", "sad", "sleepy"]
COLUMNS = [("config", "config"), ("batch", "batch"), ("requests", "requests"),
           ("tokens", "tokens"), ("seconds", "s"), ("tokens_per_s", "tok/s"),
           ("ratio", "x unconstrained"), ("stop_share", "finished (stop)"),
           ("valid_share", "valid of finished")]


def constraints() -> list[tuple[str, str]]:
    return [("json", json.dumps(s)) for s in SCHEMAS] + [("regex", REGEX),
                                                          ("choice", json.dumps(CHOICES))]


def valid(kind: str, spec: str, text: str) -> bool:
    """Whether ``text`` is a complete answer of its constraint."""
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in json.loads(spec)
    import jsonschema
    try:
        jsonschema.validate(json.loads(text), json.loads(spec),
                            format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _run(ctx: BenchContext, batch: int, constrained: bool) -> dict[str, Any]:
    engine = ctx.engine
    base = ctx.base_params().replace(gen_length=ctx.gen_length, steps=None)
    specs = constraints() * 2                       # 16 requests: two of each constraint
    params = [base.replace(seed=i, structured=spec if constrained else None)
              for i, spec in enumerate(specs)]
    prompt = [{"role": "user", "content": PROMPT}] if engine.tokenizer.has_chat_template \
        else PROMPT
    tokens, stops, ok, start = 0, 0, 0, time.perf_counter()
    for lo in range(0, len(specs), batch):
        results = engine.generate_batch([prompt] * len(params[lo:lo + batch]),
                                        params[lo:lo + batch])
        for spec, result in zip(specs[lo:lo + batch], results):
            tokens += result.usage.completion_tokens
            if result.finish_reason == "stop":
                stops += 1
                ok += valid(*spec, result.text)
    seconds = time.perf_counter() - start
    row = {"config": "constrained" if constrained else "unconstrained", "batch": batch,
           "requests": len(specs), "tokens": tokens, "seconds": round(seconds, 2),
           "tokens_per_s": round(tokens / seconds, 1) if seconds else None}
    if constrained:
        row |= {"stop_share": round(stops / len(specs), 3),
                "valid_share": round(ok / stops, 3) if stops else None}
    return row


def run_structured(ctx: BenchContext) -> dict[str, Any]:
    ctx.engine.generate(PROMPT, ctx.base_params().replace(
        gen_length=16, steps=None, structured=constraints()[0]))      # compile, warm up
    rows: list[dict[str, Any]] = []
    for batch in (1, 16):
        pair = [_run(ctx, batch, False), _run(ctx, batch, True)]     # side by side
        plain, constrained = pair
        if plain["tokens_per_s"]:
            constrained["ratio"] = round(constrained["tokens_per_s"] / plain["tokens_per_s"],
                                         2)
        rows += pair
    notes = [f"16 requests per row (two each of {len(SCHEMAS)} JSON schemas, a regex and a "
             f"choice list), max_tokens {ctx.gen_length} (--gen-length), greedy; the "
             "unconstrained rows are the same "
             "prompts without the constraint (they write until EOS or the cap)",
             "tok/s = completion tokens / wall time of the rows' generate_batch calls; "
             "constrained tokens include those the grammar wrote without a forward",
             "valid: JSON parsed and validated with jsonschema (formats checked), the regex "
             "fully matched, the choice found"]
    settings = {"model": ctx.engine.model_dir.name, "prompt": PROMPT,
                "max_tokens": ctx.gen_length, "temperature": 0.0}
    return section("structured", "Structured output: constrained vs unconstrained", COLUMNS,
                   rows, settings, notes)
