"""The playground's answers to issue 34 (items 1-7), tested on handlers without a browser:
per-session model choice among the offered models, a chat that survives empty and
over-long messages, a replay that clamps, empty answers that say why, race ratios with
their tokens and time, and the smaller items (presets, labels, chat defaults)."""

from __future__ import annotations

import os
from pathlib import Path

import gradio as gr
import pytest

from celeris import Engine, GenerationParams
from celeris.outputs import FinishReason, GenerationResult, StepEvent, Timings, Usage
from tests.tiny_model import make_tiny_model_dir
from ui.chat import EMPTY_REPLY, SINGLE_TURN, final_reply, fit_history, make_respond, \
    reply_bounds
from ui.context import EngineSlot
from ui.model_tab import make_choose
from ui.playground import finished_summary, replay_at
from ui.race import compare, not_comparable, race_summary, stats
from ui.settings import DEFAULT_PRESET, FIELDS, preset_settings, preset_values
from ui.trajectory import Trajectory
from ui.widgets import DECODING_CHOICES, decoding_info, preset_radio

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_BD = ROOT / "models" / "celeris-tiny-bd"
M = 99
NO_PROGRESS = lambda *args, **kwargs: None  # noqa: E731


def request(session: str):
    return type("Request", (), {"session_hash": session})()


class FakeEngine:
    def __init__(self, path):
        self.model_dir = Path(path)
        self.started = self.stopped = False

    def start(self):
        self.started = True
        return self

    def stop(self):
        self.stopped = True

    def info(self):
        return {"model": self.model_dir.name, "parameters": 10, "memory_kind": "rss",
                "memory_bytes": 1}


@pytest.fixture(scope="module")
def small_context_engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("round2") / "tiny",
                               max_position_embeddings=96,
                               generation_defaults={"gen_length": 16, "block_length": 8})
    engine = Engine.from_pretrained(str(path), device="cpu").start()
    yield engine
    engine.stop()


# ---------------------------------------------------------------------- item 1: models
def test_choosing_a_model_changes_only_that_session_and_shares_engines(tmp_path):
    loads = []

    def factory(path, device, dtype):
        loads.append((path, device, dtype))
        return FakeEngine(path)

    primary = FakeEngine(tmp_path / "served")
    slot = EngineSlot(primary, models=[tmp_path / "b", tmp_path / "c"], device="cpu",
                      engine_factory=factory)
    assert list(slot.models) == ["served", "b", "c"]
    choose = make_choose(slot)
    info, status = choose("b", request("alice"), progress=NO_PROGRESS)
    assert "`b`" in info and "This tab now runs **b**" in status
    assert slot.session(request("alice")).engine.model_dir.name == "b"
    assert slot.session(request("bob")).engine is primary and slot.engine is primary
    choose("b", request("bob"), progress=NO_PROGRESS)
    assert slot.session(request("bob")).engine is slot.session(request("alice")).engine
    assert loads == [(str((tmp_path / "b").resolve()), "cpu", "auto")]   # loaded once
    assert slot.chosen("alice") == "b" and slot.chosen("carol") == "served"
    choose("served", request("alice"), progress=NO_PROGRESS)
    assert slot.session(request("alice")).engine is primary
    slot.forget("bob")
    assert slot.session(request("bob")).engine is primary
    slot.close()
    assert not primary.stopped                       # the /v1 engine is never stopped


def test_only_offered_models_load_unless_the_operator_allows_paths(tmp_path):
    loads = []
    factory = lambda path, device, dtype: loads.append(path) or FakeEngine(path)  # noqa: E731
    closed = EngineSlot(None, models=[tmp_path / "b"], engine_factory=factory)
    choose = make_choose(closed)
    info, status = choose("/etc", request("mallory"), progress=NO_PROGRESS)
    assert info == gr.skip() and "offered models (b)" in status and loads == []
    assert closed.session(request("mallory")).engine is None
    opened = EngineSlot(None, models=[tmp_path / "b"], allow_paths=True,
                        engine_factory=factory)
    make_choose(opened)(str(tmp_path / "mine"), request("op"), progress=NO_PROGRESS)
    assert opened.session(request("op")).engine.model_dir.name == "mine"


def test_app_offers_the_shipped_models_by_default_and_checks_the_models_flag(tmp_path):
    import app

    models, why = app.offered_models(None)
    assert why is None and [Path(m).name for m in models] == ["celeris-tiny-bd",
                                                              "celeris-tiny"]
    models, why = app.offered_models(f"{SHIPPED_BD}, {tmp_path}")
    assert models == [] and str(tmp_path) in why and "not a model directory" in why
    args = app.parse_args(["--models", "a,b", "--allow-model-paths"])
    assert (args.models, args.allow_model_paths) == ("a,b", True)
    assert app.parse_args([]).allow_model_paths is False


def test_the_app_refuses_a_models_flag_naming_no_model(tmp_path, capsys):
    import app

    assert app.main(["--models", str(tmp_path), "--port", "1"]) == 2
    assert "not a model directory" in capsys.readouterr().err


# ---------------------------------------------------------------------- item 2 and 3: chat
def test_respond_leaves_the_chat_alone_when_there_is_nothing_to_answer():
    """Enter on a whitespace-only message: the chained respond step must not wipe the
    history (it yielded nothing, and Gradio cleared the chatbot)."""
    slot = EngineSlot(FakeEngine("x"))
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert list(make_respond(slot)(history, "fast", 64, None)) == [(gr.skip(), gr.skip())]


def test_a_message_sent_while_the_tab_is_answering_waits_in_the_box():
    """A second message during a reply got no answer (its answer step was dropped)."""
    from ui.chat import BUSY, make_add

    slot = EngineSlot(FakeEngine("x"))
    history = [{"role": "user", "content": "hi"}]
    rid = slot.begin("s1", slot.engine)
    with pytest.warns(UserWarning, match="still answering"):
        assert make_add(slot)("more", history, request("s1")) == (gr.skip(), gr.skip())
    assert make_add(slot)("more", history, request("s2"))[1][-1]["content"] == "more"
    slot.end("s1", rid)
    assert make_add(slot)("more", history, request("s1"))[1] == history + [
        {"role": "user", "content": "more"}]
    assert "press Stop" in BUSY


def test_an_over_long_message_leaves_the_history_and_goes_back_in_the_box(
        small_context_engine):
    slot = EngineSlot(small_context_engine, frame_interval=0.0)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    long = "the quick brown fox " * 40
    with pytest.warns(UserWarning, match="does not fit"):
        out = list(make_respond(slot)(history + [{"role": "user", "content": long}],
                                      "fast", 16, None))
    assert out == [(history, long)]
    replies = list(make_respond(slot)(history + [{"role": "user", "content": "and?"}],
                                      "fast", 16, None))
    chat, box = replies[-1]
    assert chat[:3] == history + [{"role": "user", "content": "and?"}] and box == gr.skip()
    assert chat[-1]["role"] == "assistant" and chat[-1]["content"]


def test_old_turns_are_left_out_oldest_first_to_fit_the_context(small_context_engine):
    slot = EngineSlot(small_context_engine)
    turn = [{"role": "user", "content": "the quick brown fox " * 4},
            {"role": "assistant", "content": "the lazy dog " * 4}]
    messages = turn * 4 + [{"role": "user", "content": "and then?"}]
    kept, dropped = fit_history(slot, messages, 16)
    assert dropped > 0 and dropped % 2 == 0 and kept == messages[dropped:]
    assert slot.prompt_tokens(kept) + 16 <= 96 < slot.prompt_tokens(messages) + 16
    assert fit_history(slot, messages[-1:], 16) == (messages[-1:], 0)


# ---------------------------------------------------------------------- item 4: replay
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


# ---------------------------------------------------------------------- item 5: empty answer
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


# ---------------------------------------------------------------------- item 6: race
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


# ---------------------------------------------------------------------- item 7: smaller
def test_the_model_default_preset_is_selected_and_is_the_model_settings():
    radio = preset_radio("x")
    assert radio.value == DEFAULT_PRESET and radio.choices[0][0] == DEFAULT_PRESET
    own = GenerationParams(gen_length=64, block_length=16, steps=32, decoding="fixed")
    values = dict(zip([f for f in FIELDS if f != "seed"], preset_values(DEFAULT_PRESET, 8,
                                                                        None, own)))
    assert (values["gen_length"], values["block_length"], values["steps"]) == (64, 16, 32)


@pytest.mark.skipif(not (SHIPPED_BD / "config.json").is_file(), reason="shipped model")
def test_balanced_is_stricter_than_fast_on_the_shipped_block_model():
    """On the shipped block model, balanced (threshold 0.95) committed exactly what fast
    (0.85) did: the same text in the same 43 forwards."""
    engine = Engine.from_pretrained(str(SHIPPED_BD), device="cpu")
    base, size = engine.default_params(), engine.block_size
    prompt = [{"role": "user", "content": "Tell me a story about a brave fox."}]
    nfe = {}
    for name in ("fast", "balanced"):
        preset = preset_settings(name, 256, size, base)
        preset.pop("steps")
        nfe[name] = engine.generate(prompt, base.replace(**preset)).nfe
    assert nfe["balanced"] > nfe["fast"]


def test_the_decoding_help_names_every_choice_including_ltr():
    info = decoding_info()
    assert all(f"{name} = " in info for name in DECODING_CHOICES) and "ltr = " in info


def test_chat_reply_length_defaults_to_the_model_gen_length_and_says_single_turn():
    assert reply_bounds(512, 256) == (448, 256)
    assert reply_bounds(512, None) == (448, 256)       # was 64: stories cut mid-sentence
    assert reply_bounds(128, 256) == (64, 64)
    assert "single questions and answers" in SINGLE_TURN


def test_the_playground_follows_a_session_model_for_presets_and_titles(tmp_path):
    """Presets and Race titles come from the session's model, not the app's default."""
    from ui.playground import make_preset
    from ui.race import headers

    class Block(FakeEngine):
        block_causal, block_size = True, 4

        def default_params(self):
            return GenerationParams(gen_length=256, block_length=4, decoding="ltr",
                                    threshold=0.85, cache="prefix")

    class Full(FakeEngine):
        block_causal = False

        def default_params(self):
            return GenerationParams(gen_length=64, block_length=32, steps=64)

    slot = EngineSlot(Full(tmp_path / "full"), models=[tmp_path / "bd"],
                      engine_factory=lambda path, device, dtype: Block(path))
    make_choose(slot)("bd", request("a"), progress=NO_PROGRESS)
    mine = make_preset(slot)("fast", 64, request("a"))
    theirs = make_preset(slot)("fast", 64, request("b"))
    assert (mine[3], mine[5]) == (4, "ltr") and (theirs[3], theirs[5]) == (32, "threshold")
    assert "Block diffusion · bd" in headers(slot.session(request("a")))[0]
    assert "Fast configuration · full" in headers(slot.session(request("b")))[0]
    assert os.path.basename(str(slot.session(request("b")).engine.model_dir)) == "full"
