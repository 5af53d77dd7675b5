"""Block diffusion decoding: the exact KV cache equals full recompute token for token, rows at
different blocks share a forward, max_tokens is a cap, EOS ends a request, the cache is static."""

from __future__ import annotations

import pytest
import torch

from celeris import Engine, GenerationParams
from tests.engine_harness import run_requests, write_runs
from tests.tiny_model import make_tiny_model_dir

PROMPTS = ["the quick brown fox", "Once", "def fib(n): return n if n < 2 else fib",
           "café naïve über the lazy dog jumps over"]
FAMILIES = {   # Fast-dLLM v2-shaped (q/k/v biases, shifted logits) and SDAR-shaped (q/k norm)
    "fast_dllm": dict(shift_logits=True, qkv_bias=True, num_key_value_heads=2),
    "sdar": dict(shift_logits=False, qk_norm=True, head_dim=8),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory):
    path = make_tiny_model_dir(
        tmp_path_factory.mktemp(request.param) / "m", attention="block_causal", block_size=4,
        generation_defaults={"gen_length": 24, "temperature": 0.0, "decoding": "threshold",
                             "threshold": 0.3}, **FAMILIES[request.param])
    return Engine.from_pretrained(path, device="cpu")


def _ids(results):
    return [r.token_ids for r in results]


@pytest.mark.parametrize("decoding,block_length", [("threshold", 4), ("fixed", 2),
                                                   ("factor", 4), ("ltr", 4)])
def test_cached_decode_equals_full_recompute_alone_and_in_a_mixed_batch(engine, decoding,
                                                                        block_length):
    params = engine.default_params().replace(decoding=decoding, block_length=block_length)
    cached = params.replace(cache="prefix")
    recompute = params.replace(cache="none")
    alone = [engine.generate(p, cached) for p in PROMPTS]
    assert _ids(alone) == [engine.generate(p, recompute).token_ids for p in PROMPTS]
    assert _ids(engine.generate_batch(PROMPTS, cached)) == _ids(alone)
    assert _ids(engine.generate_batch(PROMPTS, recompute)) == _ids(alone)
    assert sum(len(r.token_ids) for r in alone) > 20          # not a trivially empty answer


def test_defaults_of_a_block_causal_model_use_its_block_and_the_exact_cache(engine):
    p = engine.default_params()
    assert (p.block_length, p.cache) == (4, "prefix")
    assert engine.info()["context_length"] == 256


def test_cached_steps_forward_only_the_block_and_recompute_forwards_everything(engine):
    """After the prompt, a cached step's window is the block (+ the finished block being
    written, + one re-read column for shifted logits); recompute grows with the answer."""
    widths = {"prefix": [], "none": []}
    model = engine.model
    original = model.forward

    def spy(input_ids, **kw):
        widths[current].append(input_ids.shape[1])
        return original(input_ids, **kw)

    params = engine.default_params().replace(suppress_eos=True, gen_length=24)
    model.forward = spy
    try:
        for current in ("prefix", "none"):
            engine.generate(PROMPTS[2], params.replace(cache=current))
    finally:
        model.forward = original
    prompt_len = len(engine.tokenizer.encode_prompt(PROMPTS[2]))
    assert max(widths["prefix"][1:]) <= 2 * 4 + 1
    assert min(widths["prefix"][1:]) == 4   # the block alone once its first position is set
    assert widths["none"][-1] >= prompt_len + 20
    assert widths["none"] != widths["prefix"]


def test_max_tokens_is_a_cap_not_a_canvas(engine):
    for cap in (1, 5, 7):
        r = engine.generate(PROMPTS[0], engine.default_params().replace(
            gen_length=cap, suppress_eos=True))
        assert len(r.token_ids) == cap and r.finish_reason == "length"
        assert r.usage.completion_tokens == cap


def test_a_stop_token_ends_generation_before_the_cap(engine):
    eos = engine.special.stop[0]
    params = engine.default_params().replace(gen_length=64)
    biased = _with_bias(engine, eos, after=3)
    try:
        r = engine.generate(PROMPTS[1], params)
    finally:
        biased.remove()
    assert r.finish_reason == "stop"
    assert len(r.token_ids) < 8 and eos not in r.token_ids
    assert r.nfe < 64 // 4


def _with_bias(engine, token: int, after: int):
    """Make ``token`` the model's favourite at answer positions >= ``after`` (a hook)."""
    prompt_len = len(engine.tokenizer.encode_prompt(PROMPTS[1]))

    def hook(module, args, kwargs, out):
        pos = kwargs["position_ids"]
        idx = kwargs.get("logits_index")
        if idx is not None:
            pos = pos.gather(1, idx)
        out.logits[..., token] += torch.where(pos >= prompt_len + after, 1e4, 0.0)
        return out
    return engine.model.register_forward_hook(hook, with_kwargs=True)


def test_request_joining_mid_flight_gives_the_same_tokens_as_alone(engine):
    params = engine.default_params().replace(suppress_eos=True, gen_length=20)
    alone = {p: engine.generate(p, params).token_ids for p in PROMPTS[:2]}
    results = {}

    def sink(item):
        if hasattr(item, "token_ids"):
            results[item.request_id] = item.token_ids
    engine.submit(PROMPTS[0], params, "0", None, sink)
    for _ in range(3):
        engine.run_step()
    engine.submit(PROMPTS[1], params, "1", None, sink)
    while engine.scheduler.has_work:
        engine.run_step()
    assert results == {"0": alone[PROMPTS[0]], "1": alone[PROMPTS[1]]}


def test_kv_cache_is_allocated_once_and_slots_are_reused(engine):
    params = engine.default_params().replace(gen_length=8)
    engine.generate_batch(PROMPTS, params)
    kv = engine._kv
    before = (kv.capacity, kv.k[0].data_ptr())
    for _ in range(3):
        engine.generate_batch(PROMPTS[:3], params)
        engine.generate(PROMPTS[0], params)
    assert (kv.capacity, kv.k[0].data_ptr()) == before
    assert sorted(kv.free) == list(range(kv.capacity))


def test_attention_reads_the_slots_in_place_and_masks_what_lies_past_a_row(engine):
    """Keys are read from the slot storage itself (no per-layer copy), and whatever a slot
    holds past a row's current block (another request's leftovers) never reaches the answer."""
    params = engine.default_params()
    want = [engine.generate(p, params.replace(cache="none")).token_ids for p in PROMPTS]
    engine.generate_batch(PROMPTS, params)
    kv = engine._kv
    for buffers in (kv.k, kv.v):
        for buf in buffers:
            buf.normal_(0, 1e3)                 # loud garbage everywhere
    assert _ids(engine.generate_batch(PROMPTS, params)) == want
    view = kv.bind([0, 1], [6, 9], write_runs([(0, 0, 0, 5), (1, 0, 1, 8)]))
    k, v = view.update(0, torch.zeros(2, kv.shape[0], 1, kv.shape[2]),
                       torch.ones(2, kv.shape[0], 1, kv.shape[2]))
    assert k.data_ptr() == kv.k[0].data_ptr() and k.shape[2] == 9     # a view, 9 keys
    assert view.key_mask.tolist() == [[True] * 6 + [False] * 3, [True] * 9]
    assert float(kv.v[0][1, :, 8].min()) == 1.0 and float(kv.k[0][0, :, 5].abs().max()) == 0.0


def test_block_length_must_divide_the_model_block(engine):
    with pytest.raises(ValueError, match=r"block_length must divide the model's block size 4 "
                                         r"\(one of 1, 2, 4\), got 3"):
        engine.generate("x", engine.default_params().replace(block_length=3, gen_length=6))


def test_non_finite_logits_fail_the_request_with_a_clear_error(engine):
    def hook(module, args, kwargs, out):
        out.logits[0] = float("nan")
        return out
    handle = engine.model.register_forward_hook(hook, with_kwargs=True)
    try:
        with pytest.raises(RuntimeError, match="non-finite"):
            engine.generate("hello", engine.default_params())
    finally:
        handle.remove()


def test_block_batch_canvas_grows_block_by_block_up_to_the_cap(engine):
    params = GenerationParams(gen_length=9, block_length=4, suppress_eos=True, cache="none")
    outs = run_requests(engine, [("a", engine.tokenizer.encode_prompt("Once"), params, 0)])
    lengths = [len(out.canvas) for out in outs["a"]]
    assert lengths[-1] == 9 and lengths == sorted(lengths)


def test_prefix_decoding_commits_a_confident_run_from_the_left():
    """decoding="ltr": the leftmost masked position, then the masked positions after it
    while their confidence passes the threshold; committed positions are skipped over."""
    from celeris.sampler.policies import LeftToRightThreshold
    conf = torch.tensor([[0.9, 0.8, 0.2, 0.95],      # run of two, stops at 0.2
                         [0.1, 0.9, 0.9, 0.9],       # leftmost below: it alone
                         [0.0, 0.9, 0.1, 0.9],       # position 0 committed already
                         [0.9, 0.9, 0.9, 0.9]])
    masked = torch.tensor([[True, True, True, True], [True, True, True, True],
                           [False, True, False, True], [False, False, False, False]])
    got = LeftToRightThreshold()(conf, masked, None, torch.full((4,), 0.5), None)
    assert got.tolist() == [[True, True, False, False], [True, False, False, False],
                            [False, True, False, True], [False, False, False, False]]


def test_prefix_decoding_at_threshold_one_is_left_to_right_greedy(engine):
    """Nothing passes a threshold of 1.0, so each step commits the leftmost position only:
    the same tokens as the reference schedule one position at a time (block length 1)."""
    base = engine.default_params().replace(gen_length=12)
    prefix = base.replace(decoding="ltr", threshold=1.0)
    ltr = base.replace(decoding="fixed", block_length=1, steps=12)
    for p in PROMPTS:
        a, b = engine.generate(p, prefix), engine.generate(p, ltr)
        assert a.token_ids == b.token_ids and a.nfe == b.nfe
    fast = base.replace(decoding="ltr", threshold=0.01, suppress_eos=True)
    runs = [engine.generate(p, fast) for p in PROMPTS]
    assert sum(r.nfe for r in runs) < sum(len(r.token_ids) for r in runs)   # runs per forward


def test_kv_cache_slots_start_short_and_grow_with_the_longest_request(engine, monkeypatch):
    """A slot starts at INITIAL_CACHE_LEN positions, not the whole context; a request that
    reaches past it doubles every slot's length mid-flight, keeping what was cached."""
    from celeris.families import layouts
    monkeypatch.setattr(layouts, "INITIAL_CACHE_LEN", 8)
    fresh = Engine(engine.model, engine.tokenizer, engine.model_dir, engine.config)
    params = fresh.default_params()
    want = [engine.generate(p, params.replace(cache="none")).token_ids for p in PROMPTS]
    assert _ids(fresh.generate_batch(PROMPTS, params)) == want
    kv = fresh._kv
    assert kv.max_len == 256 + 4                       # the model's context + one block
    assert 8 < kv.length < kv.max_len and kv.k[0].shape[2] == kv.length
    assert max(len(w) for w in want) > 8               # the answers alone passed 8 positions


def test_kv_cache_refuses_a_position_past_the_context():
    from celeris.cache import SlotKVCache
    kv = SlotKVCache(1, 1, 2, max_len=8, dtype=torch.float32, device=torch.device("cpu"),
                     slots=1, length=4)
    kv.bind([0], [8], [(0, 0, 0, 4, 4)])
    assert kv.length == 8
    with pytest.raises(ValueError, match=r"position 8 is past the model's context \(8 positions\)"):
        kv.bind([0], [9], [(0, 0, 0, 8, 1)])
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        SlotKVCache(1, 1, 2, 8, torch.float32, torch.device("cpu"), length=0)


@pytest.mark.parametrize("max_runs", [0, 4])
def test_slice_and_index_cache_writes_store_the_same_keys(monkeypatch, max_runs):
    """Few write runs go in as slice copies, many by index (``MAX_SLICE_RUNS``): both paths
    leave every slot as writing each column by hand would."""
    from celeris import cache
    monkeypatch.setattr(cache, "MAX_SLICE_RUNS", max_runs)
    kv = cache.SlotKVCache(1, 2, 3, max_len=32, dtype=torch.float32, device=torch.device("cpu"),
                           slots=3, length=16)
    writes = [(0, 1, 2, 4), (0, 2, 2, 5), (1, 0, 0, 9), (1, 1, 0, 10), (1, 2, 0, 11)]
    k, v = torch.randn(2, 2, 3, 3), torch.randn(2, 2, 3, 3)                # (B, Hkv, W, D)
    view = kv.bind([2, 0], [6, 12], write_runs(writes))
    assert (view._index is None) == (max_runs > 0)
    view.update(0, k, v)
    for row, col, slot, pos in writes:
        assert torch.equal(kv.k[0][slot, :, pos], k[row, :, col])
        assert torch.equal(kv.v[0][slot, :, pos], v[row, :, col])
