"""DiffusionGemma (model_type "diffusion_gemma"): transformers' own encoder/decoder model.

A causal encoder writes the prompt and each finished canvas into a cache; a bidirectional
decoder denoises one canvas of ``canvas_length`` positions from uniform noise with an
entropy-bound sampler (``gemma_layout.py``). There is no mask token. The model is
transformers' (``model/diffusion_gemma.py`` wraps it), loaded by ``load`` below; its sampler
settings come from the checkpoint's generation_config.json, with temperature 1 (the
published schedule) as the request default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from ..config import ModelLoadError
from ..model.diffusion_gemma import load_diffusion_gemma
from ..model.weights import weight_files
from .gemma_layout import GemmaLayout
from .registry import Family, register
from .tool_calls import ToolSyntax


class DiffusionGemmaConfig(PretrainedConfig):
    """A DiffusionGemma checkpoint's config.json (model_type "diffusion_gemma", class
    DiffusionGemmaForBlockDiffusion), read for the engine; the model itself is transformers'
    (``diffusion_gemma.py``), built from the same file. The text part (``text_config``) is
    flattened onto this object; the vision tower is loaded but not used (text prompts only).

    The engine's attributes: ``block_causal`` (canvases are blocks, each sees every earlier
    one through the encoder's cache), ``block_size`` (= ``canvas_length``) and
    ``mask_token_id``: DiffusionGemma has no mask token, so the engine's "not yet final"
    marker is the id ``vocab_size``, which no real token can take.
    """

    model_type = "diffusion_gemma"

    def __init__(self, text_config: dict | None = None, vision_config: dict | None = None,
                 canvas_length: int = 256, **kwargs) -> None:
        text = dict(text_config or {})
        if hasattr(text_config, "to_dict"):
            text = text_config.to_dict()
        self.vocab_size = text.get("vocab_size", 262_144)
        self.hidden_size = text.get("hidden_size", 2304)
        self.num_hidden_layers = text.get("num_hidden_layers", 30)
        self.max_position_embeddings = text.get("max_position_embeddings", 131_072)
        self.sliding_window = text.get("sliding_window", 512)
        self.use_bidirectional_attention = text.get("use_bidirectional_attention")
        self.num_experts = text.get("num_experts")
        self.top_k_experts = text.get("top_k_experts")
        self.canvas_length = canvas_length
        eos = text.get("eos_token_id", kwargs.pop("eos_token_id", 1))
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        # the engine's stop ids: the tokenizer's EOS, and a second configured EOS as EoT
        self.eot_token_id = eos_ids[1] if len(eos_ids) > 1 else None
        self.attention, self.block_size, self.shift_logits = "block_causal", canvas_length, False
        self.family = "diffusion_gemma"
        for unused in ("boi_token_id", "eoi_token_id", "image_token_id", "initializer_range",
                       "dtype", "torch_dtype"):
            kwargs.pop(unused, None)
        super().__init__(pad_token_id=text.get("pad_token_id", 0), eos_token_id=eos_ids[0],
                         bos_token_id=text.get("bos_token_id", 2), **kwargs)
        # set after PretrainedConfig's checks, which expect a mask id inside the vocabulary
        self.mask_token_id = self.vocab_size if isinstance(self.vocab_size, int) else None
        self._check()

    @property
    def block_causal(self) -> bool:
        return True

    def _check(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "canvas_length",
                     "sliding_window", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config field {name} must be a positive integer, "
                                 f"got {value!r}")
        if self.use_bidirectional_attention not in (None, "vision"):
            raise ValueError(f"config field use_bidirectional_attention must be null or "
                             f"'vision' (the engine encodes the prompt and each finished "
                             f"canvas once, causally), got "
                             f"{self.use_bidirectional_attention!r}")


def load(config: DiffusionGemmaConfig, model_dir: Path, device: torch.device,
         dtype: torch.dtype, device_map: str | None, **options: Any) -> Any:
    """transformers' model on one device (a clear error for a missing weight file);
    ``options`` go to its ``from_pretrained`` (a compressed-tensors checkpoint's
    ``quantization_config``: ``families.loading.prequantized``)."""
    if device_map is not None:
        raise ModelLoadError("device_map: DiffusionGemma checkpoints load on one device; "
                             "leave device_map unset (None)")
    weight_files(model_dir)
    return load_diffusion_gemma(config, model_dir, device, dtype, **options)


DIFFUSION_GEMMA = register(Family(
    name="diffusion_gemma", display="DiffusionGemma", model_types=("diffusion_gemma",),
    config_class=DiffusionGemmaConfig, architectures=("DiffusionGemmaForBlockDiffusion",),
    sampler={"temperature": 1.0}, layout=GemmaLayout, load=load, auto=False,
    tool_calls=ToolSyntax("generic", constrained=False)))
