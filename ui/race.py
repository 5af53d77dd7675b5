"""Race tab: one prompt, three runs side by side with live tokens/s and NFE.

1. the reference sampler (fixed linear schedule, one token per step, no cache);
2. the fast configuration (threshold decoding + prefix KV cache);
3. the autoregressive twin trained on the same data (``celeris.ARBaseline``, transformers'
   ``generate()`` with its KV cache), when it is installed.

The runs go one after another, so no run slows another down on a shared machine; each column
animates while its run is live and its numbers are that run's own wall-clock figures.
"""

from __future__ import annotations

from typing import Any, Iterator

import gradio as gr

from celeris.params import GenerationParams

from . import bounds, limits, render, widgets
from .context import EngineSlot, follow, session_of, user_errors, with_error_frame
from .examples import examples
from .playground import prompt_input
from .trajectory import Trajectory

STATS_TEMPLATE = (
    '<div class="race-stats" data-state="{{value.state}}">'
    '<div class="gauge" data-g="tps"><b>{{value.tps}}</b><span>{{value.tps_label}}</span></div>'
    '<div class="gauge" data-g="nfe"><b>{{value.nfe}}</b><span>NFE</span></div>'
    '<div class="gauge" data-g="elapsed"><b>{{value.elapsed}}</b>'
    '<span>elapsed · {{value.state}}</span>'
    '</div></div>')
TEXT_TEMPLATE = '<div class="race-text">{{{value}}}</div>'
STOPPED = "Stopped."
COLUMNS = (("ref", "Reference sampler", "decoding fixed · one token per step · no cache"),
           ("fast", "Fast configuration", "threshold decoding · prefix KV cache"),
           ("ar", "Autoregressive twin", "same data, transformers generate() + KV cache"))


def race_params(base: GenerationParams, gen_length: int, block_length: int,
                threshold: float) -> tuple[GenerationParams, GenerationParams]:
    """(reference, fast) settings over the model's defaults."""
    with user_errors():
        common = dict(gen_length=int(float(gen_length)), block_length=int(float(block_length)),
                      steps=None)
        ref = base.replace(decoding="fixed", cache="none", **common)
        fast = base.replace(decoding="threshold", threshold=float(threshold), cache="prefix",
                            **common)
    return ref, fast


def stats(tokens: int = 0, nfe: int = 0, elapsed: float = 0.0, state: str = "waiting",
          unit: str = "tokens") -> dict[str, str]:
    tps = tokens / elapsed if elapsed > 0 else 0.0
    return {"tps": f"{tps:.1f}", "nfe": str(nfe), "elapsed": f"{elapsed:.2f} s",
            "state": state, "tokens": str(tokens), "tps_label": f"{unit}/s"}


def stopped(column: dict[str, str] | None) -> dict[str, str]:
    """A column after Stop: a run that had not finished says "stopped"."""
    out = dict(column or stats())
    if out.get("state") in ("waiting", "running"):
        out["state"] = "stopped"
    return out


def traj_stats(traj: Trajectory) -> dict[str, str]:
    if traj.result is not None:
        r = traj.result
        done = "stopped" if r["finish_reason"] == "abort" else "done"
        out = stats(r["usage"]["completion_tokens"], r["nfe"], r["elapsed_s"], done)
        out["tps"] = f"{r['tokens_per_s']:.1f}"
        return out
    last = traj.steps[-1] if traj.steps else None   # live: positions committed so far
    return stats(len(traj.commit_steps()), last.nfe if last else 0,
                 last.elapsed if last else 0.0, "running", unit="positions")


def race_summary(results: dict[str, dict[str, str]]) -> str:
    """Ratios of the finished runs against the reference (tokens/s and forwards)."""
    ref = results.get("ref")
    if not ref or float(ref["tps"]) <= 0:
        return ""
    lines = []
    for key, name in (("fast", "fast"), ("ar", "autoregressive")):
        other = results.get(key)
        if not other or other.get("state") != "done":
            continue
        speed = float(other["tps"]) / float(ref["tps"])
        lines.append(f"**{name}**: {speed:.2f}x the reference's tokens/s "
                     f"(NFE {other['nfe']} vs {ref['nfe']})")
    return " · ".join(lines)


def make_race_stop(slot: EngineSlot):
    """Stop: abort the running request and mark every unfinished column "stopped" (the
    cancelled race sends no further update of its own)."""
    def stop(ref: dict, fast: dict, ar: dict, request: gr.Request) -> list[Any]:
        slot.abort(session_of(request))
        return [stopped(ref), stopped(fast), stopped(ar), STOPPED]
    return stop


def make_race(slot: EngineSlot):
    @slot.gpu
    def race(prompt: str, as_chat: bool, gen_length: float, block_length: float,
             threshold: float, request: gr.Request) -> Iterator[list[Any]]:
        """Run reference, fast and autoregressive one after another; yields 7 outputs."""
        run = _race(slot, prompt, as_chat, gen_length, block_length, threshold, request)
        yield from with_error_frame(run, error_columns)
    return race


def error_columns(why: str) -> list[Any]:
    return [[], stats(state="error"), [], stats(state="error"), "", stats(state="error"),
            render.error_markdown(why)]


def _race(slot: EngineSlot, prompt: str, as_chat: bool, gen_length: float,
          block_length: float, threshold: float, request: gr.Request) -> Iterator[list[Any]]:
    engine = slot.require()
    message = prompt_input(prompt, as_chat)
    ref, fast = race_params(engine.default_params(), gen_length, block_length, threshold)
    results: dict[str, dict[str, str]] = {}
    latest = [[], stats(), [], stats(), "", stats(), "Racing..."]   # resent whole: the
    yield list(latest)                                                # diff is tiny
    for i, params in enumerate((ref, fast)):
        traj = Trajectory(params.gen_length, params.block_length, params=params.to_dict())
        start = lambda rid, p=params: engine.stream(message, p, request_id=rid)  # noqa
        for traj in follow(slot, session_of(request), engine, start, traj):
            latest[2 * i:2 * i + 2] = [render.canvas_cells(traj, live=True), traj_stats(traj)]
            yield list(latest)
        if traj.result and traj.result["finish_reason"] == "abort":   # Stop: end the race
            latest[1:6:2] = [stopped(c) for c in latest[1:6:2]]
            latest[6] = STOPPED
            yield list(latest)
            return
        results[COLUMNS[i][0]] = traj_stats(traj)
    for text, st in run_ar(slot, message, int(gen_length)):
        latest[4:6] = [text, st]
        yield list(latest)
        results["ar"] = st
    latest[6] = race_summary(results) or "Done."
    yield list(latest)


def run_ar(slot: EngineSlot, message: Any, max_new_tokens: int) -> Iterator[tuple[str, dict]]:
    """Stream the autoregressive twin: (escaped text html, stats) per update."""
    ar, why = slot.ar_baseline()
    if ar is None:
        yield (f'<span class="race-unavailable">Unavailable: {render.escape_text(why)}</span>',
               stats(state="unavailable"))
        return
    try:
        for item in ar.stream(message, max_new_tokens):
            tokens, elapsed = int(item.get("tokens", 0)), float(item.get("elapsed", 0.0))
            state = "done" if item.get("done") else "running"
            yield render.escape_text(item.get("text", "")), stats(tokens, tokens, elapsed, state)
    except Exception as exc:   # the twin failing must not break the other two columns
        yield (f'<span class="race-unavailable">Failed: {render.escape_text(str(exc))}</span>',
               stats(state="failed"))


def _column(key: str, title: str, note: str) -> list[gr.HTML]:
    with gr.Column(elem_classes=["race-col"], elem_id=f"race-{key}"):
        gr.Markdown(f"### {title}\n<span class='race-note'>{note}</span>")
        if key == "ar":
            body = gr.HTML("", html_template=TEXT_TEMPLATE, js_on_load=None,
                           apply_default_css=False, elem_id=f"race-{key}-text")
        else:
            body = widgets.canvas(f"race-{key}-canvas", "Waiting for the race.")
        stat = gr.HTML(stats(), html_template=STATS_TEMPLATE, js_on_load=None,
                       apply_default_css=False, elem_id=f"race-{key}-stats")
    return [body, stat]


def create_ui(slot: EngineSlot) -> None:
    base = slot.engine.default_params() if slot.engine else GenerationParams()
    with gr.Tab("Race", id="race"):
        gr.Markdown("One prompt, three samplers. Runs go one after another so that no run "
                    "slows another; every figure is that run's own wall-clock time.")
        with gr.Row():
            prompt = gr.Textbox(examples("race") or "", label="prompt", scale=4,
                                elem_id="race-prompt")
            as_chat = gr.Checkbox(True, label="chat message", scale=1)
        with gr.Row():
            gen = bounds.gen_bounds(slot, None)   # the prompt's share: on load (ui/bounds)
            gen_length = gr.Slider(gen.lo, gen.hi, value=min(base.gen_length, gen.hi),
                                   step=limits.GEN_MIN, label="gen length",
                                   info=widgets.gen_info(gen), elem_id="race-gen-length")
            block_length = gr.Dropdown(
                limits.block_choices(gen_length.value),
                value=limits.fit_block(base.block_length, gen_length.value),
                label="block length", info="divides gen length", allow_custom_value=True,
                elem_id="race-block-length")
            threshold = gr.Slider(0.05, 1.0, value=base.threshold, step=0.01,
                                  label="fast: threshold", elem_id="race-threshold")
        with gr.Row():
            go = gr.Button("Race", variant="primary", elem_id="race-go")
            stop = gr.Button("Stop", variant="stop", elem_id="race-stop")
        with gr.Row(equal_height=False):
            outputs = [c for key, title, note in COLUMNS for c in _column(key, title, note)]
        summary = gr.Markdown(elem_id="race-summary")
    event = go.click(make_race(slot), [prompt, as_chat, gen_length, block_length, threshold],
                     outputs + [summary], api_name="race", concurrency_id="engine",
                     concurrency_limit=slot.concurrency,
                     show_progress="hidden")
    stop.click(make_race_stop(slot), outputs[1::2], outputs[1::2] + [summary],
               cancels=[event], queue=False, api_visibility="private")
    bounds.wire_gen_length(slot, prompt, as_chat, gen_length)
    bounds.warn_out_of_range(threshold, "threshold")
    gen_length.change(bounds.block_dropdown, [gen_length, block_length], block_length,
                      **bounds.QUIET)
