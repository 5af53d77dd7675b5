"""Big checkpoints: a model spread over the visible GPUs, CPU memory and disk (``device_map``).

``EngineConfig(device_map="auto")`` loads through ``load_dispatched``: the model is built on
the meta device, accelerate's ``infer_auto_device_map`` assigns whole decoder layers
(``Block``, never split) to the GPUs first, then CPU memory, then disk (within ``max_memory``;
several GPUs get a balanced share, as transformers' ``device_map="auto"``), each checkpoint
tensor is read once and put straight on its device or written to ``offload_folder``, and
``dispatch_model`` attaches the hooks that move activations between layers and stream
offloaded weights in for each forward.

Execution devices follow accelerate: a layer mapped to a GPU runs there; a layer mapped to
"cpu" or "disk" runs on the main device (the first GPU of the map, or the CPU when there is no
GPU), its weights copied in for every forward. The KV cache puts each layer's keys/values on
that layer's execution device (``layer_devices``). What a step then costs is in
docs/BENCHMARKS.md ("Big checkpoints").

A map with one device and nothing on disk attaches no hooks (accelerate moves the model
there): the model is then an ordinary one and keeps every fast path (packed CPU weights, fused
kernels). With hooks (``hooked``), those paths step aside and the module path runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..config import ModelLoadError

OFFLOADED = ("cpu", "disk")


def hooked(model: Any) -> bool:
    """Whether accelerate hooks spread ``model`` over devices (or stream it from disk)."""
    return getattr(model, "_hf_hook", None) is not None


def _map_device(entry: Any) -> torch.device:
    return torch.device(f"cuda:{entry}" if isinstance(entry, int) else entry)


def map_main_device(device_map: dict[str, Any]) -> torch.device:
    """The first GPU of the map in module order (the embeddings' side), else the CPU."""
    for entry in device_map.values():
        if entry not in OFFLOADED:
            return _map_device(entry)
    return torch.device("cpu")


def _entry(device_map: dict[str, Any], name: str) -> Any:
    """The map's entry for a module or parameter name (the longest key that contains it)."""
    best = None
    for key in device_map:
        if (key == "" or name == key or name.startswith(key + ".")) and \
                (best is None or len(key) > len(best)):
            best = key
    if best is None:
        raise ModelLoadError(f"device_map has no entry for {name}")
    return device_map[best]


def main_device(model: Any) -> torch.device:
    """Where a step's inputs live: the map's main device, or the device of the parameters."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:
        return map_main_device(device_map)
    return next(model.parameters()).device


def layer_devices(model: Any) -> list[torch.device] | None:
    """Each decoder layer's execution device (where its keys/values are made and read), or
    None for a model that is not dispatched (every layer on ``main_device``)."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return None
    main = map_main_device(device_map)
    out = []
    for i in range(model.config.num_hidden_layers):
        entry = _entry(device_map, f"model.layers.{i}")
        out.append(main if entry in OFFLOADED else _map_device(entry))
    return out


def _accelerate() -> Any:
    try:
        import accelerate
    except ImportError:
        raise ModelLoadError("device_map='auto' needs accelerate (pip install accelerate; it "
                             "is in requirements.txt)") from None
    return accelerate


def plan(model: torch.nn.Module, dtype: torch.dtype, max_memory: dict[Any, int] | None,
         offload_folder: str | None) -> dict[str, Any]:
    """The device map of a meta-device ``model``: whole layers, GPUs first (balanced when
    there are several), then CPU memory, then disk; refused when it needs the disk and no
    ``offload_folder`` was given."""
    accelerate = _accelerate()
    from accelerate.utils import get_balanced_memory
    no_split = list(model._no_split_modules)
    budget = dict(max_memory) if max_memory else None
    gpus = [k for k in (budget or {i: 0 for i in range(torch.cuda.device_count())})
            if isinstance(k, int)]
    if len(gpus) > 1:        # transformers' "auto": an even share on each GPU
        budget = get_balanced_memory(model, max_memory=budget, no_split_module_classes=no_split,
                                     dtype=dtype, low_zero=False)
    device_map = accelerate.infer_auto_device_map(model, max_memory=budget,
                                                  no_split_module_classes=no_split,
                                                  dtype=dtype)
    if "disk" in device_map.values() and not offload_folder:
        on_disk = [k for k, v in device_map.items() if v == "disk"]
        room = budget or "all free GPU and CPU memory"
        raise ModelLoadError(f"the model does not fit in max_memory ({room}): "
                             f"{len(on_disk)} module(s), e.g. {on_disk[0]}, "
                             "would go to disk; pass offload_folder (--offload-folder DIR) to "
                             "offload them there, or allow more max_memory")
    return device_map


def load_dispatched(model: torch.nn.Module, dtype: torch.dtype,
                    load: Callable[[Callable[[str, torch.Tensor], torch.Tensor]], None],
                    max_memory: dict[Any, int] | None, offload_folder: str | None
                    ) -> torch.nn.Module:
    """Plan ``model`` (built on the meta device), fill it through ``load(place)`` — the
    loader calls ``place(name, tensor)`` for each final tensor and assigns what it returns —
    and dispatch it. Tensors of modules mapped to disk are written to ``offload_folder``
    one at a time (they never stay in memory) and stay on the meta device."""
    _accelerate()
    from accelerate import dispatch_model
    from accelerate.utils import offload_weight, save_offload_index
    device_map = plan(model, dtype, max_memory, offload_folder)
    index: dict[str, Any] = {}
    folder = Path(offload_folder) if offload_folder else None
    ties = {"model.embed_tokens.weight": "lm_head.weight"} if \
        model.config.tie_word_embeddings else {}

    def place(name: str, tensor: torch.Tensor) -> torch.Tensor:
        entry = _entry(device_map, name)
        if entry != "disk":
            return tensor.to(_map_device(entry))
        assert folder is not None
        folder.mkdir(parents=True, exist_ok=True)
        for key in (name, ties.get(name)):
            if key is not None:
                offload_weight(tensor.cpu(), key, str(folder), index)
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")

    load(place)
    if index:
        assert folder is not None
        _clear_index(folder)
        save_offload_index(index, str(folder))
    main = map_main_device(device_map)
    dispatch_model(model, device_map=device_map, main_device=main,
                   offload_dir=str(folder) if index else None)
    return model


def _clear_index(folder: Path) -> None:
    """An index.json left by an earlier load would be merged with this one: start afresh."""
    stale = folder / "index.json"
    if stale.is_file():
        os.remove(stale)


def memory_info(device: torch.device) -> dict[str, Any]:
    """GPU memory via torch on CUDA, process RSS on CPU, labelled which."""
    if device.type == "cuda":
        return {"memory_kind": "gpu", "memory_bytes": torch.cuda.memory_allocated(device),
                "memory_peak_bytes": torch.cuda.max_memory_allocated(device)}
    try:
        import psutil
        rss = psutil.Process().memory_info().rss
    except ImportError:
        import resource
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"memory_kind": "rss", "memory_bytes": rss}
