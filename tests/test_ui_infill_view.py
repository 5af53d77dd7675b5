"""The Infill tab's step view shows the whole text: the pinned text before the first [MASK]
(the engine's prompt, which its StepEvents do not carry) in front, pinned; the generated
cells distinct from the pinned ones; no end-of-text padding (ui/infill.py, ui/render.py)."""

from __future__ import annotations

from pathlib import Path
import pytest

from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from ui import render
from ui.render import END_GLYPH
from ui.trajectory import NEW, OLD, PINNED, Trajectory, lead_strings

ROOT = Path(__file__).resolve().parents[1]
CANVAS_MODEL = ROOT / "models" / "celeris-tiny"
M, EOS, BOS = 99, 2, 1
WORDS = {BOS: "", EOS: "", 10: "Once", 11: " upon", 12: " a", 13: " time", 20: " happy",
         21: " named", 22: " Lily", 23: "."}
LILY = "Once upon a time, there was a [MASK] [MASK] named Lily. One day, Lily found a red " \
       "[MASK] under a tree."


def token_text(ids):
    return [WORDS[t] for t in ids]


def decode(ids):
    return "".join(WORDS[t] for t in ids)


def fake_infill() -> Trajectory:
    """"Once upon a time [MASK] named Lily." as the engine runs it: the prompt
    [BOS, Once, upon, a, time] outside the canvas, the canvas [MASK, named, Lily, ., EOS x4]."""
    lead = lead_strings([BOS, 10, 11, 12, 13], token_text, decode)
    traj = Trajectory(0, 8, lead=lead)
    canvas = [M, 21, 22, 23] + [EOS] * 4
    traj.add(StepEvent("r", 1, 0, tuple([20] + canvas[1:]), (0,), (0.8,), 1, 0.1, "", M, 8),
             token_text, decode)
    traj.finish(GenerationResult("r", " happy", (20,), (), FinishReason.STOP, 1, 1,
                                 Timings(0.1), Usage(5, 1), seed=0))
    return traj


def shown(cells: list[str]) -> list[tuple[str, str]]:
    return [(c["k"], c["t"]) for c in map(render.parse_cell, cells)]


def test_the_step_view_starts_with_the_pinned_prompt_and_has_no_padding_cells():
    cells = shown(render.canvas_cells(fake_infill()))
    assert "".join(t for _, t in cells) == "Once upon a time happy named Lily."
    assert [k.split()[0] for k, _ in cells] == [PINNED] * 4 + [OLD] + [PINNED] * 3
    assert all(END_GLYPH not in t for _, t in cells)        # the BOS and EOS padding: gone
    assert all("lead" in k for k, _ in cells[:4])            # the prompt: pinned, no block
    assert "lead" not in cells[5][0]


def test_the_prompt_is_drawn_before_the_first_step_too():
    traj = Trajectory(0, 8, lead=["Once", " upon"])
    assert shown(render.canvas_cells(traj)) == [("pin lead", "Once"), ("pin lead", " upon")]
    back = Trajectory.from_dict(traj.to_dict())
    assert back.lead == ["Once", " upon"]


class Request:
    session_hash = "infill-test"


@pytest.fixture(scope="module")
def canvas_slot():
    import celeris
    from ui import EngineSlot

    assert (CANVAS_MODEL / "config.json").is_file(), f"no shipped model at {CANVAS_MODEL}"
    engine = celeris.Engine.from_pretrained(str(CANVAS_MODEL), device="cpu")
    yield EngineSlot(engine, frame_interval=0.0)
    engine.stop()


def test_the_shipped_model_fills_and_the_view_shows_the_whole_text(canvas_slot):
    from ui.infill import make_fill

    frames = list(make_fill(canvas_slot)(LILY, 1, "fixed", Request()))
    cells, filled, gauges, note, _ = frames[-1]
    assert gauges["state"] == "done"
    parsed = [render.parse_cell(c) for c in cells]
    text = "".join(c["t"] for c in parsed)
    assert text.startswith("Once upon a time, there was a")
    assert text == render.escape_text(filled)               # the view reads as the result
    assert all(c["t"] != END_GLYPH for c in parsed if c["k"].startswith(PINNED))
    generated = [c for c in parsed if c["k"].split()[0] in (NEW, OLD)]
    assert len(generated) == 3                                 # three [MASK]s of one token
    assert parsed[0]["k"] == "pin lead" and parsed[0]["t"] == "Once"
