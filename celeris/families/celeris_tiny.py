"""Celeris's own checkpoints (model_type "celeris"): the shipped tiny models and any model
trained by ``celeris train``. Full attention (``celeris-tiny``) or block-causal
(``celeris-tiny-bd``) as their config says; GenerationParams' defaults and each checkpoint's
generation_config.json are their sampler. Their chat template has no tool-call syntax of its
own: tool calls use the documented generic one. They learned single-turn chats, so a chat
prompt is sent as its system turns and its last user turn (``single_turn_chat``): a request
after other turns is answered as it would be alone.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig
from .registry import Family, register

CELERIS = register(Family(
    name="celeris", display="Celeris tiny", model_types=("celeris",), config_class=CelerisConfig,
    architectures=("CelerisForMaskedDiffusion",), single_turn_chat=True))
