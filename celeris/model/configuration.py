"""Model configurations: our canonical one and the upstream spellings.

All of them describe one Llama-style transformer; the upstream configs only rename fields and
set the flags that differ:

- LLaDA (OLMo names: d_model, n_layers, ...) and Dream (Qwen2 names, q/k/v biases, logits
  shifted by one position) attend bidirectionally over the whole canvas.
- Fast-dLLM v2 (Qwen2.5 blocks, q/k/v biases, ``bd_size``, shifted logits) and SDAR (Qwen3
  blocks with per-head q/k RMSNorm) attend *block-causally*: a position sees every earlier
  block and its whole own block, so the keys/values of finished blocks never change.
- The mixture-of-experts families replace some layers' MLP with routed experts (``moe.py``):
  LLaDA-MoE (model_type "llada" with MoE keys, full attention), LLaDA2.x (block-causal, fused
  q/k/v, half-rotary heads, grouped sigmoid routing) and SDAR-MoE (Qwen3-MoE, block-causal).
"""

from __future__ import annotations

from transformers import PretrainedConfig


ATTENTIONS = ("bidirectional", "block_causal")
ROUTER_SCORES = ("softmax", "sigmoid")
# how a router's expert_bias is used: not at all; only to choose the experts (LLaDA2: the
# weights stay the unbiased scores); or added to the scores, which are then the weights
# (LLaDA-MoE)
ROUTER_BIASES = ("none", "select", "add")

# Special ids a family's published checkpoints use but name neither in config.json nor in the
# tokenizer config (they are given in the model cards); the tokenizer loader falls back on
# them after the config, the tokenizer config and the vocabulary's own names.
KNOWN_SPECIAL_IDS: dict[str, dict[str, int]] = {
    "fast_dllm_v2": {"mask": 151665},              # |<MASK>|
    "llada_moe": {"mask": 156895},                 # LLaDA-MoE-7B-A1B's card: generate(mask_id=)
    "llada2": {"mask": 156895, "eos": 156892},     # <|mask|>, <|endoftext|>
    "sdar_moe": {"mask": 151669},                  # <|MASK|>
}


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
    partial_rotary_factor: RoPE rotates only the first factor * head_dim dims of each head
                  (LLaDA2: 0.5); the frequencies are those of a head of that width.
    fused_qkv:    one q/k/v projection (LLaDA2's query_key_value) instead of three.
    o_bias:       a bias on the attention output projection; clip_qkv clamps q/k/v (OLMoE).
    num_experts:  > 0 makes the layers in ``moe_layers`` (default: all) mixture-of-experts
                  layers (``moe.py``): a router scores the experts per token
                  (``router_score``), keeps ``num_experts_per_tok`` of them (within the best
                  ``router_topk_groups`` of ``router_groups`` groups), weighs them (normalised
                  if ``norm_topk_prob``, times ``routed_scaling_factor``) and adds the always-on
                  shared experts (``shared_expert_intermediate_size`` > 0).
    family:       the upstream family a config was read from (e.g. "llada2"), for the special
                  ids its checkpoints leave unnamed (KNOWN_SPECIAL_IDS).
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
                 block_size: int | None = None, qk_norm: bool = False,
                 partial_rotary_factor: float = 1.0, fused_qkv: bool = False,
                 o_bias: bool = False, clip_qkv: float | None = None, num_experts: int = 0,
                 num_experts_per_tok: int = 0, moe_intermediate_size: int | None = None,
                 shared_expert_intermediate_size: int = 0, moe_layers: list | None = None,
                 router_score: str = "softmax", router_bias: str = "none",
                 router_groups: int = 1, router_topk_groups: int = 1,
                 norm_topk_prob: bool = False, routed_scaling_factor: float = 1.0,
                 router_fp32: bool = False, family: str | None = None, **kwargs) -> None:
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
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.fused_qkv, self.o_bias, self.clip_qkv = fused_qkv, o_bias, clip_qkv
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size or 0
        self.moe_layers = (None if moe_layers is None else [int(i) for i in moe_layers])
        self.router_score, self.router_bias = router_score, router_bias
        self.router_groups, self.router_topk_groups = router_groups, router_topk_groups
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, routed_scaling_factor
        self.router_fp32, self.family = router_fp32, family
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self._check()
        if self.num_experts:
            self._check_moe()

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

        rot = self.rotary_dim
        if not 0.0 < self.partial_rotary_factor <= 1.0 or rot < 2 or rot % 2:
            raise ValueError(f"partial_rotary_factor must be in (0, 1] and leave an even number "
                             f"(>= 2) of rotated dims per head, got {self.partial_rotary_factor} "
                             f"(head_dim {self.head_dim})")

    def _check_moe(self) -> None:
        E, k, G, TG = (self.num_experts, self.num_experts_per_tok, self.router_groups,
                       self.router_topk_groups)
        if not isinstance(E, int) or E < 1:
            raise ValueError(f"config field num_experts must be a non-negative integer, got {E!r}")
        if not isinstance(k, int) or not 1 <= k <= E:
            raise ValueError(f"config field num_experts_per_tok must be in [1, {E}], got {k!r}")
        size = self.moe_intermediate_size
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"config field moe_intermediate_size must be a positive integer, "
                             f"got {size!r}")
        if self.router_score not in ROUTER_SCORES:
            raise ValueError(f"config field router_score must be one of "
                             f"{', '.join(ROUTER_SCORES)}, got {self.router_score!r}")
        if self.router_bias not in ROUTER_BIASES:
            raise ValueError(f"config field router_bias must be one of "
                             f"{', '.join(ROUTER_BIASES)}, got {self.router_bias!r}")
        if G < 1 or E % G or not 1 <= TG <= G or (G > 1 and E // G < 2):
            raise ValueError(f"router_groups ({G}) must divide num_experts ({E}) into groups of "
                             f"at least 2, and router_topk_groups ({TG}) be in [1, {G}]")
        if k > TG * (E // G):
            raise ValueError(f"num_experts_per_tok ({k}) exceeds the experts of the "
                             f"{TG} kept group(s) ({TG * (E // G)})")
        bad = [i for i in self.moe_layer_ids if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"config field moe_layers names layers outside "
                             f"[0, {self.num_hidden_layers - 1}]: {bad}")

    @property
    def block_causal(self) -> bool:
        return self.attention == "block_causal"

    @property
    def rotary_dim(self) -> int:
        """The rotated dims of each head (the rest pass through RoPE unchanged)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def moe_layer_ids(self) -> frozenset[int]:
        if not self.num_experts:
            return frozenset()
        layers = range(self.num_hidden_layers) if self.moe_layers is None else self.moe_layers
        return frozenset(layers)

    @property
    def known_special_ids(self) -> dict[str, int]:
        return dict(KNOWN_SPECIAL_IDS.get(self.family or "", {}))


# Upstream LLaDA (OLMo lineage) field names -> ours.
_LLADA_RENAMES = {
    "d_model": "hidden_size", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "n_layers": "num_hidden_layers",
    "mlp_hidden_size": "intermediate_size", "max_sequence_length": "max_position_embeddings",
    "weight_tying": "tie_word_embeddings", "include_qkv_bias": "qkv_bias",
}


def _pop_unused(kwargs: dict, *names: str) -> None:
    """Drop upstream fields that change nothing at inference (dropouts, training knobs)."""
    for name in names:
        kwargs.pop(name, None)


def _check_plain_rope_and_silu(kwargs: dict) -> None:
    rope = kwargs.pop("rope_scaling", None)
    if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope_scaling {rope!r} is not supported (only plain RoPE)")
    act = kwargs.pop("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act must be silu (SwiGLU), got {act!r}")


def _llada_moe_fields(kwargs: dict) -> None:
    """inclusionAI/LLaDA-MoE-7B-A1B-*: model_type "llada" with OLMoE-style MoE keys.

    Its router (modeling_lladamoe.py) takes the softmax of the gate logits, adds
    ``expert_bias`` (when ``moe_router_enable_expert_bias``) and keeps the top-k of those sums,
    which are also the weights: no renormalisation and no scaling, whatever
    ``norm_topk_prob``/``routed_scaling_factor`` say. ``moe_layer_freq[i] == 0`` makes layer i
    dense (``dense_intermediate_size``); a shared expert sits beside the routed ones when
    ``shared_expert_intermediate_size`` is set. q/k RMSNorm is per head."""
    _check_plain_rope_and_silu(kwargs)
    freq = kwargs.pop("moe_layer_freq", None) or []
    if freq and "moe_layers" not in kwargs:
        kwargs["moe_layers"] = [i for i, f in enumerate(freq) if f]
    for theirs, ours in (("dense_intermediate_size", "intermediate_size"),
                         ("expert_intermediate_size", "moe_intermediate_size"),
                         ("qk_layernorm", "qk_norm")):
        if theirs in kwargs:
            kwargs.setdefault(ours, kwargs.pop(theirs))
    bias = bool(kwargs.pop("attention_bias", False))
    kwargs.setdefault("qkv_bias", bias)
    kwargs.setdefault("o_bias", bias)
    if kwargs.pop("moe_router_enable_expert_bias", False):
        kwargs.setdefault("router_bias", "add")
    if (kwargs.get("partial_rotary_factor") or -1) <= 0:
        kwargs["partial_rotary_factor"] = 1.0        # the upstream class defaults to -1
    kwargs["norm_topk_prob"], kwargs["routed_scaling_factor"] = False, 1.0
    kwargs.setdefault("family", "llada_moe")
    _pop_unused(kwargs, "moe_router_score_function", "router_num_group", "router_topk_group",
                "router_aux_loss_coef", "output_router_logits", "attention_dropout",
                "use_cache")


class LLaDAConfig(CelerisConfig):
    """GSAI-ML/LLaDA-8B-* configs (model_type "llada"), read with their own field names, and
    inclusionAI's LLaDA-MoE configs, which share the model_type (``_llada_moe_fields``).
    iLLaDA uses the dense layout; its mask id (5) comes from its config.json like LLaDA's."""

    model_type = "llada"

    def __init__(self, **kwargs) -> None:
        if "expert_intermediate_size" in kwargs or "moe_layer_freq" in kwargs:
            _llada_moe_fields(kwargs)
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
        kwargs.setdefault("family", "fast_dllm_v2")
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
        kwargs.setdefault("family", "sdar")
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


class SDARMoeConfig(SDARConfig):
    """JetLM/SDAR-*-A*B configs (model_type "sdar_moe"): SDAR's block-causal Qwen3 attention
    with Qwen3-MoE's mixture of experts and its keys. A layer is sparse unless listed in
    ``mlp_only_layers``, when (i + 1) is a multiple of ``decoder_sparse_step``; the router is
    a softmax over the experts, top-k, renormalised when ``norm_topk_prob``; no shared
    experts."""

    model_type = "sdar_moe"

    def __init__(self, **kwargs) -> None:
        _check_plain_rope_and_silu(kwargs)
        step = kwargs.pop("decoder_sparse_step", 1) or 1
        dense = set(kwargs.pop("mlp_only_layers", None) or ())
        layers = kwargs.get("num_hidden_layers", 0)
        if kwargs.get("num_experts") and "moe_layers" not in kwargs:
            kwargs["moe_layers"] = [i for i in range(layers)
                                    if i not in dense and (i + 1) % step == 0]
        kwargs.setdefault("family", "sdar_moe")
        _pop_unused(kwargs, "router_aux_loss_coef", "output_router_logits", "use_cache",
                    "attention_dropout", "use_sliding_window", "sliding_window",
                    "max_window_layers")
        super().__init__(**kwargs)


class LLaDA2MoeConfig(CelerisConfig):
    """inclusionAI/LLaDA2.0-*/LLaDA2.1-* configs (model_type "llada2_moe"), as read by their
    modeling_llada2_moe.py: block-causal attention (blocks of 32 unless the config says
    ``block_size``), one fused q/k/v projection, per-head q/k RMSNorm (``use_qk_norm``), RoPE
    on the first ``partial_rotary_factor`` of each head, logits not shifted. The first
    ``first_k_dense_replace`` layers are dense; the others route with sigmoid scores:
    ``expert_bias`` picks the experts (the ``n_group`` groups ranked by the sum of their two
    best biased scores, the best ``topk_group`` kept) but the weights are the unbiased scores
    of the chosen experts, normalised (top-k > 1) and times ``routed_scaling_factor``; the
    shared experts are one MLP of ``num_shared_experts * moe_intermediate_size``."""

    model_type = "llada2_moe"

    def __init__(self, **kwargs) -> None:
        _check_plain_rope_and_silu(kwargs)
        if "use_qkv_bias" in kwargs or "n_group" in kwargs or "first_k_dense_replace" in kwargs:
            self._upstream_fields(kwargs)
        if kwargs.get("block_size") is None:
            kwargs["block_size"] = kwargs.pop("block_length", None) or 32
        kwargs.setdefault("attention", "block_causal")
        kwargs.setdefault("family", "llada2")
        super().__init__(**kwargs)

    @staticmethod
    def _upstream_fields(kw: dict) -> None:
        if not kw.get("num_key_value_heads"):
            kw["num_key_value_heads"] = None                  # upstream 0: as many as heads
        kw.setdefault("qkv_bias", bool(kw.pop("use_qkv_bias", False)))
        kw.setdefault("qk_norm", bool(kw.pop("use_qk_norm", True)))
        kw.setdefault("o_bias", bool(kw.pop("use_bias", True)))
        kw.setdefault("fused_qkv", True)
        kw.setdefault("partial_rotary_factor", 0.5)
        kw.setdefault("rms_norm_eps", 1e-5)
        kw.setdefault("max_position_embeddings", 16384)
        experts = kw.setdefault("num_experts", 16) or 0
        top_k = kw.setdefault("num_experts_per_tok", 2)
        first_dense = kw.pop("first_k_dense_replace", 0) or 0
        layers = kw.get("num_hidden_layers", 24)
        kw.setdefault("moe_layers", list(range(first_dense, layers)) if experts else [])
        shared = kw.pop("num_shared_experts", 0) or 0
        kw.setdefault("shared_expert_intermediate_size",
                      shared * (kw.get("moe_intermediate_size") or 0))
        score = kw.pop("score_function", "sigmoid")
        kw.setdefault("router_score", score)
        kw.setdefault("router_bias", "select")                # the gate's expert_bias buffer
        kw.setdefault("router_groups", kw.pop("n_group", 8))
        kw.setdefault("router_topk_groups", kw.pop("topk_group", 4))
        kw.setdefault("routed_scaling_factor", 2.5)
        kw["norm_topk_prob"] = top_k > 1                      # the upstream rule, not the key
        kw.setdefault("router_fp32", True)
        _pop_unused(kw, "norm_head", "embedding_dropout", "attention_dropout", "output_dropout",
                    "use_cache", "use_sliding_window", "sliding_window", "max_window_layers",
                    "output_router_logits", "moe_router_enable_expert_bias", "router_dtype",
                    "rotary_dim")





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


CONFIG_CLASSES = {cls.model_type: cls for cls in (CelerisConfig, LLaDAConfig, DreamConfig,
                                                  FastDLLMQwenConfig, SDARConfig,
                                                  LlamaAsBlockConfig, SDARMoeConfig,
                                                  LLaDA2MoeConfig,
                                                  DiffusionGemmaConfig)}
