"""Dream (Dream-org/Dream-v0-*-7B): full attention with Qwen2 names and shifted logits.

Its generation_config.json names the remasking rule ``alg``.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig
from .layouts import CanvasLayout
from .registry import Family, register


class DreamConfig(CelerisConfig):
    """Dream-org/Dream-v0-* configs (model_type "Dream"): Qwen2 names, biases, shifted logits."""

    model_type = "Dream"

    def __init__(self, qkv_bias: bool = True, shift_logits: bool = True, **kwargs) -> None:
        super().__init__(qkv_bias=qkv_bias, shift_logits=shift_logits, **kwargs)


DREAM = register(Family(
    name="dream", display="Dream", model_types=("Dream",), config_class=DreamConfig,
    architectures=("DreamModel",), generation_keys={"alg": "remasking"}, layout=CanvasLayout))
