"""The decode-time forward for small models on CPU: the same transformer, fewer and cheaper ops.

A decoding step of a small model (celeris-tiny-bd: 6 layers of width 256, a window of 4-9
columns) is not arithmetic-bound. On the 2-core CPU it ran seven ``nn.Linear`` calls and ~40
other small ops per layer through two module dispatches per sub-layer, and the matrix products
of 1-9 rows were the larger half of its ~4 ms: MKL's general product is slow at so few rows.
This path computes the same function with

- oneDNN's linear on weights reordered once into its blocked layout (``mkldnn._linear_pointwise``,
  the kernel PyTorch's own inductor uses for frozen CPU graphs): 2-2.7x faster than
  ``F.linear`` at 1-9 rows on the AVX-512 VM (``bench/step_cost.py`` shows the whole step).
  Where oneDNN is unavailable, plain ``mm`` on transposed (in, out) weights;
- each layer's q/k/v projections as one product and gate/up as one (7 products -> 4), and the
  residual adds fused into the output and down products;
- rotary embeddings as ``x * cos + roll(x) * sin'`` on the q and k heads of the fused
  projection instead of slicing, negating and concatenating;
- no ``nn.Module`` dispatch below the model;
- the row count of every product rounded up to one of a few sizes (``bucket_rows``): oneDNN
  and ideep keep a compiled kernel per distinct shape in caches of 1024 entries, ~0.6 MB each,
  and the rows of a step (the real columns of a batch of windows) take hundreds of values
  under varied traffic: a full-attention engine grew by 530 MB in 3 rounds of 25 batches
  (docs/BENCHMARKS.md, "Serving"), a server by 1.4 GB, until the caches filled.
  Bucketed, a few dozen shapes cover every step; the zero rows added stay zero and are
  dropped before attention and at the end.

Only inference uses it (no gradients, no CPU autocast: ``applies``) and only once packed
(``CelerisForMaskedDiffusion.pack_for_inference``, which the engine calls on CPU for models up
to ``PACK_MAX_BYTES``: the packed copy doubles the weights' memory). The packed tensors follow
the parameters: an in-place change (an optimiser step, ``load_state_dict``) is seen in the
parameters' version counters and data pointers and the weights are packed again before the
next forward; a model moved off the CPU falls back to the module path. The module path stays
the reference: tests hold the two to the same logits (within float32 rounding) and the same
greedy tokens.

Quantized weights (``--quantize``, ``quantize.py``) keep their width here too. int8 weights
(torchao's per-row ``Int8Tensor``) are packed as int8: the rows of q/k/v (and of gate/up) and
their scales are concatenated, exactly the same values, and multiplied by
``torch._weight_int8pack_mm`` with bfloat16 inputs and outputs (int8 weights, bfloat16
activations: the kernel is vectorised for bfloat16; with float32 inputs it ran 2.5-20x slower
than oneDNN's float32 product on the 2-core AVX2 VM). Other torchao weights (int4) are not
fused: each runs its own product through torchao's kernel, on bfloat16 inputs too. The output
head stays as loaded.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from .quantize import QUANT_CPU_INPUT

PACK_MAX_BYTES = 256 * 2 ** 20      # larger models are bound by arithmetic, not by op count


class PackedLayer(NamedTuple):
    """One block's weights; the products' shapes are given in the plain (in, out) layout
    (oneDNN's reordered ones are opaque to everything but its linear)."""

    ln1: torch.Tensor                   # (C,) input RMSNorm weight
    qkv: torch.Tensor                   # (C, (H + 2 Hkv) D): q, k, v projections side by side
    qkv_bias: torch.Tensor | None       # ((H + 2 Hkv) D,) or None
    q_norm: torch.Tensor | None         # (D,) Qwen3-style per-head norms, or None
    k_norm: torch.Tensor | None
    o: torch.Tensor                     # (H D, C)
    ln2: torch.Tensor                   # (C,)
    gate_up: torch.Tensor               # (C, 2 I): gate and up side by side
    down: torch.Tensor                  # (I, C)


def onednn_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                    and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    except (AttributeError, RuntimeError):      # a build without the oneDNN ops
        return False


@functools.lru_cache(maxsize=None)
def onednn_supports(dtype: torch.dtype) -> bool:
    """Whether this CPU runs oneDNN's linear in ``dtype``: its bfloat16 path needs AVX-512
    (or AVX-NE-CONVERT) and raises on an AVX2-only CPU, so a tiny product is tried once."""
    if not onednn_available():
        return False
    try:
        w = OneDNNProducts.prep(torch.zeros(8, 8, dtype=dtype))
        OneDNNProducts.mm(torch.zeros(1, 8, dtype=dtype), w)
    except RuntimeError:
        return False
    return True


EXACT_ROWS = 16     # row counts up to this run as they are (a decode step's few columns)
ROWS_PER_OCTAVE = 8  # above it, this many sizes per doubling: at most 1/8 of the rows padding


def bucket_rows(n: int) -> int:
    """``n`` rounded up to the next product row count the packed path runs: n itself up to
    ``EXACT_ROWS``, then multiples of 2**k / ROWS_PER_OCTAVE within [2**k, 2**(k+1)) (18, 20,
    ..., 32, 36, 40, ...). Rows up to R then take at most 16 + 8 log2(R / 16) shapes (64 up to
    1024) instead of R, so the kernels' caches stay small whatever the traffic. (4 sizes per
    doubling held 20-40 MB less but padded up to 1/4 of the rows, ~6% more CPU time on the
    full-attention serving workload.)"""
    if n <= EXACT_ROWS:
        return n
    step = 1 << (n.bit_length() - 1 - (ROWS_PER_OCTAVE.bit_length() - 1))
    return -(-n // step) * step


ROWS_HINT = 8       # oneDNN's reorder takes a row count to tune for; 1-64 measured alike


class OneDNNProducts:
    """x (R, in) @ W.T with W reordered for oneDNN once."""

    @staticmethod
    def prep(weight: torch.Tensor) -> torch.Tensor:          # weight (out, in), nn.Linear's
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ROWS_HINT)

    @staticmethod
    def mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")

    @staticmethod
    def mm_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, None, "add")


class PlainProducts:
    """x (R, in) @ W.T with W stored transposed, (in, out) contiguous."""

    @staticmethod
    def prep(weight: torch.Tensor) -> torch.Tensor:
        return weight.detach().t().contiguous()

    @staticmethod
    def mm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)

    @staticmethod
    def mm_add(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.addmm(residual, x, w)


INT8_INPUT = QUANT_CPU_INPUT    # the activations' dtype into torch._weight_int8pack_mm


class Int8Rows(NamedTuple):
    """int8 weight rows (N, K) and their scales (N,), multiplied by _weight_int8pack_mm."""

    q: torch.Tensor
    scale: torch.Tensor

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x.to(INT8_INPUT), self.q, self.scale).to(x.dtype)


class Linears(NamedTuple):
    """Quantized weights that cannot be fused (int4): one product each on bfloat16 inputs
    (torchao's CPU int4 kernel; see ``quantize.QUANT_CPU_INPUT``), outputs side by side in
    the input's dtype."""

    weights: tuple[torch.Tensor, ...]

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        xq = x.to(QUANT_CPU_INPUT)
        outs = [F.linear(xq, w).to(x.dtype) for w in self.weights]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


def is_int8_rows(w: torch.Tensor) -> bool:
    """torchao's weight-only Int8Tensor with one scale per output row (what --quantize int8
    makes), which packs as plain int8 rows."""
    return (type(w).__name__ == "Int8Tensor" and w.dim() == 2
            and getattr(w, "act_quant_kwargs", None) is None
            and list(getattr(w, "block_size", ())) == [1, w.shape[1]])


def is_quantized(w: torch.Tensor) -> bool:
    return type(w) not in (torch.Tensor, torch.nn.Parameter)


class PackedWeights:
    """Fused copies of a CPU model's weights laid out for its product kernel, with a stamp of
    the parameters they were made from."""

    def __init__(self, model: Any, products: Any = None) -> None:
        self.model, self.forced = model, products
        self.pack()

    def _stamp(self) -> tuple:
        # the parameter list is taken once per packing: walking the module tree on every
        # forward cost ~0.4 ms, 12% of a batch-1 step of celeris-tiny-bd; in-place changes
        # (training, load_state_dict, .to()) show in the version, pointer or device
        return tuple((p.device, p.data_ptr(), p._version) for p in self._params)

    def _products(self) -> Any:
        if self.forced is not None:
            return self.forced
        dtypes = {p.dtype for p in self.model.parameters()}
        return (OneDNNProducts if dtypes <= {torch.float32, torch.bfloat16}
                and all(onednn_supports(d) for d in dtypes) else PlainProducts)

    def pack(self) -> None:
        self._params = list(self.model.parameters())
        self.products = self._products()
        m, cfg = self.model, self.model.config
        with torch.no_grad():
            layers = []
            for blk in m.model.layers:
                a, mlp = blk.self_attn, blk.mlp
                projs = (a.q_proj, a.k_proj, a.v_proj)
                bias = (torch.cat([p.bias for p in projs]) if a.q_proj.bias is not None
                        else None)
                layers.append(PackedLayer(
                    ln1=blk.input_layernorm.weight.detach(),
                    qkv=self._fused([p.weight for p in projs]),
                    qkv_bias=bias,
                    q_norm=a.q_norm.weight.detach() if a.qk_norm else None,
                    k_norm=a.k_norm.weight.detach() if a.qk_norm else None,
                    o=self._fused([a.o_proj.weight]),
                    ln2=blk.post_attention_layernorm.weight.detach(),
                    gate_up=self._fused([mlp.gate_proj.weight, mlp.up_proj.weight]),
                    down=self._fused([mlp.down_proj.weight])))
            self.layers = layers
            self.norm = m.model.norm.weight.detach()
            self.head = self._fused([m.lm_head.weight])
        self.eps = cfg.rms_norm_eps
        self.heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.stamp = self._stamp()

    def _fused(self, weights: list[torch.Tensor]) -> Any:
        """One product's weight from the (out, in) weights whose outputs go side by side:
        float weights concatenated in the product kernel's layout, int8 rows concatenated
        with their scales, other quantized weights kept as they are (one product each)."""
        if all(is_int8_rows(w) for w in weights):
            return Int8Rows(torch.cat([w.qdata for w in weights]).contiguous(),
                            torch.cat([w.scale.reshape(-1) for w in weights]).to(INT8_INPUT))
        if any(is_quantized(w) for w in weights):
            return Linears(tuple(w.detach() for w in weights))
        return self.products.prep(weights[0] if len(weights) == 1 else torch.cat(weights))

    def mm(self, x: torch.Tensor, w: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(w, (Int8Rows, Linears)):
            y = w.mm(x)
            return y if bias is None else y + bias
        return self.products.mm(x, w, bias)

    def mm_add(self, x: torch.Tensor, w: Any, residual: torch.Tensor) -> torch.Tensor:
        if isinstance(w, (Int8Rows, Linears)):
            return residual + w.mm(x)
        return self.products.mm_add(x, w, residual)

    def current(self) -> "PackedWeights | None":
        """Self, packed again first if any parameter changed since the last packing; None
        once the model has left the CPU (the caller then takes the module path)."""
        stamp = self._stamp()
        if stamp != self.stamp:
            if any(dev.type != "cpu" for dev, _, _ in stamp):
                return None
            self.pack()
        return self

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head over h (..., C)."""
        lead = h.shape[:-1]
        x = h.reshape(-1, h.shape[-1])
        rows = x.shape[0]
        return self.mm(pad_rows(x, bucket_rows(rows)), self.head)[:rows].view(*lead, -1)


def packable(config: Any) -> bool:
    """Whether this path computes the model's function: dense SwiGLU MLPs, RoPE over whole
    heads, separate q/k/v projections, no output-projection bias and no q/k/v clamp. The
    mixture-of-experts families (LLaDA2, LLaDA-MoE, SDAR-MoE) keep the module path."""
    return (not getattr(config, "num_experts", 0)
            and getattr(config, "rotary_dim", config.head_dim) == config.head_dim
            and not getattr(config, "fused_qkv", False) and not getattr(config, "o_bias", False)
            and getattr(config, "clip_qkv", None) is None)


def applies() -> bool:
    """Whether this forward may take the packed path: inference (no gradients), no CPU
    autocast (its bfloat16 activations are for the module path's autocast-aware ops) and not
    under torch.compile (inductor cannot lower oneDNN's packed products; it compiles the
    module path)."""
    return (not torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with the rotate-half sign folded in: rotate_half(x) * sin == roll(x, D/2) * this."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def packed_layers(w: PackedWeights, h: torch.Tensor, cos: torch.Tensor, sin_s: torch.Tensor,
                  key_mask: torch.Tensor | None, kv: Any, real: torch.Tensor | None
                  ) -> torch.Tensor:
    """Every transformer block over h, (B, W, C) or (N, C) packed real columns; cos and
    ``signed_sin`` tables shaped like h's leading dims + (1, D)."""
    H, Hkv, D = w.heads
    lead, C = h.shape[:-1], h.shape[-1]
    mm, mm_add = w.mm, w.mm_add
    x = h.reshape(-1, C)                                                     # (R, C)
    R = x.shape[0]
    padded = bucket_rows(R)     # products run on zero rows up to a bucketed count (few shapes)
    x = pad_rows(x, padded)                                                  # (R', C)
    shape = (*lead, H + 2 * Hkv, D)
    for layer, p in enumerate(w.layers):
        a = F.rms_norm(x, (C,), p.ln1, w.eps)
        qkv = mm(a, p.qkv, p.qkv_bias)[:R].view(shape)                       # (., H+2Hkv, D)
        if p.q_norm is not None:
            q = F.rms_norm(qkv[..., :H, :], (D,), p.q_norm, w.eps)
            k = F.rms_norm(qkv[..., H:H + Hkv, :], (D,), p.k_norm, w.eps)
            qk = torch.cat([q, k], dim=-2)
        else:
            qk = qkv[..., :H + Hkv, :]
        qk = torch.addcmul(qk * cos, qk.roll(D // 2, -1), sin_s)             # RoPE
        v = qkv[..., H + Hkv:, :]
        if real is not None:            # attention runs on the padded (B, W) window
            qk, v = unpack_rows(qk, real), unpack_rows(v, real)
        q, k = qk[..., :H, :].transpose(1, 2), qk[..., H:, :].transpose(1, 2)
        v = v.transpose(1, 2)                                                # (B, ., W, D)
        if kv is not None:
            k, v = kv.update(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask,
                                             enable_gqa=Hkv != H).transpose(1, 2)
        if real is not None:
            out = out[real]
        x = mm_add(pad_rows(out.reshape(-1, H * D), padded), p.o, x)       # residual fused
        a = F.rms_norm(x, (C,), p.ln2, w.eps)
        gate, up = mm(a, p.gate_up).chunk(2, dim=-1)
        x = mm_add(F.silu(gate).mul_(up), p.down, x)
    return F.rms_norm(x[:R], (C,), w.norm, w.eps).view(*lead, C)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x (R, K) with zero rows appended up to ``rows`` (x itself when R == rows)."""
    return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))


def unpack_rows(t: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(N, ...) rows of the real columns -> (B, W, ...) with zeros in the padding."""
    full = t.new_zeros(*real.shape, *t.shape[1:])
    full[real] = t
    return full
