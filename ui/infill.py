"""Infill tab: text with [MASK] spans anywhere; the model fills them, every other word pinned.

Runs through ``engine.stream_infill``: each [MASK] becomes ``span`` masked positions and the
rest of the text stays fixed on the canvas (drawn as pinned cells). The text before the first
span is the engine's prompt, not part of the canvas it reports: the step view draws it in
front, pinned too, so that it shows the whole text (``Trajectory.lead``). Only a full-attention
(full-canvas) model can do that: when the loaded model is block-causal (block diffusion, which
writes left to right), the tab fills with the full-canvas model ``EngineSlot.canvas_model()``
(models/celeris-tiny, loaded on first use) and says so above the text.
"""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from celeris import split_infill
from celeris.params import DECODINGS

from . import bounds, render, widgets
from .context import (EngineSlot, Follow, follow, session_of, user_error, user_errors,
                      with_error_frame)
from .examples import examples
from .playground import wire_stop_gauges
from .trajectory import Trajectory, lead_strings

MARKER = "[MASK]"
TAB = "infill"
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


def is_block_causal(engine: Any) -> bool:
    return bool(getattr(engine, "block_causal", False))


def model_name(engine: Any) -> str:
    model_dir = getattr(engine, "model_dir", None)
    return model_dir.name if model_dir is not None else "the loaded model"


def unavailable(engine: Any, why: str) -> str:
    """Why this tab cannot fill: a block-causal model loaded and no full-canvas one to use."""
    return (f"The loaded model, {model_name(engine)}, is a block-diffusion model: it writes "
            f"left to right, block after block, and cannot fill [MASK] spans. Infill needs a "
            f"full-canvas (full-attention) model and none is available: {why}. Load "
            f"models/celeris-tiny in the Model tab (or start the app with --canvas-model DIR).")


def model_note(slot: Any, used: Any = None) -> str:
    """Which model fills, above the text: the loaded one, or next to a block-diffusion model
    the full-canvas one (``used`` once a run picked it, else the slot's canvas path)."""
    engine = slot.engine
    if engine is None:
        return ""
    name = render.escape_text(model_name(engine))
    if not is_block_causal(engine):
        return f"Fills with the loaded model, **{name}** (full attention)."
    if used is not None:
        canvas = model_name(used)
    elif slot.canvas_loaded or (slot.canvas_path / "config.json").is_file():
        canvas = slot.canvas_path.name
    else:
        return (f"The loaded model, **{name}**, is block diffusion: it writes left to right and "
                f"cannot fill a gap, and there is no full-canvas model at "
                f"`{render.escape_text(str(slot.canvas_path))}` to fill with instead. Load "
                "models/celeris-tiny in the Model tab.")
    later = "" if used is not None or slot.canvas_loaded else " (loaded on the first fill)"
    return (f"Fills with the full-canvas model **{render.escape_text(canvas)}**{later}: the "
            f"loaded model, **{name}**, is block diffusion, which writes left to right, block "
            "after block, and cannot fill a gap.")


def infill_engine(slot: Any) -> Any:
    """The engine that fills: the loaded one, or the full-canvas model next to a
    block-causal one (a toast saying why when there is none)."""
    engine = slot.require()
    if not is_block_causal(engine):
        return engine
    canvas, why = slot.canvas_model()
    if canvas is None:
        raise user_error(unavailable(engine, why), "Infill needs a full-canvas model")
    return canvas


def prompt_lead(engine: Any, text: str, params: Any, span: int, token_text: Any,
                decode: Any) -> list[str]:
    """The pinned text before the first span as the engine feeds it (its prompt, not part
    of the canvas that ``stream_infill`` reports), one display string per token, so that
    the step view shows the whole text."""
    with user_errors():
        prompt_ids = engine.infill_request(text, params, span, MARKER)[0]
    return lead_strings(prompt_ids, token_text, decode)


def infill_frame(traj: Trajectory, prefix: str, slot: Any, decode: Any = None,
                 ended: bool = False) -> tuple[Any, ...]:
    """Canvas, filled text (pinned runs decoded whole with ``decode``, default the slot's),
    gauges (filled tokens only), note. ``ended``: the run's event is over (a run without
    its result was stopped)."""
    state, note = ("stopped" if ended else "running"), ""
    if traj.finished:
        state = "stopped" if traj.result["finish_reason"] == "abort" else "done"
        note = NOTHING if state == "done" and not traj.filled_tokens() else ""
    return (render.canvas_cells(traj, live=not traj.finished),
            prefix + render.spans_text(traj, decode or slot.decode),
            render.trajectory_gauges(traj, slot.info(), state), note)


def error_frame(why: str, slot: Any) -> tuple[Any, ...]:
    return [], "", render.error_gauges(slot.info()), render.error_markdown(why), gr.skip()


def make_fill(slot: EngineSlot):
    @slot.gpu
    def fill(text: str, span: float, decoding: str, request: gr.Request
             ) -> Iterator[tuple[Any, ...]]:
        """Fill the [MASK] spans of ``text``; yields (canvas cells, filled text, gauges,
        note, which model fills)."""
        view = slot.session(request)
        yield from with_error_frame(_fill(view, text, span, decoding, request),
                                    lambda why: error_frame(why, view))
    return fill


def _fill(slot: Any, text: str, span: float, decoding: str, request: gr.Request
          ) -> Iterator[tuple[Any, ...]]:
    loaded = slot.require()
    text = check_infill_text(text)
    if is_block_causal(loaded) and not slot.canvas_loaded:   # the first fill loads it
        yield ([], "", render.gauges(info=slot.info(), state="loading"), "",
               model_note(slot))
    engine = infill_engine(slot)
    note = model_note(slot, engine)
    with user_errors():
        params = engine.default_params().replace(decoding=decoding)
    prefix = split_infill(text, MARKER)[0]
    token_text, decode = slot.spellers(engine)
    traj = Trajectory(0, params.block_length, prompt=text, params=params.to_dict(),
                      lead=prompt_lead(engine, text, params, int(span), token_text, decode))
    start = lambda rid: engine.stream_infill(text, params, span=int(span),  # noqa: E731
                                             marker=MARKER, request_id=rid)
    session = session_of(request)
    draw = lambda run=traj: infill_frame(run, prefix, slot, decode, True)  # noqa: E731
    for traj in slot.recorded(session, TAB, draw, follow(slot, session, engine, start, traj)):
        yield (*infill_frame(traj, prefix, slot, decode), note)


def create_ui(slot: EngineSlot) -> Follow:
    samples = examples("infill")
    with gr.Tab("Infill", id="infill") as tab:
        gr.Markdown(f"Write {MARKER} where the model should fill in text. Everything else is "
                    "pinned: it stays fixed and the model writes around it.")
        used = gr.Markdown(model_note(slot), elem_id="infill-model")
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
    event = go.click(make_fill(slot), [text, span, decoding],
                     [canvas, filled, gauge, note, used],
                     api_name="infill", concurrency_id="engine",
                     concurrency_limit=slot.concurrency, show_progress="hidden")
    wire_stop_gauges(slot, stop, event, gauge, [canvas, filled, gauge, note], TAB)
    bounds.warn_out_of_range(span, "tokens per [MASK]")
    # which model fills follows this browser tab's model (and the full-canvas one loading)
    def note_for(request: gr.Request) -> str:
        return model_note(slot.session(request))

    tab.select(note_for, None, used, **bounds.QUIET)
    return Follow([], [used], lambda view: [model_note(view)])
