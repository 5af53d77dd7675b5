"""Components shared by several tabs: the token canvas, the gauges, the generation controls.

The canvas and gauges are ``gr.HTML`` components over a list / dict value: a streaming update
then carries only the cells that changed (Gradio diffs lists element by element). Cell labels
arrive already escaped (ui/render.py); the gauges go through Handlebars' own escaping.
"""

from __future__ import annotations

import gradio as gr

from celeris.params import GenerationParams

from . import limits, render
from .settings import (CACHE_CHOICES, DECODING_CHOICES, DEFAULT_PRESET, PRESETS,
                       REMASKING_CHOICES, preset_caption, widget_values)

# The canvas template is constant, so Gradio's own re-render is a no-op; CANVAS_JS paints the
# cells and, on every update, touches only the cells whose class, opacity or label changed.
# That keeps a 1,000-token canvas at 25 frames a second cheap for the browser.
CANVAS_TEMPLATE = ('<div class="cv-wrap"><div class="cv"></div>'
                   '<div class="cv-empty">{{placeholder}}</div></div>')
CANVAS_JS = """
const cv = element.querySelector('.cv');
const keys = [];
function paint() {
  const cells = Array.isArray(props.value) ? props.value : [];
  while (cv.children.length > cells.length) { cv.lastChild.remove(); keys.pop(); }
  cells.forEach((c, i) => {
    if (keys[i] === c) return;
    const [k, b, o, h, t] = c.split('\\t');
    const span = cv.children[i] || cv.appendChild(document.createElement('span'));
    span.className = 'tk ' + k + ' ' + b;
    span.style.opacity = o;
    span.title = h;
    span.innerHTML = t;   /* escaped by ui/render.py */
    keys[i] = c;
  });
}
paint();
watch('value', paint);
"""

# (key, label): a label in braces comes from the value (tokens/s once done, positions/s live)
GAUGE_TILES = (("tps", "{{value.tps_label}}"), ("tpf", "{{value.tpf_label}}"), ("nfe", "NFE"),
               ("elapsed", "elapsed"))
GAUGES_TEMPLATE = (
    '<div class="gauges" data-state="{{value.state}}">'
    + "".join(f'<div class="gauge" data-g="{key}"><b>{{{{value.{key}}}}}</b>'
              f'<span>{label}</span></div>' for key, label in GAUGE_TILES)
    + '<div class="gauge" data-g="mem"><b>{{value.mem}}</b><span>{{value.mem_label}}</span>'
    '</div><div class="gauge state" data-g="state"><b>{{value.state}}</b><span>status</span>'
    '</div></div>')

LEGEND = ('<div class="cv-legend"><span class="tk mask">&#9617;&#9617;</span> masked '
          '<span class="tk new">new</span> committed this step '
          '<span class="tk old">old</span> committed earlier '
          '<span class="tk new edit">edit</span> edited (replaced a token) '
          '<span class="tk draft">draft</span> draft, not accepted yet '
          '<span class="tk pin">pinned</span> pinned (infill) '
          '<span class="tk skip">&middot;</span> not needed{structured} &nbsp;&middot;&nbsp; '
          'opacity = confidence &nbsp;&middot;&nbsp; alternating tint / bar = block '
          'boundary</div>')
# the cells of a run under a grammar (structured output)
STRUCTURED_LEGEND = (' <span class="tk old forced">&#123;&quot;</span> written by the grammar '
                     '<span class="tk mask front">&#9617;&#9617;</span> frontier (structured '
                     'output: the grammar constrains it next)')


def canvas(elem_id: str, placeholder: str = "Press Generate: masks appear here and turn "
           "into text step by step.") -> gr.HTML:
    return gr.HTML(value=[], html_template=CANVAS_TEMPLATE, js_on_load=CANVAS_JS,
                   apply_default_css=False, elem_id=elem_id, elem_classes=["canvas"],
                   placeholder=placeholder)


def gauges(elem_id: str) -> gr.HTML:
    return gr.HTML(value=render.gauges(), html_template=GAUGES_TEMPLATE, js_on_load=None,
                   apply_default_css=False, elem_id=elem_id)


def legend(structured: bool = False) -> gr.HTML:
    """The canvas legend; ``structured``: with the cells of a run under a grammar."""
    return gr.HTML(legend_html(structured), js_on_load=None, apply_default_css=False)


def legend_html(structured: bool = False) -> str:
    return LEGEND.format(structured=STRUCTURED_LEGEND if structured else "")


def block_info(block_size: int | None = None) -> str:
    """The block length dropdown's help line (``block_size``: a block-causal model's)."""
    if block_size:
        return (f"sub-block of the model's blocks of {block_size} (divides it; {block_size} = "
                "whole blocks, 1 = left to right)")
    return "semi-autoregressive block (divides gen length); 1 = left to right"


def generation_controls(defaults: GenerationParams, prefix: str,
                        gen: limits.Bounds | None = None, block_size: int | None = None
                        ) -> list[gr.components.Component]:
    """The widgets for ui.settings.FIELDS, in that order, showing ``defaults``; gen length
    goes up to ``gen.hi`` (the context left after the prompt), steps up to gen length in
    multiples of the blocks, and block length offers the divisors of gen length (of
    ``block_size`` for a block-causal model)."""
    v = widget_values(defaults)
    gen = gen or limits.Bounds("gen length", limits.GEN_MIN, max(1024, v["gen_length"]))
    gen_length = min(v["gen_length"], gen.hi)
    block = limits.fit_block(v["block_length"], gen_length, block_size)
    return [
        gr.Slider(0, gen_length, value=limits.fit_steps(v["steps"], gen_length, block),
                  step=limits.steps_stride(gen_length, block), label="steps",
                  info="0 = one token per step; for threshold decoding: the cap",
                  elem_id=f"{prefix}-steps"),
        gr.Slider(0.0, 2.0, value=v["temperature"], step=0.05, label="temperature",
                  info="0 = greedy", elem_id=f"{prefix}-temperature"),
        gr.Slider(gen.lo, gen.hi, value=gen_length, step=limits.GEN_MIN, label="gen length",
                  info=gen_info(gen), elem_id=f"{prefix}-gen-length"),
        gr.Dropdown(limits.block_choices(gen_length, block_size), value=block,
                    label="block length", info=block_info(block_size),
                    allow_custom_value=True, elem_id=f"{prefix}-block-length"),
        gr.Slider(0.05, 1.0, value=v["threshold"], step=0.01, label="threshold",
                  info="confidence needed to commit (threshold decoding)",
                  elem_id=f"{prefix}-threshold"),
        gr.Dropdown(list(DECODING_CHOICES), value=v["decoding"], label="decoding",
                    info=decoding_info(), elem_id=f"{prefix}-decoding"),
        gr.Dropdown(list(REMASKING_CHOICES), value=v["remasking"], label="remasking",
                    info="which confidence orders the commits", elem_id=f"{prefix}-remasking"),
        gr.Dropdown(list(CACHE_CHOICES), value=v["cache"], label="cache",
                    info="block KV cache: none is exact", elem_id=f"{prefix}-cache"),
        gr.Number(value=v["seed"], precision=0, label="seed", info="-1 = random",
                  elem_id=f"{prefix}-seed"),
    ]


def gen_info(gen: limits.Bounds) -> str:
    why = f" ({gen.why})" if gen.why else ""
    return f"answer canvas length in tokens; at most {gen.hi}{why}"


def preset_radio(elem_id: str, caption: str | None = None) -> gr.Radio:
    """The presets, the model's own settings selected (they are what the controls show);
    ``caption``: what each one is on the loaded model (settings.preset_caption)."""
    return gr.Radio([DEFAULT_PRESET, *PRESETS], value=DEFAULT_PRESET, label="preset",
                    elem_id=elem_id, info=caption or preset_caption())


# what each decoding does, for the dropdown's help line (every choice is named there)
DECODING_HELP = {"fixed": "the reference linear schedule (steps set how many per step)",
                 "threshold": "all positions at or above the threshold",
                 "factor": "as many as the factor rule allows (Fast-dLLM)",
                 "ltr": "threshold, left to right within the block",
                 "dynamic": "all above the threshold, at least the steps' count (SDAR)"}


def decoding_info() -> str:
    return " · ".join(f"{name} = {DECODING_HELP.get(name, name)}" for name in DECODING_CHOICES)

