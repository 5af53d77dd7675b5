"""Chat tab: multi-turn chat through the model's chat template (Gradio 6 messages format).

The whole history goes to ``engine.stream`` as messages; the assistant's reply grows as its
committed prefix does, with a shaded tail for the positions still masked.
"""

from __future__ import annotations

import time
from contextlib import closing
from typing import Any, Iterator

import gradio as gr

from celeris import GenerationResult

from . import render
from .context import EngineSlot, session_of, user_error, user_errors
from .examples import examples
from .playground import make_stop
from .settings import PRESETS

MASK_TAIL = "\u2591"


def reply_so_far(text: str, masked: int) -> str:
    """The assistant bubble while denoising: committed prefix + one shade per 8 masks."""
    return text + (" " + MASK_TAIL * max(1, masked // 8) if masked else "")


def add_user_message(message: str, history: list[dict[str, Any]]
                     ) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(message, str) or not message.strip():
        raise user_error("Type a message first.", "Empty message")
    return "", list(history or []) + [{"role": "user", "content": message}]


def make_respond(slot: EngineSlot):
    @slot.gpu
    def respond(history: list[dict[str, Any]], preset: str, gen_length: float,
                request: gr.Request) -> Iterator[list[dict[str, Any]]]:
        """Answer the last user message; yields the history with the reply growing."""
        engine = slot.require()
        messages = render.plain_messages(history)
        if not messages or messages[-1]["role"] != "user":
            return
        with user_errors():
            params = engine.default_params().replace(gen_length=int(gen_length),
                                                     **_preset(preset, int(gen_length)))
        rid = slot.begin(session_of(request), engine)
        done, reply, sent = False, {"role": "assistant", "content": ""}, float("-inf")
        try:
            with user_errors(), closing(engine.stream(messages, params, request_id=rid)) as run:
                for item in run:
                    if isinstance(item, GenerationResult):
                        reply["content"], done = item.text or "(empty answer)", True
                    else:
                        reply["content"] = reply_so_far(item.text, item.num_masked)
                    if done or time.monotonic() - sent >= slot.frame_interval:
                        sent = time.monotonic()
                        yield list(history) + [dict(reply)]
        finally:
            if not done:
                engine.abort(rid)
            slot.end(session_of(request), rid)
    return respond


def _preset(name: str, gen_length: int) -> dict[str, Any]:
    preset = dict(PRESETS.get(name) or {})
    preset.pop("steps", None)
    preset["block_length"] = min(preset.get("block_length", 32), gen_length)
    return preset


def create_ui(slot: EngineSlot) -> None:
    with gr.Tab("Chat", id="chat"):
        chatbot = gr.Chatbot(label="chat", height=420, elem_id="chat-box",
                             buttons=["copy"], placeholder="Ask the model something.")
        with gr.Row():
            message = gr.Textbox(placeholder="Type a message and press Enter", scale=5,
                                 show_label=False, elem_id="chat-message")
            send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
            stop = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
        with gr.Row():
            preset = gr.Radio(list(PRESETS), value="fast", label="preset")
            gen_length = gr.Slider(16, 512, value=64, step=16, label="reply length (tokens)")
            clear = gr.Button("Clear", scale=0)
        samples = examples("chat")
        if samples:
            gr.Examples([[s] for s in samples], [message], label="examples")
    respond = make_respond(slot)
    events = []
    for trigger in (send.click, message.submit):
        ev = trigger(add_user_message, [message, chatbot], [message, chatbot], queue=False,
                     api_visibility="private")
        events.append(ev.then(respond, [chatbot, preset, gen_length], chatbot,
                              api_visibility="private", concurrency_id="engine",
                              concurrency_limit=slot.concurrency, show_progress="hidden"))
    stop.click(make_stop(slot), None, None, cancels=events, queue=False,
               api_visibility="private")
    clear.click(lambda: [], None, chatbot, queue=False, api_visibility="private")
