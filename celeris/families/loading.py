"""Loading through the registry: config.json -> its family -> config, model, Auto classes.

``load`` reads a checkpoint directory (or hub id) as its family says: the family's config
class reads config.json, and either the family's own loader builds the model (DiffusionGemma:
transformers' classes) or the native model is filled from the safetensors files with the
family's tensor renames (``model.weights.load_native``). ``register_auto`` makes transformers'
``AutoConfig``/``AutoModel`` (and ``AutoModelForCausalLM`` for the block-causal families, as
their model cards load them) read the same checkpoints without ``trust_remote_code``, with the
same renames and per-expert tensors merged into our stacked experts.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..config import ModelLoadError, normalize_dtype
from ..model.modeling import CelerisForMaskedDiffusion
from ..model.quantize import check as check_quantize
from ..model.quantize import estimate_bytes, installed, quantize_model
from ..model.weights import (load_native, read_config_json, resolve_device, resolve_dtype,
                             resolve_model_dir)
from .registry import Family, find, on_register, supported_model_types

# config.json keys that name the file rather than the model
_FILE_KEYS = ("auto_map", "architectures", "model_type", "transformers_version")


def read_config(model_dir: Path) -> tuple[Family, Any]:
    """The family of a checkpoint directory and its config, read by the family's class."""
    raw = read_config_json(model_dir)
    path = model_dir / "config.json"
    family = find(raw)
    if family is None:
        raise ModelLoadError(f"{path}: model_type {raw.get('model_type')!r} is not a supported "
                             f"architecture; supported: {', '.join(supported_model_types())}")
    fields = {k: v for k, v in raw.items() if k not in _FILE_KEYS}
    try:
        return family, family.config_class(**fields)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {exc}") from None


def load(path_or_id: str | os.PathLike, device: str = "auto", dtype: str = "auto",
         device_map: str | None = None, max_memory: dict | None = None,
         offload_folder: str | None = None, quantize: str | None = None
         ) -> tuple[Family, Any, Path]:
    """(family, model in evaluation mode, model directory) of a checkpoint directory or hub
    id. ``device_map="auto"`` spreads a native model's layers over GPUs, CPU memory and disk.
    ``quantize`` (int8 | int4 | fp8): the layers' weights quantized after loading
    (``model/quantize.py``; refused before anything loads where the mode cannot run). A
    checkpoint whose config.json carries a ``quantization_config`` loads through the library
    of its format (``prequantized``) or is refused by name. What was done is in the model's
    ``celeris_quantization`` (None: full width as loaded)."""
    model_dir = resolve_model_dir(path_or_id)
    family, config = read_config(model_dir)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if quantize is not None:
        check_quantize(quantize, dev, dt)
    pre = prequantized(read_config_json(model_dir), model_dir, dev, quantize, device_map)
    if pre is not None:
        model = _load_prequantized(family, config, model_dir, dev, dt, pre)
    elif family.load is not None:
        model = family.load(config, model_dir, dev, dt, device_map)
    else:
        model = load_native(model_dir, config, family.canonical_name, dev, dt, device_map,
                            max_memory, offload_folder)
    report = quantize_model(model, quantize, dev, dt) if quantize is not None else \
        (None if pre is None else pre["report"])
    model.celeris_quantization = report
    return family, model, model_dir


def load_model(path_or_id: str | os.PathLike, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None, max_memory: dict | None = None,
               offload_folder: str | None = None, quantize: str | None = None
               ) -> tuple[Any, Path]:
    """The model of a checkpoint and its directory (``load`` without the family)."""
    _, model, model_dir = load(path_or_id, device, dtype, device_map, max_memory,
                               offload_folder, quantize)
    return model, model_dir


# ---------------------------------------------------------------- pre-quantized checkpoints
PREQUANTIZED_FORMATS = ("compressed-tensors",)    # quant_method values loaded as published


def prequantized(raw: dict, model_dir: Path, device: torch.device, quantize: str | None,
                 device_map: str | None) -> dict[str, Any] | None:
    """None for a full-width checkpoint; for one whose config.json has a
    ``quantization_config``: how it loads (its format is read by the library that defines
    it, compressed-tensors through transformers), or a ModelLoadError naming the format and
    what to do. Its weights are never read as full-width ones."""
    qc = raw.get("quantization_config")
    if not qc:
        return None
    path = model_dir / "config.json"
    method = str(qc.get("quant_method", "unknown")) if isinstance(qc, dict) else "unknown"
    scheme = _scheme(qc) if isinstance(qc, dict) else method
    if quantize is not None:
        raise ModelLoadError(f"{path}: this checkpoint is already quantized ({scheme}); "
                             f"--quantize {quantize} quantizes full-width weights: drop "
                             f"--quantize to load it as published")
    if method not in PREQUANTIZED_FORMATS:
        raise ModelLoadError(f"{path}: quantization_config {scheme}: Celeris loads "
                             f"pre-quantized checkpoints in the compressed-tensors format "
                             f"only (DiffusionGemma's FP8/NVFP4 releases); load the "
                             f"full-width checkpoint instead, optionally with --quantize "
                             f"int8, int4 or fp8")
    if not installed("compressed_tensors"):
        raise ModelLoadError(f"{path}: a compressed-tensors checkpoint ({scheme}); reading "
                             f"its weights needs the library that defines the format: pip "
                             f"install -r requirements-quant.txt (or pip install "
                             f"compressed-tensors); transformers reads the checkpoint through it")
    if device_map is not None:
        raise ModelLoadError(f"{path}: a compressed-tensors checkpoint ({scheme}) loads on one "
                             f"device; leave device_map unset")
    fp8_kernels = (_fp8_weights(qc) and device.type == "cuda"
                   and torch.cuda.get_device_capability(device) >= (8, 9))
    runs = ("FP8 products (transformers' CompressedTensorsFP8Linear; not yet run on a GPU "
            "by Celeris's tests)" if fp8_kernels else
            "dequantized to the load dtype at load (this device has no FP8 products): the "
            "checkpoint's values, full-width bytes")
    return {"fp8_kernels": fp8_kernels,
            "report": {"mode": None, "prequantized": scheme, "runs_as": runs,
                       "library": f"compressed-tensors {_version('compressed-tensors')}"}}


def _scheme(qc: dict) -> str:
    """'compressed-tensors float-quantized: float8 weights per channel' and the like."""
    parts = []
    for group in (qc.get("config_groups") or {}).values():
        w = (group or {}).get("weights") or {}
        a = (group or {}).get("input_activations") or {}
        text = f"{w.get('type', '?')}{w.get('num_bits', '?')} weights per {w.get('strategy')}"
        if a:
            text += f", {a.get('type', '?')}{a.get('num_bits', '?')} activations"
        parts.append(text)
    fmt = qc.get("format")
    head = str(qc.get("quant_method", "unknown")) + (f" {fmt}" if fmt else "")
    return head + (f": {'; '.join(sorted(set(parts)))}" if parts else "")


def _fp8_weights(qc: dict) -> bool:
    groups = (qc.get("config_groups") or {}).values()
    return bool(groups) and all(((g or {}).get("weights") or {}).get("type") == "float"
                                and ((g or {}).get("weights") or {}).get("num_bits") == 8
                                for g in groups)


def _version(package: str) -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _load_prequantized(family: Family, config: Any, model_dir: Path, dev: torch.device,
                       dt: torch.dtype, pre: dict[str, Any]) -> Any:
    """A compressed-tensors checkpoint through transformers' loader (its quantizer, with
    the family's renames and expert merge): dequantized at load, or kept in FP8 with
    transformers' FP8 products where the GPU has them. A missing tensor is refused."""
    from transformers import CompressedTensorsConfig
    options = {"quantization_config": (CompressedTensorsConfig(use_optimized_inference=True)
                                       if pre["fp8_kernels"] else
                                       CompressedTensorsConfig(dequantize=True))}
    if dev.type == "cuda":
        options["device_map"] = {"": str(dev)}
    with warnings.catch_warnings():     # "loading attributes ... will be overwritten": asked
        warnings.filterwarnings("ignore", message=".*quantization_config.*")
        if family.load is not None:
            return family.load(config, model_dir, dev, dt, None, **options)
        try:
            model = native_class(family).from_pretrained(str(model_dir), dtype=dt,
                                                          local_files_only=True, **options)
        except (OSError, ValueError, RuntimeError, ImportError) as exc:
            raise ModelLoadError(f"cannot load the compressed-tensors checkpoint in "
                                 f"{model_dir}: {exc}") from None
    return model.to(dev).eval()


# ---------------------------------------------------------------- weight bytes from a config
def config_weight_bytes(raw: dict, mode: str | None = None, dtype: str = "bfloat16",
                        device: str = "cuda") -> int:
    """The weight bytes of the model a config.json (as a dict) describes, loaded in ``dtype``
    and quantized with ``mode`` (None: full width) on ``device`` ("cuda" or "cpu", whose int4
    layouts differ): the model is built on the meta device (no memory) and each tensor
    counted as its layout stores it (``quantize.estimate_bytes``). Equals the loaded model's
    ``weight_bytes`` (tests/test_quantize.py holds the two together)."""
    family = find(raw)
    if family is None:
        raise ModelLoadError(f"model_type {raw.get('model_type')!r} is not a supported "
                             f"architecture; supported: {', '.join(supported_model_types())}")
    fields = {k: v for k, v in raw.items() if k not in _FILE_KEYS + ("quantization_config",)}
    config = family.config_class(**fields)
    dt = getattr(torch, normalize_dtype(dtype).replace("auto", "bfloat16"))
    with torch.device("meta"):
        if family.load is not None:       # DiffusionGemma: transformers' own classes
            model = _meta_diffusion_gemma(raw)
        else:
            model = CelerisForMaskedDiffusion(config)
    return estimate_bytes(model, mode, dt, device)


def _meta_diffusion_gemma(raw: dict) -> Any:
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from ..model.diffusion_gemma import DiffusionGemma
    hf_config = DiffusionGemmaConfig(**{k: v for k, v in raw.items()
                                        if k not in _FILE_KEYS + ("quantization_config",)})
    return DiffusionGemma(DiffusionGemmaForBlockDiffusion(hf_config), None)


# ---------------------------------------------------------------- transformers' Auto classes
_NATIVE: dict[type, type] = {}


def native_class(family: Family) -> type:
    """The model class transformers' Auto classes build for a native family: our one model,
    named as its checkpoints name their architecture, bound to the family's config class."""
    config_class = family.config_class
    if config_class is CelerisForMaskedDiffusion.config_class:
        return CelerisForMaskedDiffusion
    if config_class not in _NATIVE:
        name = family.architectures[0] if family.architectures else \
            f"{config_class.__name__.removesuffix('Config')}Model"
        _NATIVE[config_class] = type(name, (CelerisForMaskedDiffusion,), {
            "config_class": config_class, "__module__": __name__,
            "__doc__": f"{family.display} checkpoints on Celeris's native model."})
    return _NATIVE[config_class]


def register_auto(family: Family) -> None:
    """AutoConfig / AutoModel (/ AutoModelForMaskedLM, AutoModelForCausalLM) for a family,
    and transformers' weight conversion (renames, then per-expert tensors stacked)."""
    if not family.auto or family.load is not None:
        return
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
    config_class, model_class = family.config_class, native_class(family)
    for register, args in ((AutoConfig.register, (config_class.model_type, config_class)),
                           *((auto.register, (config_class, model_class)) for auto in
                             (AutoModel, AutoModelForMaskedLM)
                             + ((AutoModelForCausalLM,) if family.causal_lm else ()))):
        try:
            register(*args, exist_ok=True)
        except (TypeError, ValueError):
            pass           # an older transformers without exist_ok, registered already
    if family.renames or family.experts:
        _register_conversion(config_class.model_type, family)


def _register_conversion(model_type: str, family: Family) -> None:
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import (Concatenate, MergeModulelist, WeightConverter,
                                                 WeightRenaming)
    mapping = [WeightRenaming(src, dst) for src, dst in family.renames]
    mapping += [
        WeightConverter(source_patterns=["mlp.experts.*.gate_proj.weight",
                                         "mlp.experts.*.up_proj.weight"],
                        target_patterns="mlp.experts.gate_up_proj",
                        operations=[MergeModulelist(dim=0), Concatenate(dim=1)]),
        WeightConverter(source_patterns="mlp.experts.*.down_proj.weight",
                        target_patterns="mlp.experts.down_proj",
                        operations=[MergeModulelist(dim=0)])]
    register_checkpoint_conversion_mapping(model_type, mapping, overwrite=True)


on_register(register_auto)          # every family, built in or added later