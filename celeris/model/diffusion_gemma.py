"""DiffusionGemma through transformers' own classes (``transformers.models.diffusion_gemma``,
class ``DiffusionGemmaForBlockDiffusion``; text prompts only).

The architecture is transformers': a causal encoder over the prompt and the finished canvases
writes a KV cache, and a bidirectional decoder (the same weights) denoises one canvas against
that cache without writing it. Celeris adds what an engine needs around it:

- a per-request cache (``GemmaCache``: transformers' ``DynamicCache`` plus the number of
  positions encoded), filled by ``encode`` with explicit positions (a sliding layer's cache
  keeps only its window, so its length is not the next position);
- ``stack``: the caches of the running requests as one batch cache, each layer's keys/values
  right-padded to the longest row, with the decoder's 4D masks hiding the padding (one mask
  per layer type: the sliding and the full layers hold different lengths), so that requests
  of different prompt lengths and ages share one decoder forward;
- ``denoise``: that decoder forward with per-row positions and self-conditioning.

The sampler is its layout's (``celeris/families/gemma_layout.py``); the config reader and
the family's declaration are in ``celeris/families/diffusion_gemma.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelLoadError

# The reference generate()'s defaults when a checkpoint's generation_config.json is silent
# (DiffusionGemmaGenerationConfig._get_default_generation_params).
SAMPLER_DEFAULTS = {"max_denoising_steps": 48, "t_min": 0.4, "t_max": 0.8,
                    "entropy_bound": 0.1, "stability_threshold": 1,
                    "confidence_threshold": 0.005}


@dataclass(eq=False)
class GemmaCache:
    """One request's encoded prefix: transformers' cache and ``length``, the positions
    encoded so far (the next one's position)."""

    hf: Any                     # transformers.DynamicCache
    length: int = 0
    version: int = 0            # bumped at each encode (a batch built from it is stale)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's cached keys and values, (1, Hkv, n, D)."""
        entry = self.hf.layers[i]
        return entry.keys, entry.values


class DiffusionGemma(nn.Module):
    """Celeris's handle on transformers' ``DiffusionGemmaForBlockDiffusion`` (``hf``):
    ``encode`` a prefix into a ``GemmaCache``, ``stack`` the caches of a batch, ``denoise``
    the batch's canvases. ``config`` is Celeris's reading of the same config.json (the
    engine's fields: canvas, vocabulary, stop ids)."""

    def __init__(self, hf: nn.Module, config: Any) -> None:
        super().__init__()
        self.hf, self.config = hf, config
        self.layer_types = list(hf.config.get_text_config().layer_types)

    def new_cache(self) -> GemmaCache:
        from transformers import DynamicCache
        return GemmaCache(DynamicCache(config=self.hf.config.get_text_config(decoder=True)))

    @torch.no_grad()
    def encode(self, ids: torch.Tensor, cache: GemmaCache | None = None) -> GemmaCache:
        """Append ``ids`` (1, n), at positions cache.length.., to ``cache`` (a new one when
        None) through the causal encoder."""
        cache = cache or self.new_cache()
        n = ids.shape[1]
        pos = torch.arange(cache.length, cache.length + n, device=ids.device)[None]
        self.hf.model.encoder(input_ids=ids, cache=cache.hf, position_ids=pos)
        cache.length += n
        cache.version += 1
        return cache

    def stack(self, caches: list[GemmaCache]) -> tuple[Any, dict | None]:
        """(batch cache, key masks) for the rows' caches: one request's own cache as it is;
        several padded on the right to the longest, with per layer type a (B, M) mask of the
        real entries (None when no row is padded)."""
        if len(caches) == 1:
            return caches[0].hf, None
        from transformers import DynamicCache
        out = DynamicCache(config=self.hf.config.get_text_config(decoder=True))
        real: dict[str, torch.Tensor] = {}
        padded = False
        for i, kind in enumerate(self.layer_types):
            ks, vs = zip(*(c.layer(i) for c in caches))
            lens = [k.shape[2] for k in ks]
            M = max(lens)
            entry = out.layers[i]
            entry.keys = torch.cat([F.pad(k, (0, 0, 0, M - k.shape[2])) for k in ks])
            entry.values = torch.cat([F.pad(v, (0, 0, 0, M - v.shape[2])) for v in vs])
            entry.is_initialized = True
            if kind not in real:
                dev = ks[0].device
                real[kind] = torch.arange(M, device=dev)[None] < torch.tensor(lens,
                                                                             device=dev)[:, None]
                padded |= min(lens) < M
        return out, (real if padded else None)

    @torch.no_grad()
    def denoise(self, canvas: torch.Tensor, positions: torch.Tensor, batch: tuple[Any, dict | None],
                self_conditioning_logits: torch.Tensor | None = None,
                self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, L, V) float32 for canvases (B, L) at ``positions`` (B, L) against a
        ``stack``ed batch; ``self_conditioning_mask`` (B,) bool zeroes the signal of the rows
        at a canvas's first step when others pass logits."""
        cache, real = batch
        masks = None
        if real is not None:          # the canvas sees the real cached keys and all of itself
            own = torch.ones(canvas.shape, dtype=torch.bool, device=canvas.device)
            L = canvas.shape[1]
            masks = {kind: torch.cat([m, own], dim=1)[:, None, None, :].expand(
                         -1, 1, L, -1) for kind, m in real.items()}
        return self.hf(cache=cache, decoder_input_ids=canvas,
                       self_conditioning_logits=self_conditioning_logits,
                       self_conditioning_mask=self_conditioning_mask,
                       decoder_attention_mask=masks, decoder_position_ids=positions).logits


# ---------------------------------------------------------------------- loading
def load_diffusion_gemma(config: Any, model_dir: Path, device: torch.device,
                         dtype: torch.dtype, **options: Any) -> DiffusionGemma:
    """transformers' model from the checkpoint directory, every weight accounted for: a
    missing or unexpected tensor is refused by name (transformers would only warn).
    ``options`` go to ``from_pretrained`` (a compressed-tensors ``quantization_config``)."""
    try:
        from transformers import DiffusionGemmaForBlockDiffusion as HFModel
    except ImportError:
        import transformers
        raise ModelLoadError(f"DiffusionGemma needs transformers >= 5.24 (its own "
                             f"diffusion_gemma classes); this is {transformers.__version__}")
    try:
        hf, info = HFModel.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True,
                                           attn_implementation="sdpa",
                                           output_loading_info=True, **options)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise ModelLoadError(f"cannot load the DiffusionGemma checkpoint in {model_dir}: "
                             f"{exc}") from None
    for what in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        names = sorted(str(k) for k in info.get(what) or ())
        if names:
            raise ModelLoadError(f"weights in {model_dir}: {len(names)} "
                                 f"{what.replace('_keys', '')} tensor(s), e.g. "
                                 f"{', '.join(names[:3])}")
    hf = hf.to(device).eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    config.sampler = read_sampler(model_dir)
    return DiffusionGemma(hf, config)


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
