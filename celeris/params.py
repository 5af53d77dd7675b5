"""GenerationParams: the one place where request knobs are defined and validated.

Every consumer (CLI, server, UI, bench, batch) builds a ``GenerationParams`` and lets its
``__post_init__`` reject bad values with a ``ValueError`` that names the field, the value and
what is allowed, so error messages look the same everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

DECODINGS = ("fixed", "threshold", "factor", "ltr", "dynamic")
REMASKINGS = ("low_confidence", "margin", "entropy", "random")
CACHES = ("none", "prefix", "dual")
FIRST_TOKENS = ("policy", "greedy")
CONFIDENCE_DTYPES = ("float32", "model")
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
MAX_STRUCTURED_SPEC = 100_000

MAX_GEN_LENGTH = 4096
MAX_TEMPERATURE = 2.0     # OpenAI's range; the UI slider's too
MAX_CFG_SCALE = 20.0
MAX_STOP_STRINGS = 8
MAX_SEED = 2**63 - 1
MAX_POST_EDIT_STEPS = 256
MAX_TOP_LOGPROBS = 20     # OpenAI's top_logprobs range
MAX_LOGIT_BIAS = 100.0     # OpenAI's logit_bias values: [-100, 100]
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_PENALTY = 2.0         # OpenAI's presence/frequency penalty range: [-2, 2]

# Dream's names for its unmasking orders map onto our confidence measures.
DREAM_ALGS = {"maskgit_plus": "low_confidence", "topk_margin": "margin",
              "entropy": "entropy", "origin": "random"}
REMASKING_ALIASES = tuple(a for a in DREAM_ALGS if a not in REMASKINGS)


@dataclass(frozen=True)
class GenerationParams:
    """How one request is denoised.

    gen_length:   at most this many answer tokens (OpenAI's max_tokens): a full-attention
                  model denoises a canvas of whole blocks (gen_length rounded up to a multiple
                  of block_length) and the answer is cut at gen_length (finish "length"); a
                  block-causal model generates block after block until EOS or this cap.
    block_length: semi-autoregressive block size; blocks are denoised left to right. For a
                  block-causal model it is the sub-block (Fast-dLLM v2): a divisor of the
                  model's block size, committed left to right inside each model block.
    steps:        one meaning on every surface (UI, CLI, API, batch) and for every family:
                  the denoising steps over the whole answer (gen_length rounded up to whole
                  blocks), split evenly across its blocks (LLaDA's linear schedule) for
                  ``decoding="fixed"`` and ``"dynamic"``; for the other decodings, the cap on
                  steps per block times blocks. 0 or None = one token a step. Otherwise a
                  multiple of the number of blocks, at most the rounded-up gen_length.
    temperature:  0 = greedy; > 0 adds Gumbel noise computed in float64 (LLaDA, sec. B.3).
    top_p/top_k:  nucleus / top-k filtering of the logits before sampling (1.0 / 0 = off).
    decoding:     "fixed" (reference), "threshold" (commit every position with confidence >=
                  threshold, at least one), "factor" (Fast-dLLM's factor rule), "ltr"
                  (left-to-right threshold: the leftmost masked position and the run of
                  masked positions after it whose confidence >= threshold), "dynamic"
                  (SDAR's low_confidence_dynamic: every position above threshold, and at
                  least the fixed schedule's count for the step, the most confident ones;
                  at one token a step, steps None, it is "threshold").
    remasking:    which confidence orders the commits: low_confidence (top-1 probability),
                  margin (top1 - top2), entropy (negative entropy), random.
    cache:        block KV cache policy: none (exact), prefix, dual.
    cfg_scale:    unsupervised classifier-free guidance scale (0 = off).
    suppress_eos: set EOS/EoT logits to -inf (forces a full-length answer).
    defer_eos:    give EOS/EoT confidence -inf so they are committed last.
    early_stop:   finish as soon as everything after a committed EOS can only be EOS.
    stop:         strings that end the text (cut at the first; finish_reason "stop").
    seed:         per-request noise seed; None picks one and reports it.
    first_token:  block-causal models: "policy" (a new block's first position is committed by
                  the unmask schedule like the others) or "greedy" (it is committed at once, by
                  argmax, from the finished block's last position, before the rest of the block
                  is denoised: Fast-dLLM v2's generate(); with decoding="threshold" and its
                  sub-blocks this reproduces that sampler token for token at T=0).
    edit_threshold: block-causal models: token editing (LLaDA2.1's token-to-token rule), off
                  when None. A token already committed in the current (sub-)block is replaced
                  by the model's choice there when that choice differs and its probability >
                  edit_threshold; once the unit has no masks left, up to max_post_edit_steps
                  more forwards edit it until one changes nothing. 1.0 turns it off too.
    confidence_dtype: "float32" (confidences from the logits in float32) or "model" (as
                  Fast-dLLM v2's generate() and the other upstream samplers take them from
                  bfloat16/float16 logits: softmax in the model's dtype, so probabilities that
                  round together tie, the token at T=0 is the argmax of those probabilities,
                  and a threshold compares as ``bf16_tensor > 0.9`` does, rounded to that
                  dtype: 0.8984375). The same as "float32" for a float32 model.
    structured:   constrained decoding, None when off: (kind, spec) with kind one of
                  STRUCTURED_KINDS: "json" (spec: a JSON schema, as JSON text), "json_object"
                  (any JSON object; spec ""), "regex", "choice" (spec: a JSON list of strings)
                  "grammar" (EBNF) or "structural_tag" (xgrammar's structural tag, as JSON
                  text: tool calls are decoded under one). The answer read left to right is always a prefix the
                  grammar accepts, and it ends at the grammar's end (sampler/grammar.py).
    logprobs:     None = off; k in [0, 20] = report each answer token's log-probability and
                  its k most likely alternatives, from the distribution of the step that
                  committed it (the one its confidence comes from: temperature 1, after the
                  row's filters, grammar and biases). Costs nothing to rows that do not ask.
    logit_bias:   OpenAI's logit_bias: (token id, bias) pairs, sorted by id (a dict or a list
                  of pairs is accepted), ids >= 0 and below the model's vocabulary (checked
                  when the engine prepares the request), biases in [-100, 100], at most 300.
    presence_penalty / frequency_penalty: OpenAI's penalties, each in [-2, 2] (0 = off).
                  At every denoising step each row's logits get ``+ bias[token]`` and
                  ``- presence_penalty * (count[token] > 0) - frequency_penalty *
                  count[token]``, count being over the answer tokens the row has committed so
                  far (not the prompt, not masks); this comes before the grammar mask, the EOS
                  handling, top-k/top-p and temperature, so a bias never makes a
                  grammar-invalid token valid. -100 effectively bans a token, +100
                  effectively forces it wherever it is allowed. Costs nothing to rows that
                  ask for none.
    """

    gen_length: int = 128
    block_length: int = 32
    steps: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    decoding: str = "fixed"
    threshold: float = 0.9
    factor: float = 1.0
    remasking: str = "low_confidence"
    cache: str = "none"
    cfg_scale: float = 0.0
    suppress_eos: bool = False
    defer_eos: bool = False
    early_stop: bool = True
    stop: tuple[str, ...] = ()
    seed: int | None = None
    first_token: str = "policy"
    edit_threshold: float | None = None
    max_post_edit_steps: int = 16
    confidence_dtype: str = "float32"
    structured: tuple[str, str] | None = None
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.steps == 0 and not isinstance(self.steps, bool):
            object.__setattr__(self, "steps", None)      # 0 = one token a step
        if isinstance(self.structured, list):
            object.__setattr__(self, "structured", tuple(self.structured))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "logit_bias", _logit_bias_pairs(self.logit_bias))
        if self.remasking in DREAM_ALGS:
            object.__setattr__(self, "remasking", DREAM_ALGS[self.remasking])
        _validate(self)

    # ----------------------------------------------------------------- derived
    @property
    def edits(self) -> bool:
        """Token editing is on (a threshold below 1: no probability is above 1)."""
        return self.edit_threshold is not None and self.edit_threshold < 1.0

    @property
    def num_blocks(self) -> int:
        return -(-self.gen_length // self.block_length)

    @property
    def canvas_length(self) -> int:
        """gen_length rounded up to whole blocks: the full-attention canvas."""
        return self.num_blocks * self.block_length

    @property
    def total_steps(self) -> int:
        return self.canvas_length if self.steps is None else self.steps

    @property
    def steps_per_block(self) -> int:
        return self.total_steps // self.num_blocks

    def replace(self, **changes: Any) -> "GenerationParams":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stop"] = list(self.stop)
        out["logit_bias"] = [list(pair) for pair in self.logit_bias]     # JSON: pairs
        return out

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: "GenerationParams | None" = None
                  ) -> "GenerationParams":
        """Build from a mapping (JSON body, CLI args); unknown keys are an error."""
        unknown = sorted(set(data) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown generation parameter(s): {', '.join(unknown)}; "
                             f"allowed: {', '.join(cls.field_names())}")
        return replace(base or cls(), **data)


# ---------------------------------------------------------------------- validation
def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")


def _check_float(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    interval = f"{'(' if lo_open else '['}{lo}, {hi}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number in {interval}, got {value}")
    if value < lo or value > hi or (lo_open and value == lo):
        raise ValueError(f"{name} must be in {interval}, got {value}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")


def _validate(p: GenerationParams) -> None:
    _check_int("gen_length", p.gen_length, 1, MAX_GEN_LENGTH)
    _check_int("block_length", p.block_length, 1, MAX_GEN_LENGTH)
    if p.steps is not None:
        _check_steps(p)
    _check_float("temperature", p.temperature, 0.0, MAX_TEMPERATURE)
    _check_float("top_p", p.top_p, 0.0, 1.0, lo_open=True)
    _check_int("top_k", p.top_k, 0, 1_000_000)
    _check_choice("decoding", p.decoding, DECODINGS)
    _check_float("threshold", p.threshold, 0.0, 1.0, lo_open=True)
    _check_float("factor", p.factor, 0.0, 100.0, lo_open=True)
    _check_choice("remasking", p.remasking, REMASKINGS + REMASKING_ALIASES)
    _check_choice("cache", p.cache, CACHES)
    _check_float("cfg_scale", p.cfg_scale, 0.0, MAX_CFG_SCALE)
    if p.cfg_scale > 0 and p.cache != "none":
        raise ValueError(f"cfg_scale > 0 needs cache 'none' (guidance runs a second, "
                         f"prompt-masked forward that the block cache does not hold); "
                         f"got cache {p.cache!r}")
    for name in ("suppress_eos", "defer_eos", "early_stop"):
        _check_bool(name, getattr(p, name))
    if len(p.stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(p.stop)}")
    for s in p.stop:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
    if p.seed is not None:
        _check_int("seed", p.seed, 0, MAX_SEED)
    _check_choice("first_token", p.first_token, FIRST_TOKENS)
    if p.edit_threshold is not None:
        _check_float("edit_threshold", p.edit_threshold, 0.0, 1.0, lo_open=True)
    _check_int("max_post_edit_steps", p.max_post_edit_steps, 0, MAX_POST_EDIT_STEPS)
    _check_choice("confidence_dtype", p.confidence_dtype, CONFIDENCE_DTYPES)
    if p.structured is not None:
        _check_structured(p)
    if p.logprobs is not None:
        _check_int("logprobs", p.logprobs, 0, MAX_TOP_LOGPROBS)
    _check_float("presence_penalty", p.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
    _check_float("frequency_penalty", p.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)


def _logit_bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as given (a dict, or a list/tuple of (id, bias) pairs) -> validated
    (id, bias) pairs sorted by id; the error names logit_bias and what is allowed."""
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise ValueError(f"logit_bias must be a mapping of token id -> bias or a list of "
                         f"(token id, bias) pairs, got {value!r}")
    if len(pairs) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS_ENTRIES} token ids, "
                         f"got {len(pairs)}")
    out: dict[int, float] = {}
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ValueError(f"logit_bias entries must be (token id, bias) pairs, got "
                             f"{pair!r}")
        token, bias = pair
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias token ids must be integers >= 0, got {token!r}")
        if token in out:
            raise ValueError(f"logit_bias gives token id {token} more than once")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or \
                not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:      # NaN fails this too
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got "
                             f"{bias!r} for token id {token}")
        out[token] = float(bias)
    return tuple(sorted(out.items()))


def _check_steps(p: GenerationParams) -> None:
    """The one explanation of ``steps`` every surface shows (numbers from this request)."""
    steps, blocks, canvas = p.steps, p.num_blocks, p.canvas_length
    fits = isinstance(steps, int) and not isinstance(steps, bool) and 1 <= steps <= canvas \
        and steps % blocks == 0
    if not fits:
        raise ValueError(
            f"steps must be 0 (one token a step) or a multiple of the number of blocks "
            f"({blocks} = gen_length {p.gen_length} / block_length {p.block_length}, rounded "
            f"up) and at most {canvas}: it counts denoising steps over the whole answer; "
            f"got {steps!r}")


def _check_structured(p: GenerationParams) -> None:
    s = p.structured
    if not (isinstance(s, tuple) and len(s) == 2 and all(isinstance(x, str) for x in s)):
        raise ValueError(f"structured must be a (kind, spec) pair of strings, got {s!r}")
    _check_choice("structured kind", s[0], STRUCTURED_KINDS)
    if len(s[1]) > MAX_STRUCTURED_SPEC:
        raise ValueError(f"structured spec must be at most {MAX_STRUCTURED_SPEC} characters, "
                         f"got {len(s[1])}")
    for name, clash in (("suppress_eos", p.suppress_eos), ("cfg_scale", p.cfg_scale > 0),
                        ("edit_threshold", p.edits)):
        if clash:
            raise ValueError(f"{name} cannot be combined with structured output (the grammar "
                             f"decides where the answer ends and what each token may be)")
