"""The native transformer behind LLaDA, Dream, Fast-dLLM v2, SDAR and the celeris-tiny models.

Llama-style blocks (RMSNorm, RoPE, SwiGLU; optional q/k biases and Qwen3's per-head q/k norm)
with no causal mask. ``config.attention`` decides what a position sees: every real position
(bidirectional: LLaDA, Dream, celeris-tiny) or every earlier block and its own block
(block_causal: Fast-dLLM v2, SDAR, celeris-tiny-bd; blocks are counted in absolute positions,
so the mask follows from the RoPE positions alone). Parameter names follow the Qwen2/Qwen3
spelling; each family's renames (``celeris/families/``) map LLaDA's OLMo-style names and
LLaDA2's onto them. The
mixture-of-experts families swap some layers' MLP for ``moe.SparseMoE``, and may fuse the q/k/v
projection (LLaDA2), rotate only part of each head (``partial_rotary_factor``), add a bias to
the output projection or clamp q/k/v (LLaDA-MoE's OLMoE lineage).

A forward may cover only a window of the canvas when a ``KVView`` supplies the keys and values
of the other positions (the block KV cache); the model itself keeps no state between calls.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import MaskedLMOutput

from ..config import ModelLoadError
from ..kernels import fused_kernels, rms_norm, rope_qk
from .configuration import CelerisConfig
from .dispatch import hooked as dispatch_hooked
from .moe import Experts, Router, SparseMoE, SwiGLU
from .packed import PACK_MAX_BYTES, PackedWeights, packable, packed_layers, signed_sin, unpack_rows
from .packed import applies as packed_applies


class KVView(Protocol):
    """Per-forward access to cached keys/values, passed explicitly (no hidden global state).

    ``update`` receives the fresh keys/values of the positions in this forward, (B, Hkv, W, D),
    and returns the full keys/values to attend to, (B, Hkv, Lk, D). ``key_mask`` is (B, Lk) bool,
    True for real (attendable) positions (None: every key is real). ``key_positions`` (B, Lk),
    the absolute position of each key, is needed by block-causal models (None: the keys are the
    forward's own positions).
    """

    key_mask: torch.Tensor | None
    key_positions: torch.Tensor | None
    # optional, (B, W) bool: the window's real columns when some rows are left-padded; the
    # projections and MLPs then run on those columns only (None or absent: every column)
    query_mask: torch.Tensor | None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused op (statistics in float32) instead of six small ones: the per-op cost,
        # not the arithmetic, is what a decoding step of a small model pays
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for rotary embeddings (Su et al. 2021), computed per call in float32.
    ``head_dim`` is the rotated width (the config's ``rotary_dim``: the whole head, or its
    first half for LLaDA2, whose frequencies are then those of a head that wide).

    Not registered as buffers: transformers 5 builds modules on the meta device and would hand
    back non-persistent buffers as zeros; recomputing is cheap next to the layers.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device,
                                            dtype=torch.float32) / head_dim)   # (D/2,)
    freqs = position_ids.float()[..., None] * inv_freq                         # (B, L, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None]                        # (B, L, 1, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, L, heads, D) rotated by the (B, L, 1, R) tables (rotate-half convention); with
    R < D (partial rotary) only the first R dims turn and the rest pass unchanged."""
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: CelerisConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = (cfg.num_attention_heads,
                                                  cfg.num_key_value_heads, cfg.head_dim)
        H, Hkv, D, C = self.n_heads, self.n_kv, self.head_dim, cfg.hidden_size
        self.fused = cfg.fused_qkv
        if self.fused:    # LLaDA2's query_key_value: q, k, v rows one after the other
            self.qkv_proj = nn.Linear(C, (H + 2 * Hkv) * D, bias=cfg.qkv_bias)
        else:
            self.q_proj = nn.Linear(C, H * D, bias=cfg.qkv_bias)
            self.k_proj = nn.Linear(C, Hkv * D, bias=cfg.qkv_bias)
            self.v_proj = nn.Linear(C, Hkv * D, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * D, C, bias=cfg.o_bias)
        self.clip = cfg.clip_qkv
        if cfg.qk_norm:   # Qwen3 / SDAR: RMSNorm over each head's queries and keys
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                key_mask: torch.Tensor | None, kv: KVView | None,
                real: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
        """x (B, W, C), or (N, C) packed: the real columns of a (B, W) window (``real``).
        ``fused``: q/k norm and RoPE in one Triton launch (``kernels.rope_qk``)."""
        lead = x.shape[:-1]
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        q, k, v = self._project(x)                                                 # (., H, D)
        if self.qk_norm and self.clip is not None:    # OLMoE's order: norm, clamp, rotate
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
            q, k = rope_qk(q, k, cos, sin, fused=True) if fused else (
                apply_rope(q, cos, sin), apply_rope(k, cos, sin))
        elif fused:
            norms = (self.q_norm.weight, self.k_norm.weight) if self.qk_norm else (None, None)
            eps = self.q_norm.eps if self.qk_norm else 0.0
            q, k = rope_qk(q, k, cos, sin, *norms, eps, fused=True)
        elif self.qk_norm:
            q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        else:             # queries and keys rotated in one go: half the small ops
            q, k = apply_rope(torch.cat([q, k], dim=-2), cos, sin).split([H, Hkv], dim=-2)
        if real is not None:                # attention itself runs on the padded window
            q, k, v = (unpack_rows(t, real) for t in (q, k, v))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)         # (B, ., W, D)
        if kv is not None:
            k, v = kv.update(self.layer, k, v)                                      # (B, Hkv, Lk, D)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask,
                                             enable_gqa=Hkv != H).transpose(1, 2)   # (B, W, H, D)
        out = out[real] if real is not None else out
        return self.o_proj(out.reshape(*lead, H * D))

    def _project(self, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lead, H, Hkv, D = x.shape[:-1], self.n_heads, self.n_kv, self.head_dim
        if self.fused:
            return self.qkv_proj(x).view(*lead, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=-2)
        q = self.q_proj(x).view(*lead, H, D)
        k = self.k_proj(x).view(*lead, Hkv, D)
        v = self.v_proj(x).view(*lead, Hkv, D)
        if self.clip is not None and not self.qk_norm:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        return q, k, v


class Block(nn.Module):
    def __init__(self, cfg: CelerisConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = (SparseMoE(cfg) if layer in cfg.moe_layer_ids
                    else SwiGLU(cfg.hidden_size, cfg.intermediate_size))

    def forward(self, x, cos, sin, key_mask, kv, real=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, key_mask, kv, real)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_fused(self, delta, residual, cos, sin, key_mask, kv, real=None):
        """The same block with each residual add fused into the RMSNorm that follows it
        (Triton kernels): takes and returns the stream as (delta, residual), its value being
        residual + delta; the last add happens in the next block's (or the final) norm."""
        ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
        a, residual = rms_norm(residual, ln1.weight, ln1.eps, delta, fused=True)
        delta = self.self_attn(a, cos, sin, key_mask, kv, real, fused=True)
        a, residual = rms_norm(residual, ln2.weight, ln2.eps, delta, fused=True)
        return self.mlp(a), residual


class Backbone(nn.Module):
    def __init__(self, cfg: CelerisConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CelerisForMaskedDiffusion(PreTrainedModel):
    """Bidirectional transformer returning per-position token logits, (B, L, V).

    ``model(input_ids, attention_mask=None)`` matches the upstream LLaDA call, so code written
    for GSAI-ML/LLaDA-8B-Instruct's remote code runs on this class unchanged.
    """

    config_class = CelerisConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_sdpa = True

    def __init__(self, config: CelerisConfig) -> None:
        super().__init__(config)
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._packed: PackedWeights | None = None
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        with torch.no_grad():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
            elif isinstance(module, Router):
                module.weight.normal_(0.0, std)
                if module.expert_bias is not None:
                    module.expert_bias.zero_()
            elif isinstance(module, Experts):
                module.gate_up_proj.normal_(0.0, std)
                module.down_proj.normal_(0.0, std)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' loader, but a checkpoint that leaves any weight missing (and so
        randomly initialised) is refused with the keys named instead of a warning."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(info.get("missing_keys") or ())
        if missing:
            where = args[0] if args else kwargs.get("pretrained_model_name_or_path", "")
            raise ModelLoadError(f"weights in {where} lack {len(missing)} tensor(s) the "
                                 f"{cls.__name__} needs, e.g. {', '.join(missing[:5])}")
        return (model, info) if want_info else model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_mask: torch.Tensor | None = None,
                kv: KVView | None = None, logits_index: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, **unused) -> MaskedLMOutput:
        """input_ids (B, W); attention_mask (B, Lk) with 1 for real tokens (Lk = W without a
        cache); position_ids (B, W), default: positions counted from each row's first real
        token; logits_mask (B, W) bool selects the rows of the returned logits, (N, V);
        logits_index (B, N) gathers them instead, (B, N, V); attn_mask (B, 1, W, Lk) bool
        replaces the mask the config implies (training layouts)."""
        if attention_mask is None and kv is not None:
            attention_mask = kv.key_mask
        if position_ids is None:
            position_ids = default_positions(input_ids, attention_mask)
        key_mask = attn_mask if attn_mask is not None else self._attention_mask(
            position_ids, attention_mask, kv)
        packed = None
        if self._packed is not None and packed_applies():
            packed = self._packed.current()
            if packed is None:            # the model left the CPU: module path from now on
                self._packed = None
        hooked = dispatch_hooked(self)     # layers spread by device_map: through the modules
        h = self.model.embed_tokens(input_ids) if hooked else \
            F.embedding(input_ids, self.model.embed_tokens.weight)                 # (B, W, C)
        cos, sin = rope_tables(position_ids, self.config.rotary_dim, self.config.rope_theta,
                               h.dtype)
        # left-padded rows (a batch of windows of different widths): every matmul runs on the
        # real columns only, packed (N, C); attention unpacks them to the (B, W) window
        real = getattr(kv, "query_mask", None)
        if real is not None:
            h, cos, sin = h[real], cos[real], sin[real]
        if packed is not None:
            h = packed_layers(packed, h, cos, signed_sin(sin), key_mask, kv, real)
        else:
            h = self._layers(h, cos, sin, key_mask, kv, real, hooked)
        if real is not None:
            h = unpack_rows(h, real.to(h.device))                                  # (B, W, C)
        shift = self.config.shift_logits              # logits at i come from state i-1
        if logits_index is not None:
            logits_index = logits_index.to(h.device)     # the last layer's device (device_map)
            if shift:
                logits_index = (logits_index - 1).clamp_(min=0)
            h = h.gather(1, logits_index[..., None].expand(-1, -1, h.shape[-1]))   # (B, N, C)
        else:
            if shift:
                h = torch.cat([h[:, :1], h[:, :-1]], dim=1)
            if logits_mask is not None:
                h = h[logits_mask.to(h.device)]                                    # (N, C)
        if packed is not None:
            return MaskedLMOutput(logits=packed.logits(h))
        return MaskedLMOutput(logits=self.lm_head(h))

    def _layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                key_mask: torch.Tensor | None, kv: KVView | None,
                real: torch.Tensor | None, hooked: bool = False) -> torch.Tensor:
        """Every block and the final norm over h. On CUDA at inference the RMSNorms with
        the residual adds and the RoPE of q and k run as three Triton launches a layer
        (``kernels.fused_kernels``) instead of ten ops; otherwise, and when accelerate's
        hooks (device_map) must see every block's call, the modules."""
        if hooked or not fused_kernels(h):
            for block in self.model.layers:
                h = block(h, cos, sin, key_mask, kv, real)
            return self.model.norm(h)
        delta = None
        for block in self.model.layers:
            delta, h = block.forward_fused(delta, h, cos, sin, key_mask, kv, real)
        norm = self.model.norm
        return rms_norm(h, norm.weight, norm.eps, delta, fused=True)[0]

    def pack_for_inference(self, max_bytes: int = PACK_MAX_BYTES) -> bool:
        """Decode with packed weights (``packed.py``: fused products in the CPU kernel's own
        layout) in every forward without gradients or autocast, if the model is on the CPU,
        has at most ``max_bytes`` of parameters and only layers the packed path knows (dense
        MLPs, whole-head RoPE, separate q/k/v, no output bias or clamp: ``packed.packable``);
        True when packed. ``unpack_inference()`` goes back to the module path."""
        params = list(self.parameters())
        size = sum(p.numel() * p.element_size() for p in params)
        on_cpu = all(p.device.type == "cpu" for p in params) and not dispatch_hooked(self)
        fits = on_cpu and size <= max_bytes and packable(self.config)
        self._packed = PackedWeights(self) if fits else None
        return self._packed is not None

    def unpack_inference(self) -> None:
        self._packed = None

    def _attention_mask(self, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                        kv: KVView | None) -> torch.Tensor | None:
        """(B, 1, W|1, Lk) bool, or None when every key is visible (SDPA's fast path)."""
        valid = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        if not self.config.block_causal:
            return valid                                                           # (B, 1, 1, Lk)
        bs = self.config.block_size
        key_pos = kv.key_positions if kv is not None and kv.key_positions is not None \
            else position_ids                                                      # (B, Lk)
        mask = (key_pos // bs)[:, None, None, :] <= (position_ids // bs)[:, None, :, None]
        if valid is not None:
            mask = mask & valid                                                    # (B, 1, W, Lk)
        # a padding query that sees no key would give NaN: let it see everything instead
        return mask | ~mask.any(-1, keepdim=True)


def default_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None
                      ) -> torch.Tensor:
    """Positions 0.. from each row's first real token, so a left-padded row sees the same
    positions it would see alone (batch invariance)."""
    W = input_ids.shape[1]
    if attention_mask is None:
        return torch.arange(W, device=input_ids.device).expand_as(input_ids)
    pos = attention_mask.long().cumsum(-1) - 1                                     # (B, Lk)
    return pos[:, -W:].clamp(min=0)
