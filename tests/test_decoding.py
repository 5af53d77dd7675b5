"""Fast decoding: parallel unmask schedules, early stop and the block KV cache."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from celeris import CelerisConfig, CelerisForMaskedDiffusion, GenerationParams
from celeris.sampler.policies import SELECTORS, linear_schedule
from tests.engine_harness import bare_engine, finish, run_requests, submit

MASK, PAD = 3, 0
PROMPTS = [(5, 6, 7), (8, 9, 10, 11, 12), (13, 14, 15, 16, 17, 18, 19)]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = CelerisConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, mask_token_id=MASK, initializer_range=0.3)
    return CelerisForMaskedDiffusion(cfg).eval()


def run(model, params, stop=(2,), prompts=PROMPTS, seeds=(1, 2, 3), cache=None):
    engine = bare_engine(model, MASK, PAD, tuple(stop))
    params = params.replace(cache=cache or params.cache)
    steps = run_requests(engine, [(f"r{j}", p, params, s) for j, (p, s) in
                                  enumerate(zip(prompts, seeds))])
    return [steps[f"r{j}"] for j in range(len(prompts))]


def answer(canvas, stop):
    out = []
    for t in canvas:
        if t in stop or t == MASK:
            break
        out.append(t)
    return out


def test_linear_schedule_spreads_the_remainder_over_the_first_steps():
    assert linear_schedule(10, 4) == [3, 3, 2, 2]
    assert linear_schedule(32, 32) == [1] * 32
    assert sum(linear_schedule(7, 3)) == 7


@pytest.mark.parametrize("threshold", [0.05, 0.5, 0.99])
def test_threshold_decoding_commits_at_least_one_token_per_step_inside_the_block(model,
                                                                               threshold):
    params = GenerationParams(gen_length=32, block_length=8, decoding="threshold",
                              threshold=threshold, early_stop=False)
    for trace in run(model, params):
        prev_block = 0
        for out in trace:
            assert len(out.committed) >= 1
            blocks = {pos // 8 for pos in out.committed}
            assert len(blocks) == 1 and blocks.pop() >= prev_block
            prev_block = out.committed[0] // 8
        assert MASK not in trace[-1].canvas


def test_threshold_commits_everything_above_the_threshold():
    conf = torch.tensor([[0.95, 0.2, 0.91, float("-inf"), 0.5]])
    masked = torch.tensor([[True, True, True, False, True]])
    sel = SELECTORS["threshold"](conf, masked, torch.tensor([1]), torch.tensor([0.9]),
                                 torch.tensor([1.0]))
    assert sel.tolist() == [[True, False, True, False, False]]
    low = SELECTORS["threshold"](conf, masked, torch.tensor([1]), torch.tensor([0.99]),
                                 torch.tensor([1.0]))
    assert low.tolist() == [[True, False, False, False, False]]   # at least the best one


def test_factor_rule_commits_the_admissible_prefix():
    conf = torch.tensor([[0.99, 0.9, 0.6, 0.3]])
    masked = torch.ones(1, 4, dtype=torch.bool)
    # (n+1)(1-c_n): n=1 -> 0.02, n=2 -> 0.3, n=3 -> 1.6, n=4 -> 3.5
    sel = SELECTORS["factor"](conf, masked, torch.tensor([1]), torch.tensor([0.9]),
                              torch.tensor([1.0]))
    assert sel.tolist() == [[True, True, False, False]]


def test_fixed_schedule_commits_exactly_k(model):
    params = GenerationParams(gen_length=32, block_length=16, steps=8, early_stop=False)
    for trace in run(model, params):
        assert [len(o.committed) for o in trace] == [4] * 8


def test_fast_configurations_need_fewer_forwards(model):
    ref = GenerationParams(gen_length=32, block_length=8, early_stop=False)
    fast = ref.replace(decoding="threshold", threshold=0.3)
    assert max(t[-1].nfe for t in run(model, fast)) < min(t[-1].nfe for t in run(model, ref))


@pytest.mark.parametrize("decoding", ["fixed", "threshold"])
def test_early_stop_never_changes_the_text_only_the_nfe(model, decoding):
    base = GenerationParams(gen_length=64, block_length=8, decoding=decoding, threshold=0.3,
                            early_stop=False)
    full = run(model, base, stop=())
    # Call the most frequent committed token "EOS" so that it occurs early in most rows.
    common = Counter(t for trace in full for t in trace[-1].canvas).most_common(1)[0][0]
    stop = (common,)
    late = run(model, base, stop=stop)
    early = run(model, base.replace(early_stop=True), stop=stop)
    for a, b in zip(late, early):
        assert answer(a[-1].canvas, stop) == answer(b[-1].canvas, stop)
        assert b[-1].nfe <= a[-1].nfe
        assert b[-1].finish == "stop"
    assert sum(b[-1].nfe for b in early) < sum(a[-1].nfe for a in late)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_decoding_finishes_every_row_and_saves_compute(model, cache):
    params = GenerationParams(gen_length=32, block_length=8, steps=16, early_stop=False)
    exact = run(model, params)
    cached = run(model, params.replace(cache=cache))
    for a, b in zip(exact, cached):
        assert MASK not in b[-1].canvas and b[-1].nfe == a[-1].nfe == 16
        # the first step of every block is an exact refresh: it commits the same tokens
        assert b[0].canvas == a[0].canvas


def test_rows_with_different_settings_share_a_batch_and_match_their_solo_runs(model):
    mixed = [GenerationParams(gen_length=16, block_length=8, temperature=0.7, seed=None),
             GenerationParams(gen_length=32, block_length=8, decoding="threshold",
                              threshold=0.2),
             GenerationParams(gen_length=24, block_length=8, remasking="random", steps=6)]
    outs = run_requests(bare_engine(model, MASK, PAD, (2,)),
                        [(f"r{j}", PROMPTS[j], p, 10 + j) for j, p in enumerate(mixed)])
    final = {rid: steps[-1].canvas for rid, steps in outs.items()}
    for j, p in enumerate(mixed):
        solo = run(model, p, prompts=[PROMPTS[j]], seeds=[10 + j])[0][-1].canvas
        assert final[f"r{j}"] == solo


def test_a_request_can_join_a_running_batch_between_steps(model):
    params = GenerationParams(gen_length=16, block_length=8, temperature=0.5)
    engine, outs = bare_engine(model, MASK, PAD, (2,)), {}
    submit(engine, outs, "a", PROMPTS[0], params, 1)
    engine.run_step()
    submit(engine, outs, "b", PROMPTS[2], params, 2)
    finish(engine)
    final = {rid: steps[-1].canvas for rid, steps in outs.items()}
    assert final["a"] == run(model, params, prompts=[PROMPTS[0]], seeds=[1])[0][-1].canvas
    assert final["b"] == run(model, params, prompts=[PROMPTS[2]], seeds=[2])[0][-1].canvas


def test_top_k_and_top_p_filter_per_row_and_keep_the_best_token():
    from celeris.sampler.noise import filter_logits
    logits = torch.tensor([[[3.0, 2.0, 1.0, 0.0]] * 2, [[0.0, 1.0, 2.0, 3.0]] * 2])  # (2, 2, 4)
    out = filter_logits(logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.5]))
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [[True, True, False, False]] * 2        # top-2
    assert kept[1].tolist() == [[False, False, False, True]] * 2       # top-p 0.5: p(3)=0.64
    assert torch.equal(out[kept], logits[kept])


def test_sampling_with_top_p_runs_through_the_batch(model):
    params = GenerationParams(gen_length=16, block_length=8, temperature=1.0, top_p=0.9,
                              top_k=20)
    for trace in run(model, params):
        assert MASK not in trace[-1].canvas
