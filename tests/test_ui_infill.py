"""The Infill tab (ui/infill.py) and how its runs are shown (ui/trajectory.py,
ui/render.py), without a browser: pinned text outside ASCII is spelled whole, the canvas, the
filled text and the gauges keep it and count only the filled tokens, and a lone mask or an
empty fill explains itself."""

from __future__ import annotations

import gradio as gr
import pytest

from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from tests.ui_fakes import EOS, M, byte_ids, decode, token_text
from ui import render
from ui.trajectory import FRAGMENT, Trajectory, spell_whole

TEXT = "naïve 日本 🦊"
BYTES = TEXT.encode("utf-8")    # in the fake byte-level vocabulary, id i + 100 is byte i


def test_pinned_text_outside_ascii_is_spelled_whole():
    ids = byte_ids(TEXT)
    singles = token_text(ids)
    assert any("\ufffd" in s for s in singles)               # byte by byte it breaks
    spelled = spell_whole(ids, decode, token_text)
    assert len(spelled) == len(ids)
    assert "".join(s for s in spelled if s != FRAGMENT) == TEXT
    assert spelled[:3] == ["n", "a", FRAGMENT]                # ï is two bytes


def infill_run(fill_with: list[int]) -> Trajectory:
    """A canvas: pinned "naïve 日本 🦊" + one masked position + pinned EOS padding."""
    pinned = byte_ids(TEXT)
    canvas = pinned + [M] + [EOS] * 3
    traj = Trajectory(0, 4)
    pos = len(pinned)
    traj.add(StepEvent("r", 1, 0, tuple(canvas[:pos] + fill_with + canvas[pos + 1:]),
                       (pos,), (0.9,), 1, 0.5, "", M, 4), token_text, decode)
    n = len(canvas)
    traj.finish(GenerationResult("r", "", (), (), FinishReason.STOP, 1, 1, Timings(0.5),
                                 Usage(1, n), seed=0))
    return traj


def test_infill_canvas_and_filled_text_keep_non_ascii_pinned_text():
    traj = infill_run(byte_ids("!"))
    cells = [render.parse_cell(c) for c in render.canvas_cells(traj)]
    shown = "".join(c["t"] for c in cells if c["k"].startswith("pin"))
    assert "\ufffd" not in shown and "日本" in shown and "🦊" in shown
    assert sum("frag" in c["k"] for c in cells) == len(BYTES) - len(TEXT)
    assert render.spans_text(traj, decode) == TEXT + "!"


def test_infill_gauges_count_the_filled_tokens_only():
    g = render.trajectory_gauges(infill_run(byte_ids("!")), None, "done")
    assert (g["tps"], g["tpf"]) == ("2.0", "1.00")          # 1 token in 0.5 s, 1 forward
    empty = render.trajectory_gauges(infill_run([EOS]), None, "done")
    assert empty["tps"] == "0.0"


def test_a_lone_mask_and_an_empty_fill_explain_themselves():
    from ui.infill import LONE, NOTHING, check_infill_text, infill_frame

    with pytest.raises(gr.Error, match="nothing around the"):
        check_infill_text("  [MASK] ")
    assert check_infill_text("Once [MASK].") == "Once [MASK]."

    class Slot:
        def decode(self, ids):
            return decode(ids)

        def info(self, *_):
            return None

    assert infill_frame(infill_run([EOS]), "", Slot())[3] == NOTHING
    assert infill_frame(infill_run(byte_ids("!")), "", Slot())[3] == ""
    assert "write some words" in LONE
