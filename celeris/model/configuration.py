"""The model configuration: our canonical one, and helpers the families' readers share.

Every native family describes one Llama-style transformer; each family's config class
(``celeris/families/<family>.py``) only renames its upstream fields onto ``CelerisConfig``
and sets the flags that differ:

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
    family:       the registered family a config was read as (e.g. "llada2"; informational:
                  the family itself is found by ``celeris.families``).
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


def pop_unused(kwargs: dict, *names: str) -> None:
    """Drop upstream fields that change nothing at inference (dropouts, training knobs)."""
    for name in names:
        kwargs.pop(name, None)


def check_plain_rope_and_silu(kwargs: dict) -> None:
    rope = kwargs.pop("rope_scaling", None)
    if rope and rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope_scaling {rope!r} is not supported (only plain RoPE)")
    act = kwargs.pop("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act must be silu (SwiGLU), got {act!r}")
