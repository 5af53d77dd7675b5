"""Race tab: one prompt, three runs side by side with live tokens/s and NFE.

1. "main": the loaded model at its default settings. A block-diffusion (block-causal) model
   runs its own defaults (threshold decoding, exact KV cache, the block size of its config)
   with the tab's threshold; a full-attention model runs its fast configuration (threshold
   decoding + prefix KV cache).
2. "canvas": next to a block-diffusion model, the full-canvas (full-attention) model
   ``EngineSlot.canvas_path`` (models/celeris-tiny), loaded on first use, at its own
   settings (its generation config) with the tab's gen length and block length. Next to a
   full-attention model, the loaded model's reference sampler (fixed linear schedule, one
   token per step, no cache), so the tab still compares something after a switch in the
   Model tab.
3. "ar": the autoregressive twin trained on the same data (``celeris.ARBaseline``,
   transformers' ``generate()`` with its KV cache), when it is installed.

The column titles depend on the browser tab's model, so they are outputs: built from the
default model when the page is built, updated when the tab picks another and sent by every
race (the last three outputs of ``api_name="race"``; the first seven are unchanged). The runs
go one after another, so no run slows another down on a shared machine; each column animates
while its run is live and its numbers are that run's own wall-clock figures. The summary's two
ratios (main vs the twin, main vs the canvas column) follow one rule: tokens/s is already per
generated token, so runs whose answers differ in length still compare, and each ratio is given
with both runs' tokens and time (and says when the lengths differ); only an answer too short
to time (under MIN_TIMED_TOKENS tokens) gets no ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import gradio as gr

from celeris.params import GenerationParams

from . import bounds, limits, render, widgets
from .context import (EngineSlot, Follow, error_message, follow, paced, session_of,
                      user_errors, with_error_frame)
from .examples import examples
from .playground import prompt_input
from .settings import ADAPTIVE
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
KEYS = ("main", "canvas", "ar")
CANVAS_BLOCK = 32   # the block length first offered for the full-canvas column (its usual)
BLOCK_INFO = ("divides gen length; full-canvas runs only: a block-diffusion model keeps the "
              "block size of its config")


@dataclass(frozen=True)
class Column:
    key: str     # "main", "canvas" or "ar" (the elem_ids race-<key>-*)
    title: str   # what runs, e.g. "Block diffusion · celeris-tiny-bd"
    note: str    # how it runs
    label: str   # its name in the summary line


def is_block_causal(engine: Any) -> bool:
    return bool(getattr(engine, "block_causal", False))


def model_name(engine: Any) -> str:
    model_dir = getattr(engine, "model_dir", None)
    if model_dir is not None:
        return model_dir.name
    return str((engine.info() or {}).get("model", "the loaded model"))


def lineup(slot: Any, engine: Any) -> tuple[Column, Column, Column]:
    """The three columns for ``engine`` (the slot's UI engine): what each one runs."""
    ar = Column("ar", f"Autoregressive twin · {slot.ar_path.name}",
                "same data · transformers generate() + KV cache · one token per forward",
                "autoregressive")
    if engine is None:
        return (Column("main", "Loaded model", "no model loaded: see the Model tab", "main"),
                Column("canvas", "Full canvas", "no model loaded", "canvas"), ar)
    name = model_name(engine)
    if is_block_causal(engine):
        base = engine.default_params()
        cache = "no cache" if base.cache == "none" else "exact KV cache"
        main = Column("main", f"Block diffusion · {name}",
                      f"its defaults: threshold decoding · {cache} · blocks of "
                      f"{base.block_length} (from its config) · gen length is a cap",
                      "block diffusion")
        canvas = Column("canvas", f"Full canvas · {slot.canvas_path.name}",
                        "full attention at its own settings (its generation config) · the "
                        "same length cap · the tab's block length", "full canvas")
        return main, canvas, ar
    return (Column("main", f"Fast configuration · {name}",
                   "full attention: threshold decoding · prefix KV cache", "fast"),
            Column("canvas", f"Reference sampler · {name}",
                   "full attention: fixed schedule · one token per step · no cache",
                   "reference"),
            ar)


def header(column: Column) -> str:
    return (f"### {render.escape_text(column.title)}\n"
            f"<span class='race-note'>{render.escape_text(column.note)}</span>")


def headers(slot: Any) -> list[str]:
    """The column titles for ``slot``'s model (the EngineSlot's default, or a session's)."""
    return [header(c) for c in lineup(slot, slot.engine)]


def fast_params(base: GenerationParams, gen_length: int, block_length: int,
                threshold: float) -> GenerationParams:
    """A full-attention model's fast configuration: threshold decoding + prefix KV cache."""
    return base.replace(decoding="threshold", threshold=threshold, cache="prefix",
                        gen_length=gen_length, block_length=block_length, steps=None)


def race_params(base: GenerationParams, gen_length: Any, block_length: Any, threshold: Any,
                *, block_causal: bool = False, canvas_base: GenerationParams | None = None
                ) -> tuple[GenerationParams, GenerationParams | None]:
    """(main, canvas) settings. ``base`` is the loaded model's defaults.

    Block-causal: main = its own defaults with its threshold rule (plain, left-to-right
    "ltr" or SDAR's "dynamic"; threshold when its default is the fixed schedule), the tab's threshold and
    gen length (a cap), its block length and cache kept; canvas = the full-canvas model's
    own settings (``canvas_base``, its generation config; None when it is unavailable) with
    the same gen length and the tab's block length: at the fast configuration the shipped
    full-canvas model wrote the same broken 21 tokens for every prompt, which made the
    speed ratio meaningless. Full attention: main = the fast configuration, canvas = the
    reference sampler.
    """
    with user_errors():
        gen, block, thr = int(float(gen_length)), int(float(block_length)), float(threshold)
        if block_causal:
            rule = base.decoding if base.decoding in ADAPTIVE else "threshold"
            main = base.replace(decoding=rule, threshold=thr, gen_length=gen, steps=None)
            canvas = (None if canvas_base is None
                      else canvas_base.replace(gen_length=gen, block_length=block, steps=None))
            return main, canvas
        ref = base.replace(decoding="fixed", cache="none", gen_length=gen,
                           block_length=block, steps=None)
        return fast_params(base, gen, block, thr), ref


def stats(tokens: int = 0, nfe: int = 0, elapsed: float = 0.0, state: str = "waiting",
          finish: str = "") -> dict[str, str]:
    """One column's tiles (tokens/s live and once done: text tokens, never end of text),
    with the run's tokens, seconds and finish reason kept for the summary."""
    tps = tokens / elapsed if elapsed > 0 else 0.0
    return {"tps": f"{tps:.1f}", "nfe": str(nfe), "elapsed": f"{elapsed:.2f} s",
            "state": state, "tokens": str(tokens), "tps_label": "tokens/s",
            "seconds": f"{elapsed:.3f}", "finish": finish}


def stopped(column: dict[str, str] | None) -> dict[str, str]:
    """A column after Stop: a run that had not finished says "stopped"."""
    out = dict(column or stats())
    if out.get("state") in ("waiting", "running", "loading"):
        out["state"] = "stopped"
    return out


def traj_stats(traj: Trajectory) -> dict[str, str]:
    if traj.result is not None:
        r = traj.result
        done = "stopped" if r["finish_reason"] == "abort" else "done"
        out = stats(r["usage"]["completion_tokens"], r["nfe"], r["elapsed_s"], done,
                    r["finish_reason"])
        out["tps"] = f"{r['tokens_per_s']:.1f}"
        return out
    last = traj.steps[-1] if traj.steps else None   # live: text tokens committed so far
    return stats(traj.filled_tokens(), last.nfe if last else 0,
                 last.elapsed if last else 0.0, "running")


def notice_cells(text: str) -> list[str]:
    """A canvas column that did not run: one cell holding the reason (escaped)."""
    return [f"race-unavailable\t\t1\t\t{render.escape_text(text)}"]


MIN_TIMED_TOKENS = 16   # below this an answer is over before tokens/s means anything
LENGTHS_DIFFER = 1.5    # answers further apart than this get the lengths named in the ratio


def run_figures(r: dict[str, str]) -> str:
    return f"{r['tokens']} tokens in {float(r.get('seconds') or 0):.2f} s"


def not_comparable(a: dict[str, str], b: dict[str, str]) -> str | None:
    """Why runs ``a`` and ``b`` get no tokens/s ratio (None: they get one). The one rule of
    both ratios: tokens/s counts each run's own tokens, so any two answers long enough to
    time compare, whatever their lengths."""
    shortest = min(int(a["tokens"]), int(b["tokens"]))
    if shortest < MIN_TIMED_TOKENS:
        return (f"an answer of {shortest} tokens is too short to time (under "
                f"{MIN_TIMED_TOKENS})")
    return None


def length_note(a: dict[str, str], b: dict[str, str]) -> str:
    """Said beside a ratio of answers of quite different lengths (tokens/s is per token)."""
    ta, tb = int(a["tokens"]), int(b["tokens"])
    if max(ta, tb) <= LENGTHS_DIFFER * min(ta, tb):
        return ""
    return "; the answers differ in length, and tokens/s counts each run's own tokens"


def compare(main: dict[str, str], other: dict[str, str], names: tuple[str, str]) -> str:
    """``main`` vs ``other``: the tokens/s ratio with both runs' tokens and time, or why
    there is none (the same rule for every pair: ``not_comparable``)."""
    head = f"**{names[0]} vs {names[1]}**: "
    figures = f"{run_figures(main)} vs {run_figures(other)}"
    why = not_comparable(main, other)
    if why is not None or float(other["tps"]) <= 0:
        return head + f"no speed ratio: {why or 'no time measured'} ({figures})"
    speed = float(main["tps"]) / float(other["tps"])
    return (head + f"{speed:.2f}x the tokens/s ({figures}; NFE {main['nfe']} vs "
            f"{other['nfe']}{length_note(main, other)})")


def race_summary(results: dict[str, dict[str, str]],
                 labels: dict[str, str] | None = None) -> str:
    """The finished runs side by side: tokens/s of each with its tokens and time, then main
    vs the autoregressive twin and main vs the canvas column, both by one rule
    (``not_comparable``: a ratio unless an answer is too short to time; otherwise why not)."""
    names = {"main": "main", "canvas": "canvas", "ar": "autoregressive", **(labels or {})}
    done = {k: results[k] for k in KEYS if k in results and results[k].get("state") == "done"}
    if not done:
        return ""
    parts = ["**tokens/s**: " + " · ".join(
        f"{names[k]} {float(r['tps']):.1f} ({run_figures(r)})" for k, r in done.items())]
    main = done.get("main")
    for key in ("ar", "canvas"):
        if main is not None and key in done:
            parts.append(compare(main, done[key], (names["main"], names[key])))
    return "\n\n".join(parts)


def make_race_stop(slot: EngineSlot):
    """Stop: abort the running request and mark every unfinished column "stopped" (the
    cancelled race sends no further update of its own)."""
    def stop(main: dict, canvas: dict, ar: dict, request: gr.Request) -> list[Any]:
        slot.abort(session_of(request))
        return [stopped(main), stopped(canvas), stopped(ar), STOPPED]
    return stop


def make_race_settle(slot: EngineSlot):
    """After the race's event ended, however it ended: columns still "waiting", "running" or
    "loading" say "stopped" (frames sent before Stop's cancel completed can land after Stop's
    own update). A newer run of the same session is left alone."""
    def settle(main: dict, canvas: dict, ar: dict, request: gr.Request) -> list[Any]:
        columns = [main, canvas, ar]
        marked = [stopped(c) for c in columns]
        if slot.running(session_of(request)) or marked == columns:
            return [gr.skip()] * 4
        return [*marked, STOPPED]
    return settle


def make_race(slot: EngineSlot):
    @slot.gpu
    def race(prompt: str, as_chat: bool, gen_length: float, block_length: float,
             threshold: float, request: gr.Request) -> Iterator[list[Any]]:
        """Run main, canvas and autoregressive one after another; yields 10 outputs (each
        column's body and stats, the summary, then the three column headers)."""
        run = _race(slot.session(request), prompt, as_chat, gen_length, block_length,
                    threshold, request)
        yield from with_error_frame(run, error_columns)
    return race


def error_columns(why: str) -> list[Any]:
    return [[], stats(state="error"), [], stats(state="error"), "", stats(state="error"),
            render.error_markdown(why), gr.skip(), gr.skip(), gr.skip()]


def _race(slot: Any, prompt: str, as_chat: bool, gen_length: float,
          block_length: float, threshold: float, request: gr.Request) -> Iterator[list[Any]]:
    engine = slot.require()
    message = prompt_input(prompt, as_chat)
    columns = lineup(slot, engine)
    block_causal = is_block_causal(engine)
    main_p, _ = race_params(engine.default_params(), gen_length, block_length, threshold,
                            block_causal=block_causal)   # invalid settings: before anything
    loading = block_causal and not slot.canvas_loaded
    latest = [[], stats(), [], stats(state="loading" if loading else "waiting"), "", stats(),
              "Racing...", *[header(c) for c in columns]]   # resent whole: the diff is tiny
    yield list(latest)
    canvas_engine, why = (slot.canvas_model() if block_causal else (engine, ""))
    canvas_base = canvas_engine.default_params() if canvas_engine is not None else None
    main_p, canvas_p = race_params(engine.default_params(), gen_length, block_length,
                                   threshold, block_causal=block_causal,
                                   canvas_base=canvas_base)
    if loading:
        latest[3] = stats()
    results: dict[str, dict[str, str]] = {}
    runs = (("main", engine, main_p, ""), ("canvas", canvas_engine, canvas_p, why))
    for i, (key, run_engine, params, why) in enumerate(runs):
        if run_engine is None or params is None:
            latest[2 * i:2 * i + 2] = [notice_cells(f"Unavailable: {why}"),
                                       stats(state="unavailable")]
            yield list(latest)
            continue
        grows = is_block_causal(run_engine)   # its canvas grows block by block from empty
        traj = Trajectory(0 if grows else params.gen_length, params.block_length,
                          params=params.to_dict())
        start = lambda rid, e=run_engine, p=params: e.stream(message, p, request_id=rid)  # noqa
        try:
            for traj in follow(slot, session_of(request), run_engine, start, traj):
                latest[2 * i:2 * i + 2] = [render.canvas_cells(traj, live=True),
                                           traj_stats(traj)]
                yield list(latest)
        except gr.Error as exc:
            if key == "main":   # the loaded model refused: the race's own error frame
                raise
            # the second model refused (e.g. its context is shorter): say so in its column
            latest[2 * i:2 * i + 2] = [notice_cells(f"Failed: {error_message(exc)}"),
                                       stats(state="error")]
            yield list(latest)
            continue
        if traj.result and traj.result["finish_reason"] == "abort":   # Stop: end the race
            latest[1:6:2] = [stopped(c) for c in latest[1:6:2]]
            latest[6] = STOPPED
            yield list(latest)
            return
        results[key] = traj_stats(traj)
    for text, st in run_ar(slot, message, int(float(gen_length))):
        latest[4:6] = [text, st]
        yield list(latest)
        results["ar"] = st
    latest[6] = race_summary(results, {c.key: c.label for c in columns}) or "Done."
    yield list(latest)


def run_ar(slot: EngineSlot, message: Any, max_new_tokens: int) -> Iterator[tuple[str, dict]]:
    """Stream the autoregressive twin: (escaped text html, stats) per update."""
    ar, why = slot.ar_baseline()
    if ar is None:
        yield (f'<span class="race-unavailable">Unavailable: {render.escape_text(why)}</span>',
               stats(state="unavailable"))
        return
    try:
        frames = paced(ar.stream(message, max_new_tokens), slot.frame_interval,
                       final=lambda item: bool(item.get("done")),
                       cells=lambda item: int(item.get("tokens", 0)))
        for item in frames:
            tokens, elapsed = int(item.get("tokens", 0)), float(item.get("elapsed", 0.0))
            state = "done" if item.get("done") else "running"
            yield render.escape_text(item.get("text", "")), stats(
                tokens, tokens, elapsed, state, str(item.get("finish_reason") or ""))
    except Exception as exc:   # the twin failing must not break the other two columns
        yield (f'<span class="race-unavailable">Failed: {render.escape_text(str(exc))}</span>',
               stats(state="failed"))


def _column(column: Column) -> list[Any]:
    """[header, body, stats] of one column."""
    with gr.Column(elem_classes=["race-col"], elem_id=f"race-{column.key}"):
        head = gr.Markdown(header(column), elem_id=f"race-{column.key}-title")
        if column.key == "ar":
            body = gr.HTML("", html_template=TEXT_TEMPLATE, js_on_load=None,
                           apply_default_css=False, elem_id=f"race-{column.key}-text")
        else:
            body = widgets.canvas(f"race-{column.key}-canvas", "Waiting for the race.")
        stat = gr.HTML(stats(), html_template=STATS_TEMPLATE, js_on_load=None,
                       apply_default_css=False, elem_id=f"race-{column.key}-stats")
    return [head, body, stat]


def create_ui(slot: EngineSlot) -> Follow:
    engine = slot.engine
    base = engine.default_params() if engine else GenerationParams()
    block = CANVAS_BLOCK if is_block_causal(engine) else base.block_length
    with gr.Tab("Race", id="race"):
        gr.Markdown("One prompt, three runs: the loaded model at its default settings, a "
                    "full-canvas diffusion run (the full-attention model next to a "
                    "block-diffusion one; next to a full-attention one, its reference "
                    "sampler) and the autoregressive twin. Runs go one after another so that "
                    "no run slows another; every figure is that run's own wall-clock time.")
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
                value=limits.fit_block(block, gen_length.value),
                label="block length", info=BLOCK_INFO, allow_custom_value=True,
                elem_id="race-block-length")
            threshold = gr.Slider(0.05, 1.0, value=base.threshold, step=0.01,
                                  label="threshold",
                                  info="threshold decoding (not the reference sampler)",
                                  elem_id="race-threshold")
        with gr.Row():
            go = gr.Button("Race", variant="primary", elem_id="race-go")
            stop = gr.Button("Stop", variant="stop", elem_id="race-stop")
        with gr.Row(equal_height=False):
            parts = [_column(c) for c in lineup(slot, engine)]
        heads = [p[0] for p in parts]
        outputs = [c for p in parts for c in p[1:]]   # body, stats per column
        summary = gr.Markdown(elem_id="race-summary")
    event = go.click(make_race(slot), [prompt, as_chat, gen_length, block_length, threshold],
                     outputs + [summary] + heads, api_name="race", concurrency_id="engine",
                     concurrency_limit=slot.concurrency,
                     show_progress="hidden")
    stop.click(make_race_stop(slot), outputs[1::2], outputs[1::2] + [summary],
               cancels=[event], queue=False, api_visibility="private")
    event.then(make_race_settle(slot), outputs[1::2], outputs[1::2] + [summary], queue=False,
               api_visibility="private", show_progress="hidden")
    bounds.wire_gen_length(slot, prompt, as_chat, gen_length)
    bounds.warn_out_of_range(threshold, "threshold")
    gen_length.change(bounds.block_dropdown, [gen_length, block_length], block_length,
                      **bounds.QUIET)
    return Follow([prompt, as_chat], [*heads, gen_length, block_length, threshold],
                  follow_model)


def follow_model(view: Any, prompt: Any, as_chat: Any) -> list[Any]:
    """The column titles and settings for ``view``'s model (after a browser tab picked it)."""
    engine = view.engine
    base = engine.default_params() if engine else GenerationParams()
    gen = bounds.gen_bounds(view, bounds.prompt_message(prompt, as_chat))
    value = min(base.gen_length, gen.hi)
    block = CANVAS_BLOCK if is_block_causal(engine) else base.block_length
    return [*headers(view),
            gr.Slider(minimum=gen.lo, maximum=gen.hi, value=value, info=widgets.gen_info(gen)),
            gr.Dropdown(choices=limits.block_choices(value), value=limits.fit_block(block, value)),
            base.threshold]
