"""The Playground tab's handlers and gauges (ui/playground.py, the gauges of ui/render.py),
tested without a browser: replay clamps a step beyond the run, an empty answer says why and
what to try, a refused run shows its error, a stale "running" settles to "stopped", and the
tokens gauge counts text tokens only."""

from __future__ import annotations

import gradio as gr
import pytest

from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from tests.ui_fakes import EOS, M, ActiveSlot, token_text
from ui import render
from ui.chat import EMPTY_REPLY, final_reply
from ui.playground import finished_summary, replay_at
from ui.trajectory import Trajectory


def test_replay_clamps_a_step_beyond_the_run_and_moves_the_slider():
    traj = Trajectory(2, 2)
    for step, pos in ((1, 0), (2, 1)):
        canvas = [5 if p <= pos else M for p in range(2)]
        traj.add(StepEvent("r", step, 0, tuple(canvas), (pos,), (0.9,), step, 0.1 * step,
                           "", M, 2), lambda ids: ["a"] * len(ids))
    data = traj.to_dict()
    cells, caption, slider = replay_at(data, 9999)
    assert caption.startswith("step 2 of 2") and len(cells) == 2 and slider.value == 2
    cells, caption, slider = replay_at(data, -3)
    assert caption.startswith("step 0 of 2") and slider.value == 0
    assert replay_at(data, 1)[2] == gr.skip()          # inside the range: left alone
    assert replay_at(data, "x")[1].startswith("step 2 of 2")


def finished(tokens: int, finish=FinishReason.STOP) -> Trajectory:
    traj = Trajectory(0, 4)
    traj.finish(GenerationResult("r", "", tuple(range(tokens)), (), finish, 1, 1,
                                 Timings(total_s=0.1), Usage(5, tokens), seed=0))
    return traj


def test_an_empty_answer_says_why_and_what_to_try():
    chat = finished_summary(finished(0), as_chat=True)
    assert "Nothing was generated" in chat and "untick **chat message**" in chat
    plain = finished_summary(finished(0), as_chat=False)
    assert "Nothing was generated" in plain and "tick **chat message**" in plain
    assert "Nothing was generated" not in finished_summary(finished(3), as_chat=True)
    assert "Nothing" not in finished_summary(finished(0, FinishReason.ABORT), True)
    empty = GenerationResult("r", "", (), (), FinishReason.STOP, 1, 1, Timings(total_s=0.1),
                             Usage(5, 0), seed=0)
    assert final_reply(empty) == EMPTY_REPLY and "ended its reply at once" in EMPTY_REPLY


def test_a_refused_run_shows_status_error_then_raises():
    from ui.context import with_error_frame

    def refused():
        yield "opened"
        raise gr.Error("prompt (600 tokens) + gen_length (64) exceeds the context")

    frames = []
    with pytest.raises(gr.Error):
        for f in with_error_frame(refused(), lambda why: ("error", why)):
            frames.append(f)
    assert frames == ["opened", ("error", "prompt (600 tokens) + gen_length (64) exceeds "
                                          "the context")]
    assert render.error_gauges()["state"] == "error"


def test_the_settle_after_a_run_draws_its_last_recorded_frame_once():
    from ui.context import EngineSlot
    from ui.playground import make_settle

    request = type("R", (), {"session_hash": "s1"})()
    slot = EngineSlot()
    settle = make_settle(slot, "playground", 2)
    assert settle(request) == [gr.skip()] * 2                 # nothing recorded
    slot.keep_last("s1", "playground", lambda: ("canvas", "gauges"))
    slot.keep_last("s1", "infill", lambda: ("other", "tab"))
    assert settle(request) == ["canvas", "gauges"]
    assert settle(request) == [gr.skip()] * 2                 # taken once
    slot.keep_last("s1", "playground", lambda: ("canvas", "gauges"))
    slot._active["s1"] = (None, "ui-newer")                   # the session runs again
    assert settle(request) == [gr.skip()] * 2


def test_a_run_that_fails_keeps_its_error_frame_as_the_last_word():
    from ui.context import EngineSlot
    from ui.playground import make_settle

    request = type("R", (), {"session_hash": "s1"})()
    slot = EngineSlot()

    def failing():
        yield "frame"
        raise gr.Error("a step failed")

    with pytest.raises(gr.Error):
        list(slot.recorded("s1", "playground", lambda: ("canvas", "gauges"), failing()))
    assert make_settle(slot, "playground", 2)(request) == [gr.skip()] * 2
    stopped = slot.recorded("s1", "playground", lambda: ("canvas", "stopped"), failing())
    assert next(stopped) == "frame"
    stopped.close()                                           # Stop: the event is cancelled
    assert make_settle(slot, "playground", 2)(request) == ["canvas", "stopped"]

def test_the_tokens_gauge_keeps_its_label_and_counts_text_tokens_only_while_running():
    """The tile once read "positions/s" live and "tokens/s" when done. Live it counts the text
    tokens committed so far (end of text left out), under one label."""
    traj = Trajectory(4, 4)
    canvas = [M, M, M, M]
    for step, (pos, tok) in enumerate([(3, EOS), (0, 100 + ord("a")), (1, 100 + ord("b"))],
                                      start=1):
        canvas[pos] = tok
        traj.add(StepEvent("r", step, 0, tuple(canvas), (pos,), (0.9,), step, 0.1 * step,
                           "", M, 4), token_text)
        g = render.trajectory_gauges(traj, None, "running")
        assert g["tps_label"] == "tokens/s" and g["tpf_label"] == "tokens / forward"
        assert float(g["tps"]) == pytest.approx((step - 1) / (0.1 * step), abs=0.05)
