"""The 2026 families on tiny random checkpoints laid out as published: LLaDA2.x, LLaDA-MoE,
SDAR-MoE, iLLaDA and Fast-dLLM v2 (config.json keys, tensor names, special ids, tokenizer).

Each checkpoint is written here from upstream names and shapes (not by our classes), then
loaded through ``load_model`` and through transformers' Auto classes, decoded by the engine,
and its mixture-of-experts layer is held to a per-token computation of the family's routing
rule written out below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import celeris
from celeris import Engine, GenerationParams, ModelLoadError, load_model
from celeris.model.moe import SparseMoE
from tests.tiny_model import write_family_tokenizer

C, H, HKV, D, INTER, EXPERTS, EXPERT_INTER = 32, 4, 2, 8, 48, 8, 16
LLADA_MOE_VOCAB = 156900        # room for the model card's mask id 156895
GEN = {"gen_length": 16, "block_length": 8, "temperature": 0.0, "decoding": "fixed",
       "cache": "none"}


def _rand(g: torch.Generator, *shape: int, scale: float = 0.3) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _norm(g: torch.Generator, n: int) -> torch.Tensor:
    return 1.0 + _rand(g, n, scale=0.1)


def _mlp(g, prefix: str, inter: int) -> dict[str, torch.Tensor]:
    return {f"{prefix}.gate_proj.weight": _rand(g, inter, C),
            f"{prefix}.up_proj.weight": _rand(g, inter, C),
            f"{prefix}.down_proj.weight": _rand(g, C, inter)}


def _experts(g, prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for e in range(EXPERTS):
        out.update(_mlp(g, f"{prefix}.experts.{e}", EXPERT_INTER))
    return out


# ------------------------------------------------------------------ the published layouts
def _llada2(g, vocab: dict[str, int]) -> tuple[dict, dict]:
    """inclusionAI/LLaDA2.0-mini's config keys and Ling-style names (layer 0 dense)."""
    config = {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"],
              "vocab_size": len(vocab), "hidden_size": C, "intermediate_size": INTER,
              "num_hidden_layers": 2, "num_attention_heads": H, "num_key_value_heads": HKV,
              "head_dim": D, "moe_intermediate_size": EXPERT_INTER, "num_experts": EXPERTS,
              "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "num_shared_experts": 1,
              "first_k_dense_replace": 1, "use_qkv_bias": False, "use_bias": False,
              "use_qk_norm": True, "partial_rotary_factor": 0.5, "rope_theta": 600000,
              "routed_scaling_factor": 2.5, "score_function": "sigmoid", "norm_topk_prob": True,
              "moe_router_enable_expert_bias": True, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 512, "tie_word_embeddings": False,
              "hidden_act": "silu", "pad_token_id": vocab["<|endoftext|>"]}
    state = {"model.word_embeddings.weight": _rand(g, len(vocab), C),
             "model.norm.weight": _norm(g, C), "lm_head.weight": _rand(g, len(vocab), C)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        state.update({f"{p}.input_layernorm.weight": _norm(g, C),
                      f"{p}.post_attention_layernorm.weight": _norm(g, C),
                      f"{p}.attention.query_key_value.weight": _rand(g, (H + 2 * HKV) * D, C),
                      f"{p}.attention.dense.weight": _rand(g, C, H * D),
                      f"{p}.attention.query_layernorm.weight": _norm(g, D),
                      f"{p}.attention.key_layernorm.weight": _norm(g, D)})
        if layer == 0:
            state.update(_mlp(g, f"{p}.mlp", INTER))
            continue
        state.update({f"{p}.mlp.gate.weight": _rand(g, EXPERTS, C),
                      f"{p}.mlp.gate.expert_bias": _rand(g, EXPERTS, scale=0.1)})
        state.update(_experts(g, f"{p}.mlp"))
        state.update(_mlp(g, f"{p}.mlp.shared_experts", EXPERT_INTER))
    return config, state


def _qwen_attention(g, p: str, heads: int, kv: int) -> dict[str, torch.Tensor]:
    return {f"{p}.self_attn.q_proj.weight": _rand(g, heads * D, C),
            f"{p}.self_attn.k_proj.weight": _rand(g, kv * D, C),
            f"{p}.self_attn.v_proj.weight": _rand(g, kv * D, C),
            f"{p}.self_attn.o_proj.weight": _rand(g, C, heads * D),
            f"{p}.self_attn.q_norm.weight": _norm(g, D),
            f"{p}.self_attn.k_norm.weight": _norm(g, D),
            f"{p}.input_layernorm.weight": _norm(g, C),
            f"{p}.post_attention_layernorm.weight": _norm(g, C)}


def _sdar_moe(g, vocab: dict[str, int]) -> tuple[dict, dict]:
    """JetLM/SDAR-30B-A3B-Chat: Qwen3-MoE keys and names plus block_size and mask_token_id."""
    config = {"model_type": "sdar_moe", "architectures": ["SDARMoeForCausalLM"],
              "vocab_size": len(vocab), "hidden_size": C, "intermediate_size": INTER,
              "num_hidden_layers": 3, "num_attention_heads": H, "num_key_value_heads": HKV,
              "head_dim": D, "moe_intermediate_size": EXPERT_INTER, "num_experts": EXPERTS,
              "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": [0], "router_aux_loss_coef": 0.001,
              "output_router_logits": False, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 512, "attention_bias": False,
              "tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False,
              "block_size": 4, "mask_token_id": vocab["<|MASK|>"],
              "eos_token_id": vocab["<|im_end|>"], "bos_token_id": vocab["<|endoftext|>"]}
    state = {"model.embed_tokens.weight": _rand(g, len(vocab), C),
             "model.norm.weight": _norm(g, C), "lm_head.weight": _rand(g, len(vocab), C)}
    for layer in range(3):
        p = f"model.layers.{layer}"
        state.update(_qwen_attention(g, p, H, HKV))
        if layer == 0:
            state.update(_mlp(g, f"{p}.mlp", INTER))
        else:
            state[f"{p}.mlp.gate.weight"] = _rand(g, EXPERTS, C)
            state.update(_experts(g, f"{p}.mlp"))
    return config, state


def _llada_moe(g, vocab: dict[str, int]) -> tuple[dict, dict]:
    """inclusionAI/LLaDA-MoE-7B-A1B-Instruct: model_type "llada", OLMoE-style keys, no mask id
    anywhere (the model card gives 156895); layer 0 dense, a shared expert on layer 1."""
    config = {"model_type": "llada", "architectures": ["LLaDAMoEModelLM"],
              "vocab_size": LLADA_MOE_VOCAB, "hidden_size": C, "dense_intermediate_size": INTER,
              "expert_intermediate_size": EXPERT_INTER, "shared_expert_intermediate_size": 24,
              "num_hidden_layers": 2, "num_attention_heads": H, "num_key_value_heads": H,
              "num_experts": EXPERTS, "num_experts_per_tok": 2, "moe_layer_freq": [0, 1],
              "moe_router_enable_expert_bias": True, "moe_router_score_function": "softmax",
              "norm_topk_prob": False, "routed_scaling_factor": 1, "router_num_group": -2,
              "qk_layernorm": True, "attention_bias": False, "clip_qkv": None,
              "partial_rotary_factor": 1, "rope_theta": 50000, "rope_scaling": None,
              "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "hidden_act": "silu",
              "tie_word_embeddings": False, "eos_token_id": vocab["<|eos|>"],
              "pad_token_id": vocab["<|pad|>"]}
    state = {"model.embed_tokens.weight": _rand(g, LLADA_MOE_VOCAB, C),
             "model.norm.weight": _norm(g, C), "lm_head.weight": _rand(g, LLADA_MOE_VOCAB, C)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        state.update(_qwen_attention(g, p, H, H))
        if layer == 0:
            state.update(_mlp(g, f"{p}.mlp", INTER))
            continue
        state.update({f"{p}.mlp.gate.weight": _rand(g, EXPERTS, C),
                      f"{p}.mlp.expert_bias": _rand(g, EXPERTS, scale=0.1)})
        state.update(_experts(g, f"{p}.mlp"))
        state.update(_mlp(g, f"{p}.shared_expert", 24))
    return config, state


def _illada(g, vocab: dict[str, int]) -> tuple[dict, dict]:
    """iLLaDA-8B: LLaDA's OLMo names and keys, mask 5, eos 2, pad 1, bos 0 in config.json."""
    config = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": C,
              "n_heads": H, "n_kv_heads": H, "n_layers": 2, "mlp_hidden_size": INTER,
              "vocab_size": len(vocab), "max_sequence_length": 512, "rope_theta": 500000.0,
              "rms_norm_eps": 1e-5, "weight_tying": False, "include_bias": False,
              "mask_token_id": 5, "eos_token_id": 2, "pad_token_id": 1, "bos_token_id": 0}
    t = "model.transformer"
    state = {f"{t}.wte.weight": _rand(g, len(vocab), C), f"{t}.ln_f.weight": _norm(g, C),
             f"{t}.ff_out.weight": _rand(g, len(vocab), C)}
    for layer in range(2):
        b = f"{t}.blocks.{layer}"
        state.update({f"{b}.attn_norm.weight": _norm(g, C), f"{b}.ff_norm.weight": _norm(g, C),
                      f"{b}.q_proj.weight": _rand(g, C, C), f"{b}.k_proj.weight": _rand(g, C, C),
                      f"{b}.v_proj.weight": _rand(g, C, C), f"{b}.attn_out.weight": _rand(g, C, C),
                      f"{b}.ff_proj.weight": _rand(g, INTER, C),
                      f"{b}.up_proj.weight": _rand(g, INTER, C),
                      f"{b}.ff_out.weight": _rand(g, C, INTER)})
    return config, state


def _fast_dllm_v2(g, vocab: dict[str, int]) -> tuple[dict, dict]:
    """Efficient-Large-Model/Fast_dLLM_v2_1.5B as published: Qwen2 names with q/k/v biases,
    ``bd_size``, and no mask token named anywhere (|<MASK>| is only in the vocabulary)."""
    config = {"model_type": "Fast_dLLM_Qwen", "architectures": ["Fast_dLLM_QwenForCausalLM"],
              "vocab_size": len(vocab), "hidden_size": C, "intermediate_size": INTER,
              "num_hidden_layers": 2, "num_attention_heads": H, "num_key_value_heads": HKV,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False,
              "bd_size": 4, "bos_token_id": vocab["<|endoftext|>"],
              "eos_token_id": vocab["<|im_end|>"]}
    state = {"model.embed_tokens.weight": _rand(g, len(vocab), C),
             "model.norm.weight": _norm(g, C), "lm_head.weight": _rand(g, len(vocab), C)}
    for layer in range(2):
        p = f"model.layers.{layer}"
        attn = _qwen_attention(g, p, H, HKV)
        del attn[f"{p}.self_attn.q_norm.weight"], attn[f"{p}.self_attn.k_norm.weight"]
        state.update(attn)
        state.update({f"{p}.self_attn.q_proj.bias": _rand(g, H * D),
                      f"{p}.self_attn.k_proj.bias": _rand(g, HKV * D),
                      f"{p}.self_attn.v_proj.bias": _rand(g, HKV * D)})
        state.update(_mlp(g, f"{p}.mlp", INTER))
    return config, state


QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FAMILIES = {   # name: (layout, tokenizer special tokens, their roles)
    "llada2": (_llada2, ["<|endoftext|>", "<role>", "</role>", "<|mask|>"],
               {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
    "sdar_moe": (_sdar_moe, QWEN_SPECIALS + ["<|MASK|>"],
                 {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "llada_moe": (_llada_moe, ["<|pad|>", "<|eos|>", "<|bos|>"],
                  {"eos_token": "<|eos|>", "pad_token": "<|pad|>", "bos_token": "<|bos|>"}),
    "illada": (_illada, ["<s>", "<pad>", "</s>", "<unk>", "<|eot_id|>", "<|x|>",
                         "<|mdm_mask|>"],
               {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>"}),
    "fast_dllm_v2": (_fast_dllm_v2, QWEN_SPECIALS + ["|<MASK>|"],
                     {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
}
BLOCK_CAUSAL = ("llada2", "sdar_moe", "fast_dllm_v2")
AUTO_CLASS = {"llada2": "LLaDA2MoeModelLM", "sdar_moe": "SDARMoeForCausalLM",
              "llada_moe": "LLaDAModelLM", "illada": "LLaDAModelLM",
              "fast_dllm_v2": "FastDLLMQwenModel"}
MOE = ("llada2", "sdar_moe", "llada_moe")


def write_family(path: Path, family: str, seed: int = 0) -> Path:
    layout, specials, roles = FAMILIES[family]
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_family_tokenizer(path, specials, **roles)
    config, state = layout(torch.Generator().manual_seed(seed), vocab)
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    gen = {"gen_length": 16, "temperature": 0.0} if family in BLOCK_CAUSAL else GEN
    (path / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: write_family(root / name, name) for name in FAMILIES}


def _ids(vocab: int, B: int = 2, L: int = 11) -> torch.Tensor:
    return torch.randint(8, min(vocab, 300), (B, L), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ loading
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_loads_the_same_through_load_model_and_transformers_auto(family, family_dirs):
    from transformers import AutoModel, AutoModelForCausalLM
    path = family_dirs[family]
    ours, _ = load_model(path, device="cpu")
    auto_cls = AutoModelForCausalLM if family in BLOCK_CAUSAL else AutoModel
    auto = auto_cls.from_pretrained(path).eval()
    assert type(auto).__name__ == AUTO_CLASS[family]
    assert ours.config.block_causal == (family in BLOCK_CAUSAL)
    ids = _ids(ours.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, auto(ids).logits)
    assert bool(ours.config.moe_layer_ids) == (family in MOE)


def test_config_facts_match_the_upstream_modeling_code(family_dirs):
    llada2, _ = load_model(family_dirs["llada2"], device="cpu")
    c = llada2.config
    assert (c.block_size, c.rotary_dim, c.fused_qkv, c.router_score, c.router_bias,
            c.router_groups, c.router_topk_groups, c.norm_topk_prob, c.shift_logits) == \
        (32, 4, True, "sigmoid", "select", 4, 2, True, False)
    assert c.moe_layer_ids == {1} and c.shared_expert_intermediate_size == EXPERT_INTER
    sdar, _ = load_model(family_dirs["sdar_moe"], device="cpu")
    assert sdar.config.moe_layer_ids == {1, 2} and sdar.config.block_size == 4
    assert sdar.config.router_score == "softmax" and sdar.config.norm_topk_prob
    moe, _ = load_model(family_dirs["llada_moe"], device="cpu")
    assert not moe.config.block_causal and moe.config.moe_layer_ids == {1}
    assert moe.config.router_bias == "add" and not moe.config.norm_topk_prob


@pytest.mark.parametrize("family,key,ours", [
    ("llada2", "model.layers.1.attention.query_key_value.weight",
     "model.layers.1.self_attn.qkv_proj.weight"),
    ("llada_moe", "model.layers.1.shared_expert.up_proj.weight",
     "model.layers.1.mlp.shared_experts.up_proj.weight"),
    ("sdar_moe", "model.layers.2.mlp.gate.weight", "model.layers.2.mlp.gate.weight"),
])
def test_missing_weight_is_refused_naming_it_in_both_loaders(tmp_path, family, key, ours):
    from transformers import AutoModel
    path = write_family(tmp_path / family, family)
    state = load_file(str(path / "model.safetensors"))
    del state[key]
    save_file(state, str(path / "model.safetensors"))
    for load in (lambda: load_model(path, device="cpu"), lambda: AutoModel.from_pretrained(path)):
        with pytest.raises(ModelLoadError, match=ours.replace(".", r"\.")):
            load()


def test_missing_expert_tensor_is_refused_with_its_upstream_name(tmp_path):
    path = write_family(tmp_path / "llada2", "llada2")
    state = load_file(str(path / "model.safetensors"))
    del state["model.layers.1.mlp.experts.5.down_proj.weight"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.experts\.5\.down_proj"):
        load_model(path, device="cpu")
    from transformers import AutoModelForCausalLM    # transformers refuses the short stack
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForCausalLM.from_pretrained(path)


# ------------------------------------------------------------------ the routing rules
def _swiglu(x, gate, up, down):
    return down @ (F.silu(gate @ x) * (up @ x))


def _expert(moe: SparseMoE, e: int, x: torch.Tensor) -> torch.Tensor:
    gate_up, down = moe.experts.gate_up_proj[e], moe.experts.down_proj[e]
    return _swiglu(x, *gate_up.chunk(2, dim=0), down)


def _llada2_choice(cfg, logits, bias):
    """Sigmoid scores; groups ranked by their two best biased scores; top-k biased scores in
    the kept groups; weights = unbiased scores normalised, times the scaling factor."""
    scores = logits.sigmoid()
    biased = scores + bias
    size = cfg.num_experts // cfg.router_groups
    group_score = [sorted(biased[g * size:(g + 1) * size].tolist())[-2:]
                   for g in range(cfg.router_groups)]
    ranked = sorted(range(cfg.router_groups), key=lambda g: -sum(group_score[g]))
    allowed = [e for g in ranked[:cfg.router_topk_groups] for e in range(g * size, (g + 1) * size)]
    chosen = sorted(allowed, key=lambda e: -biased[e].item())[:cfg.num_experts_per_tok]
    w = torch.stack([scores[e] for e in chosen])
    return chosen, w / w.sum() * cfg.routed_scaling_factor


def _llada_moe_choice(cfg, logits, bias):
    """Softmax plus expert_bias; the top-k of the sums are the experts and their weights."""
    probs = logits.softmax(-1) + bias
    chosen = sorted(range(cfg.num_experts), key=lambda e: -probs[e].item())
    chosen = chosen[:cfg.num_experts_per_tok]
    return chosen, torch.stack([probs[e] for e in chosen])


def _qwen3_moe_choice(cfg, logits, bias):
    """Softmax, top-k, renormalised (norm_topk_prob)."""
    probs = logits.softmax(-1)
    chosen = sorted(range(cfg.num_experts), key=lambda e: -probs[e].item())
    chosen = chosen[:cfg.num_experts_per_tok]
    w = torch.stack([probs[e] for e in chosen])
    return chosen, w / w.sum()


RULES = {"llada2": _llada2_choice, "llada_moe": _llada_moe_choice, "sdar_moe": _qwen3_moe_choice}


@pytest.mark.parametrize("family", MOE)
def test_moe_layer_equals_a_per_token_computation_of_the_family_rule(family, family_dirs):
    model, _ = load_model(family_dirs[family], device="cpu")
    layer = min(model.config.moe_layer_ids)
    moe = model.model.layers[layer].mlp
    x = _rand(torch.Generator().manual_seed(5), 13, C, scale=1.0)
    with torch.no_grad():
        got = moe(x)
        bias = (moe.gate.expert_bias if moe.gate.expert_bias is not None
                else torch.zeros(EXPERTS))
        for t in range(x.shape[0]):
            chosen, w = RULES[family](model.config, moe.gate.weight @ x[t], bias)
            want = sum(wi * _expert(moe, e, x[t]) for e, wi in zip(chosen, w))
            if moe.shared_experts is not None:
                s = moe.shared_experts
                want = want + _swiglu(x[t], s.gate_proj.weight, s.up_proj.weight,
                                      s.down_proj.weight)
            torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", MOE)
def test_grouped_expert_products_equal_the_expert_loop(family, family_dirs):
    model, _ = load_model(family_dirs[family], device="cpu")
    moe = model.model.layers[max(model.config.moe_layer_ids)].mlp
    x = _rand(torch.Generator().manual_seed(6), 2, 9, C, scale=1.0)
    with torch.no_grad():
        moe.experts.grouped = False
        loop = moe(x)
        moe.experts.grouped = True
        grouped = moe(x)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-5)


def test_partial_rotary_turns_only_the_first_dims_with_their_own_frequencies():
    from celeris.model.modeling import apply_rope, rope_tables
    pos = torch.arange(6)[None]
    x = torch.randn(1, 6, 2, 8)
    cos, sin = rope_tables(pos, 4, 600000.0, torch.float32)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:])
    inv = 1.0 / 600000.0 ** (torch.arange(0, 4, 2).float() / 4)    # a head 4 dims wide
    angle = pos[0, :, None].float() * inv                              # (6, 2)
    x1, x2 = x[..., :2], x[..., 2:4]
    c, s = angle.cos()[None, :, None], angle.sin()[None, :, None]
    torch.testing.assert_close(out[..., :2], x1 * c - x2 * s)
    torch.testing.assert_close(out[..., 2:4], x2 * c + x1 * s)


# ------------------------------------------------------------------ special ids
def test_special_ids_come_from_the_checkpoint_or_the_family_table(family_dirs):
    def special(family):
        found, model, path = celeris.families.load(family_dirs[family], device="cpu")
        vocab = json.loads((path / "tokenizer.json").read_text())["added_tokens"]
        names = {t["content"]: t["id"] for t in vocab}
        tokenizer = celeris.tokenizer.Tokenizer.load(path, model.config, found.special_ids)
        return tokenizer.special, names

    sp, names = special("illada")                       # mask 5 from config.json, not a name
    assert (sp.mask, sp.eos, sp.pad) == (5, 2, 1) and names["<|mdm_mask|>"] == 6
    sp, names = special("fast_dllm_v2")                 # |<MASK>| found in the vocabulary
    assert sp.mask == names["|<MASK>|"] and sp.eos == names["<|im_end|>"]
    sp, _ = special("llada_moe")                        # named nowhere: the model card's id
    assert sp.mask == 156895
    sp, names = special("llada2")
    assert sp.mask == names["<|mask|>"] and sp.eos == names["<|endoftext|>"]
    sp, names = special("sdar_moe")
    assert sp.mask == names["<|MASK|>"]


def test_known_mask_id_outside_the_vocabulary_is_refused(tmp_path):
    path = write_family(tmp_path / "m", "llada_moe")
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = 1000
    (path / "config.json").write_text(json.dumps(config))
    cfg = celeris.LLaDAConfig(**{k: v for k, v in config.items()
                                 if k not in ("model_type", "architectures")})
    with pytest.raises(ModelLoadError, match="known mask id 156895 is outside"):
        celeris.tokenizer.Tokenizer.load(path, cfg, celeris.families.by_name("llada_moe")
                                         .special_ids)


# ------------------------------------------------------------------ the engine
PROMPTS = ["the quick brown fox", "def fib(n):", "Once upon a time"]


def _tokens(results) -> list[tuple[int, ...]]:
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def engines(family_dirs) -> dict[str, Engine]:
    return {name: Engine.from_pretrained(path, device="cpu") for name, path in family_dirs.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_decodes_the_family_alone_and_among_companions(family, engines):
    engine = engines[family]
    assert engine.packed == (family in ("illada", "fast_dllm_v2"))   # MoE: the module path
    params = engine.default_params().replace(gen_length=12, temperature=0.0)
    alone = engine.generate(PROMPTS[0], params)
    assert alone.nfe > 0 and len(alone.canvas) > 0
    together = engine.generate_batch(PROMPTS, params)
    assert together[0].token_ids == alone.token_ids
    assert together[0].canvas == alone.canvas


@pytest.mark.parametrize("family", BLOCK_CAUSAL)
def test_exact_block_cache_equals_recompute_token_for_token(family, engines):
    engine = engines[family]
    assert engine.block_size == {"llada2": 32, "sdar_moe": 4, "fast_dllm_v2": 4}[family]
    params = engine.default_params().replace(gen_length=12, temperature=0.0)
    cached = engine.generate_batch(PROMPTS, params.replace(cache="prefix"))
    recompute = engine.generate_batch(PROMPTS, params.replace(cache="none"))
    assert _tokens(cached) == _tokens(recompute)
    assert [r.canvas for r in cached] == [r.canvas for r in recompute]


def test_fast_dllm_v2_as_published_generates_with_its_vocabulary_mask(engines):
    engine = engines["fast_dllm_v2"]
    mask = engine.tokenizer.hf.convert_tokens_to_ids("|<MASK>|")
    assert engine.special.mask == mask
    result = engine.generate("def fib(n):", GenerationParams(gen_length=8, block_length=4,
                                                             temperature=0.0, cache="prefix"))
    assert mask not in result.token_ids and result.nfe > 0
