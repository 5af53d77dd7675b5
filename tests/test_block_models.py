"""Block-causal models: the mask, the upstream Fast-dLLM v2 / SDAR / LLaDA layouts through both
loaders (ours and transformers' Auto classes), and missing weights refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import celeris
from celeris import CelerisConfig, CelerisForMaskedDiffusion, ModelLoadError, load_model

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, mask_token_id=3)
QWEN = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
            tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
            max_window_layers=2, attention_dropout=0.0, initializer_range=0.5)


def _ids(B: int = 2, L: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, TINY["vocab_size"], (B, L), generator=g)


def _block_model(block_size: int = 4, seed: int = 0, **kw) -> CelerisForMaskedDiffusion:
    torch.manual_seed(seed)
    cfg = CelerisConfig(**{**TINY, "attention": "block_causal", "block_size": block_size,
                           "initializer_range": 0.5, **kw})
    return CelerisForMaskedDiffusion(cfg).eval()


def test_block_causal_position_sees_earlier_blocks_and_its_own_block_only():
    model = _block_model(block_size=4)
    ids = _ids(B=1, L=12)
    base = model(ids).logits
    later = ids.clone()
    later[0, 8:] = 5                    # change the third block
    out = model(later).logits
    assert torch.equal(out[0, :8], base[0, :8])          # blocks 0-1 never see block 2
    assert not torch.allclose(out[0, 8:], base[0, 8:])
    inside = ids.clone()
    inside[0, 7] = 6                    # last position of block 1: block 1 sees it both ways
    out = model(inside).logits
    assert torch.equal(out[0, :4], base[0, :4])
    assert not torch.allclose(out[0, 4], base[0, 4])


def test_bidirectional_config_is_unchanged_by_the_new_fields():
    cfg = CelerisConfig(**TINY)
    assert cfg.attention == "bidirectional" and not cfg.block_causal and not cfg.qk_norm


@pytest.mark.parametrize("field,value,needle", [
    ("attention", "causal", "attention must be one of bidirectional, block_causal"),
    ("block_size", 0, "block_size must be an integer in [1, 1024]"),
])
def test_bad_attention_config_names_the_field(field, value, needle):
    kw = {"attention": "block_causal", "block_size": 4, field: value}
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        CelerisConfig(**TINY, **kw)


def _save_upstream(path, model_type: str, arch: str, extra: dict, seed: int):
    """A random checkpoint in the upstream layout: config.json with upstream fields, weights
    under upstream (Qwen2 / Qwen3) names, built by our class from that very config."""
    path.mkdir()
    raw = {"model_type": model_type, "architectures": [arch], **QWEN, **extra}
    (path / "config.json").write_text(json.dumps(raw))
    config = celeris.families.find(raw).config_class(
        **{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(seed)
    model = CelerisForMaskedDiffusion(config).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(path / "model.safetensors"))
    return model


FAMILIES = [
    ("Fast_dLLM_Qwen", "Fast_dLLM_QwenForCausalLM", {"bd_size": 4, "attention_bias": True},
     {"q_proj.bias", "k_proj.bias", "v_proj.bias"}),
    ("sdar", "SDARForCausalLM", {"head_dim": 8, "attention_bias": False},
     {"q_norm.weight", "k_norm.weight"}),
]


@pytest.mark.parametrize("model_type,arch,extra,expected_params", FAMILIES)
def test_block_diffusion_families_load_identically_through_auto_and_load_model(
        tmp_path, model_type, arch, extra, expected_params):
    from transformers import AutoModel, AutoModelForCausalLM
    ref = _save_upstream(tmp_path / "ckpt", model_type, arch, extra, seed=4)
    names = {k.split("self_attn.")[-1] for k in ref.state_dict() if "layers.0.self_attn." in k}
    assert expected_params <= names
    ours, _ = load_model(tmp_path / "ckpt", device="cpu")
    auto = AutoModel.from_pretrained(tmp_path / "ckpt").eval()
    causal = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    assert ours.config.block_causal and ours.config.block_size == 4
    ids = _ids(L=10)
    expected = ref(ids).logits
    for loaded in (ours, auto, causal):
        assert torch.equal(loaded(ids).logits, expected)


def test_fast_dllm_v2_shifts_logits_and_sdar_does_not(tmp_path):
    fast = celeris.FastDLLMQwenConfig(**QWEN)
    sdar = celeris.SDARConfig(**QWEN)
    assert fast.shift_logits and fast.qkv_bias and fast.block_size == 32
    assert not sdar.shift_logits and sdar.qk_norm and sdar.block_size == 4


def _llada_dir(tmp_path, model):
    from tests.test_model import _to_llada_names
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(_to_llada_names(state), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llada", "architectures": ["LLaDAModelLM"],
        "d_model": 32, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 64,
        "vocab_size": 96, "max_sequence_length": 4096, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "mask_token_id": 3, "weight_tying": False}))
    return tmp_path


def test_llada_upstream_names_load_through_auto_model_with_their_weights(tmp_path):
    from transformers import AutoModel
    torch.manual_seed(2)
    model = CelerisForMaskedDiffusion(CelerisConfig(**TINY, rope_theta=500000.0,
                                                    initializer_range=0.5)).eval()
    path = _llada_dir(tmp_path, model)
    auto = AutoModel.from_pretrained(path).eval()
    ours, _ = load_model(path, device="cpu")
    ids = _ids()
    assert torch.equal(auto(ids).logits, model(ids).logits)
    assert torch.equal(auto(ids).logits, ours(ids).logits)


def test_checkpoint_missing_a_weight_is_refused_with_the_key_in_every_path(tmp_path):
    from transformers import AutoModel
    torch.manual_seed(2)
    model = CelerisForMaskedDiffusion(CelerisConfig(**TINY)).eval()
    path = _llada_dir(tmp_path, model)
    from safetensors.torch import load_file
    state = load_file(str(path / "model.safetensors"))
    del state["model.transformer.blocks.1.q_proj.weight"]
    save_file(state, str(path / "model.safetensors"))
    for load in (lambda: AutoModel.from_pretrained(path), lambda: load_model(path, device="cpu")):
        with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.self_attn\.q_proj\.weight"):
            load()
