"""The structured suite: constrained vs unconstrained decoding, side by side in one run.

A fixed set of JSON schemas (enums, booleans, nested objects, arrays, number ranges, an
optional key, a bounded string, a date format), a regex and a choice list is sent to the
loaded model as structured requests and, interleaved with them, as the same prompts without a
constraint, at batch 1 and batch 16. Reported per batch size: tokens/s of each and their
ratio, the share of constrained requests that finish with "stop" within the cap, and the share
of those whose answer validates (JSON parsed and checked against its schema with jsonschema,
the regex matched, the choice found). Tool calls: the same prompt with two functions, under
``tool_choice`` required and each named function (the family's syntax and call grammar):
the share that finish with calls, and of those the share whose every call parses and whose
arguments validate against the function's schema. Schema acceptance (compilation only, no
generation): each schema of ``schemas.json`` (pydantic-generated, tool parameters and
hand-written ones) compiled by xgrammar itself and sent the way a request sends it; reported:
how many Celeris accepts of those xgrammar compiles, and what refused the others.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from .. import EXAMPLE_TOOLS
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
TOOLS = EXAMPLE_TOOLS
TOOL_PROMPT = "What is the weather in Paris?"
REGEX = r"(yes|no), [a-z]+( [a-z]+)?\."
CHOICES = ["happy", "sad", "sleepy"]
CORPUS = Path(__file__).with_name("schemas.json")
ACCEPTANCE_COLUMNS = [("corpus", "corpus", "s"), ("schemas", "schemas", "d"),
                      ("compiled", "xgrammar compiles", "d"),
                      ("accepted", "Celeris accepts", "d"),
                      ("ratio", "accepted / compiled", ".3f"), ("seconds", "s", ".2f")]
COLUMNS = [("config", "config", "s"), ("batch", "batch", "d"), ("requests", "requests", "d"),
           ("tokens", "tokens", "d"), ("seconds", "s", ".2f"), ("tokens_per_s", "tok/s", ".1f"),
           ("ratio", "x unconstrained", ".2f"), ("stop_share", "finished (stop)", ".3f"),
           ("valid_share", "valid of finished", ".3f")]


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


def corpus() -> list[dict[str, Any]]:
    """The acceptance corpus: [{"name", "source", "schema"}]."""
    return json.loads(CORPUS.read_text(encoding="utf-8"))["schemas"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text.splitlines()[0] if text else
                  type(exc).__name__)[:200]


def schema_acceptance(engine: Any, prompt: str = PROMPT) -> dict[str, Any]:
    """Each corpus schema compiled by xgrammar itself (``Grammar.from_json_schema``, its
    defaults) and sent as a request sends it: ``response_format`` json_schema through the
    server's request schema and parameter mapping to ``Engine.prepare``, which compiles the
    request's grammar (a refusal there is the request's 400). Nothing is generated.
    Returns the counts and, per schema, (name, xgrammar's error or None, Celeris's error or
    None)."""
    import xgrammar as xgr

    from celeris.server.bodies import generation_params
    from celeris.server.errors import APIError
    from celeris.server.protocol import CompletionRequest

    start = time.perf_counter()
    outcomes: list[tuple[str, str | None, str | None]] = []
    for entry in corpus():
        try:
            xgr.Grammar.from_json_schema(json.dumps(entry["schema"]))
            native = None
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError
            native = _first_line(exc)
        try:
            req = CompletionRequest.model_validate({
                "prompt": prompt, "max_tokens": 16,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": entry["name"], "schema": entry["schema"], "strict": True}}})
            params = generation_params(req, engine.default_params())
            if engine.prepare(req.to_prompt(), params).grammar is None:
                raise ValueError("no grammar was compiled")
            ours = None
        except (APIError, ValueError) as exc:
            ours = _first_line(exc)
        outcomes.append((entry["name"], native, ours))
    compiled = [o for o in outcomes if o[1] is None]
    accepted = [o for o in compiled if o[2] is None]
    return {"schemas": len(outcomes), "compiled": len(compiled), "accepted": len(accepted),
            "ratio": round(len(accepted) / len(compiled), 3) if compiled else None,
            "seconds": round(time.perf_counter() - start, 2), "outcomes": outcomes}


def _acceptance_table(ctx: BenchContext) -> tuple[dict[str, Any], list[str]]:
    """The schema-acceptance table and its notes."""
    found = schema_acceptance(ctx.engine)
    row = {"corpus": CORPUS.name, **{k: v for k, v in found.items() if k != "outcomes"}}
    refused = [f"{name} ({ours})" for name, native, ours in found["outcomes"]
               if native is None and ours is not None]
    beyond = [f"{name} ({native})" for name, native, _ in found["outcomes"]
              if native is not None]
    notes = [f"schema acceptance ({CORPUS.name}: pydantic-generated, tool-parameter and "
             "hand-written JSON schemas): compiled by xgrammar itself, and sent as "
             "response_format json_schema through the request path to Engine.prepare "
             "(compilation only, no generation); Celeris refuses "
             + ("; ".join(refused) if refused else "none that xgrammar compiles"),
             "schemas xgrammar itself does not compile (not counted): "
             + ("; ".join(beyond) if beyond else "none"),
             "accepted is compiled, not every keyword enforced: xgrammar 0.2.9 lets through "
             "answers that break not, if/then/else, dependentRequired, uniqueItems, contains, "
             "multipleOf on numbers, length bounds beside a pattern or format, and oneOf's "
             "exclusivity"]
    return ({"name": "schema_acceptance", "rows": [row],
             "title": "schema acceptance: real-world JSON schemas, compile only",
             "columns": [list(c) for c in ACCEPTANCE_COLUMNS]}, notes)


def _chunk(ctx: BenchContext, prompt: Any, specs: list, params: list, tally: dict) -> None:
    """One generate_batch call, added to ``tally`` (tokens, seconds, stops, valid)."""
    start = time.perf_counter()
    results = ctx.engine.generate_batch([prompt] * len(params), params)
    tally["seconds"] += time.perf_counter() - start
    for spec, result in zip(specs, results):
        tally["tokens"] += result.usage.completion_tokens
        if spec is not None and result.finish_reason == "stop":
            tally["stops"] += 1
            tally["valid"] += valid(*spec, result.text)


def _pair(ctx: BenchContext, batch: int) -> list[dict[str, Any]]:
    """Unconstrained and constrained rows at one batch size, chunk by chunk alternately (the
    same load for both)."""
    base = ctx.base_params().replace(gen_length=ctx.gen_length, steps=None)
    specs = constraints() * 2                       # 16 requests: two of each constraint
    prompt = [{"role": "user", "content": PROMPT}] if ctx.engine.tokenizer.has_chat_template \
        else PROMPT
    tallies = [dict.fromkeys(("tokens", "seconds", "stops", "valid"), 0) for _ in range(2)]
    for lo in range(0, len(specs), batch):
        chunk = specs[lo:lo + batch]
        for tally, constrained in zip(tallies, (False, True)):
            params = [base.replace(seed=lo + i, structured=spec if constrained else None)
                      for i, spec in enumerate(chunk)]
            _chunk(ctx, prompt, chunk if constrained else [None] * len(chunk), params, tally)
    rows = []
    for tally, name in zip(tallies, ("unconstrained", "constrained")):
        t = tally["seconds"]
        rows.append({"config": name, "batch": batch, "requests": len(specs),
                     "tokens": tally["tokens"], "seconds": round(t, 2),
                     "tokens_per_s": round(tally["tokens"] / t, 1) if t else None})
    rows[1] |= {"stop_share": round(tallies[1]["stops"] / len(specs), 3),
                "valid_share": round(tallies[1]["valid"] / tallies[1]["stops"], 3)
                if tallies[1]["stops"] else None}
    return rows


def _sharing_rows(ctx: BenchContext, repeats: int = 3) -> list[dict[str, Any]]:
    """What constrained rows cost the unconstrained rows of their batch: 8 unconstrained rows
    share a batch of 16 with 8 constrained rows, or with 8 unconstrained rows of the same
    lengths (the constrained rows' token counts, EOS suppressed), alternately. Reported:
    the 8 rows' tokens over the time until the last of them finished (their tokens are the
    same in both batches: batch invariance)."""
    base = ctx.base_params().replace(gen_length=ctx.gen_length, steps=None)
    prompt = [{"role": "user", "content": PROMPT}] if ctx.engine.tokenizer.has_chat_template \
        else PROMPT
    plain = [base.replace(seed=i) for i in range(8)]
    specs = constraints()[:8]
    timed = {"matched": [0, 0.0], "constrained": [0, 0.0]}
    for _ in range(repeats):
        mixed = ctx.engine.generate_batch(
            [prompt] * 16, plain + [base.replace(seed=8 + i, structured=spec)
                                    for i, spec in enumerate(specs)])
        lengths = [max(1, r.usage.completion_tokens) for r in mixed[8:]]
        matched = ctx.engine.generate_batch(
            [prompt] * 16, plain + [base.replace(seed=8 + i, gen_length=n, suppress_eos=True)
                                    for i, n in enumerate(lengths)])
        for name, results in (("constrained", mixed), ("matched", matched)):
            timed[name][0] += sum(r.usage.completion_tokens for r in results[:8])
            timed[name][1] += max(r.timings.total_s for r in results[:8])
    rows = [{"config": f"8 unconstrained beside 8 {name}", "batch": 16, "requests": 8 * repeats,
             "tokens": tokens, "seconds": round(seconds, 2),
             "tokens_per_s": round(tokens / seconds, 1) if seconds else None}
            for name, (tokens, seconds) in (("unconstrained (same lengths)", timed["matched"]),
                                            ("constrained", timed["constrained"]))]
    if rows[0]["tokens_per_s"] and rows[1]["tokens_per_s"]:
        rows[1]["ratio"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 3)
    return rows


def calls_valid(syntax: Any, text: str) -> bool | None:
    """None: no call; else whether every call parses and its arguments validate."""
    import jsonschema
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    _, calls = syntax.parse(text)
    if not calls:
        return None
    try:
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return True


def _tool_rows(ctx: BenchContext) -> list[dict[str, Any]]:
    """16 requests per tool_choice (required, each function by name), batch 16."""
    engine = ctx.engine
    syntax = engine.family.tool_calls
    prompt = syntax.prompt(engine.tokenizer, [{"role": "user", "content": TOOL_PROMPT}], TOOLS)
    base = ctx.base_params().replace(gen_length=min(ctx.gen_length, 128), steps=None,
                                     temperature=0.8)      # sampled: 16 different calls
    if len(prompt) + base.gen_length > engine.model.config.max_position_embeddings:
        return []                       # the listed tools do not fit this model's context
    rows = []
    for choice in ("required", *(t["function"]["name"] for t in TOOLS)):
        params = [base.replace(seed=i, structured=syntax.constraint(TOOLS, choice, True))
                  for i in range(16)]
        start = time.perf_counter()
        results = engine.generate_batch([prompt] * 16, params)
        seconds = time.perf_counter() - start
        checks = [calls_valid(syntax, r.text) if r.finish_reason == "stop" else None
                  for r in results]
        called = [c for c in checks if c is not None]
        tokens = sum(r.usage.completion_tokens for r in results)
        rows.append({"config": f"tool_choice {choice}", "batch": 16, "requests": 16,
                     "tokens": tokens, "seconds": round(seconds, 2),
                     "tokens_per_s": round(tokens / seconds, 1),
                     "stop_share": round(len(called) / 16, 3),
                     "valid_share": round(sum(called) / len(called), 3) if called else None})
    return rows


def run_structured(ctx: BenchContext) -> dict[str, Any]:
    start = time.perf_counter()          # each grammar compiled once, outside the timing
    for spec in constraints():
        ctx.engine.generate(PROMPT, ctx.base_params().replace(gen_length=8, steps=None,
                                                               structured=spec))
    warm = time.perf_counter() - start
    rows: list[dict[str, Any]] = []
    for batch in (1, 16):
        pair = _pair(ctx, batch)
        plain, constrained = pair
        if plain["tokens_per_s"]:
            constrained["ratio"] = round(constrained["tokens_per_s"] / plain["tokens_per_s"],
                                         2)
        rows += pair
    rows += _sharing_rows(ctx)
    tool_rows = _tool_rows(ctx) if ctx.engine.tokenizer.has_chat_template else []
    rows += tool_rows
    notes = [f"16 requests per row (two each of {len(SCHEMAS)} JSON schemas, a regex and a "
             f"choice list), max_tokens {ctx.gen_length} (--gen-length), greedy; the "
             "unconstrained rows are the same "
             "prompts without the constraint (they write until EOS or the cap)",
             "tok/s = completion tokens / wall time of the rows' generate_batch calls; "
             "constrained tokens include those the grammar wrote without a forward",
             "valid: JSON parsed and validated with jsonschema (formats checked), the regex "
             "fully matched, the choice found",
             f"tool_choice rows: {TOOL_PROMPT!r} with two functions (an enum pair, two "
             "bounded integers) in the family's syntax, max_tokens min(128, --gen-length), "
             "temperature 0.8, seeds 0-15; finished = stop with calls; valid = every call parsed and its "
             "arguments validated (jsonschema)" + ("" if tool_rows else
                                                   ": not run, the listed tools do not fit "
                                                   "this model's chat context"),
             "8 unconstrained beside ...: 8 unconstrained rows (seeds 0-7) in a batch of 16 "
             "with 8 constrained rows (six schemas, the regex, the choice) or with 8 "
             "unconstrained rows EOS-suppressed to the constrained rows' lengths, alternately, "
             "three times; tok/s = the 8 rows' tokens / time until the last of them finished; "
             "x = what the constrained neighbours cost them",
             f"each grammar was compiled (and run once, 8 tokens) before timing: "
             f"{warm:.1f} s for the {len(constraints())}; batches alternate unconstrained and "
             "constrained chunk by chunk"]
    acceptance, acceptance_notes = _acceptance_table(ctx)
    settings = {"model": ctx.engine.model_dir.name, "prompt": PROMPT,
                "max_tokens": ctx.gen_length, "temperature": 0.0}
    out = section("structured", "Structured output: constrained vs unconstrained", COLUMNS,
                  rows, settings, notes + acceptance_notes)
    out["tables"] = [acceptance]
    return out
