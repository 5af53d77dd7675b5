"""Structured-output request fields -> GenerationParams.structured, as clients send them.

- OpenAI: ``response_format`` ``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}`` (what ``client.chat.completions.parse`` sends
  for a pydantic model); ``{"type": "text"}`` is no constraint.
- vLLM's extra body: ``structured_outputs: {"json" | "regex" | "choice" | "grammar" |
  "json_object": ...}`` and its older ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
  ``guided_grammar``.

One constraint per request; a malformed one is a 400 naming the field. Whether the grammar
engine can compile it is decided when the request is prepared (a 400 naming the same field).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import invalid

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}
STRUCTURED_KEYS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar",
                   "json_object": "json_object"}


def structured_of(req: Any) -> tuple[tuple[str, str] | None, str | None]:
    """((kind, spec) or None, the request field it came from)."""
    found: list[tuple[str, tuple[str, str]]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        spec = _response_format(fmt)
        if spec is not None:
            found.append(("response_format", spec))
    outputs = getattr(req, "structured_outputs", None)
    if outputs is not None:
        found.append(("structured_outputs", _structured_outputs(outputs)))
    for name, kind in GUIDED.items():
        value = getattr(req, name, None)
        if value is not None:
            found.append((name, (kind, _spec(kind, value, name))))
    if len(found) > 1:
        names = ", ".join(n for n, _ in found)
        raise invalid(f"give one structured-output constraint per request, got {names}",
                      found[1][0])
    return (found[0][1], found[0][0]) if found else (None, None)


def _response_format(fmt: dict[str, Any]) -> tuple[str, str] | None:
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json_object", "")
    if kind == "json_schema":
        body = fmt.get("json_schema")
        if not isinstance(body, dict) or not isinstance(body.get("schema"), dict):
            raise invalid("response_format.json_schema.schema must be a JSON schema object",
                          "response_format.json_schema.schema")
        return ("json", json.dumps(body["schema"]))
    raise invalid(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                  f"got {kind!r}", "response_format.type")


def _structured_outputs(outputs: dict[str, Any]) -> tuple[str, str]:
    given = {k: v for k, v in outputs.items() if v is not None and v is not False}
    unknown = sorted(set(given) - set(STRUCTURED_KEYS))
    if unknown:
        raise invalid(f"structured_outputs.{unknown[0]} is not supported; use one of "
                      f"{', '.join(STRUCTURED_KEYS)}", f"structured_outputs.{unknown[0]}")
    if len(given) != 1:
        raise invalid("structured_outputs must hold exactly one of "
                      f"{', '.join(STRUCTURED_KEYS)}", "structured_outputs")
    (key, value), = given.items()
    kind = STRUCTURED_KEYS[key]
    return (kind, "" if kind == "json_object" else _spec(kind, value,
                                                          f"structured_outputs.{key}"))


def _spec(kind: str, value: Any, name: str) -> str:
    """The grammar source of one constraint, checked for its JSON type."""
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise invalid(f"{name} is not valid JSON: {exc.msg}", name) from None
        if not isinstance(value, dict):
            raise invalid(f"{name} must be a JSON schema object", name)
        return json.dumps(value)
    if kind == "choice":
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) and c for c in value):
            raise invalid(f"{name} must be a non-empty list of non-empty strings", name)
        return json.dumps(value)
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string", name)
    return value
