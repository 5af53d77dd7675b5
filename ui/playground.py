"""Playground tab: prompt -> a live canvas of masks turning into text, gauges, replay, charts.

The canvas is fed by the engine's real StepEvents as they happen (``engine.stream``); after
the run, the recorded trajectory drives the replay scrubber, three plotly charts and the JSON
download. Stop cancels the Gradio event and aborts the engine request.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from celeris.params import GenerationParams

from . import bounds, charts, limits, render, structured, widgets, world
from .context import (EngineSlot, Follow, follow, session_of, user_error, user_errors,
                      with_error_frame)
from .examples import examples
from .settings import (DEFAULT_PRESET, build_params, preset_caption, preset_values,
                       widget_values)
from .trajectory import Trajectory

DOWNLOAD_DIR = Path(tempfile.gettempdir()) / "celeris-ui"
TAB = "playground"


def prompt_input(prompt: str, as_chat: bool) -> str | list[dict[str, str]]:
    """The prompt as the engine takes it: plain text, or one user message (chat template)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise user_error("Type a prompt first.", "Empty prompt")
    return [{"role": "user", "content": prompt}] if as_chat else prompt


def params_from(slot: Any, values: tuple[Any, ...],
                constraint: tuple[str | None, str | None] = (structured.OFF, "")
                ) -> GenerationParams:
    """The run's GenerationParams: the model's defaults, the widgets' ``values`` and the
    Structured control's (mode, spec); a refusal becomes a toast."""
    with user_errors():
        return build_params(slot.require().default_params(), values,
                            structured.structured_value(*constraint))


def finished_summary(traj: Trajectory, as_chat: bool) -> str:
    """The line under a finished run; a run that wrote nothing says why and what to try."""
    r = traj.result
    if r["finish_reason"] != "abort" and not r["usage"]["completion_tokens"]:
        return render.run_summary(traj) + "\n\n" + render.empty_answer_hint(as_chat)
    return render.run_summary(traj)


def frame(traj: Trajectory, slot: Any, as_chat: bool = False) -> tuple[Any, ...]:
    """One streaming update: canvas cells, answer text, gauges (summary and state skipped)."""
    if not traj.steps and not traj.finished:     # accepted, nothing committed yet
        return (render.masked_cells(traj.gen_length, traj.block_length, traj.structured), "",
                render.gauges(info=slot.info(), state="running"), "", gr.skip())
    if traj.finished:
        state = "stopped" if traj.result["finish_reason"] == "abort" else "done"
        return (render.canvas_cells(traj), traj.text_at(), render.trajectory_gauges(
            traj, slot.info(0.0), state), finished_summary(traj, as_chat), traj.to_dict())
    return (render.canvas_cells(traj, live=True), traj.text_at(),
            render.trajectory_gauges(traj, slot.info(), "running"), gr.skip(), gr.skip())


def final_frame(traj: Trajectory, slot: Any, as_chat: bool = False) -> tuple[Any, ...]:
    """Canvas, answer, gauges and summary of a run whose event has ended, all read from
    ``traj``: its final frame once the result came; else (Stop cut the stream first) the
    state it reached, "stopped"."""
    if traj.finished:
        return frame(traj, slot, as_chat)[:4]
    return (render.canvas_cells(traj), traj.text_at(),
            render.trajectory_gauges(traj, slot.info(0.0), "stopped"),
            render.stopped_summary(traj))


def make_generate(slot: EngineSlot):
    @slot.gpu
    def generate(prompt: str, as_chat: bool, steps: float, temperature: float,
                 gen_length: float, block_length: float, threshold: float, decoding: str,
                 remasking: str, cache: str, seed: float, mode: str = structured.OFF,
                 spec: str = "", request: gr.Request = None) -> Iterator[tuple[Any, ...]]:
        """Generate with live denoising steps: yields (canvas cells, text, gauges, summary)
        after every step; a refused run shows status "error" and says why. ``mode`` and
        ``spec``: the Structured control (off: unconstrained)."""
        settings = (steps, temperature, gen_length, block_length, threshold, decoding,
                    remasking, cache, seed)
        view = slot.session(request)
        yield from with_error_frame(_run(view, prompt, as_chat, settings, request,
                                         (mode, spec)),
                                    lambda why: error_frame(why, view))
    return generate


def _run(slot: Any, prompt: str, as_chat: bool, settings: tuple[Any, ...],
         request: gr.Request, constraint: tuple[Any, Any] = (structured.OFF, "")
         ) -> Iterator[tuple[Any, ...]]:
    engine = slot.require()
    params = params_from(slot, settings, constraint)
    message = prompt_input(prompt, as_chat)
    # a block-diffusion canvas grows block by block from nothing (gen length is a cap)
    grows = bool(getattr(engine, "block_causal", False))
    traj = Trajectory(0 if grows else params.gen_length, params.block_length, prompt=prompt,
                      params=params.to_dict())
    start = lambda rid: engine.stream(message, params, request_id=rid)  # noqa: E731
    session = session_of(request)
    draw = lambda run=traj: final_frame(run, slot, bool(as_chat))  # noqa: E731
    for traj in slot.recorded(session, TAB, draw, follow(slot, session, engine, start, traj)):
        yield frame(traj, slot, bool(as_chat))


def error_frame(why: str, slot: Any) -> tuple[Any, ...]:
    """A refused run: no canvas, status "error", the reason under the canvas."""
    return [], "", render.error_gauges(slot.info()), render.error_markdown(why), \
        gr.skip()


def make_preset(slot: EngineSlot):
    """The preset radio's handler: its settings for this browser tab's model."""
    def preset(name: str, gen_length: float, request: gr.Request = None) -> list[Any]:
        view = slot.session(request)
        engine = view.engine
        return preset_values(name, gen_length, view.block_size(),
                             engine.default_params() if engine is not None else None)
    return preset


def make_stop(slot: EngineSlot):
    def stop(request: gr.Request) -> None:
        slot.abort(session_of(request))
    return stop


# Stop's instant feedback, in the browser: "running" becomes "stopped" and every figure stays
# as shown. A server answer could land after the run's last frame and bring older figures back.
STOP_JS = "(g) => (g && g.state === 'running') ? {...g, state: 'stopped'} : g"


def make_settle(slot: EngineSlot, tab: str, outputs: int):
    """After a run's event ended, however it ended: the run's last frame (canvas, gauges,
    summary, ...) as the server recorded it (``EngineSlot.keep_last``), so that they all read
    one final state. Stop cancels the event: the run's own final frame may never reach the
    page, and frames sent before the cancel can land after Stop. A newer run of the same
    session is left alone."""
    def settle(request: gr.Request) -> list[Any]:
        session = session_of(request)
        draw = None if slot.running(session) else slot.last_frame(session, tab)
        return list(draw()) if draw is not None else [gr.skip()] * outputs
    return settle


def wire_stop_gauges(slot: EngineSlot, stop: gr.Button, event: Any, gauges: Any,
                     outputs: list[Any], tab: str) -> None:
    """Stop for a tab with gauges: cancel ``event`` and abort its request, say "stopped" at
    once; once the event has ended, draw ``outputs`` (gauges among them) from the run's
    last recorded state."""
    stop.click(make_stop(slot), None, None, cancels=[event], queue=False,
               api_visibility="private")
    stop.click(None, gauges, gauges, js=STOP_JS, queue=False, api_visibility="private",
               show_progress="hidden")
    event.then(make_settle(slot, tab, len(outputs)), None, outputs, queue=False,
               api_visibility="private", show_progress="hidden")


def write_trajectory(traj: Trajectory) -> str:
    DOWNLOAD_DIR.mkdir(parents=True, exist_ok=True)
    path = DOWNLOAD_DIR / f"celeris-trajectory-{traj.request_id or 'run'}.json"
    path.write_text(json.dumps(traj.to_dict(), indent=1), encoding="utf-8")
    return str(path)


def after_run(data: dict[str, Any] | None) -> tuple[Any, ...]:
    """Charts, replay slider and download for the finished run."""
    if not data:
        return tuple(gr.skip() for _ in range(7))
    traj = Trajectory.from_dict(data)
    n = traj.num_steps
    return (gr.Slider(minimum=0, maximum=max(n, 1), value=n, step=1),
            render.replay_caption(traj, n), render.canvas_cells(traj, n),
            *(gr.Plot(value=fig, visible=True) for fig in (
                charts.commits_per_step(traj), charts.confidence_chart(traj),
                charts.unmask_heatmap(traj))),
            gr.DownloadButton(value=write_trajectory(traj), interactive=True))


REPLAY_IDLE = "Replay and charts show a run once it has finished."


def replay_at(data: dict[str, Any] | None, step: Any) -> tuple[Any, str, Any]:
    """The canvas and caption at ``step``, clamped to the run's steps (a typed value beyond
    them shows the last step and moves the slider there, instead of an error)."""
    if not data:
        return [], REPLAY_IDLE, gr.skip()
    traj = Trajectory.from_dict(data)
    try:
        wanted = float(step)
    except (TypeError, ValueError):
        wanted = traj.num_steps
    k = max(0, min(int(wanted) if wanted == wanted else 0, traj.num_steps))
    moved = gr.skip() if wanted == k else gr.Slider(value=k)
    return render.canvas_cells(traj, k), render.replay_caption(traj, k), moved


def clear_replay() -> tuple[Any, ...]:
    """A new run starts: the replay and charts of the last one go (so that after Stop they
    never show the run before as if it were this one)."""
    hidden = gr.Plot(value=None, visible=False)   # an emptied plot kept its old figure
    return (None, gr.Slider(minimum=0, maximum=1, value=0, step=1), REPLAY_IDLE, [], hidden,
            hidden, hidden, gr.DownloadButton(value=None, interactive=False))


def _replay_section() -> dict[str, Any]:
    """Replay right under the answer (open: a collapsed section at the page's foot went
    unseen); the charts of the same run below the whole row."""
    with gr.Accordion("Replay: step through the last run", open=True, elem_id="pg-replay"):
        out = {"scrub": gr.Slider(0, 1, value=0, step=1, label="replay: step",
                                  elem_id="pg-scrub"),
               "caption": gr.Markdown(REPLAY_IDLE, elem_id="pg-caption"),
               "canvas": widgets.canvas("pg-replay-canvas", "After a run, drag the slider "
                                        "to show any step again."),
               "download": gr.DownloadButton("Download trajectory (JSON)", interactive=False,
                                             elem_id="pg-download")}
    return out


def _charts_section(out: dict[str, Any]) -> None:
    with gr.Accordion("Charts of the last run", open=True, elem_id="pg-charts"):
        with gr.Row():
            out["commits"] = gr.Plot(label="tokens committed per step", elem_id="pg-commits")
            out["conf"] = gr.Plot(label="confidence", elem_id="pg-confidence")
        out["heat"] = gr.Plot(label="unmask order", elem_id="pg-heatmap")


def _prompt_column() -> dict[str, Any]:
    prompts = [(e["prompt"], e.get("chat", True)) for e in examples("playground")]
    first = prompts[0] if prompts else ("", True)
    parts = {"prompt": gr.Textbox(first[0], lines=3, label="prompt", elem_id="pg-prompt"),
          "as_chat": gr.Checkbox(first[1], label="chat message", elem_id="pg-chat",
                                 info="wrap the prompt in the model's chat template")}
    parts["unknown"] = world.notice_box("pg-unknown")
    parts["mode"], parts["spec"] = structured.create_control("pg")
    with gr.Row():
        parts["run"] = gr.Button("Generate", variant="primary", elem_id="pg-generate")
        parts["stop"] = gr.Button("Stop", variant="stop", elem_id="pg-stop")
    parts["canvas"] = widgets.canvas("pg-canvas")
    widgets.legend(structured=True)
    parts["gauges"] = widgets.gauges("pg-gauges")
    parts["answer"] = gr.Textbox(label="answer (committed prefix)", lines=3, interactive=False,
                              elem_id="pg-answer")
    parts["summary"] = gr.Markdown(elem_id="pg-summary")
    parts["replay"] = _replay_section()
    if prompts:
        gr.Examples([list(p) for p in prompts], [parts["prompt"], parts["as_chat"]],
                    label="example prompts", elem_id="pg-examples")
    return parts


def caption(view: Any) -> str:
    """What each preset is on ``view``'s model (the slot's default, or a session's)."""
    engine = view.engine
    return preset_caption(view.block_size(),
                          engine.default_params() if engine is not None else None)


def controls_for(view: Any, prompt: Any, as_chat: Any) -> list[Any]:
    """The preset radio and the controls (FIELDS order, seed kept) showing the defaults of
    ``view``'s model, with its ranges: after a browser tab picked another model."""
    defaults = view.engine.default_params() if view.engine else GenerationParams()
    size = view.block_size()
    gen = bounds.gen_bounds(view, bounds.prompt_message(prompt, as_chat))
    v = widget_values(defaults)
    gen_length = min(v["gen_length"], gen.hi)
    block = limits.fit_block(v["block_length"], gen_length, size)
    return [gr.Radio(value=DEFAULT_PRESET, info=caption(view)),
            gr.Slider(minimum=0, maximum=gen_length, step=limits.steps_stride(gen_length, block),
                      value=limits.fit_steps(v["steps"], gen_length, block)),
            v["temperature"],
            gr.Slider(minimum=gen.lo, maximum=gen.hi, value=gen_length,
                      info=widgets.gen_info(gen)),
            gr.Dropdown(choices=limits.block_choices(gen_length, size), value=block,
                        info=widgets.block_info(size)),
            v["threshold"], v["decoding"], v["remasking"], v["cache"], gr.skip()]


def create_ui(slot: EngineSlot) -> Follow:
    defaults = slot.engine.default_params() if slot.engine else GenerationParams()
    with gr.Tab("Playground", id="playground") as tab:
        with gr.Row(elem_id="pg-row"):
            with gr.Column(scale=3, elem_id="pg-main"):
                parts = _prompt_column()
            with gr.Column(scale=2, elem_id="pg-settings"):
                preset = widgets.preset_radio("pg-preset", caption(slot))
                controls = widgets.generation_controls(defaults, "pg",
                                                       bounds.gen_bounds(slot, None),
                                                       slot.block_size())
        traj_state = gr.State(None)
        replay = parts.pop("replay")
        _charts_section(replay)
    _wire(slot, parts, preset, controls, traj_state, replay)
    bounds.wire_controls(slot, parts["prompt"], parts["as_chat"], controls)
    # the demo world (shipped celeris models only): builder and unknown-word notice
    with tab:
        builder = world.create_builder(slot, parts["prompt"], parts["as_chat"])

    def check_words(text: Any, chat: Any, request: gr.Request) -> str:
        return world.notice(slot.session(request), text)

    parts["prompt"].change(check_words, [parts["prompt"], parts["as_chat"]], parts["unknown"],
                           queue=False, api_visibility="private", show_progress="hidden")

    def fit_gen(text: Any, chat: Any, value: Any, request: gr.Request) -> Any:
        view = slot.session(request)
        return bounds.gen_slider(bounds.gen_bounds(view, bounds.prompt_message(text, chat)),
                                 value)

    def fit_block(gen: Any, block: Any, request: gr.Request) -> Any:
        size = slot.session(request).block_size()
        return bounds.block_dropdown(gen, block, size, widgets.block_info(size))

    tab.select(fit_gen, [parts["prompt"], parts["as_chat"], controls[2]], controls[2],
               **bounds.QUIET)
    tab.select(fit_block, [controls[2], controls[3]], controls[3], **bounds.QUIET)
    return Follow([parts["prompt"], parts["as_chat"]], [preset, *controls, builder],
                  lambda view, *inputs: [*controls_for(view, *inputs),
                                         gr.Accordion(visible=world.applies(view))])


def _wire(slot: EngineSlot, parts: dict[str, Any], preset: gr.Radio, controls: list[Any],
          traj_state: gr.State, replay: dict[str, Any]) -> None:
    charts = [replay[k] for k in ("scrub", "caption", "canvas", "commits", "conf", "heat",
                                  "download")]
    parts["run"].click(clear_replay, None, [traj_state, *charts], queue=False,
                       api_visibility="private", show_progress="hidden")
    event = parts["run"].click(
        make_generate(slot), [parts["prompt"], parts["as_chat"], *controls, parts["mode"],
                              parts["spec"]],
        [parts["canvas"], parts["answer"], parts["gauges"], parts["summary"], traj_state],
        api_name="generate", concurrency_id="engine", concurrency_limit=slot.concurrency,
        show_progress="hidden")
    event.then(after_run, traj_state, charts, api_visibility="private", show_progress="hidden")
    wire_stop_gauges(slot, parts["stop"], event, parts["gauges"],
                     [parts[k] for k in ("canvas", "answer", "gauges", "summary")], TAB)
    preset.input(make_preset(slot), [preset, controls[2]], controls[:-1],
                 api_visibility="private", queue=False)
    replay["scrub"].change(replay_at, [traj_state, replay["scrub"]],
                           [replay["canvas"], replay["caption"], replay["scrub"]],
                           api_visibility="private", show_progress="hidden", queue=False,
                           preprocess=False)
