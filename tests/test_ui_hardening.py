"""The playground's answers to what a tester hit (issue 17, items 10-15), tested without a
browser: slider limits that follow the model, refused runs that say so, Stop in the race, an
empty chat message, non-ASCII infill text, gauges that count generated tokens only, the API
tab's max_tokens range and a failed model load."""

from __future__ import annotations

import gradio as gr
import pytest

from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from ui import limits, render
from ui.trajectory import FRAGMENT, Trajectory, spell_whole

M = 99                          # mask id of the fake runs
EOS = 98                        # a special token: decodes to nothing
TEXT = "naïve 日本 🦊"
BYTES = TEXT.encode("utf-8")    # a fake byte-level vocabulary: id i + 100 is byte i


def decode(ids):
    return bytes(t - 100 for t in ids if t >= 100).decode("utf-8", errors="replace")


def token_text(ids):
    return [decode([t]) for t in ids]


def byte_ids(text: str) -> list[int]:
    return [b + 100 for b in text.encode("utf-8")]


# ---------------------------------------------------------------------- item 14: limits
def test_gen_length_goes_up_to_the_context_left_after_the_prompt():
    b = limits.gen_bounds(512, 14)
    assert (b.lo, b.hi) == (8, 498) and "context 512 - prompt 14" in b.why
    assert limits.gen_bounds(512, None).hi == 511          # unknown prompt: a BOS at least
    assert limits.gen_bounds(6, 2).lo == 4                   # a tiny context still works


def test_out_of_range_values_get_a_message_naming_field_and_range():
    b = limits.gen_bounds(512, 14)
    assert b.check(64) is None and b.check("498") is None
    assert b.check(2000) == ("gen length must be in [8, 498] (context 512 - prompt 14 "
                             "tokens); 2000 was set to 498.")
    assert "was set to 8" in b.check(3)
    assert b.check("lots") == "gen length must be a number in [8, 498]; got 'lots'."
    assert "steps must be in [0, 64]" in limits.steps_bounds(64).check(100)
    assert limits.Bounds("temperature", 0.0, 2.0).check(5) == \
        "temperature must be in [0.0, 2.0]; 5 was set to 2.0."


@pytest.mark.parametrize("gen", [64, 40, 498, 7, 1])
def test_block_choices_all_divide_gen_length(gen):
    choices = limits.block_choices(gen)
    assert choices[0] == 1 and choices[-1] == gen
    assert all(gen % c == 0 for c in choices)
    assert len(choices) == sum(1 for d in range(1, gen + 1) if gen % d == 0)


def test_block_and_steps_are_fitted_to_gen_length():
    assert limits.fit_block(32, 64) == 32 and limits.fit_block(32, 40) == 20
    assert limits.fit_block(12, 498) == 6 and limits.fit_block("x", 40) == 40
    assert limits.steps_stride(64, 16) == 4
    assert limits.fit_steps(30, 64, 16) == 28 and limits.fit_steps(100, 64, 16) == 64
    assert limits.fit_steps(0, 64, 16) == 0


def test_every_value_the_controls_offer_is_valid():
    from celeris import GenerationParams

    for gen in (8, 40, 64, 498):
        for block in limits.block_choices(gen):
            stride = limits.steps_stride(gen, block)
            for steps in range(stride, gen + 1, stride):
                GenerationParams(gen_length=gen, block_length=block, steps=steps)


# ---------------------------------------------------------------------- item 13: infill
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


# ---------------------------------------------------------------------- item 10: errors
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


# ---------------------------------------------------------------------- items 11, 12, 15
def test_race_stop_marks_unfinished_columns_stopped():
    from ui.race import STOPPED, make_race_stop, stats

    class Slot:
        aborted = None

        def abort(self, session):
            Slot.aborted = session

    request = type("R", (), {"session_hash": "s1"})()
    out = make_race_stop(Slot())(stats(3, 3, 1.0, "done"), stats(state="running"),
                                 stats(), request)
    assert [c["state"] for c in out[:3]] == ["done", "stopped", "stopped"]
    assert out[3] == STOPPED and Slot.aborted == "s1"


class ActiveSlot:
    """The part of EngineSlot the settle handlers read: which sessions are running."""

    def __init__(self, *active):
        self.active = set(active)

    def running(self, session):
        return session in self.active


def test_race_settle_after_a_cancelled_race_marks_stale_running_columns_stopped():
    # Stop's own update came first, then a frame sent before the cancel brought "running"
    # back: the handler chained after the race event (it runs once the cancel completed)
    # puts "stopped" back, and leaves finished columns as they are
    from ui.race import STOPPED, make_race_settle, stats

    request = type("R", (), {"session_hash": "s1"})()
    settle = make_race_settle(ActiveSlot())
    out = settle(stats(3, 3, 1.0, "done"), stats(5, 2, 0.5, "running"), stats(), request)
    assert [c["state"] for c in out[:3]] == ["done", "stopped", "stopped"]
    assert out[1]["tokens"] == "5" and out[1]["nfe"] == "2"   # the figures so far kept
    assert out[3] == STOPPED


def test_race_settle_leaves_a_finished_race_and_a_newer_run_alone():
    from ui.race import make_race_settle, stats

    request = type("R", (), {"session_hash": "s1"})()
    finished = [stats(3, 3, 1.0, "done"), stats(state="unavailable"), stats(4, 4, 1.0, "done")]
    assert make_race_settle(ActiveSlot())(*finished, request) == [gr.skip()] * 4
    running = [stats(state="running"), stats(), stats()]   # the session started a new race
    assert make_race_settle(ActiveSlot("s1"))(*running, request) == [gr.skip()] * 4
    other = make_race_settle(ActiveSlot("s2"))(*running, request)   # another tab's run
    assert [c["state"] for c in other[:3]] == ["stopped"] * 3


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


def test_the_steps_grid_update_keeps_a_value_that_fits_and_moves_one_that_does_not():
    # the update is computed from the steps value of before; it lands after the user may have
    # typed another one, so a value already on the new grid is not sent (not overwritten)
    from ui.bounds import steps_slider

    # what an update sends: the arguments passed (gradio's constructor_args)
    kept = steps_slider(1024, 32, 128).constructor_args   # 32 blocks: 128 steps fit
    assert kept == {"minimum": 0, "maximum": 1024, "step": 32}
    moved = steps_slider(1024, 32, 100).constructor_args  # off the grid of 32: down to 96
    assert moved == {"minimum": 0, "maximum": 1024, "step": 32, "value": 96}
    assert steps_slider(64, 8, "x").constructor_args["value"] == 0   # unreadable: 0
    assert "value" not in steps_slider(64, 8, 0).constructor_args     # 0 is on every grid
    assert steps_slider(64, 8, 128).constructor_args["value"] == 64   # above gen length


def test_the_block_choices_update_keeps_a_block_length_that_is_offered():
    from ui.bounds import block_dropdown

    kept = block_dropdown(1024, 32).constructor_args
    assert set(kept) == {"choices"} and 32 in kept["choices"]
    assert block_dropdown(1024, "32").constructor_args.keys() == {"choices"}
    assert block_dropdown(24, 32).constructor_args["value"] == 24   # no longer offered
    assert block_dropdown(64, 32, block_size=4).constructor_args["value"] == 4


def test_an_empty_chat_message_is_not_sent():
    from ui.chat import add_user_message, send_button

    history = [{"role": "user", "content": "hi"}]
    assert add_user_message("   ", history) == (gr.skip(), gr.skip())
    assert add_user_message("hello", history)[1][-1] == {"role": "user", "content": "hello"}
    assert send_button("").interactive is False and send_button(" x ").interactive is True


def test_api_tab_states_the_max_tokens_range_of_the_context():
    from ui.api_tab import describe

    text = describe("http://h:1", False, 512)
    assert "`max_tokens`: 1 to 511" in text and "at most 512" in text


def test_a_failed_model_load_is_a_status_line_not_an_error(tmp_path):
    from ui.context import EngineSlot
    from ui.model_tab import make_choose

    def refuse(path, device, dtype):
        raise FileNotFoundError(f"model directory not found: {path}")

    slot = EngineSlot(None, models=[tmp_path / "broken"], engine_factory=refuse)
    choose = make_choose(slot)
    info, status = choose("broken", None, progress=lambda *a, **k: None)
    assert info == gr.skip() and "Could not load the model" in status and "broken" in status
    info, status = choose("  ", None, progress=lambda *a, **k: None)
    assert "Pick one of the offered models" in status

def test_the_tokens_gauge_keeps_its_label_and_counts_text_tokens_only_while_running():
    """Issue 34, item 7: the tile read "positions/s" live and "tokens/s" once done. Live it
    now counts the text tokens committed so far (end of text left out), under one label."""
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
