"""The model forward with the fused Triton RMSNorm / RoPE (forced on CPU under
TRITON_INTERPRET=1 with CELERIS_KERNELS=triton) gives the module path's logits, for each
architecture the model covers, alone, through the block KV cache and in a left-padded batch."""

from __future__ import annotations

import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from celeris import CelerisConfig, CelerisForMaskedDiffusion
from celeris.cache import SlotKVCache

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
ARCHS = {
    "llama": dict(),
    "qwen2_block_gqa_bias": dict(attention="block_causal", block_size=4, qkv_bias=True,
                                 num_key_value_heads=2, shift_logits=True),
    "qwen3_qk_norm": dict(attention="block_causal", block_size=4, qk_norm=True, head_dim=12),
    "llada2_moe": dict(fused_qkv=True, partial_rotary_factor=0.5, qk_norm=True,
                       attention="block_causal", block_size=4, moe_layers=[1],
                       shared_expert_intermediate_size=16, router_score="sigmoid",
                       router_bias="select", router_groups=2, router_topk_groups=1,
                       **MOE),
    "olmoe_clip": dict(qk_norm=True, clip_qkv=0.6, o_bias=True, moe_layers=[0], **MOE),
}


def _model(arch: str, dtype=torch.float32, seed: int = 0) -> CelerisForMaskedDiffusion:
    torch.manual_seed(seed)
    cfg = CelerisConfig(vocab_size=96, hidden_size=48, intermediate_size=80,
                        num_hidden_layers=2, num_attention_heads=4, initializer_range=0.3,
                        max_position_embeddings=128, mask_token_id=95, **ARCHS[arch])
    model = CelerisForMaskedDiffusion(cfg).eval().to(dtype)
    with torch.no_grad():                       # norms away from 1, so their weights count
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _logits(model, monkeypatch, mode: str, *args, **kwargs) -> torch.Tensor:
    monkeypatch.setenv("CELERIS_KERNELS", mode)
    with torch.inference_mode():
        return model(*args, **kwargs).logits.float()


def _ids(B: int, W: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 95, (B, W), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fused_forward_gives_the_module_paths_logits(arch, monkeypatch):
    model = _model(arch)
    ids = _ids(2, 11)
    fused = _logits(model, monkeypatch, "triton", ids)
    ref = _logits(model, monkeypatch, "torch", ids)
    assert fused.shape == (2, 11, 96)
    torch.testing.assert_close(fused, ref, atol=2e-5, rtol=2e-5)
    assert torch.equal(fused.argmax(-1), ref.argmax(-1))


def _cached_forward(model, monkeypatch, mode: str) -> list[torch.Tensor]:
    """Two forwards of a padded batch of 2 rows through a fresh slot cache: a prompt, then a
    block against the cached prompt (row 1 is left-padded by 3 in the first)."""
    cfg = model.config
    kv = SlotKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 64,
                     next(model.parameters()).dtype, torch.device("cpu"), slots=2)
    ids = _ids(2, 8, seed=2)
    real = torch.ones(2, 8, dtype=torch.bool)
    real[1, :3] = False
    pos = (torch.arange(8)[None] - torch.tensor([[0], [3]])).clamp(min=0)
    first = kv.bind([0, 1], [8, 5], [(0, 0, 0, 0, 8), (1, 3, 1, 0, 5)], real)
    out = [_logits(model, monkeypatch, mode, ids, position_ids=pos, kv=first)]
    block = _ids(2, 4, seed=3)
    pos2 = torch.tensor([[8, 9, 10, 11], [5, 6, 7, 8]])
    second = kv.bind([0, 1], [12, 9], [(0, 0, 0, 8, 4), (1, 0, 1, 5, 4)])
    out.append(_logits(model, monkeypatch, mode, block, position_ids=pos2, kv=second))
    return out


@pytest.mark.parametrize("arch", ["qwen2_block_gqa_bias", "llada2_moe", "llama"])
def test_fused_forward_through_the_kv_cache_and_padding(arch, monkeypatch):
    model = _model(arch, seed=3)
    fused = _cached_forward(model, monkeypatch, "triton")
    ref = _cached_forward(model, monkeypatch, "torch")
    for f, r in zip(fused, ref):
        torch.testing.assert_close(f, r, atol=2e-5, rtol=2e-5)
    assert not torch.equal(fused[1][0], fused[1][1])            # the rows differ: real test


@pytest.mark.parametrize("arch", ["llama", "qwen3_qk_norm"])
def test_fused_forward_in_bfloat16_stays_within_rounding(arch, monkeypatch):
    model = _model(arch, dtype=torch.bfloat16)
    ids = _ids(1, 9)
    fused = _logits(model, monkeypatch, "triton", ids)
    ref = _logits(model, monkeypatch, "torch", ids)
    exact = _logits(model.float(), monkeypatch, "torch", ids)       # the float32 function
    # on average no further from it than the module path in bf16 (it rounds less often),
    # and within a few bf16 ulps of the module path everywhere
    assert (fused - exact).abs().mean() <= 1.25 * (ref - exact).abs().mean()
    assert (fused - ref).abs().max() <= 0.03 * exact.abs().max()


class _OpCount(TorchDispatchMode):
    """Counts the torch ops a forward dispatches (what a GPU pays one launch or more for),
    views and metadata ops excluded; a Triton launch counts one (the interpreter's own torch
    calls inside it are not counted)."""

    FREE = {"view", "_unsafe_view", "transpose", "t", "expand", "split", "split_with_sizes",
            "slice", "select", "unsqueeze", "squeeze", "permute", "detach", "alias",
            "reshape", "empty", "empty_like", "as_strided", "unbind", "chunk"}

    def __init__(self) -> None:
        super().__init__()
        self.count, self.launches, self.paused = 0, 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and func.overloadpacket.__name__ not in self.FREE:
            self.count += 1
        return func(*args, **(kwargs or {}))

    def launch(self, kernel):
        def run(*args, **kwargs):
            self.count += 1
            self.launches += 1
            self.paused = True
            try:
                return kernel(*args, **kwargs)
            finally:
                self.paused = False
        return run


def test_fused_forward_dispatches_fewer_ops_per_layer(monkeypatch):
    """Per layer the fused path leaves two RMSNorms, two residual adds and RoPE (10 ops on the
    module path) to three Triton launches; the products, attention and the MLP remain."""
    import celeris.kernels.triton_norm_rope as k
    model = _model("llama")
    ids = _ids(1, 8)
    counts, launches = {}, 0
    for mode in ("torch", "triton"):
        monkeypatch.setenv("CELERIS_KERNELS", mode)
        ops = _OpCount()
        monkeypatch.setattr(k, "rms_norm_triton", ops.launch(k.rms_norm_triton))
        monkeypatch.setattr(k, "rope_qk_triton", ops.launch(k.rope_qk_triton))
        with torch.inference_mode(), ops:
            model(ids)
        counts[mode], launches = ops.count, ops.launches
        monkeypatch.undo()
    layers = model.config.num_hidden_layers
    assert launches == 3 * layers + 1                   # + the final norm
    assert (counts["torch"] - counts["triton"]) / layers >= 7, counts
