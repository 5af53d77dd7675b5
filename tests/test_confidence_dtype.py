"""confidence_dtype="model": confidences taken as the upstream samplers take them from bfloat16
or float16 logits (``softmax(logits)`` in the model's dtype, ``probs > 0.9`` against a Python
float), so a bfloat16 run commits what upstream commits; "float32" rows stay as they were."""

from __future__ import annotations

import pytest
import torch

from celeris import GenerationParams
from celeris.cli import build_parser, generation_overrides
from celeris.request_params import request_params
from celeris.sampler.choose import RowKnobs
from celeris.server.protocol import CompletionRequest
from tests.engine_harness import bare_engine, run_requests
from tests.test_fastdllm_reference import (MASK, PAD, SMALL, STOP, tiny_fastdllm,
                                           upstream_generate)

V, UNIT_MASK, FAR = 8, 7, -100.0       # hand-made rows: 8 tokens, the rest of a row at -100
BF16 = torch.bfloat16


# ------------------------------------------------------------------ hand-made logits
def rows(*positions: list[float], dtype: torch.dtype = BF16) -> torch.Tensor:
    """(1, W, V) logits: each position's given leading logits, FAR for the other tokens."""
    out = torch.full((1, len(positions), V), FAR)
    for j, lead in enumerate(positions):
        out[0, j, :len(lead)] = torch.tensor(lead)
    return out.to(dtype)


def step(logits: torch.Tensor, confidence_dtype: str, strict: bool, k: int = 1, **knobs):
    """(x0, confidence, committed) of one RowKnobs step over every position of each row."""
    B, W, _ = logits.shape
    params = [GenerationParams(confidence_dtype=confidence_dtype, **knobs)] * B
    rk = RowKnobs(params, [None] * B, UNIT_MASK, (), torch.device("cpu"), strict)
    active = torch.ones(B, W, dtype=torch.bool)
    x0, conf, _, _ = rk.choose(logits.clone(), [W] * B)
    return x0, conf, rk.select(conf, active, torch.full((B,), k))


def upstream_step(logits: torch.Tensor, threshold: float, strict: bool):
    """Fast-dLLM v2's step at T = 0 (sample_with_top_p, then the threshold rule), in the
    logits' dtype; ``strict=False`` is the same with >=."""
    p = logits.softmax(-1)                                       # (B, W, V) in that dtype
    x1_p, x_1 = p.max(-1)
    commit = (x1_p > threshold) if strict else (x1_p >= threshold)
    commit[torch.arange(len(p)), x1_p.argmax(-1)] = True
    return x_1, commit


def test_threshold_is_compared_in_bfloat16_as_a_python_float_is():
    # 0.9 is 0.8984375 in bfloat16; a probability 0.89912 rounds to it, 0.90002 too
    lo, hi = rows([10.0], [0.0, -2.1875]), rows([10.0], [2.890625, 0.0, 0.0])
    assert 0.8984375 < lo.float().softmax(-1)[0, 1, 0] < 0.9 < hi.float().softmax(-1)[0, 1, 0]
    for logits, strict, f32_commits in ((lo, False, False), (hi, True, True)):
        _, want = upstream_step(logits, 0.9, strict)
        _, _, model = step(logits, "model", strict, decoding="threshold", threshold=0.9)
        _, _, f32 = step(logits, "float32", strict, decoding="threshold", threshold=0.9)
        assert model.tolist() == want.tolist() == [[True, not f32_commits]]
        assert f32.tolist() == [[True, f32_commits]]


def test_threshold_is_rounded_through_float32_as_pytorch_casts_a_scalar():
    t = 0.900390625 + 2 ** -30     # float32: a bfloat16 midpoint, which rounds down (even)
    logits = rows([10.0], [0.0, -2.21875])
    assert logits.softmax(-1)[0, 1, 0].item() == 0.90234375
    assert (torch.tensor(0.90234375, dtype=BF16) > t).item()     # not against 0.90234375
    _, want = upstream_step(logits, t, strict=True)
    _, _, model = step(logits, "model", True, decoding="threshold", threshold=t)
    assert model.tolist() == want.tolist() == [[True, True]]


def test_positions_whose_probabilities_tie_in_bfloat16_commit_the_leftmost():
    logits = rows([0.0, -0.84375], [0.0, -0.84765625])     # 0.69925 < 0.70008 in float32
    p, p32 = logits.softmax(-1)[0, :, 0], logits.float().softmax(-1)[0, :, 0]
    assert p[0] == p[1] == 0.69921875 and p32[0] < p32[1]
    _, want = upstream_step(logits, 0.9, strict=True)
    for decoding in ("threshold", "fixed", "dynamic"):
        _, _, model = step(logits, "model", True, decoding=decoding, threshold=0.9, steps=16)
        _, _, f32 = step(logits, "float32", True, decoding=decoding, threshold=0.9, steps=16)
        assert model.tolist() == want.tolist() == [[True, False]], decoding
        assert f32.tolist() == [[False, True]], decoding


def test_token_is_the_argmax_of_the_rounded_probabilities():
    # tokens 1 and 2: 2's logit is one bfloat16 step higher, their probabilities tie
    logits = rows([FAR, 2 ** -10, 2 ** -9, 0.0, 0.0])
    p = logits.softmax(-1)[0, 0]
    assert p[1] == p[2] and logits[0, 0, 2] > logits[0, 0, 1]
    want, _ = upstream_step(logits, 0.9, strict=True)
    x0, conf, _ = step(logits, "model", True, decoding="threshold")
    assert x0.tolist() == want.tolist() == [[1]] and conf[0, 0] == p[1].float()
    assert step(logits, "float32", True, decoding="threshold")[0].tolist() == [[2]]


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("strict", [True, False])
def test_random_rows_commit_what_upstream_commits_in_the_model_dtype(dtype, strict):
    g = torch.Generator().manual_seed(3)
    differ = 0
    for threshold in (0.9, 0.85, 0.5, 1.0):
        scale = torch.rand(64, 1, 1, generator=g) * 12        # flat to peaked rows
        logits = (torch.randn(64, 6, V, generator=g) * scale).to(dtype)
        logits[..., UNIT_MASK] = float("-inf")               # upstream's model never picks it
        x1, want = upstream_step(logits, threshold, strict)
        x0, _, model = step(logits, "model", strict, decoding="threshold", threshold=threshold)
        _, _, f32 = step(logits, "float32", strict, decoding="threshold", threshold=threshold)
        assert torch.equal(model, want) and torch.equal(x0[want], x1[want]), threshold
        differ += int((f32 != want).any(-1).sum())
    assert differ > 0                     # the float32 rule commits otherwise somewhere


def test_margin_and_entropy_are_dreams_formulas_in_the_model_dtype():
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(1, 6, V, generator=g) * 3).to(BF16)
    logits[..., UNIT_MASK] = float("-inf")
    p = logits.softmax(-1)
    top2 = p.sort(-1, descending=True).values
    margin = (top2[..., 0] - top2[..., 1]).float()
    negentropy = (p * torch.log(p + 1e-10)).sum(-1).float()
    assert torch.equal(step(logits, "model", True, remasking="margin")[1], margin)
    assert torch.equal(step(logits, "model", True, remasking="entropy")[1], negentropy)


def test_float32_rows_are_bit_for_bit_unchanged_beside_model_rows():
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(4, 6, V, generator=g) * 4).to(BF16)
    kinds = [dict(decoding="threshold", threshold=0.8), dict(remasking="margin", steps=32),
             dict(remasking="entropy", decoding="dynamic", threshold=0.5, steps=32),
             dict(temperature=0.7, decoding="ltr", threshold=0.7)]
    active = torch.ones(4, 6, dtype=torch.bool)
    k = torch.full((4,), 2)

    def run(dtypes):
        params = [GenerationParams(confidence_dtype=d, **kw) for d, kw in zip(dtypes, kinds)]
        gens = [torch.Generator().manual_seed(i) for i in range(4)]
        rk = RowKnobs(params, gens, UNIT_MASK, (), torch.device("cpu"), True)
        x0, conf, p_x0, _ = rk.choose(logits.clone(), [6] * 4)
        return x0, conf, p_x0, rk.select(conf, active, k)

    alone_f32, alone_model = run(["float32"] * 4), run(["model"] * 4)
    mixed = run(["float32", "model", "float32", "model"])
    for got, f32, model in zip(mixed, alone_f32, alone_model):
        assert torch.equal(got[0::2], f32[0::2]) and torch.equal(got[1::2], model[1::2])
    assert not torch.equal(alone_f32[1], alone_model[1])      # the rows did change


def test_model_dtype_of_a_float32_model_is_float32():
    logits = torch.randn(2, 6, V, generator=torch.Generator().manual_seed(9)) * 4
    for a, b in zip(step(logits, "model", True, decoding="threshold"),
                    step(logits, "float32", True, decoding="threshold")):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ the knob everywhere
def test_confidence_dtype_is_validated_and_round_trips():
    with pytest.raises(ValueError, match="confidence_dtype must be one of float32, model"):
        GenerationParams(confidence_dtype="bfloat16")
    p = GenerationParams(confidence_dtype="model")
    assert "confidence_dtype" in GenerationParams.field_names()
    assert GenerationParams.from_dict(p.to_dict()) == p
    assert request_params({"confidence_dtype": "model"}, GenerationParams()) == p
    body = CompletionRequest(prompt="x", confidence_dtype="model")
    assert body.generation_fields()["confidence_dtype"] == "model"
    args = build_parser().parse_args(["generate", "--prompt", "x",
                                      "--confidence-dtype", "model"])
    assert generation_overrides(args) == {"confidence_dtype": "model"}


# ------------------------------------------------------------------ the engine, in bfloat16
@pytest.fixture(scope="module")
def model():
    """tests/test_fastdllm_reference.py's tiny Fast-dLLM v2 layout, in bfloat16."""
    m = tiny_fastdllm()
    with torch.no_grad():
        m.lm_head.weight[STOP] *= 0.3
    m = m.to(BF16)
    # the engine packs a small model on CPU; the transcription then takes the same forward
    # (in bfloat16 the packed and module paths round differently)
    assert m.pack_for_inference()
    return m


class NeverMask:
    """The model as upstream sees it, from a checkpoint that never predicts [MASK] (a real
    one gives it ~0 probability; Celeris sets its logit to -inf): the softmax's denominator
    then holds the same terms in both, which bfloat16 rounding would otherwise show."""

    def __init__(self, model) -> None:
        self.model, self.config = model, model.config

    def __call__(self, ids, **kw):
        out = self.model(ids, **kw)
        out.logits[..., MASK] = float("-inf")
        return out


def _prompt(n: int) -> list[int]:
    return torch.randint(4, 96, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def _params(cap, threshold, cache, confidence_dtype):
    return GenerationParams(gen_length=cap, block_length=SMALL, decoding="threshold",
                            threshold=threshold, first_token="greedy", cache=cache,
                            confidence_dtype=confidence_dtype)


CASES = [(5, 0.9), (16, 0.9), (13, 0.3), (21, 0.5), (7, 1.0), (9, 0.5)]


@pytest.mark.parametrize("cache", ["prefix", "none"])
def test_model_confidences_equal_upstream_generate_in_bfloat16(model, cache):
    differ = []
    for prompt_len, threshold in CASES:
        prompt = _prompt(prompt_len)
        ref = upstream_generate(NeverMask(model), prompt, 48, threshold)
        assert len(ref) >= 40 and STOP not in ref
        got = {}
        for dtype in ("model", "float32"):
            outs = run_requests(bare_engine(model, MASK, PAD, (STOP,)),
                                [("r", prompt, _params(len(ref), threshold, cache, dtype), 0)])
            got[dtype] = list(outs["r"][-1].canvas)
        assert got["model"] == ref, (prompt_len, threshold)
        differ += [got["float32"] != ref]
    assert any(differ)                    # float32 confidences do not reproduce upstream


def test_model_rows_among_float32_rows_equal_alone(model):
    specs = [(7, 1.0, "model", "prefix"), (9, 0.5, "float32", "prefix"),
             (9, 0.5, "model", "none"), (13, 0.3, "float32", "none"), (5, 0.9, "model", "prefix")]
    reqs = [(f"r{i}", _prompt(n), _params(40, t, cache, d), 0)
            for i, (n, t, d, cache) in enumerate(specs)]
    together = run_requests(bare_engine(model, MASK, PAD, (STOP,)), reqs)
    for req in reqs:
        alone = run_requests(bare_engine(model, MASK, PAD, (STOP,)), [req])
        assert [o.canvas for o in together[req[0]]] == [o.canvas for o in alone[req[0]]]
