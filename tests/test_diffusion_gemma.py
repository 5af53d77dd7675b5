"""DiffusionGemma against transformers' own implementation (``transformers.models.
diffusion_gemma``, shipped with transformers 5.24): a tiny random checkpoint is built with
transformers' classes and ``save_pretrained``, loaded by Celeris's loader, and held to the
reference's logits (encoder + decoder, with a cache, sliding and full layers, experts,
self-conditioning) and to its ``generate()`` token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from celeris import Engine, GenerationParams, ModelLoadError, load_model
from celeris.model import DiffusionGemmaForBlockDiffusion
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
                               text: dict | None = None) -> Path:
    """A random DiffusionGemma in transformers' own format: tokenizer (Gemma's pad/eos/bos
    ids 0/1/2), config.json, model.safetensors and the sampler's generation_config.json."""
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
    model.save_pretrained(str(path))
    (path / "generation_config.json").write_text(json.dumps(SAMPLER), encoding="utf-8")
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
def test_config_is_read_from_the_reference_config_json(pair):
    _, ours = pair
    c = ours.config
    assert isinstance(ours, DiffusionGemmaForBlockDiffusion)
    assert (c.canvas_length, c.block_size, c.block_causal, c.sliding_window) == (CANVAS, CANVAS,
                                                                                 True, 6)
    assert [c.layer_shape(i) for i in range(4)] == [(8, 2, True), (16, 1, False), (8, 2, True),
                                                    (16, 1, False)]
    assert c.mask_token_id == c.vocab_size        # no real token is the "not final" marker
    assert ours.model.decoder.layers[1].self_attn.v_proj is None     # keys double as values
    enc = ours.model.encoder.language_model.layers[0].layer_scalar
    assert not torch.equal(enc, ours.model.decoder.layers[0].layer_scalar)


def test_first_canvas_logits_equal_the_reference(pair):
    ref, ours = pair
    V = ours.config.vocab_size
    prompt, canvas = _ids(V, 11, B=2), _ids(V, CANVAS, B=2, seed=2)
    with torch.no_grad():
        want = ref(input_ids=prompt, decoder_input_ids=canvas).logits
    got = ours(input_ids=prompt, decoder_input_ids=canvas).logits
    assert got.shape == want.shape == (2, CANVAS, V)
    assert want.std() > 1.0                       # not a degenerate model
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_self_conditioned_steps_and_later_canvases_through_the_cache_equal_the_reference(pair):
    """Three canvases: each encoded into the cache after the prompt (positions past the
    sliding window), each denoised twice, the second time conditioned on the first logits."""
    ref, ours = pair
    V = ours.config.vocab_size
    prompt = _ids(V, 11)
    ref_cache = ours_cache = None
    todo = prompt
    for block in range(3):
        canvas = _ids(V, CANVAS, seed=10 + block)
        with torch.no_grad():
            if ref_cache is None:
                ref_cache = ref.model.encoder(input_ids=todo).cache
            else:
                start = ref_cache.get_seq_length()
                pos = torch.arange(start, start + todo.shape[1])[None]
                ref_cache = ref.model.encoder(input_ids=todo, cache=ref_cache,
                                              position_ids=pos).cache
            first = ref(decoder_input_ids=canvas, cache=ref_cache).logits
            second = ref(decoder_input_ids=canvas, cache=ref_cache,
                         self_conditioning_logits=first / 0.7).logits
        ours_cache = ours.encode(todo, ours_cache)
        assert ours_cache.length == ref_cache.get_seq_length()
        got1 = ours(decoder_input_ids=canvas, cache=ours_cache).logits
        got2 = ours(decoder_input_ids=canvas, cache=ours_cache,
                    self_conditioning_logits=first / 0.7).logits
        torch.testing.assert_close(got1, first, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got2, second, atol=2e-5, rtol=1e-5)
        assert not torch.allclose(got1, got2, atol=1e-3)     # self-conditioning matters
        todo = first.argmax(-1)
    # the sliding layers keep only the window's last positions, the full layers all
    assert ours_cache.keys[0].shape[2] == 5 and ours_cache.keys[1].shape[2] == 11 + 2 * CANVAS


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
    for (n, a), (_, b) in zip(alt.state_dict().items(), ours.state_dict().items()):
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
    raw = json.loads((ckpt / "config.json").read_text())
    for key, value, words in (("use_bidirectional_attention", "all", "null or 'vision'"),
                              ("hidden_activation", "relu", "gelu_pytorch_tanh")):
        cfg = json.loads(json.dumps(raw))
        cfg["text_config"][key] = value
        (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelLoadError, match=f"{key} must be .*{words}"):
            load_model(tmp_path / "m", device="cpu")
    cfg = json.loads(json.dumps(raw))
    cfg["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn"
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="rope_type must be one of default, proportional"):
        load_model(tmp_path / "m", device="cpu")
