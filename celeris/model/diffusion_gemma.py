"""DiffusionGemma, natively: a causal encoder over the prompt and the finished canvases, and a
bidirectional decoder that denoises one canvas at a time (transformers' ``diffusion_gemma``,
class DiffusionGemmaForBlockDiffusion; text prompts only).

The encoder and the decoder are one stack of Gemma 4 layers run two ways (they share every
weight but each layer's ``layer_scalar``):

- encoding appends keys/values to a per-request cache (``GemmaCache``) with a causal mask,
  limited to the last ``sliding_window`` positions in the sliding layers (whose cache keeps
  only the last ``sliding_window - 1`` positions, all a later query can see);
- denoising reads that cache without writing it: the canvas sees every cached key of the full
  layers, the cached keys of the sliding layers, and the whole canvas (no mask).

A layer: sandwich RMSNorms around attention and around the feed-forward, which adds a dense
GELU MLP to a routed mixture of experts (``moe.Experts`` with GELU; the router normalises its
input without a scale, multiplies by a learned scale and hidden**-0.5, softmaxes, keeps the
top-k renormalised, times a per-expert scale); then the whole layer output is multiplied by
``layer_scalar``. Attention normalises q and k per head (RMSNorm) and v (RMSNorm without a
scale), uses scale 1, and in the full layers projects no values: the keys' projection serves
for both. RoPE is plain in the sliding layers; the full layers use "proportional" RoPE: the
first ``partial_rotary_factor`` of the frequency pairs of a head turn, the rest stay fixed.

The decoder's input is the canvas embedding (times sqrt(hidden)) plus a self-conditioning
signal: the softmax of the previous step's logits times the embedding matrix (zero at a
canvas's first step), through a pre-normed GELU MLP, the sum RMS-normed without a scale. The
logits are the tied embedding head in float32, soft-capped at ``final_logit_softcapping``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelLoadError
from .configuration import DiffusionGemmaConfig
from .modeling import apply_rope
from .moe import Experts

# The reference generate()'s defaults when a checkpoint's generation_config.json is silent
# (DiffusionGemmaGenerationConfig._get_default_generation_params).
SAMPLER_DEFAULTS = {"max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8,
                    "entropy_bound": 0.1, "stability_threshold": 1,
                    "confidence_threshold": 0.005}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GemmaNorm(nn.Module):
    """RMSNorm computed in float32 as x * (mean(x^2) + eps)^-0.5, times ``weight`` when it
    has one (the v norm, the router's and the self-conditioning output's have none)."""

    def __init__(self, dim: int, eps: float, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.type_as(x)


class GeluMLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh(self.gate_proj(x)) * self.up_proj(x))


def inverse_frequencies(cfg: DiffusionGemmaConfig, layer: int, device: torch.device
                        ) -> torch.Tensor:
    """(D/2,) float32 frequencies of layer ``layer``'s RoPE; zeros for pairs that stay fixed."""
    D, _, _ = cfg.layer_shape(layer)
    rope = cfg.rope_by_layer_type[cfg.layer_types[layer]]
    theta = float(rope.get("rope_theta", 10_000.0))
    if rope.get("rope_type", "default") == "default":
        return 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float, device=device) / D))
    turning = int(rope.get("partial_rotary_factor", 1.0) * D // 2)
    inv = 1.0 / (theta ** (torch.arange(0, 2 * turning, 2, dtype=torch.float, device=device)
                           / D))
    inv = torch.cat([inv, torch.zeros(D // 2 - turning, device=device)])
    return inv / float(rope.get("factor", 1.0))


def rope_for(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (B, L, 1, D) for positions (B, L)."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, :, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


class GemmaAttention(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        D, Hkv, self.sliding = cfg.layer_shape(layer)
        H, C, bias = cfg.num_attention_heads, cfg.hidden_size, cfg.attention_bias
        self.H, self.Hkv, self.D = H, Hkv, D
        self.q_proj = nn.Linear(C, H * D, bias=bias)
        self.k_proj = nn.Linear(C, Hkv * D, bias=bias)
        self.v_proj = nn.Linear(C, Hkv * D, bias=bias) if self.sliding else None
        self.o_proj = nn.Linear(H * D, C, bias=bias)
        self.q_norm = GemmaNorm(D, cfg.rms_norm_eps)
        self.k_norm = GemmaNorm(D, cfg.rms_norm_eps)
        self.v_norm = GemmaNorm(D, cfg.rms_norm_eps, scale=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, W, C) -> output (B, W, C) and this window's keys/values (B, Hkv, W, D)."""
        B, W, _ = x.shape
        q = apply_rope(self.q_norm(self.q_proj(x).view(B, W, self.H, self.D)), cos, sin)
        raw_k = self.k_proj(x).view(B, W, self.Hkv, self.D)
        raw_v = raw_k if self.v_proj is None else self.v_proj(x).view(B, W, self.Hkv, self.D)
        k = apply_rope(self.k_norm(raw_k), cos, sin).transpose(1, 2)
        v = self.v_norm(raw_v).transpose(1, 2)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], dim=2),
                                                    torch.cat([past[1], v], dim=2))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                             scale=1.0, enable_gqa=self.Hkv != self.H)
        return self.o_proj(out.transpose(1, 2).reshape(B, W, self.H * self.D)), k, v


class GemmaRouter(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps, scale=False)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.num_experts))
        self.root, self.top_k = cfg.hidden_size ** -0.5, cfg.top_k_experts

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, C) -> expert ids (N, k) and weights (N, k)."""
        probs = F.softmax(self.proj(self.norm(x) * self.scale * self.root), dim=-1,
                          dtype=torch.float32)
        weights, idx = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return idx, weights * self.per_expert_scale[idx]


class GemmaLayer(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig, layer: int) -> None:
        super().__init__()
        C, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = GeluMLP(C, cfg.intermediate_size)
        self.router = GemmaRouter(cfg)
        self.experts = Experts(cfg, act=gelu_tanh)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1",
                     "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
            setattr(self, name, GemmaNorm(C, eps))
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)   # the decoder's

    def forward(self, x, cos, sin, past, mask, scalar: torch.Tensor):
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past, mask)
        x = x + self.post_attention_layernorm(attn)
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        idx, weights = self.router(flat)                  # routed on the un-normed residual
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), idx, weights)
        routed = self.post_feedforward_layernorm_2(routed.view_as(x))
        x = x + self.post_feedforward_layernorm(dense + routed)
        return x * scalar, k, v


class SelfConditioning(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.pre_norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps, scale=False)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, embeds: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
        h = self.pre_norm(soft)
        return self.post_norm(embeds + self.down_proj(gelu_tanh(self.gate_proj(h))
                                                      * self.up_proj(h)))


class Decoder(nn.Module):
    """The shared stack, under the decoder's names (``model.decoder.*``)."""

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_conditioning = SelfConditioning(cfg)


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)


class _EncoderText(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Scalar() for _ in range(cfg.num_hidden_layers))


class _Encoder(nn.Module):
    """The encoder's own tensors: only its layer scalars (``model.encoder.language_model``)."""

    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.language_model = _EncoderText(cfg)


class _Inner(nn.Module):
    def __init__(self, cfg: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.encoder = _Encoder(cfg)
        self.decoder = Decoder(cfg)


@dataclass
class GemmaCache:
    """One request's encoded prefix: per layer the keys/values (B, Hkv, n, D) of every
    position (full layers) or of the last ``sliding_window - 1`` (sliding layers), and
    ``length``, the positions encoded so far (the next one's position)."""

    keys: list[torch.Tensor | None]
    values: list[torch.Tensor | None]
    length: int = 0
    version: int = 0            # bumped at each encode (a batch built from it is stale)

    @classmethod
    def empty(cls, layers: int) -> "GemmaCache":
        return cls([None] * layers, [None] * layers)


@dataclass
class GemmaOutput:
    logits: torch.Tensor
    cache: GemmaCache | None = field(default=None)


class DiffusionGemmaForBlockDiffusion(nn.Module):
    """Celeris's DiffusionGemma: ``encode`` a prefix into a ``GemmaCache``, ``denoise`` a
    canvas against one. ``forward(input_ids, decoder_input_ids, self_conditioning_logits)``
    does both, like the reference's first call of a canvas."""

    def __init__(self, config: DiffusionGemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Inner(config)
        self.softcap = float(config.final_logit_softcapping or 0.0)

    # ------------------------------------------------------------------ pieces
    @property
    def decoder(self) -> Decoder:
        return self.model.decoder

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.decoder.embed_tokens.weight
        return F.embedding(ids, w) * self._embed_scale(w.dtype)

    def _embed_scale(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(self.config.hidden_size ** 0.5).to(dtype)

    def _tables(self, positions: torch.Tensor, dtype: torch.dtype) -> list[tuple]:
        """cos/sin per layer (computed once per layer type: the layers of a type share it)."""
        seen: dict[str, tuple] = {}
        out = []
        for i, kind in enumerate(self.config.layer_types):
            if kind not in seen:
                inv = inverse_frequencies(self.config, i, positions.device)
                seen[kind] = rope_for(inv, positions, dtype)
            out.append(seen[kind])
        return out

    # ------------------------------------------------------------------ encoder
    @torch.no_grad()
    def encode(self, ids: torch.Tensor, cache: GemmaCache | None = None) -> GemmaCache:
        """Append ``ids`` (B, n), at positions cache.length.., to ``cache`` (a new one when
        None): the causal encoder, whose keys/values are all the decoder ever sees of them."""
        cfg = self.config
        cache = cache or GemmaCache.empty(cfg.num_hidden_layers)
        B, n = ids.shape
        start, W = cache.length, cfg.sliding_window
        dev = ids.device
        pos = torch.arange(start, start + n, device=dev)
        h = self._embed(ids)
        tables = self._tables(pos.expand(B, n), h.dtype)
        scalars = self.model.encoder.language_model.layers
        masks: dict[bool, torch.Tensor] = {}
        for i, layer in enumerate(self.decoder.layers):
            sliding = layer.self_attn.sliding
            past = None if cache.keys[i] is None else (cache.keys[i], cache.values[i])
            if sliding not in masks:
                m = 0 if past is None else past[0].shape[2]
                kpos = torch.arange(start - m, start + n, device=dev)
                mask = kpos[None, :] <= pos[:, None]
                if sliding:
                    mask = mask & (kpos[None, :] > pos[:, None] - W)
                masks[sliding] = mask
            cos, sin = tables[i]
            h, k, v = layer(h, cos, sin, past, masks[sliding], scalars[i].layer_scalar)
            keys = k if past is None else torch.cat([past[0], k], dim=2)
            values = v if past is None else torch.cat([past[1], v], dim=2)
            if sliding:                # a later query sees at most W - 1 earlier positions
                keys, values = keys[:, :, -(W - 1):], values[:, :, -(W - 1):]
            cache.keys[i], cache.values[i] = keys, values
        cache.length += n
        cache.version += 1
        return cache

    # ------------------------------------------------------------------ decoder
    def soft_embeddings(self, logits: torch.Tensor) -> torch.Tensor:
        """The self-conditioning input: softmax(logits) @ embeddings * sqrt(hidden)."""
        w = self.decoder.embed_tokens.weight
        probs = F.softmax(logits, dim=-1, dtype=torch.float32).to(w.dtype)
        return torch.matmul(probs, w) * self._embed_scale(w.dtype)

    @torch.no_grad()
    def denoise(self, canvas: torch.Tensor, positions: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor],
                key_masks: list[torch.Tensor | None] | None = None,
                self_conditioning_logits: torch.Tensor | None = None,
                self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, L, V) float32 for canvases (B, L) at ``positions`` (B, L), reading
        per-layer cached keys/values (B, Hkv, M, D); ``key_masks[i]`` (B, M) is True for the
        real entries of layer i when rows of different lengths are padded (None: all real).
        ``self_conditioning_mask`` (B,) bool zeroes the signal of the rows at a canvas's
        first step when others pass logits."""
        embeds = self._embed(canvas)
        if self_conditioning_logits is None:
            soft = torch.zeros_like(embeds)
        else:
            soft = self.soft_embeddings(self_conditioning_logits).to(embeds.dtype)
            if self_conditioning_mask is not None:
                soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
        h = self.decoder.self_conditioning(embeds, soft)
        tables = self._tables(positions, h.dtype)
        own = torch.ones(canvas.shape, dtype=torch.bool, device=canvas.device)
        masks: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.decoder.layers):
            km = None if key_masks is None else key_masks[i]
            if km is not None and id(km) not in masks:
                masks[id(km)] = torch.cat([km.bool(), own], dim=1)[:, None, None, :]
            cos, sin = tables[i]
            mask = None if km is None else masks[id(km)]
            h, _, _ = layer(h, cos, sin, (keys[i], values[i]), mask, layer.layer_scalar)
        h = self.decoder.norm(h)
        logits = F.linear(h, self.decoder.embed_tokens.weight).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None,
                self_conditioning_logits: torch.Tensor | None = None,
                cache: GemmaCache | None = None, **unused: Any) -> GemmaOutput:
        """Encode ``input_ids`` (B, n) after ``cache`` (if given), then denoise
        ``decoder_input_ids`` (B, L) right after everything encoded."""
        if input_ids is not None:
            cache = self.encode(input_ids, cache)
        if cache is None or decoder_input_ids is None:
            raise ValueError("forward needs decoder_input_ids and input_ids or a cache")
        B, L = decoder_input_ids.shape
        pos = torch.arange(cache.length, cache.length + L,
                           device=decoder_input_ids.device).expand(B, L)
        logits = self.denoise(decoder_input_ids, pos, cache.keys, cache.values, None,
                              self_conditioning_logits)
        return GemmaOutput(logits=logits, cache=cache)


# ---------------------------------------------------------------------- loading
_TIED = ("model.encoder.language_model.", "model.decoder.")
_SKIPPED = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")


def canonical_gemma_name(name: str) -> str | None:
    """Our name for a checkpoint tensor; None for the parts Celeris does not use (the vision
    tower, the tied head). The encoder's copies of shared weights (a checkpoint saved from
    the encoder's side) become the decoder's; its layer scalars stay its own."""
    if name.startswith(_SKIPPED) or name == "lm_head.weight":
        return None
    if name.startswith(_TIED[0]) and not name.endswith(".layer_scalar"):
        return _TIED[1] + name[len(_TIED[0]):]
    return name


def load_diffusion_gemma(config: DiffusionGemmaConfig,
                         tensors: Iterable[tuple[str, torch.Tensor]], device: torch.device,
                         dtype: torch.dtype, model_dir: Path) -> DiffusionGemmaForBlockDiffusion:
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    expected = dict(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors:
        ours = canonical_gemma_name(name)
        if ours is None or ours not in expected:
            continue
        if ours in state and not name.startswith("model.decoder."):
            continue                       # the decoder's copy of a tied weight wins
        if tuple(tensor.shape) != tuple(expected[ours].shape):
            raise ModelLoadError(f"tensor {name} has shape {tuple(tensor.shape)} but the "
                                 f"config in {model_dir / 'config.json'} implies "
                                 f"{tuple(expected[ours].shape)}")
        state[ours] = tensor.to(device=device, dtype=dtype)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"weights in {model_dir} lack {len(missing)} tensor(s), e.g. "
                             f"{', '.join(missing[:3])}")
    model.load_state_dict(state, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    config.sampler = read_sampler(model_dir)
    return model.eval()


def read_sampler(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's entropy-bound sampler settings from generation_config.json (the
    reference's defaults where absent), checked with the field named."""
    out = dict(SAMPLER_DEFAULTS)
    path = Path(model_dir) / "generation_config.json"
    raw: dict[str, Any] = {}
    if path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    sampler = raw.get("sampler_config") or {}
    if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
        out["entropy_bound"] = sampler["entropy_bound"]
    for key in ("max_denoising_steps", "t_min", "t_max", "stability_threshold",
                "confidence_threshold"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    try:
        check_sampler(out)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return out


def check_sampler(s: dict[str, Any]) -> None:
    steps = s["max_denoising_steps"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"max_denoising_steps must be a positive integer, got {steps!r}")
    for key in ("t_min", "t_max", "entropy_bound", "confidence_threshold"):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0 or (v == 0 and key != "t_min"):
            raise ValueError(f"{key} must be a finite number "
                             f"{'>= 0' if key == 't_min' else '> 0'}, got {v!r}")
    if s["t_max"] <= s["t_min"]:
        raise ValueError(f"t_max ({s['t_max']}) must be greater than t_min ({s['t_min']})")
    st = s["stability_threshold"]
    if isinstance(st, bool) or not isinstance(st, int) or st < 0:
        raise ValueError(f"stability_threshold must be an integer >= 0, got {st!r}")
