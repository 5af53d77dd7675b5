"""Model configurations: our canonical one and the upstream spellings.

All of them describe one Llama-style transformer; the upstream configs only rename fields and
set the flags that differ:

- LLaDA (OLMo names: d_model, n_layers, ...) and Dream (Qwen2 names, q/k/v biases, logits
  shifted by one position) attend bidirectionally over the whole canvas.
- Fast-dLLM v2 (Qwen2.5 blocks, q/k/v biases, ``bd_size``, shifted logits) and SDAR (Qwen3
  blocks with per-head q/k RMSNorm) attend *block-causally*: a position sees every earlier
  block and its whole own block, so the keys/values of finished blocks never change.
"""

from __future__ import annotations

from transformers import PretrainedConfig


ATTENTIONS = ("bidirectional", "block_causal")


class CelerisConfig(PretrainedConfig):
    """A masked-diffusion transformer: Llama-style blocks with the causal mask removed.

    attention:    "bidirectional" (LLaDA, Dream, celeris-tiny: every position sees every
                  other) or "block_causal" (Fast-dLLM v2, SDAR, celeris-tiny-bd: a position sees
                  the earlier blocks of ``block_size`` positions, counted from position 0, and
                  its own block both ways; the KV cache of finished blocks is then exact).
    qk_norm:      RMSNorm over each head's queries and keys before RoPE (Qwen3, SDAR).
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
                 conv_kernel_size: int = 0, attention: str = "bidirectional",
                 block_size: int | None = None, qk_norm: bool = False, **kwargs) -> None:
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
        self.attention = attention
        self.block_size = block_size
        self.qk_norm = qk_norm
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
        if self.attention not in ATTENTIONS:
            raise ValueError(f"config field attention must be one of {', '.join(ATTENTIONS)}, "
                             f"got {self.attention!r}")
        if self.attention == "block_causal":
            bs = self.block_size
            if isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= 1024:
                raise ValueError(f"config field block_size must be an integer in [1, 1024] for "
                                 f"block_causal attention, got {bs!r}")

    @property
    def block_causal(self) -> bool:
        return self.attention == "block_causal"


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
        self.bd_size = bd_size
        super().__init__(qkv_bias=qkv_bias, shift_logits=shift_logits, **kwargs)


class SDARConfig(CelerisConfig):
    """JetLM/SDAR-* configs (model_type "sdar"): Qwen3 blocks (per-head q/k RMSNorm, no
    biases unless ``attention_bias``), block-causal, logits not shifted. The checkpoints do not
    record their block length; SDAR's chat models were trained with blocks of 4, which is the
    default here (``block_length``/``block_size`` in config.json override it)."""

    model_type = "sdar"

    def __init__(self, qk_norm: bool = True, **kwargs) -> None:
        kwargs["qkv_bias"] = kwargs.pop("attention_bias", kwargs.get("qkv_bias", False))
        kwargs.setdefault("attention", "block_causal")
        if kwargs.get("block_size") is None:
            kwargs["block_size"] = kwargs.pop("block_length", None) or 4
        kwargs.setdefault("rms_norm_eps", 1e-6)
        super().__init__(qk_norm=qk_norm, **kwargs)


class LlamaAsBlockConfig(CelerisConfig):
    """An autoregressive Llama checkpoint (model_type "llama", e.g. models/celeris-tiny-ar) read
    as a block-causal model with blocks of one position and shifted logits: position i sees
    positions <= i and the token at i is predicted from the state at i-1, which is exactly
    causal next-token prediction. Decoding it with the block engine is then greedy
    autoregressive decoding with the same kernels, cache and host loop as a diffusion model:
    the bench's same-engine control for the AR twin (``transformers``' ``generate()`` stays the
    twin's own path). Only Celeris's loader reads this; ``AutoConfig`` keeps transformers'
    own Llama."""

    model_type = "llama"

    def __init__(self, **kwargs) -> None:
        rope = kwargs.pop("rope_parameters", None) or kwargs.pop("rope_scaling", None) or {}
        if rope.get("rope_type", "default") not in ("default", None):
            raise ValueError(f"rope_type {rope.get('rope_type')!r} is not supported "
                             "(only plain RoPE)")
        if "rope_theta" in rope:
            kwargs.setdefault("rope_theta", rope["rope_theta"])
        if kwargs.pop("mlp_bias", False):
            raise ValueError("mlp_bias=true is not supported")
        act = kwargs.pop("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act must be silu (SwiGLU), got {act!r}")
        kwargs["qkv_bias"] = kwargs.pop("attention_bias", False)
        for unused in ("attention_dropout", "pretraining_tp", "use_cache"):
            kwargs.pop(unused, None)
        kwargs.update(attention="block_causal", block_size=1, shift_logits=True)
        super().__init__(**kwargs)


CONFIG_CLASSES = {cls.model_type: cls for cls in (CelerisConfig, LLaDAConfig, DreamConfig,
                                                  FastDLLMQwenConfig, SDARConfig,
                                                  LlamaAsBlockConfig)}
