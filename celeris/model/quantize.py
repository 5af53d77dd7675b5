"""Weight-only quantization of a loaded model (torchao), and what a model's weights weigh.

``EngineConfig.quantize`` / ``--quantize`` takes one of three modes. What each runs where:

- int8, CPU and CUDA: torchao's ``Int8WeightOnlyConfig``: int8 weights, a float32 scale per
  output row.
- int4, CPU: torchao's CPU int4 layout (``PrototypeInt4WeightOnlyConfig``, kernel
  ``aten._weight_int4pack_mm_for_cpu``): 4-bit weights in groups of 128 along the input (64
  or 32 where the input width is not a multiple of 128), a scale and zero point per group.
  int4, CUDA (compute capability >= 8.0, bfloat16 only): ``Int4WeightOnlyConfig`` in the
  tinygemm layout (``tile_packed_to_4d``), the same groups. (torchao's default int4 layout
  needs the mslk package, which has no CPU build.)
- fp8, CUDA of compute capability >= 8.9 only (FP8 tensor cores): ``Float8WeightOnlyConfig``,
  e4m3 weights, a float32 scale per row. Refused on the CPU and older GPUs.

What is quantized: every ``nn.Linear`` of the transformer layers (attention projections,
dense and shared-expert MLPs) and, in int8 and fp8, the stacked 3-D expert weights of a
mixture-of-experts layer (each expert's weight quantized as a linear's would be, so one
scale per expert and output row; the experts then run through their per-expert loop). What
stays as loaded: the embedding, the output head, the norms, the routers (LLaDA2, LLaDA-MoE
and SDAR-MoE's ``Router``, DiffusionGemma's ``router.proj``) and DiffusionGemma's vision
tower. int4 refuses a
mixture-of-experts model by name: torchao's int4 layouts hold 2-D linear weights only, and
quantizing the attention alone would leave most of the bytes (the experts) full width. A
linear whose shape the int4 layout cannot hold (output rows not a multiple of 16, input not
a multiple of 32) stays full width and is named in the report.

Weights that are shared (tied: DiffusionGemma's encoder and decoder layers) are quantized
once and stay shared. torchao is imported only here, only when a mode is asked for.

In eager mode torchao's int8 and fp8 weight-only products dequantize the weight and then
multiply in the activations' dtype: the memory is saved, the arithmetic is the float one
(torchao leaves fusing the two to torch.compile; not measured here). int4 runs real int4
kernels. The packed CPU path (``packed.py``) runs int8 weights with
``torch._weight_int8pack_mm`` and int4 weights with torchao's own kernel.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..config import QUANTIZE_MODES, ModelLoadError

TORCHAO = "torchao==0.18.0"      # the version these layouts were written and tested against
INT4_GROUPS = (128, 64, 32)      # an int4 group: the largest of these dividing the input width
INT4_ROWS = 16                   # the int4 layouts pack output rows in multiples of 16
FP8_CAPABILITY = (8, 9)          # Ada / Hopper / Blackwell: FP8 tensor cores


class QuantizeError(ModelLoadError):
    """A --quantize mode that cannot run here (device, dtype, model): the message says why."""


# ---------------------------------------------------------------------- what may run where
def refusal(mode: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``mode`` cannot run on ``device`` in ``dtype`` (None: it can), naming all three."""
    if mode not in QUANTIZE_MODES:
        return f"quantize must be one of {', '.join(QUANTIZE_MODES)}, got {mode!r}"
    if not installed("torchao"):
        return (f"--quantize {mode} needs torchao, which is not installed: pip install -r "
                f"requirements-quant.txt (or pip install {TORCHAO})")
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" \
        else str(device)
    if mode == "fp8":
        if device.type != "cuda":
            return (f"--quantize fp8 needs a CUDA GPU of compute capability >= 8.9 (FP8 "
                    f"tensor cores: Ada, Hopper, Blackwell); this device is {where}, which "
                    f"has no FP8 arithmetic: use --quantize int8 (or int4)")
        cap = torch.cuda.get_device_capability(device)
        if cap < FP8_CAPABILITY:
            return (f"--quantize fp8 needs compute capability >= 8.9 (FP8 tensor cores); "
                    f"{where} has {cap[0]}.{cap[1]}: use --quantize int8 (or int4)")
    if mode == "int4":
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
            cap = torch.cuda.get_device_capability(device)
            return (f"--quantize int4 on a CUDA GPU runs torchao's tinygemm kernel, which needs "
                    f"compute capability >= 8.0; {where} has {cap[0]}.{cap[1]}: use "
                    f"--quantize int8")
        if device.type == "cuda" and dtype != torch.bfloat16:
            return (f"--quantize int4 on {where} runs torchao's tinygemm int4 layout, which "
                    f"takes bfloat16 only; this model loads in "
                    f"{str(dtype).replace('torch.', '')}: add --dtype bfloat16")
        if device.type == "cpu" and not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
            return (f"--quantize int4 on the CPU needs torch's int4 CPU kernel "
                    f"(aten._weight_int4pack_mm_for_cpu), which torch {torch.__version__} "
                    f"lacks: use --quantize int8")
    if device.type not in ("cpu", "cuda"):
        return f"--quantize {mode} runs on the CPU or a CUDA GPU, not on {where}"
    return None


def installed(package: str) -> bool:
    """Whether ``package`` can be imported (without importing it)."""
    return importlib.util.find_spec(package) is not None


def check(mode: str, device: torch.device, dtype: torch.dtype) -> None:
    why = refusal(mode, device, dtype)
    if why is not None:
        raise QuantizeError(why)


# ---------------------------------------------------------------------- what gets quantized
@dataclass
class Target:
    """One weight tensor to quantize and every (module, attribute) that holds it."""

    name: str                                   # its first holder's qualified name
    kind: str                                   # "linear" (2-D) or "experts" (3-D stack)
    tensor: torch.Tensor
    owners: list[tuple[nn.Module, str]] = field(default_factory=list)


def layer_stacks(model: Any) -> list[tuple[str, nn.Module]]:
    """(qualified name, module list) of the transformer layers whose weights are quantized:
    the native model's ``model.layers``; DiffusionGemma's encoder and decoder layers."""
    hf = getattr(model, "hf", None)
    if hf is not None and hasattr(getattr(hf, "model", None), "decoder"):
        inner = hf.model
        return [("hf.model.encoder.language_model.layers", inner.encoder.language_model.layers),
                ("hf.model.decoder.layers", inner.decoder.layers)]
    layers = getattr(getattr(model, "model", None), "layers", None)
    if isinstance(layers, nn.ModuleList):
        return [("model.layers", layers)]
    raise QuantizeError(f"--quantize: {type(model).__name__} is a model whose layers "
                        f"Celeris does not know how to quantize")


def targets(model: Any) -> list[Target]:
    """The weights ``quantize_model`` quantizes, each once (tied weights share one Target)."""
    found: dict[int, Target] = {}
    for prefix, stack in layer_stacks(model):
        for name, module in stack.named_modules():
            full = f"{prefix}.{name}" if name else prefix
            if isinstance(module, nn.Linear):
                if "router" in name.split("."):       # DiffusionGemma's router.proj
                    continue
                _add(found, full + ".weight", "linear", module, "weight")
            for attr in ("gate_up_proj", "down_proj"):
                p = getattr(module, attr, None)
                if isinstance(p, nn.Parameter) and p.dim() == 3:
                    _add(found, f"{full}.{attr}", "experts", module, attr)
    return list(found.values())


def _add(found: dict[int, Target], name: str, kind: str, module: nn.Module, attr: str) -> None:
    tensor = getattr(module, attr)
    target = found.setdefault(id(tensor), Target(name, kind, tensor))
    target.owners.append((module, attr))


def int4_group(shape: tuple[int, ...]) -> int | None:
    """The int4 group size of a (N, K) weight, or None when the int4 layouts cannot hold it."""
    n, k = shape
    if n % INT4_ROWS:
        return None
    return next((g for g in INT4_GROUPS if k % g == 0), None)


# ---------------------------------------------------------------------- quantizing
# The activations' dtype into a quantized product on the CPU. torchao's int4 CPU kernel
# (_weight_int4pack_mm_for_cpu) is vectorised for bfloat16: a 1536 x 4608 product on 8 rows
# took 4 ms on bfloat16 inputs, 204 ms on float32 ones (12 ms in float32 unquantized), on the
# 2-core AVX2 VM. A float32 model's int4 linears therefore hold bfloat16 scales and take
# bfloat16 inputs, their outputs given back in float32 (``_bfloat16_inputs``); so does the
# packed path.
QUANT_CPU_INPUT = torch.bfloat16


def _bfloat16_inputs(module: nn.Module, dtype: torch.dtype) -> None:
    """Run ``module`` (an int4 linear of a ``dtype`` model on the CPU) on QUANT_CPU_INPUT
    inputs, its output cast back to ``dtype``."""
    module.register_forward_pre_hook(
        lambda m, args: (args[0].to(QUANT_CPU_INPUT), *args[1:]))
    module.register_forward_hook(lambda m, args, out: out.to(dtype))


def quantize_model(model: Any, mode: str, device: torch.device, dtype: torch.dtype,
                   check_device: bool = True) -> dict[str, Any]:
    """Quantize ``model``'s layer weights in place (``mode``: int8 | int4 | fp8) and return
    the report (``info()`` shows it). ``check_device=False`` skips the device/dtype refusal:
    the tests use it to run fp8's torchao tensors on the CPU (there they dequantize; the
    engine itself refuses fp8 on the CPU)."""
    if check_device:
        check(mode, device, dtype)
    found = targets(model)
    experts = [t for t in found if t.kind == "experts"]
    if mode == "int4" and experts:
        raise QuantizeError(
            f"--quantize int4: this model has mixture-of-experts layers ({len(experts)} stacked "
            f"expert weights, e.g. {experts[0].name}); torchao's int4 layouts hold 2-D linear "
            f"weights only, and quantizing the rest would leave most of the model full width: "
            f"use --quantize int8" + (" or fp8" if device.type == "cuda" else ""))
    full_width: dict[str, str] = {}
    for target in found:
        new = _quantize_tensor(target, mode, device)
        if new is None:
            full_width[target.name] = (f"int4 needs output rows in multiples of {INT4_ROWS} and "
                                       f"inputs in multiples of {INT4_GROUPS[-1]}, shape is "
                                       f"{tuple(target.tensor.shape)}")
            continue
        held: Any = ExpertStack(new) if target.kind == "experts" else \
            nn.Parameter(new, requires_grad=False)
        for module, attr in target.owners:
            if target.kind == "experts":
                delattr(module, attr)
            setattr(module, attr, held)
    if experts:
        _loop_experts(model)
    quantized = [t for t in found if t.name not in full_width]
    if mode == "int4" and device.type == "cpu" and dtype != QUANT_CPU_INPUT:
        for target in quantized:
            for module, _ in target.owners:
                _bfloat16_inputs(module, dtype)
    return {"mode": mode, "library": f"torchao {_torchao_version()}",
            "quantized_tensors": len(quantized),
            "quantized_experts": sum(t.kind == "experts" for t in quantized),
            "full_width_tensors": full_width,
            "kept": "embedding, output head, norms, routers"
                    + (", vision tower" if hasattr(model, "hf") else ""),
            "layout": describe(mode, device)}


def describe(mode: str, device: torch.device) -> str:
    if mode == "int8":
        return "int8 weights, a float32 scale per output row (torchao Int8Tensor)"
    if mode == "fp8":
        return "float8 e4m3 weights, a float32 scale per output row (torchao Float8Tensor)"
    layout = "tinygemm tile_packed_to_4d" if device.type == "cuda" else \
        "CPU int4 pack (_weight_int4pack_mm_for_cpu)"
    return (f"int4 weights in groups of {'/'.join(map(str, INT4_GROUPS))} along the input, a "
            f"scale and zero point per group ({layout})")


class ExpertStack(nn.ParameterList):
    """A quantized (E, N, K) expert stack as E quantized (N, K) weights: ``stack[e]`` is
    expert e's weight (what the experts' loop takes) and ``shape`` the stack's. One tensor
    per expert because indexing a torchao tensor would make a new one at every call, which
    inference mode forbids."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        super().__init__([nn.Parameter(w, requires_grad=False) for w in weights])
        self._shape = torch.Size((len(weights), *weights[0].shape))

    @property
    def shape(self) -> torch.Size:
        return self._shape

    def dim(self) -> int:
        return len(self._shape)


def _quantize_tensor(target: Target, mode: str, device: torch.device) -> Any:
    """The torchao tensor replacing ``target.tensor`` (a list of one per expert for an
    expert stack; None: it stays full width)."""
    w = target.tensor.detach()
    if target.kind == "experts":         # one weight per expert, each as a linear's would be
        return [_through_quantize_(w[e], _config(mode, device)) for e in range(w.shape[0])]
    if mode in ("int8", "fp8"):
        return _through_quantize_(w, _config(mode, device))
    group = int4_group(tuple(w.shape))
    if group is None:
        return None
    if device.type == "cpu":        # its scales take the inputs' dtype (QUANT_CPU_INPUT)
        w = w.to(QUANT_CPU_INPUT)
    return _through_quantize_(w, _config("int4", device, group))


def _config(mode: str, device: torch.device, group: int = INT4_GROUPS[0]) -> Any:
    """torchao's quantize_ config of a mode on a device (its inductor settings left alone)."""
    from torchao.quantization import (Float8WeightOnlyConfig, Int4WeightOnlyConfig,
                                      Int8WeightOnlyConfig)
    if mode == "int8":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if mode == "fp8":
        return Float8WeightOnlyConfig(set_inductor_config=False)
    if device.type == "cuda":
        from torchao.quantization.quantize_.workflows import Int4PackingFormat
        return Int4WeightOnlyConfig(group_size=group,
                                    int4_packing_format=Int4PackingFormat.TILE_PACKED_TO_4D,
                                    set_inductor_config=False)
    from torchao.prototype.quantization.int4.inference_workflow import (
        PrototypeInt4WeightOnlyConfig)
    return PrototypeInt4WeightOnlyConfig(group_size=group, set_inductor_config=False)


def _through_quantize_(weight: torch.Tensor, config: Any) -> torch.Tensor:
    """``weight`` quantized by torchao's ``quantize_`` with ``config`` (on a bare linear
    holding it, so every layer goes through the library's own entry point)."""
    from torchao.quantization import quantize_

    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    quantize_(linear, config)
    out = linear.weight
    if type(out) in (torch.Tensor, nn.Parameter):    # torchao skipped it: never silently
        raise QuantizeError(f"torchao left a weight of shape {tuple(weight.shape)} "
                            f"unquantized with {type(config).__name__}")
    return out.detach()


def _loop_experts(model: Any) -> None:
    """Quantized expert stacks run through the per-expert loop (each expert's weights taken
    by index, then one product each): the grouped products take plain tensors only."""
    hf = getattr(model, "hf", None)
    if hf is not None and hasattr(hf, "set_experts_implementation"):
        hf.set_experts_implementation("eager")
        return
    for module in model.modules():
        if hasattr(module, "grouped") and hasattr(module, "gate_up_proj"):
            module.grouped = False


def _torchao_version() -> str:
    import torchao
    return str(torchao.__version__)


# ---------------------------------------------------------------------- bytes
def tensor_bytes(t: torch.Tensor, seen: set[int] | None = None) -> int:
    """Bytes of a tensor's real storage: a torchao tensor's own tensors (int data, scales,
    zero points), a plain tensor's storage; storages in ``seen`` count once (tied weights)."""
    seen = set() if seen is None else seen
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n), seen) for n in names
                   if getattr(t, n, None) is not None)
    if t.device.type == "meta":
        key = id(t)
        size = t.numel() * t.element_size()
    else:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
    if key in seen:
        return 0
    seen.add(key)
    return size


def quantized(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, nn.Parameter)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """The model's parameters in bytes, from their real storage: ``total``, of which
    ``quantized`` (torchao tensors: data, scales, zero points) and ``full_width``; and
    ``quantized_bf16``, what the quantized ones would take in bfloat16 (2 bytes a value)."""
    seen: set[int] = set()
    out = {"total": 0, "quantized": 0, "full_width": 0, "quantized_bf16": 0}
    for p in _unique_params(model):
        size = tensor_bytes(p, seen)
        out["total"] += size
        if quantized(p):
            out["quantized"] += size
            out["quantized_bf16"] += 2 * p.numel()
        else:
            out["full_width"] += size
    return out


def _unique_params(model: nn.Module) -> Iterator[torch.Tensor]:
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def estimate_bytes(meta_model: nn.Module, mode: str | None, dtype: torch.dtype,
                   device: str = "cuda") -> int:
    """The weight bytes of ``meta_model`` (built on the meta device from a config) loaded in
    ``dtype`` and quantized with ``mode`` (None: full width) on ``device`` ("cpu" or "cuda"),
    by the layouts' formulas: what ``weight_bytes(...)["total"]`` of the real model is.
    int4 on a mixture-of-experts model is what ``--quantize int4`` refuses; here its experts
    are counted full width."""
    width = torch.empty((), dtype=dtype).element_size()
    picked = {id(t.tensor): t for t in targets(meta_model)} if mode else {}
    total = 0
    for p in _unique_params(meta_model):
        target = picked.get(id(p))
        total += _format_bytes(p, target, mode, width, device)
    return total


def _format_bytes(p: torch.Tensor, target: Target | None, mode: str | None, width: int,
                  device: str) -> int:
    if target is None or mode is None:
        return p.numel() * width
    *lead, n, k = p.shape
    stacks = int(torch.tensor(lead).prod()) if lead else 1
    if mode == "int8":       # 1-byte values, a float32 scale and an int8 zero point a row
        return stacks * (n * k + 5 * n)
    if mode == "fp8":        # 1-byte values, a float32 scale a row
        return stacks * (n * k + 4 * n)
    group = int4_group((n, k)) if target.kind == "linear" else None
    if group is None:
        return p.numel() * width
    if device == "cuda":     # tinygemm pads the input to a multiple of 1024, rows to 8
        n, k = -(-n // 8) * 8, -(-k // 1024) * 1024
    # two 4-bit values a byte; per group and row a scale and a zero point in bfloat16 (both
    # layouts: tinygemm's own; the CPU's, QUANT_CPU_INPUT)
    return n * k // 2 + (k // group) * n * 2 * 2
