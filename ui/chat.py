"""Chat tab: multi-turn chat through the model's chat template (Gradio 6 messages format).

The whole history goes to ``engine.stream`` as messages; the assistant's reply grows as its
committed prefix does, with a shaded tail for the positions still masked.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any, Iterator

import gradio as gr

from celeris import GenerationParams, GenerationResult

from . import bounds, render
from .context import EngineSlot, paced, session_of, user_errors
from .examples import examples
from .playground import make_stop
from .settings import PRESETS, preset_settings

MASK_TAIL = "\u2591"


def reply_so_far(text: str, masked: int) -> str:
    """The assistant bubble while denoising: committed prefix + one shade per 8 masks."""
    return text + (" " + MASK_TAIL * max(1, masked // 8) if masked else "")


EMPTY = "Type a message first."


def add_user_message(message: str, history: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Append the typed message; an empty box only says what to do (a warning toast, the
    history untouched), so no error status lands on the chat."""
    if not isinstance(message, str) or not message.strip():
        gr.Warning(EMPTY, title="Empty message")
        return gr.skip(), gr.skip()
    return "", list(history or []) + [{"role": "user", "content": message}]


def send_button(message: Any) -> gr.Button:
    """Send is enabled only while there is something to send."""
    return gr.Button(interactive=isinstance(message, str) and bool(message.strip()))


def reply_bounds(context: int | None) -> tuple[int, int]:
    """(max, default) reply length: the history shares the context, so at most context - 64
    (a few short turns), in steps of 16."""
    top = 512 if not context else max(16, (context - 64) // 16 * 16)
    return top, min(64, top)


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
            base = engine.default_params()
            params = base.replace(gen_length=int(gen_length), **_preset(
                preset, int(gen_length), slot.block_size(), base))
        rid = slot.begin(session_of(request), engine)
        done = False
        try:
            with user_errors(), closing(engine.stream(messages, params, request_id=rid)) as run:
                for item in paced(run, slot.frame_interval,
                                  final=lambda i: isinstance(i, GenerationResult)):
                    done = isinstance(item, GenerationResult)
                    content = ((item.text or "(empty answer)") if done
                               else reply_so_far(item.text, item.num_masked))
                    yield list(history) + [{"role": "assistant", "content": content}]
        finally:
            if not done:
                engine.abort(rid)
            slot.end(session_of(request), rid)
    return respond


def _preset(name: str, gen_length: int, block_size: int | None = None,
            base: GenerationParams | None = None) -> dict[str, Any]:
    """The preset's settings for a reply of ``gen_length`` tokens (steps: one token a step).
    A block-causal model (``block_size``, its defaults ``base``) gets ui.settings'
    preset_settings: a block length that divides its block size."""
    if name not in PRESETS:
        return {}
    if block_size:
        preset = preset_settings(name, gen_length, block_size, base)
        preset.pop("gen_length", None)
    else:
        preset = dict(PRESETS[name])
        preset["block_length"] = min(preset.get("block_length", 32), gen_length)
    preset.pop("steps", None)
    return preset


def create_ui(slot: EngineSlot) -> None:
    with gr.Tab("Chat", id="chat"):
        chatbot = gr.Chatbot(label="chat", height=420, elem_id="chat-box",
                             buttons=["copy"], placeholder="Ask the model something.")
        with gr.Row():
            message = gr.Textbox(placeholder="Type a message and press Enter", scale=5,
                                 show_label=False, elem_id="chat-message")
            send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send",
                             interactive=False)
            stop = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
        with gr.Row():
            preset = gr.Radio(list(PRESETS), value="fast", label="preset")
            top, value = reply_bounds(slot.context_length())
            gen_length = gr.Slider(16, top, value=value, step=16, label="reply length (tokens)",
                                   elem_id="chat-gen-length")
            clear = gr.Button("Clear", scale=0)
        samples = examples("chat")
        if samples:
            gr.Examples([[s] for s in samples], [message], label="examples")
    respond = make_respond(slot)
    events = []
    message.change(send_button, message, send, queue=False, api_visibility="private",
                   show_progress="hidden")
    for trigger in (send.click, message.submit):
        ev = trigger(add_user_message, [message, chatbot], [message, chatbot],
                     api_visibility="private", show_progress="hidden")
        events.append(ev.then(respond, [chatbot, preset, gen_length], chatbot,
                              api_visibility="private", concurrency_id="engine",
                              concurrency_limit=slot.concurrency, show_progress="hidden"))
    stop.click(make_stop(slot), None, None, cancels=events, queue=False,
               api_visibility="private")
    clear.click(lambda: [], None, chatbot, queue=False, api_visibility="private")
    bounds.warn_out_of_range(gen_length, "reply length")
