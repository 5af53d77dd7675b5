"""Unmask schedules, confidence measures, Gumbel noise and the denoising loops (full-canvas
``DenoiseBatch`` and block-causal ``BlockBatch``)."""

from typing import Any

from ..cache import SlotKVCache
from .blockwise import BlockBatch, BlockRow
from .denoise import (DenoiseBatch, MaskPredictor, NonFiniteLogitsError, SamplerRequest,
                      SpecialTokens, StepOutput)
from .policies import CONFIDENCES, SELECTORS, linear_schedule

MAX_CACHE_LEN = 8192     # cache positions per slot, at most (the model's context below)
INITIAL_CACHE_LEN = 1024  # positions a slot starts with; doubled when a request needs more


def new_slot_cache(model: Any, slots: int = 4) -> SlotKVCache:
    """The KV cache of a block-causal model: up to context + one block per slot, starting at
    ``INITIAL_CACHE_LEN`` positions (see ``SlotKVCache``)."""
    cfg = model.config
    param = next(model.parameters())
    length = min(cfg.max_position_embeddings, MAX_CACHE_LEN) + cfg.block_size
    return SlotKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, length,
                       param.dtype, param.device, slots,
                       length=min(length, INITIAL_CACHE_LEN))


__all__ = ["BlockBatch", "BlockRow", "DenoiseBatch", "MaskPredictor", "NonFiniteLogitsError",
           "SamplerRequest", "SpecialTokens", "StepOutput", "CONFIDENCES", "SELECTORS",
           "linear_schedule", "new_slot_cache"]
