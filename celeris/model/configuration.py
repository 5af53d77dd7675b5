"""Model configurations: our canonical one and the upstream LLaDA / Dream spellings.

All three describe the same bidirectional transformer; LLaDA and Dream configs only rename
fields (LLaDA keeps OLMo's names: d_model, n_layers, ...) and set the flags that differ
(Dream: q/k/v biases and logits shifted by one position).
"""

from __future__ import annotations

from transformers import PretrainedConfig


class CelerisConfig(PretrainedConfig):
    """A masked-diffusion transformer: Llama-style blocks with the causal mask removed.

    shift_logits: Dream's convention: the logits for position i are read from the hidden state
                  at i-1 (the model was initialised from an autoregressive one). It also helps a
                  tiny model trained from scratch: a masked position gets its neighbour's
                  unmasked state directly.
    """

    model_type = "celeris"

    def __init__(self, vocab_size: int = 2048, hidden_size: int = 256,
                 intermediate_size: int = 768, num_hidden_layers: int = 6,
                 num_attention_heads: int = 4, num_key_value_heads: int | None = None,
                 head_dim: int | None = None, max_position_embeddings: int = 4096,
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-5,
                 qkv_bias: bool = False, shift_logits: bool = False,
                 tie_word_embeddings: bool = False, initializer_range: float = 0.02,
                 mask_token_id: int | None = None, eot_token_id: int | None = None,
                 conv_kernel_size: int = 0, **kwargs) -> None:
        if conv_kernel_size:
            raise ValueError("conv_kernel_size is not supported (it breaks the block KV cache); "
                             "use shift_logits=True for the same effect")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.qkv_bias = qkv_bias
        self.shift_logits = shift_logits
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        self.eot_token_id = eot_token_id
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self._check()

    def _check(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"config field {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple "
                             f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


# Upstream LLaDA (OLMo lineage) field names -> ours.
_LLADA_RENAMES = {
    "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "n_layers": "num_hidden_layers",
    "mlp_hidden_size": "intermediate_size", "max_sequence_length": "max_position_embeddings",
    "weight_tying": "tie_word_embeddings", "include_qkv_bias": "qkv_bias",
}


class LLaDAConfig(CelerisConfig):
    """GSAI-ML/LLaDA-8B-* configs (model_type "llada"), read with their own field names."""

    model_type = "llada"

    def __init__(self, **kwargs) -> None:
        for theirs, ours in _LLADA_RENAMES.items():
            if theirs in kwargs:
                value = kwargs.pop(theirs)
                kwargs.setdefault(ours, value)
        # The embedding matrix may be padded beyond the tokenizer's vocabulary.
        if kwargs.get("embedding_size"):
            kwargs["vocab_size"] = kwargs.pop("embedding_size")
        if kwargs.get("include_bias"):
            kwargs["qkv_bias"] = True
        if kwargs.get("mlp_ratio") and "intermediate_size" not in kwargs:
            kwargs["intermediate_size"] = kwargs["mlp_ratio"] * kwargs.get("hidden_size", 256)
        kwargs.setdefault("rope_theta", 500000.0)
        super().__init__(**kwargs)


class DreamConfig(CelerisConfig):
    """Dream-org/Dream-v0-* configs (model_type "Dream"): Qwen2 names, biases, shifted logits."""

    model_type = "Dream"

    def __init__(self, qkv_bias: bool = True, shift_logits: bool = True, **kwargs) -> None:
        super().__init__(qkv_bias=qkv_bias, shift_logits=shift_logits, **kwargs)


CONFIG_CLASSES = {cls.model_type: cls for cls in (CelerisConfig, LLaDAConfig, DreamConfig)}
