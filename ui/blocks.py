"""The whole playground: a header and one tab per module, each wired by its own create_ui().

A tab whose widgets depend on the model returns a ``Follow``: after a browser tab picks
another model in the Model tab, every Follow updates that tab's widgets for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from . import api_tab, chat, infill, model_tab, playground, race
from .context import EngineSlot, Follow, session_of
from .render import escape_text

ASSETS = Path(__file__).resolve().parents[1] / "assets"
HEAD = ('<meta name="description" content="Celeris: watch a masked diffusion language model '
        'turn masks into text, step by step.">')


def theme() -> gr.themes.Base:
    return gr.themes.Soft(primary_hue="indigo", secondary_hue="amber", neutral_hue="slate")


def css() -> str:
    path = ASSETS / "celeris.css"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def header_markdown(view: Any) -> str:
    """The page header for the model a browser tab runs (``view``: a slot or session)."""
    info = view.info() or {}
    where = (f"`{info.get('model')}` on {info.get('device')} ({info.get('dtype')})"
             if info else "no model loaded")
    how = ("A block-diffusion language model writes block after block, every position of "
           "a block at once" if info.get("attention") == "block_causal" else
           "A masked diffusion language model writes every position at once")
    return (f"# Celeris\n{how}: each step commits the positions it is surest of. "
            f"Model: {where}.")


def banner(view: Any) -> Any:
    """Why there is no model (hidden once the tab has one)."""
    return gr.Markdown(escape_text(view.error or "No model is loaded."),
                       visible=view.engine is None)


def follow_model(slot: EngineSlot, follows: list[Follow]) -> tuple[list[Any], list[Any], Any]:
    """(inputs, outputs, handler): every tab's Follow in one event, run after this browser
    tab picked another model."""
    inputs = [c for f in follows for c in f.inputs]
    outputs = [c for f in follows for c in f.outputs]

    def update(request: gr.Request, *values: Any) -> list[Any]:
        view = slot.session(request)
        out, at = [], 0
        for f in follows:
            out += list(f.fn(view, *values[at:at + len(f.inputs)]))
            at += len(f.inputs)
        return out
    return inputs, outputs, update


def build_blocks(slot: EngineSlot) -> gr.Blocks:
    """Build (not launch) the Gradio Blocks; theme/css/head go to mount_gradio_app."""
    with gr.Blocks(title="Celeris playground", analytics_enabled=False) as demo:
        head = gr.Markdown(header_markdown(slot), elem_classes=["celeris-header"],
                           elem_id="celeris-header")
        note = gr.Markdown(escape_text(slot.error or "No model is loaded."),
                           visible=slot.engine is None, elem_classes=["celeris-banner"],
                           elem_id="no-model-banner")
        follows = [Follow([], [head, note], lambda view: [header_markdown(view), banner(view)])]
        with gr.Tabs():
            follows.append(playground.create_ui(slot))
            follows.append(race.create_ui(slot))
            follows.append(infill.create_ui(slot))
            follows.append(chat.create_ui(slot))
            api_tab.create_ui(slot)
            chosen = model_tab.create_ui(slot)
        inputs, outputs, update = follow_model(slot, follows)
        for event in chosen:
            event.success(update, inputs, outputs, api_visibility="private", queue=False,
                          show_progress="hidden")
        demo.unload(forgetter(slot))
    return demo


def forgetter(slot: EngineSlot):
    def forget(request: gr.Request) -> None:
        """A closed browser tab: drop its model choice."""
        slot.forget(session_of(request))
    return forget
