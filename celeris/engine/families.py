"""What a model family brings: its layout, its default knobs, its limits and messages.

``family_defaults`` turns a checkpoint's generation_config.json into the request defaults its
family's published sampler uses; ``layouts.layout_for`` picks the layout from the config's
attention kind once, at load. Nothing here runs per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..config import ModelLoadError
from ..params import GenerationParams

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "celeris-tiny-bd"   # the shipped block-diffusion model


class ContextLengthError(ValueError):
    """The prompt (plus the answer canvas) does not fit a token limit; carries the numbers."""

    def __init__(self, prompt_tokens: int, gen_length: int, limit: int) -> None:
        self.prompt_tokens, self.gen_length, self.limit = prompt_tokens, gen_length, limit
        if gen_length:
            message = (f"prompt ({prompt_tokens} tokens) + gen_length ({gen_length}) = "
                       f"{prompt_tokens + gen_length} tokens exceeds the model's context of "
                       f"{limit} tokens")
        else:
            message = f"prompt has {prompt_tokens} tokens; the limit is {limit}"
        super().__init__(message)


def read_generation_defaults(model_dir: Path) -> dict[str, Any]:
    """The GenerationParams fields found in generation_config.json (others are ignored)."""
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    known = set(GenerationParams.field_names())
    defaults = {k: v for k, v in raw.items() if k in known}
    for theirs, ours in (("alg", "remasking"), ("editing_threshold", "edit_threshold"),
                         ("max_post_steps", "max_post_edit_steps")):   # Dream's, LLaDA2.1's
        if theirs in raw and ours not in defaults:
            defaults[ours] = raw[theirs]
    try:
        GenerationParams.from_dict(defaults)
    except ValueError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return defaults


# Each family's published sampler, used where the checkpoint's generation_config.json is
# silent. Fast-dLLM v2's generate(): sub-blocks of 8, threshold 0.9, the first token of a block
# greedy; LLaDA2's generate(): threshold 0.95; SDAR's generate.py: low_confidence_dynamic at
# 0.85 (its sampling temperature 1.0 is not taken: greedy stays the default). All commit
# strictly above the threshold, as every block-causal layout here does
# (``BlockLayout.strict_threshold``).
SDAR_SAMPLER = {"decoding": "dynamic", "threshold": 0.85}
FAMILY_SAMPLERS: dict[str, dict[str, Any]] = {
    "fast_dllm_v2": {"block_length": 8, "decoding": "threshold", "threshold": 0.9,
                     "first_token": "greedy"},
    "llada2": {"decoding": "threshold", "threshold": 0.95},
    "sdar": SDAR_SAMPLER, "sdar_moe": SDAR_SAMPLER,
    # DiffusionGemma: its checkpoint's temperature schedule as published (gemma_layout.py)
    "diffusion_gemma": {"temperature": 1.0},
}


# What the playground and /info call a checkpoint's family (config.family, else model_type).
FAMILY_NAMES = {"llada2": "LLaDA2.x (MoE)", "llada_moe": "LLaDA-MoE", "sdar_moe": "SDAR-MoE",
                "fast_dllm_v2": "Fast-dLLM v2", "Fast_dLLM_Qwen": "Fast-dLLM v2",
                "llada": "LLaDA", "Dream": "Dream", "sdar": "SDAR", "celeris": "Celeris tiny",
                "llama": "Llama (autoregressive)", "diffusion_gemma": "DiffusionGemma"}


def family_name(config: Any) -> str:
    family = getattr(config, "family", None)
    return FAMILY_NAMES.get(family or "") or FAMILY_NAMES.get(config.model_type) or \
        str(config.model_type)


def family_defaults(layout: Any, family: str | None, given: dict[str, Any]
                    ) -> GenerationParams:
    """The request defaults: the checkpoint's generation config, then the family's published
    sampler, then GenerationParams'. A block-causal model uses its block as the sub-block, the
    exact cache and the adaptive step count unless told otherwise."""
    changes: dict[str, Any] = {}
    if layout.block_causal:
        changes = {"block_length": layout.block_size, "cache": "prefix", "steps": None}
    changes.update(FAMILY_SAMPLERS.get(family or "", {}))
    if layout.block_causal:          # a sub-block must divide the model's block
        bs = layout.block_size
        changes["block_length"] = max(d for d in range(1, bs + 1)
                                      if bs % d == 0 and d <= changes["block_length"])
    return GenerationParams.from_dict({**changes, **given})


def split_infill(text: str, marker: str = "[MASK]") -> list[str]:
    """The pinned pieces of an infill text around its ``marker`` spans.

    A space right before a span moves into the span: byte-level BPE and SentencePiece
    vocabularies spell a word with its leading space (``" cat"``), so ``"a [MASK]"`` must
    become ``"a"`` + masked positions, not ``"a "`` + a lone space token the model never saw
    in training followed by space-less words.
    """
    parts = text.split(marker)
    return [p[:-1] if i < len(parts) - 1 and p.endswith(" ") else p
            for i, p in enumerate(parts)]


def infill_refusal(model: str) -> str:
    """Why a block-causal model does not infill, and which model does."""
    return (f"{model} is a block-diffusion (block-causal) model: it writes left to right, "
            "block after block, so it cannot fill [MASK] spans between pinned text; infill "
            "with a full-attention model such as models/celeris-tiny "
            "(Engine.from_pretrained(\"models/celeris-tiny\"), or --model models/celeris-tiny)")


def memory_info(device: torch.device) -> dict[str, Any]:
    """GPU memory via torch on CUDA, process RSS on CPU, labelled which."""
    if device.type == "cuda":
        return {"memory_kind": "gpu", "memory_bytes": torch.cuda.memory_allocated(device),
                "memory_peak_bytes": torch.cuda.max_memory_allocated(device)}
    try:
        import psutil
        rss = psutil.Process().memory_info().rss
    except ImportError:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"memory_kind": "rss", "memory_bytes": rss}


def check_block_params(params: GenerationParams, block_size: int) -> None:
    """What a block-causal model needs of a request beyond GenerationParams' own checks."""
    if block_size % params.block_length:
        divisors = [d for d in range(1, block_size + 1) if block_size % d == 0]
        raise ValueError(f"block_length must divide the model's block size {block_size} "
                         f"(one of {', '.join(map(str, divisors))}), got {params.block_length}")
    if params.cfg_scale > 0:
        raise ValueError("cfg_scale > 0 is not supported for block-causal models")
