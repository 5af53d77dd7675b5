"""The demo world on the page (issue 52, item 5), for shipped celeris models only: a story
builder on the Playground tab (the world's kinds, names, adjectives, objects and places as
dropdowns; it writes a request phrased as the training requests are, ``celeris.builder_request``)
and the unknown-word notice of the Playground and Chat tabs (``celeris.prompt_unknown_words``).
Real checkpoints never see either: nothing is shown and nothing is computed for them."""

from __future__ import annotations

from typing import Any

import gradio as gr

from celeris import builder_request, prompt_unknown_words, world, world_markdown


def applies(view: Any) -> bool:
    """``view``'s model is one of the demo world's (family "celeris")."""
    engine = getattr(view, "engine", None)
    return engine is not None and getattr(engine.family, "name", None) == "celeris"


def notice(view: Any, prompt: Any) -> str:
    """The notice for ``prompt`` (a text or chat messages): "" when every word is known or
    the model is not a demo one."""
    if not applies(view):
        return ""
    found = prompt_unknown_words(prompt)
    if not found:
        return ""
    return ("\u26a0\ufe0f The demo model never saw: " + ", ".join(f"`{w}`" for w in found)
            + ". It knows only its small story world (see *The demo world* on the "
            "Playground tab) and the tasks; expect nonsense for these.")


def notice_box(elem_id: str) -> gr.Markdown:
    return gr.Markdown("", elem_id=elem_id)


def create_builder(slot: Any, prompt: Any, as_chat: Any) -> gr.Accordion:
    """The "demo world" accordion under the prompt: the world's tables and the builder."""
    w = world()
    with gr.Accordion("The demo world: what this model knows, and a story builder",
                      open=False, visible=applies(slot), elem_id="pg-world") as box:
        gr.Markdown(world_markdown(), elem_id="pg-world-list")
        with gr.Row():
            kind = gr.Dropdown(["", *w["kinds"]], value="fox", label="kind",
                               elem_id="pg-world-kind")
            name = gr.Dropdown(["", *w["names_she"], *w["names_he"]], value="Tom",
                               label="name", elem_id="pg-world-name")
            adj = gr.Dropdown(["", *w["adjectives"]], value="", label="adjective",
                              elem_id="pg-world-adj")
            obj = gr.Dropdown(["", *w["objects"]], value="", label="object",
                              elem_id="pg-world-obj")
            place = gr.Dropdown(["", *w["places"]], value="", label="place",
                                elem_id="pg-world-place")
        write = gr.Button("Write the request", elem_id="pg-world-write")

    def build(*picks: Any) -> tuple[str, bool]:
        return builder_request(*(p or None for p in picks)), True

    write.click(build, [kind, name, adj, obj, place], [prompt, as_chat], queue=False,
                api_visibility="private", show_progress="hidden")
    return box
