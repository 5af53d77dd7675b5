"""The Race tab without a browser: block diffusion vs the full-canvas model vs the AR twin.

Random tiny models (tests/tiny_model.py): a block-causal one loaded as the UI's engine, a
full-attention one as the full-canvas model (EngineSlot.canvas_model, loaded on first use)
and a tiny Llama as the autoregressive twin. The race generator is driven directly.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from celeris import Engine
from tests.test_app import make_ar_dir
from tests.tiny_model import make_tiny_model_dir
from tests.ui_fakes import ActiveSlot
from ui import render
from ui.context import EngineSlot
from ui.race import (KEYS, STOPPED, compare, headers, lineup, make_race, make_race_stop,
                     not_comparable, race_summary, stats)

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("race-models")
    bd = make_tiny_model_dir(root / "tiny-bd", shift_logits=True, attention="block_causal",
                             max_position_embeddings=600,
                             block_size=4, generation_defaults={
                                 "gen_length": 64, "temperature": 0.0, "decoding": "threshold",
                                 "threshold": 0.7, "suppress_eos": True})
    full = make_tiny_model_dir(root / "tiny-full", max_position_embeddings=600,
                               generation_defaults={
        "gen_length": 64, "block_length": 32, "steps": 64, "decoding": "fixed",
        "suppress_eos": True})
    return {"bd": bd, "full": full, "ar": make_ar_dir(root / "tiny-ar", Path(full))}


@pytest.fixture(scope="module")
def bd_engine(dirs):
    engine = Engine.from_pretrained(dirs["bd"], device="cpu").start()
    yield engine
    engine.stop()


def run_race(slot: EngineSlot, gen_length=16, block_length=8, threshold=0.9) -> list[list]:
    return list(make_race(slot)(PROMPT, False, gen_length, block_length, threshold, None))


def test_block_diffusion_races_the_full_canvas_model_and_the_twin(dirs, bd_engine):
    slot = EngineSlot(bd_engine, ar_path=dirs["ar"], canvas_path=dirs["full"])
    assert not slot.canvas_loaded
    frames = run_race(slot)
    last = frames[-1]
    assert len(last) == 10
    main, canvas, ar = last[1], last[3], last[5]
    for column in (main, canvas, ar):
        assert column["state"] == "done" and float(column["tps"]) > 0
    # main: the loaded model's own blocks of 4, a canvas grown to the 16-token cap
    assert int(main["tokens"]) == 16 and len(last[0]) == 16
    # canvas: the full-attention model, a 16-token canvas in blocks of 8, threshold 0.9
    cells = [render.parse_cell(c) for c in last[2]]
    assert len(cells) == 16 and not any(c["k"].startswith("mask") for c in cells)
    assert 0 < int(canvas["nfe"]) <= 16
    assert slot.canvas_loaded
    canvas_engine, _ = slot.canvas_model()
    assert canvas_engine is not bd_engine and not canvas_engine.block_causal
    titles = last[7:]
    assert "Block diffusion · tiny-bd" in titles[0] and "blocks of 4" in titles[0]
    assert "Full canvas · tiny-full" in titles[1]
    assert "Autoregressive twin · tiny-ar" in titles[2]
    summary = last[6]
    assert summary.startswith("**tokens/s**: block diffusion ")
    assert "full canvas" in summary and "autoregressive" in summary
    assert "**block diffusion vs autoregressive**" in summary
    # the canvas column said "loading" while the full-canvas model was being loaded
    assert frames[0][3]["state"] == "loading"
    assert run_race(slot)[0][3]["state"] == "waiting"     # loaded once, not again


def test_stop_during_the_full_canvas_run_stops_that_model(dirs, bd_engine):
    slot = EngineSlot(bd_engine, ar_path=dirs["ar"], canvas_path=dirs["full"])
    frames, aborted = [], False
    for frame in make_race(slot)(PROMPT, False, 512, 8, 0.99, None):
        frames.append(frame)
        if frame[3]["state"] == "running" and not aborted:
            aborted = slot.abort("anonymous")   # what the Stop button does
            assert aborted, "the running full-canvas request was not registered for Stop"
    last = frames[-1]
    assert last[1]["state"] == "done"            # main had finished
    assert last[3]["state"] == "stopped"         # the full-canvas run was aborted midway
    assert any(render.parse_cell(c)["k"].startswith("skip") for c in last[2])
    assert last[5]["state"] == "stopped" and last[6] == STOPPED   # the twin never ran


def test_the_full_canvas_model_missing_is_shown_in_its_column(dirs, bd_engine, tmp_path):
    slot = EngineSlot(bd_engine, ar_path=tmp_path / "no-twin", canvas_path=tmp_path / "none")
    last = run_race(slot)[-1]
    assert last[1]["state"] == "done"
    cell = render.parse_cell(last[2][0])
    assert len(last[2]) == 1 and cell["k"] == "race-unavailable"
    assert cell["t"].startswith("Unavailable: no full-canvas model at") and "none" in cell["t"]
    assert last[3]["state"] == "unavailable" and last[5]["state"] == "unavailable"
    assert "Traceback" not in cell["t"]
    assert last[6].startswith("**tokens/s**: block diffusion ") and " vs " not in last[6]


def test_a_block_diffusion_model_is_refused_as_the_full_canvas_one(dirs, bd_engine):
    slot = EngineSlot(bd_engine, canvas_path=dirs["bd"])
    engine, why = slot.canvas_model()
    assert engine is None and "block-diffusion model, not a full-canvas one" in why


def test_a_full_attention_model_races_its_reference_sampler(dirs):
    engine = Engine.from_pretrained(dirs["full"], device="cpu")
    slot = EngineSlot(engine, ar_path=dirs["ar"], canvas_path=dirs["bd"])
    titles = headers(slot)
    assert "Fast configuration · tiny-full" in titles[0]
    assert "Reference sampler · tiny-full" in titles[1]
    last = run_race(slot)[-1]
    main, canvas = last[1], last[3]
    assert main["state"] == canvas["state"] == "done"
    assert int(canvas["nfe"]) == 16                 # one token per step, no cache
    assert int(main["nfe"]) <= 16
    assert not slot.canvas_loaded                   # the other model is never loaded here
    assert "**fast vs reference**" in last[6]


def test_lineup_without_a_model_and_stop(tmp_path):
    slot = EngineSlot(None, ar_path=tmp_path / "twin")
    assert [c.key for c in lineup(slot, None)] == list(KEYS)
    assert "Autoregressive twin · twin" in headers(slot)[2]

    class Slot:
        aborted = None

        def abort(self, session):
            Slot.aborted = session

    out = make_race_stop(Slot())(stats(3, 3, 1.0, "done"), stats(state="loading"),
                                 stats(), None)
    assert [c["state"] for c in out[:3]] == ["done", "stopped", "stopped"]


# ---------------------------------------------------------------------- ratios, Stop and settling
def test_race_ratios_need_answers_long_enough_to_time_and_show_tokens_and_time():
    long_a = stats(160, 40, 0.5, "done", "stop")
    long_b = stats(150, 150, 1.5, "done", "stop")
    line = compare(long_a, long_b, ("block diffusion", "autoregressive"))
    assert line.startswith("**block diffusion vs autoregressive**: 3.20x the tokens/s")
    assert "160 tokens in 0.50 s vs 150 tokens in 1.50 s" in line
    short = stats(2, 1, 0.01, "done", "stop")
    assert "too short to time" in not_comparable(short, stats(2, 2, 0.02, "done", "stop"))
    broken = stats(12, 12, 0.05, "done", "stop")         # an answer cut short
    summary = race_summary({"main": long_a, "canvas": broken, "ar": long_b},
                           {"main": "block diffusion", "canvas": "full canvas"})
    assert "**block diffusion vs full canvas**: no speed ratio: an answer of 12 tokens" in summary
    assert "12 tokens in 0.05 s" in summary and "3.20x" in summary


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


def test_both_ratios_follow_one_rule_whatever_the_answers_lengths():
    """tokens/s is already per generated token: the diffusion-vs-AR ratio and the
    full-canvas ratio are both given for answers of 152, 123 and 64 tokens, each with both
    runs' tokens and time, and the one of quite different lengths says so."""
    from ui.race import race_summary

    results = {"main": stats(152, 40, 0.50, "done", "stop"),
               "ar": stats(123, 123, 1.23, "done", "stop"),
               "canvas": stats(64, 64, 0.80, "done", "length")}
    summary = race_summary(results, {"main": "block diffusion", "canvas": "full canvas"})
    ar_line, canvas_line = summary.split("\n\n")[1:]
    assert ar_line.startswith("**block diffusion vs autoregressive**: 3.04x the tokens/s")
    assert "152 tokens in 0.50 s vs 123 tokens in 1.23 s" in ar_line
    assert "differ in length" not in ar_line
    assert canvas_line.startswith("**block diffusion vs full canvas**: 3.80x the tokens/s")
    assert "152 tokens in 0.50 s vs 64 tokens in 0.80 s" in canvas_line
    assert "the answers differ in length, and tokens/s counts each run's own" in canvas_line
    assert "no speed ratio" not in summary
