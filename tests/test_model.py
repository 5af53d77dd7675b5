"""Native models: upstream checkpoint layouts, Auto-class round trip, Dream's shift, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import celeris
from celeris import CelerisConfig, CelerisForMaskedDiffusion, ModelLoadError, load_model

REPO = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, mask_token_id=3)


def _model(seed: int = 0, **overrides) -> CelerisForMaskedDiffusion:
    torch.manual_seed(seed)
    return CelerisForMaskedDiffusion(CelerisConfig(**{**TINY, **overrides})).eval()


def _ids(B: int = 2, L: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(4, TINY["vocab_size"], (B, L), generator=torch.Generator().manual_seed(seed))


def _to_llada_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Write our parameters under GSAI-ML/LLaDA-8B-Instruct's names (the inverse mapping,
    spelled out independently of celeris.model.weights)."""
    block = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm",
             "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj",
             "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
             "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}
    top = {"model.embed_tokens.weight": "model.transformer.wte.weight",
           "model.norm.weight": "model.transformer.ln_f.weight",
           "lm_head.weight": "model.transformer.ff_out.weight"}
    out = {}
    for name, t in state.items():
        if name in top:
            out[top[name]] = t
            continue
        _, _, i, rest = name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        out[f"model.transformer.blocks.{i}.{block[module]}.{kind}"] = t
    return out


def test_llada_upstream_names_and_config_load_with_identical_logits(tmp_path):
    model = _model(rope_theta=500000.0)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(_to_llada_names(state), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llada", "architectures": ["LLaDAModelLM"],
        "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"},
        "d_model": 32, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 64,
        "vocab_size": 90, "embedding_size": 96, "max_sequence_length": 4096,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "mask_token_id": 3,
        "weight_tying": False, "include_bias": False}))
    loaded, _ = load_model(tmp_path, device="cpu")
    ids = _ids()
    assert loaded.config.model_type == "llada"
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_dream_upstream_checkpoint_loads_sharded_with_biases_and_gqa(tmp_path):
    model = _model(seed=3, qkv_bias=True, shift_logits=True, num_key_value_heads=2)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / fname))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 96, "mask_token_id": 3,
        "rope_theta": 10000.0, "tie_word_embeddings": False}))
    loaded, _ = load_model(tmp_path, device="cpu")
    assert loaded.config.shift_logits and loaded.config.qkv_bias
    ids = _ids()
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_dream_logits_are_shifted_by_one_position():
    plain = _model(seed=5)
    shifted = _model(seed=5, shift_logits=True)
    ids = _ids()
    a, b = plain(ids).logits, shifted(ids).logits
    assert torch.equal(b[:, 1:], a[:, :-1])       # position i reads the state at i-1
    assert torch.equal(b[:, 0], a[:, 0])


def test_auto_model_round_trip_gives_identical_logits(tmp_path):
    from transformers import AutoConfig, AutoModel
    model = _model(seed=7)
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "celeris"
    again = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(again, CelerisForMaskedDiffusion)
    ids = _ids()
    out = again(ids, attention_mask=None)
    assert out.logits.shape == (2, 12, TINY["vocab_size"])
    assert torch.equal(out.logits, model(ids).logits)
    assert again.device.type == "cpu"


def test_left_padding_gives_the_same_logits_as_the_row_alone():
    model = _model(seed=9)
    row = _ids(1, 6)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), row], dim=1)
    mask = torch.tensor([[0] * 4 + [1] * 6])
    alone = model(row).logits
    batched = model(padded, attention_mask=mask).logits[:, 4:]
    assert torch.allclose(alone, batched, atol=1e-5)


def test_logits_mask_selects_rows_of_the_full_logits():
    model = _model(seed=11)
    ids = _ids()
    sel = torch.zeros_like(ids, dtype=torch.bool)
    sel[:, 3:7] = True
    full = model(ids).logits
    part = model(ids, logits_mask=sel).logits
    assert part.shape == (8, TINY["vocab_size"])
    assert torch.allclose(part, full[sel], atol=1e-6)


# --------------------------------------------------------------------- errors
def _saved(tmp_path: Path) -> Path:
    _model().save_pretrained(tmp_path)
    return tmp_path


def test_missing_weights_name_the_directory(tmp_path):
    d = _saved(tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights in .*model.safetensors"):
        load_model(d, device="cpu")


def test_corrupt_weights_name_the_file(tmp_path):
    d = _saved(tmp_path)
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match="cannot read weights from .*model.safetensors"):
        load_model(d, device="cpu")


def test_unknown_architecture_names_the_field(tmp_path):
    d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="model_type 'gpt2' is not a supported"):
        load_model(d, device="cpu")


def test_wrong_dtype_name_is_a_clear_value_error(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_model(_saved(tmp_path), device="cpu", dtype="float8")


def test_shape_mismatch_names_the_tensor(tmp_path):
    d = _saved(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"tensor model\.layers\.0\.mlp\.\w+_proj\.weight has shape"):
        load_model(d, device="cpu")


def test_hub_id_offline_says_so_and_how_to_place_files(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="offline.*local-dir"):
        load_model("GSAI-ML/LLaDA-8B-Instruct", device="cpu")


def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(ModelLoadError, match="model directory not found"):
        load_model(tmp_path / "nope", device="cpu")


def test_cli_reports_a_bad_model_path_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "celeris", "generate", "--model",
                           str(tmp_path / "missing"), "--prompt", "hi"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert f"error: --model {tmp_path / 'missing'}: no such local directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_import_celeris_registers_all_three_model_types():
    from transformers import AutoConfig
    for model_type in ("celeris", "llada", "Dream"):
        assert AutoConfig.for_model(model_type).model_type == model_type
    assert celeris.LLaDAConfig(d_model=64, n_heads=4, n_layers=1).hidden_size == 64
