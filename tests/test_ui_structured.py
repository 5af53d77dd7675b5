"""The Playground's Structured control (ui/structured.py) and how the canvas shows a run under
a grammar (ui/render.py, ui/trajectory.py), without a browser: cells the grammar wrote and the
frontier get their own classes, an unconstrained run looks as before, the control's off
position leaves the params untouched, and every worked example finishes on the default
model with an answer that conforms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from celeris import GenerationParams
from celeris.outputs import StepEvent
from ui import render, structured, widgets
from ui.playground import params_from
from ui.settings import FIELDS, build_params, widget_values
from ui.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
M = 99
STRINGS = {1: "{\"", 2: "kind", 3: "\":", 4: " \"", 5: "cat", 6: "\"}"}
SCHEMA = json.dumps({"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                     "required": ["kind"], "additionalProperties": False})


def token_text(ids):
    return [STRINGS.get(t, f"t{t}") for t in ids]


def event(step, canvas, committed, forced=()):
    return StepEvent("r1", step, 0, tuple(canvas), tuple(committed),
                     tuple(1.0 if p in forced else 0.8 for p in committed), step, 0.01 * step,
                     "", M, 6, forced=tuple(forced))


def schema_run(structured_spec=("json", SCHEMA)) -> Trajectory:
    """Six positions: step 1 the model writes {" and the grammar kind":; step 2 the model
    writes ' "' and cat, the grammar "}. ``structured_spec`` None: the same tokens
    unconstrained."""
    traj = Trajectory(6, 6, params={"structured": list(structured_spec)}
                      if structured_spec else {})
    on = structured_spec is not None                # the engine forces nothing unconstrained
    traj.add(event(1, [1, 2, 3, M, M, M], [0, 1, 2], forced=[1, 2] if on else []),
             token_text)
    traj.add(event(2, [1, 2, 3, 4, 5, 6], [3, 4, 5], forced=[5] if on else []), token_text)
    return traj


def cells(traj, step=None, **kw):
    return [render.parse_cell(c) for c in render.canvas_cells(traj, step, **kw)]


def classes(cell):
    return cell["k"].split()


# ---------------------------------------------------------------------- the canvas
def test_cells_the_grammar_wrote_are_marked_forced_with_their_hover():
    after_one = cells(schema_run(), 1)
    assert ["forced" in classes(c) for c in after_one] == [False, True, True, False, False,
                                                           False]
    assert render.FORCED_NOTE in after_one[1]["h"]
    assert classes(after_one[1])[0] == "new"                  # still "new" this step
    latest = cells(schema_run())
    assert ["forced" in classes(c) for c in latest] == [False, True, True, False, False, True]
    assert classes(latest[1])[0] == "old" and classes(latest[5])[0] == "new"


def test_the_frontier_is_the_leftmost_masked_cell_of_a_structured_run():
    traj = schema_run()
    fronts = lambda step: [i for i, c in enumerate(cells(traj, step))  # noqa: E731
                           if "front" in classes(c)]
    assert fronts(0) == [0] and fronts(1) == [3] and fronts(2) == []
    front = cells(traj, 1)[3]
    assert classes(front)[0] == "mask" and render.FRONTIER_NOTE in front["h"]
    assert render.frontier(traj.cells_at(1)) == 3 and render.frontier(traj.cells_at()) is None
    first = [render.parse_cell(c)["k"] for c in render.masked_cells(3, 3, structured=True)]
    assert first == ["mask front", "mask", "mask"]          # before the first event
    assert "front" not in "".join(render.masked_cells(3, 3))


def test_a_finished_structured_run_has_no_frontier_and_keeps_its_forced_cells():
    traj = Trajectory(6, 6, params={"structured": ["json", SCHEMA]})
    traj.add(event(1, [1, 2, 3, M, M, M], [0, 1, 2], forced=[1, 2]), token_text)
    from tests.test_ui_render import result
    traj.finish(result())
    shown = cells(traj)
    assert not any("front" in classes(c) for c in shown)
    assert [classes(c)[0] for c in shown[3:]] == ["skip"] * 3
    assert sum("forced" in classes(c) for c in shown) == 2


def test_an_unconstrained_run_shows_no_frontier_and_no_forced_cells():
    plain = schema_run(structured_spec=None)
    for step in (0, 1, 2):
        assert not any({"front", "forced"} & set(classes(c)) for c in cells(plain, step))
    masked = render.cell("mask", "", None, 3, 6, 0)
    assert render.cell("mask", "", None, 3, 6, 0, frontier=False) == masked
    assert "front" not in render.cell("old", "x", 0.9, 3, 6, 0, frontier=True)


def test_forced_cells_survive_the_trajectory_json_and_are_counted():
    traj = Trajectory.from_dict(json.loads(json.dumps(schema_run().to_dict())))
    assert traj.structured and traj.forced_at() == {1, 2, 5} and traj.forced_at(1) == {1, 2}
    assert traj.forced_count() == 3
    assert "2 written by the grammar" in render.replay_caption(traj, 1)
    from tests.test_ui_render import result
    traj.finish(result())
    assert "3 written by the grammar" in render.run_summary(traj)
    old = schema_run().to_dict()
    for rec in old["steps"]:
        del rec["forced"]                       # a trajectory saved before structured output
    assert Trajectory.from_dict(old).forced_at() == set()


def test_the_playground_legend_names_forced_cells_and_the_frontier():
    shown = widgets.legend_html(structured=True)
    assert 'class="tk old forced"' in shown and "written by the grammar" in shown
    assert 'class="tk mask front"' in shown and "frontier" in shown
    plain = widgets.legend_html()
    assert "forced" not in plain and "masked" in plain
    assert "{{" not in shown and "${" not in shown      # nothing the template would evaluate


# ---------------------------------------------------------------------- the control
def test_off_leaves_the_params_exactly_the_unconstrained_ones():
    base = GenerationParams(gen_length=64, block_length=4, decoding="ltr", cache="prefix")
    values = [widget_values(base)[f] for f in FIELDS]
    assert structured.structured_value(structured.OFF, SCHEMA) is None
    assert structured.structured_value(None, "") is None
    assert build_params(base, values, None) == build_params(base, values) == base


def test_a_mode_and_spec_reach_generation_params():
    base = GenerationParams(gen_length=64, block_length=4)
    values = [widget_values(base)[f] for f in FIELDS]
    constraint = structured.structured_value("regex", "  (yes|no)\\. ")
    assert constraint == ("regex", "(yes|no)\\.")
    assert build_params(base, values, constraint).structured == ("regex", "(yes|no)\\.")

    class Slot:
        def require(self):
            return type("E", (), {"default_params": lambda self: base})()
    assert params_from(Slot(), values, ("json", SCHEMA)).structured == ("json", SCHEMA)
    assert params_from(Slot(), values).structured is None


def test_an_empty_spec_or_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="the spec box is empty; type a JSON schema"):
        structured.structured_value("json", "   ")
    with pytest.raises(ValueError, match="structured mode must be one of off, json"):
        structured.structured_value("yaml", "a")


def test_picking_a_mode_offers_its_examples_and_keeps_a_visitors_own_spec():
    dropdown, box = structured.on_mode("json", "")
    pet = structured.example_specs("json")["pet"]
    assert dropdown.value == "pet" and box.value == pet and box.visible
    dropdown, box = structured.on_mode("regex", pet)          # an example: replaced
    assert box.value == structured.example_specs("regex")[dropdown.value]
    _, box = structured.on_mode("choice", "[\"mine\", \"yours\"]")
    assert box.value == "[\"mine\", \"yours\"]"               # the visitor's own: kept
    dropdown, box = structured.on_mode(structured.OFF, pet)
    assert dropdown.visible is False and box.visible is False
    assert structured.on_example("choice", "mood") == json.dumps(["happy", "sad", "angry"])


def test_each_mode_has_worked_examples():
    for kind in structured.KINDS:
        assert 2 <= len(structured.example_specs(kind)) <= 3, kind
    assert structured.example_specs("regex")["yes or no, then a word"] == r"(yes|no), [a-z]+\."


@pytest.mark.slow
def test_every_worked_example_finishes_and_conforms_on_the_default_model():
    import celeris

    engine = celeris.Engine.from_pretrained(ROOT / "models" / "celeris-tiny-bd", device="cpu")
    prompt = [{"role": "user", "content": "Tell me a story about a brave fox called Pip."}]
    for kind in structured.KINDS:
        for name, spec in structured.example_specs(kind).items():
            params = engine.default_params().replace(structured=(kind, spec))
            result = engine.generate(prompt, params)
            assert result.finish_reason == "stop", (name, result.text)
            if kind == "json":
                jsonschema.validate(json.loads(result.text), json.loads(spec))
            elif kind == "regex":
                assert re.fullmatch(spec, result.text), (name, result.text)
            else:
                assert result.text in json.loads(spec), (name, result.text)
