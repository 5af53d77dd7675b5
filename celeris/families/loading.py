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
from pathlib import Path
from typing import Any

from ..config import ModelLoadError
from ..model.modeling import CelerisForMaskedDiffusion
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
         offload_folder: str | None = None) -> tuple[Family, Any, Path]:
    """(family, model in evaluation mode, model directory) of a checkpoint directory or hub
    id. ``device_map="auto"`` spreads a native model's layers over GPUs, CPU memory and disk."""
    model_dir = resolve_model_dir(path_or_id)
    family, config = read_config(model_dir)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if family.load is not None:
        return family, family.load(config, model_dir, dev, dt, device_map), model_dir
    model = load_native(model_dir, config, family.canonical_name, dev, dt, device_map,
                        max_memory, offload_folder)
    return family, model, model_dir


def load_model(path_or_id: str | os.PathLike, device: str = "auto", dtype: str = "auto",
               device_map: str | None = None, max_memory: dict | None = None,
               offload_folder: str | None = None) -> tuple[Any, Path]:
    """The model of a checkpoint and its directory (``load`` without the family)."""
    _, model, model_dir = load(path_or_id, device, dtype, device_map, max_memory,
                               offload_folder)
    return model, model_dir


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