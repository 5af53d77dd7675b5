"""Model tab: what is loaded (name, parameters, dtype, device, memory, defaults) and loading
another local model directory, with progress shown."""

from __future__ import annotations

import gradio as gr

from celeris import CelerisError

from . import render
from .context import EngineSlot


def load_failed(why: str) -> tuple[object, str]:
    """A failed load: the reason in the status line under the form and as a warning toast.
    Raising instead put Gradio's "Error" pill over the model table."""
    gr.Warning(why, title="Model not loaded")
    return gr.skip(), f"**Could not load the model:** {render.escape_text(why)}"


def make_load(slot: EngineSlot):
    def load(path: str, device: str, dtype: str, progress=gr.Progress()) -> tuple[object, str]:
        """Load a local model directory and make it the UI's engine."""
        path = (path or "").strip()
        if not path:
            return load_failed("Enter the path of a local model directory.")
        progress(0.1, desc=f"loading {path}")
        try:
            engine = slot.load(path, device=device, dtype=dtype)
        except Exception as exc:   # any reason a directory does not load is the user's to see
            return load_failed(f"{exc}" if isinstance(exc, (CelerisError, ValueError, OSError))
                               else f"{type(exc).__name__}: {exc}")
        progress(0.9, desc="switching the playground to the new model")
        old = slot.swap(engine)
        if old is not None and old is not engine and old is not slot.primary:
            old.stop()
        progress(1.0, desc="ready")
        info = slot.info(0.0)
        return render.model_markdown(info), f"Loaded **{info.get('model')}** from `{path}`."
    return load


def create_ui(slot: EngineSlot) -> None:
    with gr.Tab("Model", id="model") as tab:
        info = gr.Markdown(render.model_markdown(slot.info(), slot.error), elem_id="model-info")
        refresh = gr.Button("Refresh", size="sm", elem_id="model-refresh")
        gr.Markdown("### Load another model\nA local Hugging Face-format directory (celeris, "
                    "LLaDA or Dream): the shipped `models/celeris-tiny-bd` (block diffusion, "
                    "the default) or `models/celeris-tiny` (full canvas: it can also infill). "
                    "The Playground, Race, Infill and Chat tabs switch to it; the /v1 API "
                    "keeps the model it was started with.")
        with gr.Row():
            path = gr.Textbox(label="model directory", placeholder="models/celeris-tiny",
                              scale=4, elem_id="model-path")
            device = gr.Dropdown(["auto", "cpu", "cuda"], value="auto", label="device", scale=1)
            dtype = gr.Dropdown(["auto", "float32", "bfloat16", "float16"], value="auto",
                                label="dtype", scale=1)
        load = gr.Button("Load", variant="primary", elem_id="model-load")
        status = gr.Markdown(elem_id="model-status")

    def show() -> str:
        return render.model_markdown(slot.info(0.0), slot.error)

    for trigger in (tab.select, refresh.click):
        trigger(show, None, info, queue=False, api_visibility="private")
    load.click(make_load(slot), [path, device, dtype], [info, status], api_visibility="private",
               concurrency_id="load", concurrency_limit=1, show_progress_on=status)
