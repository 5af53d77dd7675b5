"""The Chat tab's handlers (ui/chat.py), tested without a browser: an empty message is not
sent and leaves the chat alone, a message sent while the tab answers waits in the box, an
over-long one goes back to the box, old turns are left out oldest first to fit the context,
and the reply length defaults to the model's gen length."""

from __future__ import annotations

import gradio as gr
import pytest

from celeris import Engine
from tests.tiny_model import make_tiny_model_dir
from tests.ui_fakes import FakeEngine, request
from ui.chat import SINGLE_TURN, fit_history, make_respond, reply_bounds
from ui.context import EngineSlot


@pytest.fixture(scope="module")
def small_context_engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("chat") / "tiny",
                               max_position_embeddings=96,
                               generation_defaults={"gen_length": 16, "block_length": 8})
    engine = Engine.from_pretrained(str(path), device="cpu").start()
    yield engine
    engine.stop()


def test_an_empty_chat_message_is_not_sent():
    from ui.chat import add_user_message, send_button

    history = [{"role": "user", "content": "hi"}]
    assert add_user_message("   ", history) == (gr.skip(), gr.skip())
    assert add_user_message("hello", history)[1][-1] == {"role": "user", "content": "hello"}
    assert send_button("").interactive is False and send_button(" x ").interactive is True


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


def test_old_turns_are_left_out_oldest_first_to_fit_the_context(small_context_engine,
                                                                 monkeypatch):
    import dataclasses

    slot = EngineSlot(small_context_engine)
    turn = [{"role": "user", "content": "the quick brown fox " * 4},
            {"role": "assistant", "content": "the lazy dog " * 4}]
    messages = turn * 4 + [{"role": "user", "content": "and then?"}]
    # the demo family reads the last request alone: nothing to leave out
    assert small_context_engine.family.single_turn_chat
    assert fit_history(slot, messages, 16) == (messages, 0)
    # a family that reads the whole history (every real checkpoint's)
    monkeypatch.setattr(small_context_engine, "family", dataclasses.replace(
        small_context_engine.family, single_turn_chat=False))
    kept, dropped = fit_history(slot, messages, 16)
    assert dropped > 0 and dropped % 2 == 0 and kept == messages[dropped:]
    assert slot.prompt_tokens(kept) + 16 <= 96 < slot.prompt_tokens(messages) + 16
    assert fit_history(slot, messages[-1:], 16) == (messages[-1:], 0)


def test_chat_reply_length_defaults_to_the_model_gen_length_and_says_single_turn():
    assert reply_bounds(512, 256) == (448, 256)
    assert reply_bounds(512, None) == (448, 256)       # was 64: stories cut mid-sentence
    assert reply_bounds(128, 256) == (64, 64)
    assert "single questions and answers" in SINGLE_TURN


# ----------------------------------------------------------------------- tools
def test_the_tools_box_is_read_and_refused_by_name():
    from ui.chat import TOOLS_EXAMPLE, read_tools

    assert read_tools("not json", "none") is None               # none: the box is not read
    assert [t["function"]["name"] for t in read_tools(TOOLS_EXAMPLE, "required")] == \
        ["get_weather", "add"]
    with pytest.raises(gr.Error, match="tools is not valid JSON"):
        read_tools("[{", "auto")
    with pytest.raises(gr.Error, match="non-empty list of"):
        read_tools('[{"type": "web"}]', "required")
    with pytest.raises(gr.Error, match="tool_choice must be one of none, auto, required"):
        read_tools(TOOLS_EXAMPLE, "always")


def test_a_required_tool_call_is_shown_as_a_call_with_arguments_that_validate():
    """The default model under tool_choice required: the reply is a titled call box whose
    arguments validate against the function's schema (decoded under the call grammar)."""
    import json
    from pathlib import Path

    import jsonschema

    from ui.chat import TOOLS_EXAMPLE

    engine = Engine.from_pretrained(Path(__file__).resolve().parents[1] / "models" /
                                    "celeris-tiny-bd", device="cpu")
    slot = EngineSlot(engine)
    history = [{"role": "user", "content": "What is the weather in Paris?"}]
    frames = list(make_respond(slot)(history, "fast", 96, request("s1"), TOOLS_EXAMPLE,
                                     "required"))
    final, box = frames[-1]
    assert box == gr.skip() and final[:1] == history
    calls = final[1:]
    assert calls and all(m["metadata"]["title"].startswith("\U0001f527 call ") for m in calls)
    schemas = {t["function"]["name"]: t["function"]["parameters"]
               for t in json.loads(TOOLS_EXAMPLE)}
    for m in calls:
        name = m["metadata"]["title"].split()[-1]
        args = m["content"].removeprefix("```json\n").removesuffix("\n```")
        jsonschema.validate(json.loads(args), schemas[name])
