"""Generation settings as the UI shows them: presets and the widget values -> GenerationParams.

Pure functions (no Gradio) so that they are unit-tested without a browser. Validation is left
to ``GenerationParams`` itself: its ValueError names the field and the allowed range, and the
UI shows that message as a toast.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from celeris.params import CACHES, DECODINGS, REMASKINGS, GenerationParams

# The order of the generation widgets everywhere in the UI (and of the /generate API inputs).
FIELDS: tuple[str, ...] = ("steps", "temperature", "gen_length", "block_length", "threshold",
                           "decoding", "remasking", "cache", "seed")
INT_FIELDS = frozenset({"steps", "gen_length", "block_length", "seed"})

DECODING_CHOICES = DECODINGS
REMASKING_CHOICES = REMASKINGS
CACHE_CHOICES = CACHES

# fast: commit everything above the threshold and reuse the prompt's KV cache (Fast-dLLM);
# balanced: the same rule with a stricter threshold and the exact (uncached) forward (a
# block-causal model: near-certain tokens only, see BLOCK_BALANCED_THRESHOLD);
# quality: the reference linear schedule, one token per step, no cache (LLaDA's sampler);
# story: the same, one position at a time left to right (block 1): the small shipped model
# writes grammatical stories this way and drops words at wide blocks (see its model card).
# A block-causal (block-diffusion) model takes them with a block length that divides its
# block size (see ``preset_settings``).
_QUALITY = {"decoding": "fixed", "threshold": 0.9, "cache": "none", "steps": 0,
            "block_length": 32, "temperature": 0.0, "remasking": "low_confidence"}
ADAPTIVE = ("threshold", "ltr", "dynamic")   # decodings that commit by a confidence threshold
# balanced on a block-causal model: the shipped one commits the same tokens at thresholds
# 0.85 and 0.95 (43 forwards for a 165-token story either way) and needs 0.999 to slow down
# (68 forwards; one token a step: 166)
BLOCK_BALANCED_THRESHOLD = 0.999
DEFAULT_PRESET = "default"   # the model's own settings (its generation_config)
PRESETS: dict[str, dict[str, Any]] = {
    "fast": {**_QUALITY, "decoding": "threshold", "cache": "prefix"},
    "balanced": {**_QUALITY, "decoding": "threshold", "threshold": 0.95},
    "quality": _QUALITY,
    "story": {**_QUALITY, "block_length": 1},
}


def widget_values(params: GenerationParams) -> dict[str, Any]:
    """The widget values that show ``params`` (steps None -> 0, seed None -> -1)."""
    values = {name: getattr(params, name) for name in FIELDS}
    values["steps"] = 0 if params.steps is None else params.steps
    values["seed"] = -1 if params.seed is None else params.seed
    return values


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (1 at least)."""
    block = max(min(int(at_most), int(n)), 1)
    while n % block:
        block -= 1
    return block


def preset_settings(name: str, gen_length: int, block_size: int | None = None,
                    defaults: GenerationParams | None = None) -> dict[str, Any]:
    """A preset's settings for the loaded model, gen_length kept as the user set it.

    Full attention (``block_size`` None): the block length is fitted to divide gen_length.
    Block-causal (``block_size``: the model's block size): gen_length is only a cap, the block
    length becomes a divisor of the block size (story: 1; the others: the whole block), the
    cached forward is exact there (fast and balanced keep the KV cache), and fast runs at the
    model's own threshold and block length when its defaults (``defaults``: its
    generation_config) decode by threshold (plain or left-to-right "ltr", whose rule fast
    and balanced then keep); balanced is never less strict than that."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {name!r}")
    preset = dict(PRESETS[name], gen_length=gen_length)
    if not block_size:
        preset["block_length"] = largest_divisor(gen_length, preset["block_length"])
        return preset
    preset["block_length"] = largest_divisor(block_size, preset["block_length"])
    own = defaults is not None and defaults.decoding in ADAPTIVE
    if preset["decoding"] in ADAPTIVE:
        preset["cache"] = "prefix"
        if own:                        # the model's own rule (threshold, ltr or SDAR's dynamic)
            preset["decoding"] = defaults.decoding
    if name == "fast" and own:
        preset["threshold"] = defaults.threshold
        if block_size % defaults.block_length == 0:
            preset["block_length"] = defaults.block_length
    elif name == "balanced":   # a confident block model commits the same at 0.85 and 0.95:
        own_threshold = defaults.threshold if own else 0.0   # only near-certain tokens
        preset["threshold"] = max(BLOCK_BALANCED_THRESHOLD, own_threshold)
    return preset


def preset_values(name: str, gen_length: int, block_size: int | None = None,
                  defaults: GenerationParams | None = None) -> list[Any]:
    """Widget values for a preset, in FIELDS order (seed left out); see preset_settings.
    DEFAULT_PRESET: the model's own settings (``defaults``, its generation_config)."""
    if name == DEFAULT_PRESET:
        preset = widget_values(defaults if defaults is not None else GenerationParams())
        return [preset[f] for f in FIELDS if f != "seed"]
    preset = preset_settings(name, gen_length, block_size, defaults)
    return [preset.get(f) for f in FIELDS if f != "seed"]


SHOWN = tuple(f for f in FIELDS if f != "seed")   # the fields a preset sets, in order


def describe(values: dict[str, Any]) -> str:
    """Settings in a few words: how a step commits, the cache, the block length."""
    rule, steps = values["decoding"], values.get("steps") or 0
    if rule == "fixed":
        how = f"fixed schedule, {f'{steps} steps' if steps else 'one token per step'}"
    elif rule == "factor":
        how = "factor rule"
    else:
        how = f"{rule} decoding at {float(values['threshold']):g}"
    cache = "no cache" if values["cache"] == "none" else f"{values['cache']} cache"
    block = values["block_length"]
    return f"{how}, {cache}, {'block 1 (left to right)' if block == 1 else f'block {block}'}"


def preset_caption(block_size: int | None = None,
                   defaults: GenerationParams | None = None) -> str:
    """What each preset is on the loaded model (its block size and its own settings,
    ``defaults``), read from the values the preset sets: a preset that comes out as the
    model's own settings says so instead of naming what it would be on another model."""
    defaults = defaults if defaults is not None else GenerationParams()
    gen = defaults.gen_length
    own = dict(zip(SHOWN, preset_values(DEFAULT_PRESET, gen, block_size, defaults)))
    parts = [f"{DEFAULT_PRESET}: the model's own settings ({describe(own)})"]
    for name in PRESETS:
        values = dict(zip(SHOWN, preset_values(name, gen, block_size, defaults)))
        same = all(values[f] == own[f] for f in SHOWN if f != "gen_length")
        parts.append(f"{name}: " + (f"the same as {DEFAULT_PRESET} on this model" if same
                                    else describe(values)))
    return " · ".join(parts)


def _as_int(name: str, value: Any) -> Any:
    """Sliders hand back floats; whole numbers become ints, anything else is left for
    GenerationParams to reject with its own message."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return value


def build_params(base: GenerationParams, values: Sequence[Any] | dict[str, Any],
                 structured: tuple[str, str] | None = None) -> GenerationParams:
    """GenerationParams from widget values (FIELDS order or a mapping) over ``base``, and
    ``structured`` (the Structured control's (kind, spec); None: ``base``'s, which a model's
    defaults leave unset).

    steps 0 or empty means "one token per step" (None); seed -1 or empty means random (None).
    Raises ValueError with GenerationParams' message for an invalid combination.
    """
    if not isinstance(values, dict):
        if len(values) != len(FIELDS):
            raise ValueError(f"expected {len(FIELDS)} settings ({', '.join(FIELDS)}), "
                             f"got {len(values)}")
        values = dict(zip(FIELDS, values))
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name in INT_FIELDS:
            value = _as_int(name, value)
        changes[name] = value
    if changes.get("steps") in (0, None, ""):
        changes["steps"] = None
    if changes.get("seed") in (-1, None, ""):
        changes["seed"] = None
    if structured is not None:
        changes["structured"] = structured
    return GenerationParams.from_dict(changes, base=base)
