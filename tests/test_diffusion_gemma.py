"""DiffusionGemma against transformers' own implementation (``transformers.models.
diffusion_gemma``, shipped with transformers 5.24): a tiny random checkpoint is built with
transformers' classes and ``save_pretrained`` and loaded into transformers' model by Celeris's
loader (every weight accounted for); Celeris's cache handling (per-request caches, rows of
different lengths padded into one decoder forward) is held to transformers' own calls, and
the engine to transformers' ``generate()`` token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from celeris import Engine, GenerationParams, ModelLoadError, load_model
from celeris.model import DiffusionGemma
from tests.tiny_model import write_family_tokenizer

transformers = pytest.importorskip("transformers")
from transformers import DiffusionGemmaConfig as HFConfig  # noqa: E402
from transformers import DiffusionGemmaForBlockDiffusion as HFModel  # noqa: E402
from transformers import LogitsProcessor  # noqa: E402

SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
CANVAS = 8
# sliding window 6: a prompt of 11 tokens and later canvases reach past it
TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
            num_experts=4, top_k_experts=2, moe_intermediate_size=16, sliding_window=6,
            layer_types=["sliding_attention", "full_attention", "sliding_attention",
                         "full_attention"], max_position_embeddings=512,
            pad_token_id=0, eos_token_id=1, bos_token_id=2)
VISION = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8)
SAMPLER = {"max_denoising_steps": 6, "t_min": 0.4, "t_max": 0.8,
           "sampler_config": {"entropy_bound": 0.5, "_cls_name": "EntropyBoundSamplerConfig"},
           "stability_threshold": 1, "confidence_threshold": 0.05}


def write_tiny_diffusion_gemma(path: Path, seed: int = 0, canvas: int = CANVAS,
                               text: dict | None = None, eos_boost: float = 1.0,
                               sampler: dict | None = None) -> Path:
    """A random DiffusionGemma in transformers' own format: tokenizer (Gemma's pad/eos/bos
    ids 0/1/2), config.json, model.safetensors and the sampler's generation_config.json.
    ``eos_boost`` scales EOS's (tied) embedding row, making EOS likelier."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_family_tokenizer(path, SPECIALS, eos_token="<eos>", pad_token="<pad>",
                                   bos_token="<bos>")
    cfg = HFConfig(text_config={**TEXT, **(text or {}), "vocab_size": len(vocab)},
                   vision_config=VISION, canvas_length=canvas)
    torch.manual_seed(seed)
    model = HFModel(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():        # weights large enough that the sampler has work to do
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight", "_1.weight", "_2.weight",
                              "scale")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):     # the encoder's and the decoder's differ
                b.copy_(0.6 + 0.8 * torch.rand(b.shape, generator=g))
        model.model.decoder.embed_tokens.weight[1] *= eos_boost
    model.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps({**SAMPLER, **(sampler or {})}),
                                                 encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dgemma") / "tiny-dgemma")


@pytest.fixture(scope="module")
def pair(ckpt):
    """(transformers' model, Celeris's model), both from the saved files, float32."""
    ref = HFModel.from_pretrained(str(ckpt)).eval()
    ours, _ = load_model(ckpt, device="cpu", dtype="float32")
    return ref, ours


def _ids(vocab: int, L: int, B: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, vocab, (B, L), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------ model level
def test_the_model_is_transformers_own_loaded_with_every_weight(pair):
    ref, ours = pair
    c = ours.config
    assert isinstance(ours, DiffusionGemma) and type(ours.hf) is HFModel
    assert (c.canvas_length, c.block_size, c.block_causal, c.sliding_window) == (CANVAS, CANVAS,
                                                                                 True, 6)
    assert c.mask_token_id == c.vocab_size        # no real token is the "not final" marker
    got, want = ours.hf.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    enc = ours.hf.model.encoder.language_model.layers[0].layer_scalar
    assert not torch.equal(enc, ours.hf.model.decoder.layers[0].layer_scalar)


def test_canvases_through_the_cache_equal_the_reference_calls(pair):
    """Three canvases: each encoded into the cache after the prompt (positions past the
    sliding window), each denoised twice, the second time conditioned on the first logits;
    Celeris's encode/stack/denoise equal transformers' own calls as its generate() makes them."""
    ref, ours = pair
    V = ours.config.vocab_size
    prompt = _ids(V, 11)
    ref_cache = ours_cache = None
    todo = prompt
    for block in range(3):
        canvas = _ids(V, CANVAS, seed=10 + block)
        with torch.no_grad():
            start = 0 if ref_cache is None else ref_cache.get_seq_length(1)   # a full layer
            pos = torch.arange(start, start + todo.shape[1])[None]
            ref_cache = ref.model.encoder(input_ids=todo, cache=ref_cache, position_ids=pos).cache
            first = ref(decoder_input_ids=canvas, cache=ref_cache).logits
            second = ref(decoder_input_ids=canvas, cache=ref_cache,
                         self_conditioning_logits=first / 0.7).logits
        ours_cache = ours.encode(todo, ours_cache)
        assert ours_cache.length == ref_cache.get_seq_length(1)
        at = torch.arange(ours_cache.length, ours_cache.length + CANVAS)[None]
        batch = ours.stack([ours_cache])
        got1 = ours.denoise(canvas, at, batch)
        got2 = ours.denoise(canvas, at, batch, first / 0.7)
        torch.testing.assert_close(got1, first, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got2, second, atol=2e-5, rtol=1e-5)
        assert first.std() > 1.0                                # not a degenerate model
        assert not torch.allclose(got1, got2, atol=1e-3)     # self-conditioning matters
        todo = first.argmax(-1)
    # the sliding layers keep only the window's last positions, the full layers all
    assert ours_cache.layer(0)[0].shape[2] == 5
    assert ours_cache.layer(1)[0].shape[2] == 11 + 2 * CANVAS


def test_rows_of_different_lengths_share_one_decoder_forward(pair):
    """Requests whose caches differ in length (shorter and longer than the sliding window)
    are padded into one batch; each row's logits equal its forward alone, with and without
    self-conditioning on some rows only."""
    _, ours = pair
    V = ours.config.vocab_size
    caches = [ours.encode(_ids(V, n, seed=n)) for n in (3, 11, 7)]
    caches[2] = ours.encode(_ids(V, CANVAS, seed=99), caches[2])        # a later canvas
    canvas = _ids(V, CANVAS, B=3, seed=5)
    at = torch.stack([torch.arange(c.length, c.length + CANVAS) for c in caches])
    sc = torch.randn(3, CANVAS, V, generator=torch.Generator().manual_seed(4)) * 3
    rows = torch.tensor([True, False, True])
    batch = ours.stack(caches)
    assert batch[1] is not None                                        # padding was needed
    together = ours.denoise(canvas, at, batch, sc, rows)
    for b, cache in enumerate(caches):
        alone = ours.denoise(canvas[b:b + 1], at[b:b + 1], ours.stack([cache]),
                             sc[b:b + 1] if rows[b] else None)
        torch.testing.assert_close(together[b:b + 1], alone, atol=2e-5, rtol=1e-5)


def test_encoder_copies_of_tied_weights_load_like_the_decoder_names(ckpt, tmp_path, pair):
    """A checkpoint saved from the encoder's side of the ties loads to the same model."""
    from safetensors.torch import load_file, save_file
    state = load_file(str(ckpt / "model.safetensors"))
    renamed = {}
    for k, v in state.items():
        if k.startswith("model.decoder.layers.") and not k.endswith("layer_scalar"):
            k = k.replace("model.decoder.", "model.encoder.language_model.", 1)
        renamed[k] = v
    (tmp_path / "alt").mkdir()
    for f in ("config.json", "generation_config.json"):
        (tmp_path / "alt" / f).write_text((ckpt / f).read_text())
    save_file(renamed, str(tmp_path / "alt" / "model.safetensors"))
    alt, _ = load_model(tmp_path / "alt", device="cpu")
    _, ours = pair
    for (n, a), (_, b) in zip(alt.hf.state_dict().items(), ours.hf.state_dict().items()):
        assert torch.equal(a, b), n


def test_missing_weight_and_unsupported_options_are_refused_by_name(ckpt, tmp_path):
    from safetensors.torch import load_file, save_file
    (tmp_path / "m").mkdir()
    state = load_file(str(ckpt / "model.safetensors"))
    del state["model.decoder.layers.1.router.per_expert_scale"]
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="layers.1.router.per_expert_scale"):
        load_model(tmp_path / "m", device="cpu")
    state = load_file(str(ckpt / "model.safetensors"))
    state["model.decoder.layers.1.router.extra_scale"] = torch.ones(2)
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="unexpected.*layers.1.router.extra_scale"):
        load_model(tmp_path / "m", device="cpu")
    raw = json.loads((ckpt / "config.json").read_text())
    raw["text_config"]["use_bidirectional_attention"] = "all"
    (tmp_path / "m" / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match="use_bidirectional_attention must be null or "
                                             "'vision'"):
        load_model(tmp_path / "m", device="cpu")


# ------------------------------------------------------------------ generation
class ArgmaxOnly(LogitsProcessor):
    """For the reference's generate(): every logit but the best is -inf, so its sampler
    draws the argmax, its entropies are 0 and its self-conditioning is one-hot: the
    vanishing-temperature limit, which Celeris runs at temperature 0."""

    def __call__(self, input_ids, scores, cur_step=None):
        best = scores.argmax(-1, keepdim=True)
        return torch.full_like(scores, float("-inf")).scatter(-1, best, scores.gather(-1, best))


PROMPT = torch.randint(5, 300, (11,), generator=torch.Generator().manual_seed(1)).tolist()
GEN = 4 * CANVAS


@pytest.fixture(scope="module")
def eos_ckpt(tmp_path_factory) -> Path:
    """EOS made likelier (some answers stop inside a canvas, some run to the cap), and an
    adaptive stop the sampled runs can meet (no stability steps, a confidence threshold
    between the canvases' mean entropies), so some canvases end before the step cap."""
    return write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dgemma") / "tiny-dgemma-eos",
                                      eos_boost=1.4, sampler={"confidence_threshold": 2.0,
                                                              "stability_threshold": 0})


@pytest.fixture(scope="module")
def engine_and_ref(eos_ckpt):
    return (Engine.from_pretrained(eos_ckpt, device="cpu", dtype="float32"),
            HFModel.from_pretrained(str(eos_ckpt)).eval())


def _canvases(result, gen: int) -> int:
    n = len(result.token_ids)
    return n // CANVAS + 1 if result.finish_reason.value == "stop" else -(-gen // CANVAS)


def reference(ref, prompt: list[int], gen: int, seed: int, greedy: bool, **kw
              ) -> tuple[list[int], int]:
    """The reference generate()'s answer (before the first EOS, at most ``gen`` tokens) and
    its decoder forward count, seeded like Celeris's request generator."""
    torch.manual_seed(seed)
    if greedy:
        kw["logits_processor"] = transformers.LogitsProcessorList([ArgmaxOnly()])
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=gen, eos_token_id=1,
                       pad_token_id=0, **kw)
    new = out.sequences[0, len(prompt):].tolist()
    cut = new.index(1) if 1 in new else len(new)
    valid = sum(1 for t in new if t != 0)
    return new[:min(cut, gen)], round(valid / float(out.tokens_per_forward[0]))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generate_equals_the_reference_generate_token_for_token(engine_and_ref, temperature):
    """Temperature 1 is the checkpoint's sampler as published (linear temperature schedule,
    multinomial draws, entropy-bound acceptance, renoising, adaptive stop); both sides draw
    from a generator seeded with the request's seed in the same order, so the sampled runs
    are deterministic and comparable. Temperature 0 is compared with the reference run
    through ``ArgmaxOnly``. Both: the same tokens and the same number of decoder forwards."""
    engine, ref = engine_and_ref
    finishes, early = set(), 0
    for seed in range(4):
        params = engine.default_params().replace(gen_length=GEN, seed=seed,
                                                 temperature=temperature)
        got = engine.generate(PROMPT, params)
        want, forwards = reference(ref, PROMPT, GEN, seed, greedy=temperature == 0)
        assert list(got.token_ids) == want, seed
        assert got.nfe == forwards, seed
        finishes.add(got.finish_reason.value)
        steps = SAMPLER["max_denoising_steps"] * _canvases(got, GEN)
        early += got.nfe < steps
        assert got.nfe <= steps
    assert finishes == {"stop", "length"}           # EOS inside a canvas, and the cap
    assert engine.default_params().temperature == 1.0
    assert early > 0                                # the adaptive stop ended some canvases


def test_stability_rule_runs_like_the_reference(ckpt):
    """The published default of one stability step (the argmax must repeat), on the
    first checkpoint, sampled and at temperature 0."""
    engine = Engine.from_pretrained(ckpt, device="cpu", dtype="float32")
    ref = HFModel.from_pretrained(str(ckpt)).eval()
    assert engine.layout.sampler["stability_threshold"] == 1
    for seed, temperature in ((0, 1.0), (2, 0.0)):
        params = engine.default_params().replace(gen_length=2 * CANVAS, seed=seed,
                                                 temperature=temperature)
        got = engine.generate(PROMPT, params)
        want, forwards = reference(ref, PROMPT, 2 * CANVAS, seed, greedy=temperature == 0)
        assert (list(got.token_ids), got.nfe) == (want, forwards)


def test_given_steps_cap_each_canvas_like_max_denoising_steps(engine_and_ref):
    engine, ref = engine_and_ref
    blocks = GEN // CANVAS
    params = engine.default_params().replace(gen_length=GEN, seed=4, steps=3 * blocks)
    got = engine.generate(PROMPT, params)
    want, forwards = reference(ref, PROMPT, GEN, 4, greedy=False, max_denoising_steps=3)
    assert list(got.token_ids) == want and got.nfe == forwards <= 3 * blocks


def test_a_batch_decodes_each_request_as_alone(engine_and_ref):
    """Rows at different canvases and prompt lengths share the decoder forward (caches
    right-padded and masked; the logits are compared in
    test_rows_of_different_lengths_share_one_decoder_forward): at temperature 0 every row
    gives its solo tokens in its solo number of forwards."""
    engine, _ = engine_and_ref
    prompts = [PROMPT, PROMPT[:4], PROMPT[:9] + [7, 8, 9, 10, 11]]
    for seeds in ((0, 3, 5),):
        params = [engine.default_params().replace(gen_length=GEN, seed=s, temperature=0.0)
                  for s in seeds]
        batch = engine.generate_batch(prompts, params)
        alone = [engine.generate(p, q) for p, q in zip(prompts, params)]
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
        assert [r.nfe for r in batch] == [r.nfe for r in alone]


def test_stream_commits_canvas_by_canvas_and_ends_with_the_result(engine_and_ref):
    engine, _ = engine_and_ref
    params = engine.default_params().replace(gen_length=GEN, seed=0, temperature=1.0,
                                             suppress_eos=True)
    items = list(engine.stream(PROMPT, params))
    events, result = items[:-1], items[-1]
    assert result.finish_reason.value == "length" and len(result.token_ids) == GEN
    assert 1 not in result.token_ids                      # suppress_eos honoured
    commits = [e for e in events if e.committed]
    assert [len(e.committed) for e in commits] == [CANVAS] * (GEN // CANVAS)
    assert all(e.block == i for i, e in enumerate(commits))
    assert len(events) == result.nfe and events[-1].text == result.text
    texts = [e.text for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    # a canvas in progress shows the sampler's draft (its argmax) as tokens, not masks, each
    # listed in ``draft``; nothing of it is in the text before the canvas is accepted
    mask, final = engine.special.mask, list(result.token_ids)
    drafts = [e for e in events if not e.committed]
    assert len(drafts) == len(events) - GEN // CANVAS > 0
    for e in drafts:
        span = range(CANVAS * e.block, CANVAS * (e.block + 1))
        assert e.draft == tuple(span) and len(e.canvas) == span.stop
        assert mask not in e.canvas and e.num_masked == CANVAS
        assert list(e.canvas[:span.start]) == final[:span.start]     # the accepted canvases
        assert e.text == result.text[:len(e.text)]
    assert all(e.draft == () and mask not in e.canvas for e in commits)
    # the drafts change from step to step, and the accepted canvas is the last draft's
    # successor (its argmax), not a mask that disappears
    pairs = [(a, b) for a, b in zip(events, events[1:]) if a.draft and b.block == a.block]
    assert sum(a.canvas != b.canvas for a, b in pairs) > 0
    assert any(list(a.canvas[a.draft[0]:]) != final[a.draft[0]:a.draft[-1] + 1] for a in drafts)


@pytest.mark.parametrize("change, words", [
    ({"block_length": 4}, "block_length must be the model's canvas_length \\(8\\)"),
    ({"top_k": 5}, "top_k must be 0 for DiffusionGemma"),
    ({"top_p": 0.9}, "top_p must be 1.0 for DiffusionGemma"),
    ({"cfg_scale": 1.0, "cache": "none"}, "cfg_scale must be 0 for DiffusionGemma"),
    ({"cache": "dual"}, "cache must be 'prefix' or 'none'"),
    ({"decoding": "threshold"}, "decoding must be 'fixed' for DiffusionGemma"),
    ({"remasking": "margin"}, "remasking must be 'low_confidence' for DiffusionGemma"),
    ({"threshold": 0.5}, "threshold must be left unset \\(0.9\\) for DiffusionGemma"),
    ({"factor": 2.0}, "factor must be left unset \\(1.0\\) for DiffusionGemma"),
    ({"edit_threshold": 0.5}, "edit_threshold must be unset for DiffusionGemma"),
    ({"confidence_dtype": "model"}, "confidence_dtype must be 'float32' for DiffusionGemma"),
])
def test_unsupported_request_options_are_refused_by_name(engine_and_ref, change, words):
    engine, _ = engine_and_ref
    with pytest.raises(ValueError, match=words):
        engine.generate(PROMPT, engine.default_params().replace(gen_length=8, **change))


def test_info_names_the_family_and_the_canvas(engine_and_ref):
    engine, _ = engine_and_ref
    info = engine.info()
    assert (info["family"], info["architecture"], info["attention"], info["block_size"]) == \
        ("DiffusionGemma", "diffusion_gemma", "block_causal", CANVAS)


def test_temperature_zero_without_a_seed_is_deterministic(engine_and_ref):
    engine, _ = engine_and_ref
    params = engine.default_params().replace(gen_length=2 * CANVAS, temperature=0.0)
    first, second = engine.generate(PROMPT, params), engine.generate(PROMPT, params)
    assert first.token_ids == second.token_ids and first.seed == second.seed == 0
    sampled = engine.default_params().replace(gen_length=2 * CANVAS, temperature=1.0)
    seeds = {engine.generate(PROMPT, sampled).seed for _ in range(2)}
    assert len(seeds) == 2                  # sampled requests without a seed still get fresh ones
