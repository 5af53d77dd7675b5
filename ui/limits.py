"""How far each generation slider may go for the loaded model, and what to say when a typed
value falls outside. Pure functions (no Gradio), tested without a browser.

The answer canvas and the prompt share the model's context, so gen length goes up to
context - prompt tokens; steps go up to gen length in multiples of the number of blocks (so
every value on the slider is a valid schedule); block lengths are the divisors of gen length,
or, for a block-causal (block-diffusion) model, the divisors of its block size (gen length is
only a cap there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GEN_MIN = 8          # the smallest canvas the gen length slider offers (its step too)


@dataclass(frozen=True)
class Bounds:
    """The allowed range of one slider and why its top is where it is."""

    name: str
    lo: float
    hi: float
    why: str = ""

    def check(self, value: Any) -> str | None:
        """None when ``value`` is inside; otherwise a message naming the field and range."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            return f"{self.name} must be a number in [{self.lo}, {self.hi}]; got {value!r}."
        if math.isfinite(number) and self.lo <= number <= self.hi:
            return None
        nearest = self.lo if number < self.lo else self.hi
        why = f" ({self.why})" if self.why else ""
        if not math.isfinite(number):
            return f"{self.name} must be a finite number in [{self.lo}, {self.hi}]."
        return (f"{self.name} must be in [{self.lo}, {self.hi}]{why}; {number:g} was set "
                f"to {nearest}.")


def gen_bounds(context: int, prompt_tokens: int | None) -> Bounds:
    """gen length: at most context - prompt (prompt unknown: at least one token, a BOS)."""
    used = max(prompt_tokens or 1, 1)
    hi = max(context - used, 1)
    why = f"context {context} - prompt {used} tokens"
    return Bounds("gen length", min(GEN_MIN, hi), hi, why)


def block_choices(gen_length: int, block_size: int | None = None) -> list[int]:
    """Block lengths that divide ``gen_length`` (a block-causal model: that divide its
    ``block_size``), smallest first."""
    n = max(int(block_size or gen_length), 1)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def fit_block(block_length: Any, gen_length: int, block_size: int | None = None) -> int:
    """The largest of ``block_choices`` not above ``block_length`` (1 at least)."""
    try:
        wanted = int(float(block_length))
    except (TypeError, ValueError):
        wanted = int(block_size or gen_length)
    fitting = [d for d in block_choices(gen_length, block_size) if d <= wanted]
    return fitting[-1] if fitting else 1


def steps_stride(gen_length: int, block_length: int) -> int:
    """Steps must be a multiple of the number of blocks (ceil(gen length / block length):
    a block-causal model's gen length need not be whole blocks): the slider's step."""
    return max(-(-int(gen_length) // max(int(block_length), 1)), 1)


def steps_bounds(gen_length: int) -> Bounds:
    return Bounds("steps", 0, int(gen_length), "0 = one token per step; at most gen length")


def fit_steps(steps: Any, gen_length: int, block_length: int) -> int:
    """``steps`` moved onto the slider's grid: a multiple of the blocks, at most gen length
    (0 stays 0, "one token per step")."""
    try:
        wanted = int(float(steps))
    except (TypeError, ValueError):
        return 0
    stride = steps_stride(gen_length, block_length)
    return max(0, min(wanted, gen_length) // stride * stride)
