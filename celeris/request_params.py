"""Request fields -> GenerationParams: the one mapping shared by the /v1 routes, batch jobs
(in-process and ``--url``) and the serving bench, so one request means the same everywhere.

OpenAI's ``max_tokens`` (or its newer spelling ``max_completion_tokens``) is a cap on the
completion: it becomes ``gen_length`` unchanged, and the engine cuts the answer there with
finish_reason "length". It is never rounded up to whole blocks here.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from .params import MAX_GEN_LENGTH, GenerationParams

LENGTH_FIELDS = ("max_tokens", "max_completion_tokens")


def request_params(fields: Mapping[str, Any], defaults: GenerationParams) -> GenerationParams:
    """GenerationParams for one request: ``defaults`` overridden by ``fields``.

    ``fields`` holds GenerationParams names plus ``max_tokens`` / ``max_completion_tokens``;
    a None value means "not given". When the length changes and ``steps`` is not given, the
    default steps are scaled so each step still commits about as many tokens as by default.
    A given ``steps`` means what it means everywhere (GenerationParams: steps over the whole
    answer, for every family). Raises ValueError naming the field.
    """
    changes = {k: v for k, v in fields.items() if v is not None and k not in LENGTH_FIELDS}
    cap = max_tokens(fields)
    if cap is not None:
        if changes.get("gen_length", cap) != cap:
            raise ValueError(f"gen_length ({changes['gen_length']}) and max_tokens ({cap}) "
                             "disagree; give only one of them")
        changes["gen_length"] = cap
    if isinstance(changes.get("stop"), str):
        changes["stop"] = (changes["stop"],)
    if isinstance(changes.get("logit_bias"), Mapping):
        changes["logit_bias"] = logit_bias_pairs(changes["logit_bias"])
    if "gen_length" in changes and "steps" not in changes:
        block = changes.get("block_length", defaults.block_length)
        changes["steps"] = scaled_steps(defaults, changes["gen_length"], block)
    return GenerationParams.from_dict(changes, defaults)


def logit_bias_pairs(bias: Mapping[Any, Any]) -> list[tuple[int, Any]]:
    """OpenAI's logit_bias, whose JSON keys are token ids written as strings, as (token id,
    bias) pairs (GenerationParams checks the ids and values); a key that is not an integer
    is refused naming logit_bias."""
    pairs = []
    for key, value in bias.items():
        if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key):
            key = int(key)
        elif isinstance(key, bool) or not isinstance(key, int):
            raise ValueError(f"logit_bias keys must be token ids (integers, as strings in "
                             f"JSON), got {key!r}")
        pairs.append((key, value))
    return pairs


def max_tokens(fields: Mapping[str, Any]) -> int | None:
    """The completion cap of a request, or None; both spellings must agree."""
    given = {k: fields[k] for k in LENGTH_FIELDS if fields.get(k) is not None}
    if len(set(map(repr, given.values()))) > 1:
        raise ValueError(f"max_completion_tokens ({given['max_completion_tokens']}) differs "
                         f"from max_tokens ({given['max_tokens']}); give one of them")
    if not given:
        return None
    name, value = next(iter(given.items()))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [1, {MAX_GEN_LENGTH}], got {value!r}")
    if not 1 <= value <= MAX_GEN_LENGTH:
        raise ValueError(f"{name} must be in [1, {MAX_GEN_LENGTH}], got {value}; prompt + "
                         f"{name} must also fit the model's context")
    return value


def scaled_steps(defaults: GenerationParams, gen_length: Any, block_length: Any) -> int | None:
    """Steps for ``gen_length`` at the defaults' tokens per step: a multiple of the number of
    blocks ceil(gen_length / block_length), at most gen_length. None when the defaults have
    none (one token a step) or the lengths are invalid (GenerationParams then says why)."""
    if defaults.steps is None or not _positive_int(gen_length) or \
            not _positive_int(block_length):
        return None
    blocks = math.ceil(gen_length / block_length)
    per_block = round(defaults.steps * gen_length / defaults.gen_length / blocks)
    return min(max(per_block, 1), gen_length // blocks) * blocks


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
