"""Sliders that follow the browser tab's model (the Gradio side of ui/limits.py).

gen length follows the prompt (context - prompt tokens), steps and block length follow gen
length (block length: the model's block size for a block-diffusion model), and a value typed
outside a slider's range gets a message naming the field and the
range (the browser then moves it to the nearest end) instead of a silent clamp.

The handlers take raw values (``preprocess=False``): Gradio's own bounds check would refuse
an out-of-range number with a message that names no field.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from . import limits
from .context import EngineSlot
from .widgets import gen_info

QUIET = dict(queue=False, api_visibility="private", show_progress="hidden",
             preprocess=False)


def _number(value: Any, default: int) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def _is(value: Any, number: int) -> bool:
    """Whether a widget's value (a number or its text) is ``number``."""
    try:
        return float(value) == number
    except (TypeError, ValueError):
        return False


def gen_bounds(slot: Any, prompt: Any) -> limits.Bounds:
    """gen length's range for ``prompt`` (text or messages) on ``slot``'s model (the
    EngineSlot's default one, or a session's)."""
    context = slot.context_length()
    if not context:
        return limits.Bounds("gen length", limits.GEN_MIN, 1024)
    return limits.gen_bounds(context, slot.prompt_tokens(prompt))


def prompt_message(prompt: Any, as_chat: Any) -> Any:
    if not isinstance(prompt, str) or not prompt.strip():
        return None
    return [{"role": "user", "content": prompt}] if as_chat else prompt


def gen_slider(bounds: limits.Bounds, value: Any) -> gr.Slider:
    fitted = min(max(_number(value, bounds.lo), bounds.lo), bounds.hi)
    return gr.Slider(minimum=bounds.lo, maximum=bounds.hi, value=fitted, info=gen_info(bounds))


def block_dropdown(gen_length: Any, block_length: Any, block_size: int | None = None,
                   info: str | None = None) -> gr.Dropdown:
    """Block length's choices for gen length (or the block-causal model's ``block_size``);
    ``info`` replaces the help line (after a model switch)."""
    gen = max(_number(gen_length, limits.GEN_MIN), 1)
    extra = {} if info is None else {"info": info}
    fitted = limits.fit_block(block_length, gen, block_size)
    if not _is(block_length, fitted):   # see steps_slider: a fitting value is not resent
        extra["value"] = fitted
    return gr.Dropdown(choices=limits.block_choices(gen, block_size), **extra)


def steps_slider(gen_length: Any, block_length: Any, steps: Any,
                 block_size: int | None = None) -> gr.Slider:
    """The steps slider's grid for this gen length and block length. Its value is sent only
    when ``steps`` is off the new grid: this update can land after the user typed another
    value (it was computed from the value before), and must not overwrite a valid one."""
    gen = max(_number(gen_length, limits.GEN_MIN), 1)
    block = limits.fit_block(block_length, gen, block_size)
    grid = dict(minimum=0, maximum=gen, step=limits.steps_stride(gen, block))
    fitted = limits.fit_steps(steps, gen, block)
    return gr.Slider(**grid) if _is(steps, fitted) else gr.Slider(**grid, value=fitted)


def range_check(bounds_of: Callable[..., limits.Bounds]) -> Callable[..., None]:
    """A release handler: a warning toast when the typed value is outside
    ``bounds_of(*rest)`` (queued: only queued events deliver toasts)."""
    def check(value: Any, *rest: Any) -> None:
        warn(bounds_of(*rest).check(value))
    return check


CHECK = dict(QUIET, queue=True)


def wire_gen_length(slot: EngineSlot, prompt: gr.Textbox, as_chat: gr.Checkbox,
                    gen_length: gr.Slider) -> None:
    """gen length's top follows the prompt on this browser tab's model; a typed value outside
    gets a message.

    The range is set on page load and on prompt changes (``gr.on`` without triggers), the
    value only moved when the prompt grows past it: a handler that also ran on gen length's
    own changes would clamp a typed value before its release could say so. The slider's
    range as built stays context - 1 (the prompt unknown), which API callers are held to.
    """
    def bounds_of(text: Any, chat: Any, request: Any) -> limits.Bounds:
        return gen_bounds(slot.session(request), prompt_message(text, chat))

    def follow(text: Any, chat: Any, request: gr.Request) -> gr.Slider:
        b = bounds_of(text, chat, request)
        return gr.Slider(minimum=b.lo, maximum=b.hi, info=gen_info(b))

    def fit(text: Any, chat: Any, value: Any, request: gr.Request) -> Any:
        b = bounds_of(text, chat, request)
        return gr.skip() if b.check(value) is None else gen_slider(b, value)

    def check(value: Any, text: Any, chat: Any, request: gr.Request) -> None:
        warn(bounds_of(text, chat, request).check(value))

    gr.on(None, follow, [prompt, as_chat], gen_length, trigger_mode="always_last", **QUIET)
    gr.on([prompt.change, as_chat.change], fit, [prompt, as_chat, gen_length], gen_length,
          trigger_mode="always_last", **QUIET)
    gen_length.release(check, [gen_length, prompt, as_chat], None, **CHECK)


def wire_controls(slot: EngineSlot, prompt: gr.Textbox, as_chat: gr.Checkbox,
                  controls: list[Any]) -> None:
    """The playground's controls (ui.settings.FIELDS order) follow the model and each other."""
    steps, gen_length, block = controls[0], controls[2], controls[3]
    wire_gen_length(slot, prompt, as_chat, gen_length)

    def on_gen(g: Any, b: Any, s: Any, request: gr.Request) -> tuple[Any, Any]:
        size = slot.session(request).block_size()
        return steps_slider(g, b, s, size), block_dropdown(g, b, size)

    def on_block(g: Any, b: Any, s: Any, request: gr.Request) -> Any:
        return steps_slider(g, b, s, slot.session(request).block_size())

    gen_length.change(on_gen, [gen_length, block, steps], [steps, block], **QUIET)
    block.change(on_block, [gen_length, block, steps], steps, **QUIET)
    steps.release(range_check(lambda g: limits.steps_bounds(_number(g, 0))),
                  [steps, gen_length], None, **CHECK)
    warn_out_of_range(controls[1], "temperature")
    warn_out_of_range(controls[4], "threshold")


def warn(message: str | None) -> None:
    if message:
        gr.Warning(message, title="Out of range")


def warn_out_of_range(slider: gr.Slider, name: str) -> None:
    """A fixed-range slider: a typed value outside gets the same message as the others."""
    fixed = limits.Bounds(name, slider.minimum, slider.maximum)
    slider.release(range_check(lambda: fixed), slider, None, **CHECK)
