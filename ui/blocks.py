"""The whole playground: a header and one tab per module, each wired by its own create_ui()."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from . import api_tab, chat, infill, model_tab, playground, race
from .context import EngineSlot
from .render import escape_text

ASSETS = Path(__file__).resolve().parents[1] / "assets"
HEAD = ('<meta name="description" content="Celeris: watch a masked diffusion language model '
        'turn masks into text, step by step.">')


def theme() -> gr.themes.Base:
    return gr.themes.Soft(primary_hue="indigo", secondary_hue="amber", neutral_hue="slate")


def css() -> str:
    path = ASSETS / "celeris.css"
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def header(slot: EngineSlot) -> None:
    info = slot.info() or {}
    where = (f"`{info.get('model')}` on {info.get('device')} ({info.get('dtype')})"
             if info else "no model loaded")
    how = ("A block-diffusion language model writes block after block, every position of "
           "a block at once" if info.get("attention") == "block_causal" else
           "A masked diffusion language model writes every position at once")
    gr.Markdown(f"# Celeris\n{how}: each step commits the positions it is surest of. "
                f"Model: {where}.", elem_classes=["celeris-header"])
    if slot.engine is None:
        gr.Markdown(escape_text(slot.error or "No model is loaded."),
                    elem_classes=["celeris-banner"], elem_id="no-model-banner")


def build_blocks(slot: EngineSlot) -> gr.Blocks:
    """Build (not launch) the Gradio Blocks; theme/css/head go to mount_gradio_app."""
    with gr.Blocks(title="Celeris playground", analytics_enabled=False) as demo:
        header(slot)
        with gr.Tabs():
            playground.create_ui(slot)
            race.create_ui(slot)
            infill.create_ui(slot)
            chat.create_ui(slot)
            api_tab.create_ui(slot)
            model_tab.create_ui(slot)
    return demo
