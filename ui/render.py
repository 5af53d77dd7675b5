"""Pure render helpers: everything the UI shows, computed without Gradio or a browser.

The canvas and gauge components are ``gr.HTML`` templates over plain lists/dicts (see
ui/widgets.py), so a streaming update sends only the cells that changed. Gradio renders those
templates with Handlebars and then evaluates the result as a JavaScript template literal, so
user text is escaped here for both: HTML metacharacters and ``$ ` \\ { }``.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Sequence

from .trajectory import (DRAFT, FRAGMENT, MASK, NEW, OLD, PINNED, SKIPPED, Decode,
                         Trajectory)

MASK_GLYPH = "\u2591\u2591"      # light shade: a position still masked
END_GLYPH = "\u2205"             # empty set: an end-of-text / special token
SKIP_GLYPH = "\u00b7"            # middle dot: never needed (the run ended before it)
_TEMPLATE_ESCAPES = {"$": "&#36;", "`": "&#96;", "\\": "&#92;", "{": "&#123;", "}": "&#125;"}


# ---------------------------------------------------------------------- escaping
def escape_text(text: str) -> str:
    """User or model text -> safe inside an HTML template (tags, entities and template
    syntax all shown literally)."""
    out = html.escape(str(text), quote=True)
    return "".join(_TEMPLATE_ESCAPES.get(ch, ch) for ch in out)


def error_markdown(why: str) -> str:
    """A refused run's reason for a Markdown line (tags shown as text, quotes kept)."""
    return f"**error** · {html.escape(str(why), quote=False)}"


def token_label(text: str) -> str:
    """How one token reads on the canvas: whitespace made visible, then escaped."""
    return escape_text(visible(text))


def visible(text: str) -> str:
    """A token's text with newlines, tabs and end of text made visible (not escaped)."""
    if text == "":
        return END_GLYPH
    return text.replace("\n", "\u21b5").replace("\t", "\u21e5")


def edit_note(was: Sequence[str], text: str) -> str:
    """The hover of an edited token: 'edited: "old" -> "new"' (every replaced text in
    order). Plain text: the canvas sets it as the cell's title, never as HTML."""
    return "edited: " + " -> ".join(f'"{visible(t)}"' for t in (*was, text))


# ---------------------------------------------------------------------- the canvas
def confidence_level(conf: float | None) -> float:
    """Map a confidence onto [0, 1] for drawing. Probabilities and margins already lie there;
    negative entropies (<= 0) go through exp(); anything non-finite counts as sure."""
    if conf is None or not math.isfinite(conf):
        return 1.0
    if conf < 0:
        return math.exp(conf)
    return min(conf, 1.0)


CELL_FIELDS = ("k", "b", "o", "h", "t")
FORCED_NOTE = "written by the grammar (no forward chose it)"
FRONTIER_NOTE = "frontier: the grammar's token mask applies here next"


def cell(kind: str, text: str, conf: float | None, pos: int, block_length: int,
         active_block: int | None, block: int | None = None, start: bool | None = None,
         was: Sequence[str] = (), forced: bool = False, frontier: bool = False) -> str:
    """One canvas cell as a tab-separated string (kind classes, block classes, opacity, hover,
    label). Strings, not dicts: the browser keeps each update's value in reactive state, and
    plain strings cost a fraction of objects there. The label is escaped and has no tabs; the
    hover is plain text without tabs (set as the title). ``block``/``start`` (the cell's
    block and whether it opens it) default to blocks of ``block_length``; a block-causal run
    passes its model's blocks. ``was``: the texts token editing replaced (class ``edit``); a
    DRAFT cell shows a token the sampler has not accepted yet. Structured output:
    ``forced`` marks a committed token the grammar wrote (class ``forced``), ``frontier``
    the masked position its token mask applies to next (class ``front``)."""
    if block is None:
        block = pos // max(block_length, 1)
    if start is None:
        start = pos % max(block_length, 1) == 0
    b = f"b{block % 2}" + (" bs" if start else "")
    if active_block is not None and block == active_block:
        b += " act"
    label = {MASK: MASK_GLYPH, SKIPPED: SKIP_GLYPH}.get(kind) or token_label(text)
    k = kind + (" end" if kind in (NEW, OLD, PINNED, DRAFT) and text == "" else "")
    if text == FRAGMENT:    # part of a character: the next cell shows it whole
        label, k = "", kind + " frag"
    level = confidence_level(conf) if kind in (NEW, OLD) else 1.0
    hover = f"position {pos}, block {block}"
    if conf is not None and kind in (NEW, OLD):
        hover += f", confidence {conf:.3f}"
    if was and kind in (NEW, OLD):
        k += " edit"
        hover += ", " + edit_note(was, text)
    if kind == DRAFT:
        hover += f", draft (not accepted yet): \"{visible(text)}\""
    if forced and kind in (NEW, OLD):
        k += " forced"
        hover += ", " + FORCED_NOTE
    if frontier and kind == MASK:
        k += " front"
        hover += ", " + FRONTIER_NOTE
    return "\t".join((k, b, f"{0.3 + 0.7 * level:.2f}", hover, label))


def parse_cell(value: str) -> dict[str, str]:
    """A cell string back into its fields (k, b, o, h, t)."""
    return dict(zip(CELL_FIELDS, value.split("\t", len(CELL_FIELDS) - 1)))


LEAD_HOVER = "pinned: the text before the first [MASK] (the prompt)"


def lead_cell(text: str) -> str:
    """A pinned cell of the text in front of the canvas (``Trajectory.lead``): no block."""
    k, label = (f"{PINNED} lead frag", "") if text == FRAGMENT else (f"{PINNED} lead",
                                                                     token_label(text))
    return "\t".join((k, "", "1.00", LEAD_HOVER, label))


def canvas_cells(traj: Trajectory, step: int | None = None, live: bool = False
                 ) -> list[str]:
    """The canvas after ``step`` (None = the latest), after the pinned text in front of it
    (an infill's prompt). ``live`` highlights the active block. Pinned special tokens (an
    infill's end-of-text padding) are left out: they are not part of the text."""
    record = traj.record_at(traj.num_steps if step is None else step)
    active = record.block if (live and record and not traj.finished) else None
    states = traj.cells_at(step)
    forced = traj.forced_at(step)
    front = frontier(states) if traj.structured else None
    return [lead_cell(text) for text in traj.lead] + [
        cell(kind, text, conf, pos, traj.block_length, active, traj.block_of(pos),
             traj.starts_block(pos), was, pos in forced, pos == front)
        for pos, (kind, text, conf, was) in enumerate(states)
        if not (kind == PINNED and text == "")]


def frontier(states: Sequence[tuple[Any, ...]]) -> int | None:
    """The leftmost masked position of a canvas (``Trajectory.cells_at``): under a grammar,
    the one the next step constrains and always commits. None when nothing is masked."""
    return next((pos for pos, state in enumerate(states) if state[0] == MASK), None)


def masked_cells(gen_length: int, block_length: int, structured: bool = False
                 ) -> list[str]:
    """The canvas before the first step: every position masked (under a grammar,
    ``structured``, the first one is the frontier)."""
    return [cell(MASK, "", None, pos, block_length, 0, frontier=structured and pos == 0)
            for pos in range(gen_length)]


def canvas_text(traj: Trajectory, step: int | None = None) -> str:
    """The canvas as plain text: pinned and committed tokens, masks (and drafts, not accepted
    yet) as a shade glyph."""
    return "".join(MASK_GLYPH if kind in (MASK, DRAFT) else text.replace(FRAGMENT, "")
                   for kind, text, _ in traj.state_at(step) if kind != SKIPPED)


def spans_text(traj: Trajectory, decode: Decode) -> str:
    """The canvas as text, every run of known tokens decoded together (so characters split
    over byte-level tokens come out whole); masks as a shade glyph, nothing once finished."""
    out: list[str] = []
    run: list[int] = []
    for tok in traj.canvas_ids():
        if tok is not None:
            run.append(tok)
            continue
        if run:
            out.append(decode(run))
            run = []
        out.append("" if traj.finished else MASK_GLYPH)
    if run:
        out.append(decode(run))
    return "".join(out)


def canvas_summary(cells: Iterable[str]) -> dict[str, int]:
    """Counts of each kind of cell."""
    counts = {MASK: 0, NEW: 0, OLD: 0, PINNED: 0, SKIPPED: 0}
    for c in cells:
        kind = c.split(None, 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


# ---------------------------------------------------------------------- gauges
def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def memory_gauge(info: dict[str, Any] | None) -> tuple[str, str]:
    """(value, label): GPU memory on CUDA, process RSS on CPU, labelled which."""
    if not info or "memory_bytes" not in info:
        return "-", "memory"
    kind = "GPU memory" if info.get("memory_kind") == "gpu" else "RSS (CPU)"
    return format_bytes(info["memory_bytes"]), kind


def gauges(tokens: int = 0, nfe: int = 0, elapsed: float = 0.0,
           info: dict[str, Any] | None = None, state: str = "idle",
           tokens_per_s: float | None = None, unit: str = "tokens") -> dict[str, str]:
    """Gauge tiles: tokens/s, tokens per forward, NFE, elapsed, memory (strings, diffable).

    tokens_per_s overrides tokens/elapsed with the engine's own figure once a run is done.
    ``unit`` names what was counted (the tiles' labels say it).
    """
    tps = tokens_per_s if tokens_per_s is not None else (tokens / elapsed if elapsed > 0 else 0.0)
    mem, mem_label = memory_gauge(info)
    return {"tps": f"{tps:.1f}", "tpf": f"{tokens / nfe:.2f}" if nfe else "0.00",
            "nfe": str(nfe), "elapsed": f"{elapsed:.2f} s", "mem": mem, "mem_label": mem_label,
            "state": state, "tps_label": f"{unit}/s", "tpf_label": f"{unit} / forward"}


def error_gauges(info: dict[str, Any] | None = None) -> dict[str, str]:
    return gauges(info=info, state="error")


def trajectory_gauges(traj: Trajectory, info: dict[str, Any] | None, state: str
                      ) -> dict[str, str]:
    """Tokens per second, under the same label live and once done. Finished: generated
    tokens before the first EOS per second of the request (for an infill: the filled
    positions only, never the pinned text). Live: the text tokens committed so far (end of
    text and padding left out), wherever they lie on the canvas."""
    if traj.result is not None:
        r = traj.result
        if traj.pinned:
            return gauges(traj.filled_tokens(), r["nfe"], r["elapsed_s"], info, state)
        return gauges(r["usage"]["completion_tokens"], r["nfe"], r["elapsed_s"], info, state,
                      tokens_per_s=r["tokens_per_s"])
    last = traj.steps[-1] if traj.steps else None
    return gauges(traj.filled_tokens(), last.nfe if last else 0,
                  last.elapsed if last else 0.0, info, state)


# ---------------------------------------------------------------------- small text blocks
def run_summary(traj: Trajectory) -> str:
    """One Markdown line under the canvas after a run."""
    r = traj.result
    if r is None:
        return ""
    edits = sum(len(rec.edited) for rec in traj.steps)
    edited = f" · {edits} token{'s' if edits != 1 else ''} edited" if edits else ""
    forced = traj.forced_count()
    if forced:
        edited += f" · {forced} written by the grammar"
    return (f"**{r['finish_reason']}** · {r['usage']['completion_tokens']} tokens in "
            f"{r['steps']} steps{edited} · NFE {r['nfe']} · {r['tokens_per_forward']:.2f} "
            f"tokens/forward · {r['tokens_per_s']:.1f} tokens/s · seed {r['seed']}")


def stopped_summary(traj: Trajectory) -> str:
    """The line under a run stopped before its result came: the figures its gauges show
    (text tokens committed so far, the NFE and time of the last step recorded)."""
    last = traj.steps[-1] if traj.steps else None
    tokens, nfe = traj.filled_tokens(), (last.nfe if last else 0)
    shown = gauges(tokens, nfe, last.elapsed if last else 0.0)
    return (f"**stopped** · {tokens} tokens in {traj.num_steps} steps · NFE {nfe} · "
            f"{shown['tpf']} tokens/forward · {shown['tps']} tokens/s")


def empty_answer_hint(as_chat: bool) -> str:
    """Why a finished run wrote nothing, and what to try (never a silent empty answer)."""
    why = ("**Nothing was generated**: the model ended its answer at once (end of text was "
           "its first token).")
    if as_chat:
        return (f"{why} A chat message asks for an answer; to continue a text such as "
                "\"Once upon a time\", untick **chat message**.")
    return f"{why} Try a longer prompt, or tick **chat message** to ask a question."


def replay_caption(traj: Trajectory, step: int) -> str:
    rec = traj.record_at(step)
    if step <= 0 or rec is None:
        return f"step 0 of {traj.num_steps}: every position masked"
    fresh = len(rec.committed) if rec.step == step else 0
    edits = traj.edits_at(step)
    edited = f" ({edits} of them edited)" if edits else ""
    drafts = f" · {len(rec.draft)} draft tokens" if rec.step == step and rec.draft else ""
    if rec.step == step and rec.forced:
        drafts += f" · {len(rec.forced)} written by the grammar"
    return (f"step {step} of {traj.num_steps} · block {rec.block} · {fresh} committed this "
            f"step{edited}{drafts} · NFE {rec.nfe} · {rec.elapsed:.2f} s")


def weights_line(info: dict[str, Any]) -> str:
    """The weights' bytes and width: "23.0 MB, full width", "7.5 MB, int8" or a pre-quantized
    checkpoint's format."""
    quant = info.get("quantization") or {}
    width = info.get("quantize") or quant.get("prequantized") or "full width"
    return f"{format_bytes(info['weight_bytes'])}, {width}"


def model_markdown(info: dict[str, Any] | None, error: str | None = None) -> str:
    """The Model tab's description of the loaded model."""
    if not info:
        return f"**No model loaded.** {escape_text(error or '')}"
    mem, label = memory_gauge(info)
    rows = [("name", info.get("model")), ("path", info.get("path")),
            ("family", info.get("family")), ("architecture", info.get("architecture")),
            ("parameters", f"{info.get('parameters', 0) / 1e6:.2f} M"),
            ("dtype", info.get("dtype")), ("device", info.get("device")),
            ("context length", info.get("context_length")), (label, mem)]
    if info.get("weight_bytes") is not None:     # quantized: int data + scales, real storage
        rows.insert(rows.index(("dtype", info.get("dtype"))) + 1, ("weights", weights_line(info)))
    if info.get("attention") == "block_causal":
        rows.insert(4, ("attention", f"block-causal (block diffusion), blocks of "
                                     f"{info.get('block_size')}"))
    elif info.get("attention"):
        rows.insert(4, ("attention", "full (one answer canvas)"))
    lines = ["| property | value |", "|---|---|"] + [f"| {k} | `{v}` |" for k, v in rows]
    defaults = info.get("defaults") or {}
    if defaults:
        shown = ", ".join(f"{k}={v}" for k, v in defaults.items() if v not in (None, [], ()))
        lines += ["", f"**Generation defaults:** `{shown}`"]
    return "\n".join(lines)


def plain_messages(history: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Gradio 6 chat history -> [{role, content: str}] (content may be a list of blocks)."""
    out = []
    for msg in history:
        content = msg.get("content")
        if isinstance(content, (list, tuple)):
            content = "".join(b.get("text", "") if isinstance(b, dict) else str(b)
                              for b in content)
        elif isinstance(content, dict):
            content = content.get("text", "")
        out.append({"role": msg.get("role", "user"), "content": str(content or "")})
    return out
