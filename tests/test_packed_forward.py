"""The decode-time forward (celeris/model/packed.py) computes what the module path computes.

The engine packs a small CPU model's weights (fused q/k/v and gate/up, oneDNN's blocked layout)
and every forward without gradients then runs the packed path; the module path stays the
reference and the training path. Here the two are held to the same logits (within float32
rounding) and the same greedy tokens, for each architecture family, in a padded mixed batch
through the block KV cache; the packed copy follows in-place parameter changes; and the AR
twin read as a block-causal model of block size 1 decodes exactly what transformers'
generate() decodes.
"""

from __future__ import annotations

import pytest
import torch

from celeris import ARBaseline, Engine, GenerationParams
from celeris.model.packed import (OneDNNProducts, PackedWeights, PlainProducts, onednn_available,
                                  onednn_supports)
from tests.test_bench_fixture import tiny_ar_dir
from tests.tiny_model import make_tiny_model_dir

PROMPTS = ["the quick brown fox", "Once", "def fib(n): return n if n < 2 else fib",
           "café naïve über the lazy dog jumps over"]
FAMILIES = {
    "celeris": dict(),                                                      # bidirectional
    "fast_dllm": dict(attention="block_causal", block_size=4, shift_logits=True,
                      qkv_bias=True, num_key_value_heads=2),
    "sdar": dict(attention="block_causal", block_size=4, qk_norm=True, head_dim=8),
}
PRODUCTS = [PlainProducts] + ([OneDNNProducts] if onednn_available() else [])


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory):
    path = make_tiny_model_dir(
        tmp_path_factory.mktemp(request.param) / "m",
        generation_defaults={"gen_length": 16, "temperature": 0.0, "decoding": "threshold",
                             "threshold": 0.3, "block_length": 4}, **FAMILIES[request.param])
    return Engine.from_pretrained(path, device="cpu")


def _logits(model, ids, **kw):
    with torch.inference_mode():
        return model(ids, **kw).logits


def test_the_engine_packs_a_small_cpu_model_and_skips_the_modules(engine):
    assert engine.packed and engine.model._packed is not None
    calls = []
    handle = engine.model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        engine.generate(PROMPTS[0], engine.default_params())
        assert calls == []                     # the packed path does not call the modules
        with torch.enable_grad():              # training: the module path
            engine.model(torch.tensor([[5, 6, 7, 8]]))
        assert calls == [1]
    finally:
        handle.remove()


@pytest.mark.parametrize("products", PRODUCTS, ids=lambda p: p.__name__)
def test_packed_logits_equal_the_module_path(engine, products):
    model = engine.model
    ids = torch.tensor([[5, 9, 3, 11, 2, 40, 7, 8, 12, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    index = torch.tensor([[0, 4, 9], [1, 2, 3]])
    model.unpack_inference()
    ref, ref_idx = _logits(model, ids), _logits(model, ids, logits_index=index)
    model._packed = PackedWeights(model, products)
    try:
        got, got_idx = _logits(model, ids), _logits(model, ids, logits_index=index)
    finally:
        model.pack_for_inference()
    assert model._packed.products in (OneDNNProducts, PlainProducts)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_idx, ref_idx, atol=2e-4, rtol=1e-4)
    gathered = ref.gather(1, index[..., None].expand(-1, -1, ref.shape[-1]))
    torch.testing.assert_close(got_idx, gathered, atol=2e-4, rtol=1e-4)


def test_a_bfloat16_model_packs_and_runs_on_a_cpu_without_onednn_bfloat16(tmp_path):
    """oneDNN's bfloat16 linear needs AVX-512 and raises on an AVX2-only CPU: packing then
    takes the plain products (a check that fails on either kind of CPU if the choice is
    wrong: forced oneDNN raises where unsupported)."""
    model = Engine.from_pretrained(make_tiny_model_dir(tmp_path / "m"), device="cpu").model
    model = model.to(torch.bfloat16)
    assert model.pack_for_inference()
    want = OneDNNProducts if onednn_supports(torch.bfloat16) else PlainProducts
    assert model._packed.products is want
    ids = torch.tensor([[5, 9, 3, 11]])
    got = _logits(model, ids)
    model.unpack_inference()
    ref = _logits(model, ids)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), ref.float(), atol=0.1, rtol=0.05)
    if not onednn_supports(torch.bfloat16):
        with pytest.raises(RuntimeError):
            PackedWeights(model, OneDNNProducts)


def test_greedy_tokens_match_the_module_path_alone_and_in_a_padded_batch(engine):
    params = engine.default_params().replace(gen_length=12, suppress_eos=True)
    packed_alone = [engine.generate(p, params).token_ids for p in PROMPTS]
    packed_batch = [r.token_ids for r in engine.generate_batch(PROMPTS, params)]
    engine.model.unpack_inference()
    try:
        module_alone = [engine.generate(p, params).token_ids for p in PROMPTS]
        module_batch = [r.token_ids for r in engine.generate_batch(PROMPTS, params)]
    finally:
        engine.model.pack_for_inference()
    assert packed_alone == module_alone
    assert packed_batch == module_batch
    assert all(len(t) == 12 for t in packed_alone)


def test_packed_weights_follow_an_in_place_parameter_change(engine):
    model = engine.model
    ids = torch.tensor([[5, 9, 3, 11, 2, 40]])
    before = _logits(model, ids)
    with torch.no_grad():
        saved = model.lm_head.weight.clone()
        model.lm_head.weight.mul_(2.0)
        model.model.layers[0].mlp.down_proj.weight.add_(0.1)
    try:
        after = _logits(model, ids)
        model.unpack_inference()
        reference = _logits(model, ids)
    finally:
        with torch.no_grad():
            model.lm_head.weight.copy_(saved)
            model.model.layers[0].mlp.down_proj.weight.sub_(0.1)
        model.pack_for_inference()
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, reference, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(_logits(model, ids), before, atol=1e-5, rtol=1e-5)


def test_autocast_takes_the_module_path(engine):
    """Training's held-out loss runs under CPU autocast (bfloat16): not a packed forward."""
    model = engine.model
    ids = torch.tensor([[5, 9, 3, 11, 2, 40]])
    calls = []
    handle = model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(ids).logits
    finally:
        handle.remove()
    assert calls == [1] and logits.dtype == torch.bfloat16
    ref = _logits(model, ids)                 # bfloat16 rounding, on a random model's logits
    assert (logits.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_a_model_over_the_size_limit_is_not_packed(engine):
    model = engine.model
    try:
        assert model.pack_for_inference(max_bytes=1) is False
        assert model._packed is None
    finally:
        assert model.pack_for_inference() is True


# ----------------------------------------------------------------- the AR twin at block size 1
@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("twin")
    return tiny_ar_dir(root / "ar", make_tiny_model_dir(root / "m"), seed=3)


def test_the_ar_twin_reads_as_a_block_causal_model_of_block_size_one(twin_dir):
    engine = Engine.from_pretrained(twin_dir, device="cpu")
    assert engine.block_causal and engine.block_size == 1
    assert engine.model.config.shift_logits and engine.packed


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "modules"])
def test_the_twin_in_the_block_engine_decodes_what_generate_decodes(twin_dir, packed):
    engine = Engine.from_pretrained(twin_dir, device="cpu")
    if not packed:
        engine.model.unpack_inference()
    ar = ARBaseline.from_pretrained(twin_dir)
    params = GenerationParams(gen_length=10, block_length=1, decoding="fixed", temperature=0.0,
                              seed=0)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    expected = [r["token_ids"] for r in ar.generate_batch(prompts, 10)]
    alone = [list(engine.generate(p, params).token_ids) for p in prompts]
    batch = [list(r.token_ids) for r in engine.generate_batch(prompts, params)]
    assert alone == expected
    assert batch == expected
    assert any(len(t) >= 5 for t in expected)        # not all stopped at once


def test_an_unsupported_llama_variant_is_refused_by_name(twin_dir, tmp_path):
    import json
    import shutil

    from celeris import ModelLoadError

    bad = tmp_path / "bad"
    shutil.copytree(twin_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="rope_type 'yarn' is not supported"):
        Engine.from_pretrained(bad, device="cpu")
