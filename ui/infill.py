"""Infill tab: text with [MASK] spans anywhere; the model fills them, every other word pinned.

Runs through ``engine.stream_infill``: each [MASK] becomes ``span`` masked positions and the
rest of the text stays fixed on the canvas (drawn as pinned cells).
"""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from celeris import split_infill
from celeris.params import DECODINGS

from . import bounds, render, widgets
from .context import (EngineSlot, follow, session_of, user_error, user_errors,
                      with_error_frame)
from .examples import examples
from .playground import make_stop_gauges
from .trajectory import Trajectory

MARKER = "[MASK]"
DEFAULT_SPAN = 1        # tokens per [MASK]: the shipped model's story words are one token each


LONE = (f"There is nothing around the {MARKER} to fill from: write some words before or "
        f"after it, e.g. \"Once upon a time, there was a {MARKER} named Tom.\"")
NOTHING = (f"The model filled every {MARKER} with end of text, so nothing was added. Give "
           f"it more words around each {MARKER} (the tiny model fills one story word best).")


def check_infill_text(text: str) -> str:
    if not isinstance(text, str) or MARKER not in text:
        raise user_error(f"Put at least one {MARKER} where the model should write.",
                         "Nothing to fill")
    if not text.replace(MARKER, "").strip():
        raise user_error(LONE, "Nothing to fill from")
    return text


def infill_frame(traj: Trajectory, prefix: str, slot: EngineSlot) -> tuple[Any, ...]:
    """Canvas, filled text (pinned runs decoded whole), gauges (filled tokens only), note."""
    state, note = "running", ""
    if traj.finished:
        state = "stopped" if traj.result["finish_reason"] == "abort" else "done"
        note = NOTHING if state == "done" and not traj.filled_tokens() else ""
    return (render.canvas_cells(traj, live=not traj.finished),
            prefix + render.spans_text(traj, slot.decode),
            render.trajectory_gauges(traj, slot.info(), state), note)


def error_frame(why: str, slot: EngineSlot) -> tuple[Any, ...]:
    return [], "", render.error_gauges(slot.info()), render.error_markdown(why)


def make_fill(slot: EngineSlot):
    @slot.gpu
    def fill(text: str, span: float, decoding: str, request: gr.Request
             ) -> Iterator[tuple[Any, ...]]:
        """Fill the [MASK] spans of ``text``; yields (canvas cells, filled text, gauges,
        note)."""
        yield from with_error_frame(_fill(slot, text, span, decoding, request),
                                    lambda why: error_frame(why, slot))
    return fill


def _fill(slot: EngineSlot, text: str, span: float, decoding: str, request: gr.Request
          ) -> Iterator[tuple[Any, ...]]:
    engine = slot.require()
    text = check_infill_text(text)
    with user_errors():
        params = engine.default_params().replace(decoding=decoding)
    prefix = split_infill(text, MARKER)[0]
    traj = Trajectory(0, params.block_length, prompt=text, params=params.to_dict())
    start = lambda rid: engine.stream_infill(text, params, span=int(span),  # noqa: E731
                                             marker=MARKER, request_id=rid)
    for traj in follow(slot, session_of(request), engine, start, traj):
        yield infill_frame(traj, prefix, slot)


def create_ui(slot: EngineSlot) -> None:
    samples = examples("infill")
    with gr.Tab("Infill", id="infill"):
        gr.Markdown(f"Write {MARKER} where the model should fill in text. Everything else is "
                    "pinned: it stays fixed and the model writes around it.")
        text = gr.Textbox(samples[0] if samples else f"Once upon a time {MARKER}.", lines=3,
                          label="text with [MASK] spans", elem_id="infill-text")
        with gr.Row():
            span = gr.Slider(1, 64, value=DEFAULT_SPAN, step=1, label="tokens per [MASK]",
                             info="each [MASK] becomes exactly this many tokens; the tiny "
                                  "model's story words are one token each",
                             elem_id="infill-span")
            decoding = gr.Dropdown(list(DECODINGS), value="fixed", label="decoding",
                                   elem_id="infill-decoding")
        with gr.Row():
            go = gr.Button("Fill", variant="primary", elem_id="infill-go")
            stop = gr.Button("Stop", variant="stop", elem_id="infill-stop")
        canvas = widgets.canvas("infill-canvas", "Pinned words appear in green, the spans "
                                "fill in step by step.")
        gauge = widgets.gauges("infill-gauges")
        filled = gr.Textbox(label="filled text", lines=3, interactive=False,
                            elem_id="infill-result")
        note = gr.Markdown(elem_id="infill-note")
        if samples:
            gr.Examples([[s] for s in samples], [text], label="examples")
    event = go.click(make_fill(slot), [text, span, decoding], [canvas, filled, gauge, note],
                     api_name="infill", concurrency_id="engine",
                     concurrency_limit=slot.concurrency, show_progress="hidden")
    stop.click(make_stop_gauges(slot), gauge, gauge, cancels=[event], queue=False,
               api_visibility="private")
    bounds.warn_out_of_range(span, "tokens per [MASK]")
