"""Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_*): Qwen2.5 adapted to block diffusion.

Block-causal over ``bd_size`` positions with logits shifted by one. Its published sampler
(``generate()``): sub-blocks of 8, threshold 0.9 committed strictly above, the first token of
each block greedy. Its mask token (``|<MASK>|``) is given in its model card. Its chat template
is Qwen2.5's, whose tool calls are ``<tool_call>{json}</tool_call>``.
"""

from __future__ import annotations

from ..model.configuration import CelerisConfig
from .layouts import BlockLayout
from .registry import Family, register
from .tool_calls import QWEN


class FastDLLMQwenConfig(CelerisConfig):
    """Efficient-Large-Model/Fast_dLLM_v2_* configs (model_type "Fast_dLLM_Qwen"): Qwen2.5
    blocks with q/k/v biases, block-causal over ``bd_size`` positions, and logits shifted by
    one position (the token at i is predicted from the state at i-1, as in the AR model it was
    adapted from)."""

    model_type = "Fast_dLLM_Qwen"

    def __init__(self, bd_size: int = 32, qkv_bias: bool = True, shift_logits: bool = True,
                 **kwargs) -> None:
        qkv_bias = kwargs.pop("attention_bias", qkv_bias)    # Qwen's spelling
        kwargs.setdefault("attention", "block_causal")
        kwargs.setdefault("block_size", bd_size)
        kwargs.setdefault("family", "fast_dllm_v2")
        self.bd_size = bd_size
        super().__init__(qkv_bias=qkv_bias, shift_logits=shift_logits, **kwargs)


FAST_DLLM_V2 = register(Family(
    name="fast_dllm_v2", display="Fast-dLLM v2", model_types=("Fast_dLLM_Qwen",),
    config_class=FastDLLMQwenConfig, architectures=("FastDLLMQwenModel",), causal_lm=True,
    special_ids={"mask": 151665},
    sampler={"block_length": 8, "decoding": "threshold", "threshold": 0.9,
             "first_token": "greedy"},
    layout=BlockLayout, tool_calls=QWEN))
