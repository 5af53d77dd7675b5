"""Model tab: what this browser tab runs (name, parameters, dtype, device, memory, defaults)
and a dropdown of the models the operator offered (``app.py --models``). The choice is this
tab's only: other visitors keep theirs. A free-text directory is offered only when the
operator started the app with ``--allow-model-paths``."""

from __future__ import annotations

from typing import Any

import gradio as gr

from celeris import CelerisError

from . import render
from .context import EngineSlot, session_of


def load_failed(why: str) -> tuple[object, str]:
    """A failed load: the reason in the status line under the form and as a warning toast.
    Raising instead put Gradio's "Error" pill over the model table."""
    gr.Warning(why, title="Model not loaded")
    return gr.skip(), f"**Could not load the model:** {render.escape_text(why)}"


def why_not(exc: BaseException) -> str:
    if isinstance(exc, (CelerisError, ValueError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def make_choose(slot: EngineSlot):
    def choose(choice: str, request: gr.Request = None,
               progress=gr.Progress()) -> tuple[object, str]:
        """Make ``choice`` (an offered model, or a directory when the operator allows it)
        this browser tab's model; loads it once if no tab used it yet."""
        choice = (choice or "").strip()
        if not choice:
            return load_failed("Pick one of the offered models.")
        try:
            path = slot.resolve(choice)
            if not slot.loaded(path):
                progress(0.1, desc=f"loading {choice}")
            view = slot.choose(session_of(request), choice)
        except Exception as exc:   # any reason a model does not load is the user's to see
            return load_failed(why_not(exc))
        info = view.info(0.0) or {}
        return (render.model_markdown(info),
                f"This tab now runs **{render.escape_text(str(info.get('model')))}**; "
                "other visitors keep their own model.")
    return choose


def create_ui(slot: EngineSlot) -> list[Any]:
    """The tab; returns the events after which the other tabs follow the new model."""
    with gr.Tab("Model", id="model") as tab:
        info = gr.Markdown(render.model_markdown(slot.info(), slot.error), elem_id="model-info")
        refresh = gr.Button("Refresh", size="sm", elem_id="model-refresh")
        gr.Markdown("### Choose the model\nThe models this server offers (the operator lists "
                    "them with `--models`). The Playground, Race, Infill and Chat tabs of "
                    "**this browser tab** switch to it; other visitors keep theirs, and the "
                    "/v1 API keeps the model the app was started with.")
        choice = gr.Dropdown(list(slot.models), value=slot.chosen(""), label="model",
                             elem_id="model-choice", interactive=bool(slot.models))
        path = None
        if slot.allow_paths:
            with gr.Row():
                path = gr.Textbox(label="or a local model directory (allowed by the operator)",
                                  placeholder="models/celeris-tiny", scale=4,
                                  elem_id="model-path")
                load = gr.Button("Load", variant="primary", scale=1, elem_id="model-load")
        status = gr.Markdown(elem_id="model-status")

    def show(request: gr.Request = None) -> str:
        view = slot.session(request)
        return render.model_markdown(view.info(0.0), view.error)

    for trigger in (tab.select, refresh.click):
        trigger(show, None, info, queue=False, api_visibility="private")
    options = dict(api_visibility="private", concurrency_id="load", concurrency_limit=1,
                   show_progress_on=status)
    events = [choice.input(make_choose(slot), choice, [info, status], **options)]
    if path is not None:
        events.append(load.click(make_choose(slot), path, [info, status], **options))
    return events
