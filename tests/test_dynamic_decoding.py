"""decoding="dynamic": SDAR's low_confidence_dynamic rule (every masked position above the
threshold, and at least the schedule's count of the most confident ones), on hand-made
confidences, against a loop-by-loop transcription of SDAR's block generate() on a tiny random
SDAR-layout model, and among companions with other decodings in one batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import celeris
from celeris import CelerisForMaskedDiffusion, GenerationParams
from celeris.params import DECODINGS
from celeris.sampler.choose import RowKnobs
from celeris.sampler.policies import SELECTORS
from tests.engine_harness import bare_engine, run_requests
from tests.test_engine_core import PROMPTS, _mixed, block_model, canvas_model  # noqa: F401

MASK, PAD, STOP, BLOCK, VOCAB = 3, 0, 2, 8, 96
NEG = float("-inf")


def _select(conf, active, k, thresholds, decodings=None, strict=False):
    """RowKnobs.select for rows decoded with ``decodings`` (all "dynamic" by default)."""
    decodings = decodings or ["dynamic"] * len(thresholds)
    params = [GenerationParams(decoding=d, threshold=t) for d, t in zip(decodings, thresholds)]
    knobs = RowKnobs(params, [None] * len(params), MASK, (STOP,), torch.device("cpu"), strict)
    return knobs.select(torch.tensor(conf), torch.tensor(active), torch.tensor(k))


def _rows(transfer: torch.Tensor) -> list[list[int]]:
    return [row.nonzero().flatten().tolist() for row in transfer]


# ------------------------------------------------------------------ the rule on its own
def test_dynamic_is_a_decoding_name_and_an_unknown_one_lists_it():
    assert "dynamic" in DECODINGS and "dynamic" in SELECTORS
    with pytest.raises(ValueError, match=r"decoding must be one of .*ltr, dynamic; got 'sdar'"):
        GenerationParams(decoding="sdar")


def test_dynamic_commits_the_union_of_above_threshold_and_top_k_row_by_row():
    T = True
    conf = [[0.90, 0.80, 0.70, 0.10, 0.20, 0.30],    # 3 above 0.5 > k = 2: all three
            [0.65, 0.10, 0.50, 0.40, 0.30, 0.20],    # 1 above 0.6 < k = 3: the top 3
            [0.10, 0.90, 0.20, 0.80, 0.30, 0.40],    # exactly k = 2 above 0.5: those two
            [0.99, 0.20, 0.95, 0.90, 0.10, 0.97],    # 2 masked < k = 4: both, nothing else
            [0.40, 0.45, 0.30, 0.20, 0.10, 0.05]]    # k = 0 (schedule spent), none above
    active = [[T] * 6, [T] * 6, [T] * 6,
              [False, T, False, False, T, False], [T] * 6]
    transfer = _select(conf, active, [2, 3, 2, 4, 0], [0.5, 0.6, 0.5, 0.5, 0.5])
    assert _rows(transfer) == [[0, 1, 2], [0, 2, 3], [1, 3], [1, 4], []]


def test_dynamic_equals_a_per_row_transcription_of_sdars_rule_on_random_rows():
    g = torch.Generator().manual_seed(0)
    B, W = 64, 8
    conf = torch.rand(B, W, generator=g)
    active = torch.rand(B, W, generator=g) < 0.7
    k = torch.randint(0, W + 1, (B,), generator=g)
    thresholds = (torch.rand(B, generator=g) * 0.9 + 0.05).tolist()
    transfer = _select(conf.tolist(), active.tolist(), k.tolist(), thresholds)
    for b in range(B):
        masked = [i for i in range(W) if active[b, i]]
        high = [i for i in masked if conf[b, i] >= torch.tensor(thresholds[b])]
        if len(high) >= k[b]:
            expected = high
        else:
            expected = sorted(masked, key=lambda i: -float(conf[b, i]))[:int(k[b])]
        assert _rows(transfer[b:b + 1])[0] == sorted(expected)


def test_dynamic_agrees_with_threshold_at_one_a_step_and_differs_at_more():
    conf = [[0.95, 0.40, 0.30, 0.20]] * 2
    active = [[True] * 4] * 2
    rules = ["dynamic", "threshold"]
    one = _select(conf, active, [1, 1], [0.9, 0.9], rules)
    assert _rows(one) == [[0], [0]]
    three = _select(conf, active, [3, 3], [0.9, 0.9], rules)
    assert _rows(three) == [[0, 1, 2], [0]]


def test_dynamic_commits_strictly_above_the_threshold_where_the_batch_is_strict():
    conf = [[0.5, 0.5, 0.25, 0.125]]           # exactly representable: a tie with 0.5
    active = [[True] * 4]
    assert _rows(_select(conf, active, [1], [0.5])) == [[0, 1]]
    assert _rows(_select(conf, active, [1], [0.5], strict=True)) == [[0]]
    assert _rows(_select(conf, active, [3], [0.5], strict=True)) == [[0, 1, 2]]


# ------------------------------------------------------------------ SDAR's generate()
@pytest.fixture(scope="module")
def sdar_model():
    """A tiny random checkpoint laid out as SDAR (Qwen3 blocks with q/k norms, block-causal,
    logits not shifted), blocks of 8."""
    torch.manual_seed(0)
    cfg = celeris.SDARConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        tie_word_embeddings=False, initializer_range=0.5, block_size=BLOCK,
        mask_token_id=MASK)
    model = CelerisForMaskedDiffusion(cfg).eval()
    assert cfg.block_causal and not cfg.shift_logits and cfg.qk_norm
    with torch.no_grad():
        model.lm_head.weight[STOP] *= 1.5        # some answers end at a stop token
    return model


def sdar_generate(model, prompt: list[int], gen_length: int, steps: int, threshold: float,
                  seen: dict[str, int]) -> list[int]:
    """SDAR's block generate() with remasking_strategy="low_confidence_dynamic" for one
    sequence, spelled out loop by loop, at temperature 0.

    Upstream samples from softmax(logits / T); its T -> 0 limit is the argmax, with that
    token's softmax probability as the confidence. Upstream runs each block with a KV cache
    of the earlier blocks; block-causal attention makes recomputing the whole prefix equal to
    that, which is what this does. Its count per step comes from spreading the block length
    over ``steps`` (here the prompt fills whole blocks, so every block starts fully masked).
    One difference is Celeris's on purpose: [MASK] is never a prediction (its logit is -inf).
    ``seen`` counts the steps where the rule took more than the count ("more") and where it
    fell back to the top k with k > 1 and fewer than that above the threshold ("top_k")."""
    n_prompt = len(prompt)
    n_blocks = -(-(n_prompt + gen_length) // BLOCK)
    x = list(prompt) + [MASK] * (n_blocks * BLOCK - n_prompt)
    base, extra = divmod(BLOCK, steps)
    counts = [base + (1 if i < extra else 0) for i in range(steps)]
    for block in range(n_prompt // BLOCK, n_blocks):
        lo, hi = block * BLOCK, (block + 1) * BLOCK
        for step in range(steps + 1):
            masked = [i for i in range(lo, hi) if x[i] == MASK]
            if not masked:
                break
            assert step < steps                # each step commits at least its count
            with torch.no_grad():
                logits = model(torch.tensor([x[:hi]])).logits[0, lo:hi].float()
            logits[:, MASK] = NEG
            prob, token = logits.softmax(-1).max(-1)
            above = [i for i in masked if float(prob[i - lo]) > threshold]
            want = counts[step]
            if len(above) >= want:
                chosen = above
                seen["more"] += len(above) > want
            else:                                 # top k, at most every masked position
                chosen = sorted(masked, key=lambda i: -float(prob[i - lo]))[:want]
                seen["top_k"] += len(chosen) > 1
            for i in chosen:
                x[i] = int(token[i - lo])
        if STOP in x[n_prompt:]:                  # upstream stops after the block
            break
    answer = x[n_prompt:]
    return answer[:answer.index(STOP) + 1] if STOP in answer else answer


def _celeris(model, prompt, gen_length, steps, threshold, cache, decoding="dynamic"):
    params = GenerationParams(gen_length=gen_length, block_length=BLOCK, decoding=decoding,
                              steps=steps * gen_length // BLOCK, threshold=threshold,
                              cache=cache)
    result = bare_engine(model, MASK, PAD, (STOP,)).generate(prompt, params)
    return list(result.canvas), str(result.finish_reason)


def _matches(reference: list[int], canvas: list[int], finish: str) -> bool:
    if reference and reference[-1] == STOP:
        return finish == "stop" and canvas[:len(reference)] == reference
    return finish == "length" and canvas == reference


# (prompt length, steps per block, threshold): block 8, so k is 4, 3 or 2 at every step
SDAR_CASES = [(16, 2, 0.25), (8, 4, 0.5), (16, 3, 0.25)]


@pytest.mark.parametrize("prompt_len,steps,threshold", SDAR_CASES)
def test_dynamic_equals_sdars_generate_token_for_token(sdar_model, prompt_len, steps,
                                                       threshold):
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, VOCAB, (prompt_len,), generator=g).tolist()
    seen = {"more": 0, "top_k": 0}
    reference = sdar_generate(sdar_model, prompt, 48, steps, threshold, seen)
    assert seen["more"] > 0 and seen["top_k"] > 0      # both branches of the rule ran
    assert len(reference) >= 24
    for cache in ("prefix", "none"):                   # the exact KV cache, and none
        canvas, finish = _celeris(sdar_model, prompt, 48, steps, threshold, cache)
        assert _matches(reference, canvas, finish), cache
    for other in ("threshold", "fixed"):               # the transcription tells them apart
        canvas, finish = _celeris(sdar_model, prompt, 48, steps, threshold, "prefix", other)
        assert not _matches(reference, canvas, finish), other


# ------------------------------------------------------------------ batching and families
@pytest.mark.parametrize("family", ["block", "canvas"])
def test_a_dynamic_request_among_other_decodings_matches_its_solo_run(family, block_model,
                                                                     canvas_model):
    model = block_model if family == "block" else canvas_model
    cache = dict(cache="prefix") if family == "block" else {}
    dynamic = GenerationParams(gen_length=16, block_length=8, steps=8, decoding="dynamic",
                               threshold=0.2, **cache)      # 2 blocks, 4 steps each: k = 2
    prompt = (22, 23, 24, 25, 26, 27, 28, 29)
    companions = [(f"r{j}", PROMPTS[j], p, 10 + j)
                  for j, p in enumerate(_mixed(family == "block"))]
    together = run_requests(bare_engine(model, 3, 0, (2,)),
                            [*companions, ("dyn", prompt, dynamic, 0)])
    alone = run_requests(bare_engine(model, 3, 0, (2,)), [("dyn", prompt, dynamic, 0)])
    assert together["dyn"][-1].canvas == alone["dyn"][-1].canvas
    assert together["dyn"][-1].finish == alone["dyn"][-1].finish
    assert [o.committed for o in together["dyn"]] == [o.committed for o in alone["dyn"]]
    counts = [len(o.committed) for o in alone["dyn"]]
    assert max(counts) > 2 and min(counts) == 2     # ran ahead of k, and held to k


def test_diffusion_gemma_refuses_dynamic_naming_the_decoding_field():
    from celeris.families.gemma_layout import GemmaLayout

    layout = GemmaLayout(SimpleNamespace(canvas_length=8, vocab_size=16), MASK)
    layout.check(GenerationParams(block_length=8))
    with pytest.raises(ValueError, match=r"decoding must be 'fixed' for DiffusionGemma.*"
                                         r"got 'dynamic'"):
        layout.check(GenerationParams(block_length=8, decoding="dynamic"))
