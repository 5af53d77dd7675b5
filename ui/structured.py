"""The Playground's Structured control: the answer constrained to a JSON schema, a regex or a
choice list (``GenerationParams.structured``).

A mode, an editable spec box and worked examples (assets/examples.json) that the shipped
default model finishes with "stop". The run only hands ``(kind, spec)`` to the engine, which
decodes under the grammar (celeris/sampler/grammar.py) and says in each step's event which
cells the grammar wrote; the canvas marks those and the frontier (ui/render.py). A spec the
engine cannot compile comes back as its own message, shown under the canvas.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from .examples import examples

OFF = "off"
# (label, kind): the kinds are GenerationParams.structured's, so API callers pass "json" etc.
MODES: tuple[tuple[str, str], ...] = (("off", OFF), ("JSON schema", "json"),
                                      ("regex", "regex"), ("choice", "choice"))
KINDS = tuple(kind for _, kind in MODES if kind != OFF)
SPEC_HELP = {
    "json": "a JSON schema; enums, booleans, bounded numbers and short strings finish "
            "fastest on a small model",
    "regex": "a regular expression the whole answer matches",
    "choice": "a JSON list of strings: the answer is one of them",
}


def spec_text(kind: str, spec: Any) -> str:
    """An example's spec as the spec box shows it: a regex as it is, a schema or a choice
    list as one line of JSON."""
    return spec if kind == "regex" and isinstance(spec, str) else json.dumps(spec)


def example_specs(kind: str) -> dict[str, str]:
    """name -> spec text of the worked examples for ``kind`` (none for "off")."""
    found = (examples("structured") or {}).get(kind, [])
    return {e["name"]: spec_text(kind, e["spec"]) for e in found}


def structured_value(mode: str | None, spec: str | None) -> tuple[str, str] | None:
    """``GenerationParams.structured`` from the control: None when off (the run is then
    exactly the unconstrained one), else (kind, spec). Whether the spec compiles is the
    engine's to say; an empty one is refused here, naming what to type."""
    if mode in (None, "", OFF):
        return None
    if mode not in KINDS:
        raise ValueError(f"structured mode must be one of {', '.join(k for _, k in MODES)}; "
                         f"got {mode!r}")
    spec = (spec or "").strip()
    if not spec:
        label = dict((k, label) for label, k in MODES)[mode]
        raise ValueError(f"structured output: the spec box is empty; type a {label} or pick "
                         "an example")
    return mode, spec


def is_example(spec: str | None) -> bool:
    """``spec`` is empty or one of the worked examples, as offered (not edited)."""
    text = (spec or "").strip()
    return not text or any(text in example_specs(kind).values() for kind in KINDS)


def on_mode(mode: str, spec: str) -> tuple[Any, Any]:
    """A mode picked: its examples offered (the first selected) and shown in the spec box,
    unless the box holds the visitor's own spec; "off" hides both."""
    if mode not in KINDS:
        return gr.Dropdown(visible=False), gr.Textbox(visible=False)
    specs = example_specs(mode)
    first = next(iter(specs), None)
    value = specs[first] if first is not None and is_example(spec) else spec
    return (gr.Dropdown(choices=list(specs), value=first, visible=True),
            gr.Textbox(value=value, visible=True, info=SPEC_HELP.get(mode)))


def on_example(mode: str, name: str | None) -> Any:
    """An example picked: its spec in the box."""
    spec = example_specs(mode).get(name or "")
    return gr.skip() if spec is None else spec


def create_control(prefix: str) -> tuple[gr.Radio, gr.Textbox]:
    """The compact, closed-by-default control; returns (mode, spec), the run's inputs."""
    with gr.Accordion("Structured output (JSON schema, regex, choice)", open=False,
                      elem_id=f"{prefix}-structured"):
        mode = gr.Radio(list(MODES), value=OFF, label="constrain the answer to",
                        elem_id=f"{prefix}-structured-mode",
                        info="the engine commits only tokens the grammar accepts, left to "
                             "right; the canvas marks what the grammar wrote itself")
        example = gr.Dropdown([], value=None, label="example", visible=False,
                              elem_id=f"{prefix}-structured-example")
        spec = gr.Textbox("", lines=3, max_lines=12, label="spec", visible=False,
                          elem_id=f"{prefix}-structured-spec")
    mode.input(on_mode, [mode, spec], [example, spec], queue=False,
               api_visibility="private", show_progress="hidden")
    example.input(on_example, [mode, example], spec, queue=False, api_visibility="private",
                  show_progress="hidden")
    return mode, spec
