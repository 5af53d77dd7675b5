"""Loading Hugging Face-format checkpoints onto the native model.

The model is built on the meta device (no memory) and each tensor is read memory-mapped from
safetensors straight into its final dtype and device, so an 8B checkpoint never needs twice its
size in RAM. Upstream parameter names are renamed on the fly by the family's renames
(``celeris/families/``: LLaDA's OLMo spelling, LLaDA2's and LLaDA-MoE's), and per-expert tensors (``mlp.experts.<e>.gate_proj.weight``, ...) are
copied into the stacked expert parameters of ``moe.Experts``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..config import ModelLoadError, normalize_device, normalize_dtype
from ..hints import download_hint
from .configuration import CelerisConfig
from .dispatch import load_dispatched
from .modeling import CelerisForMaskedDiffusion

# one expert's tensor in the upstream (per-expert ModuleList) layout
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)"
                     r"\.weight$")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' = bf16 on CUDA, fp32 on CPU."""
    name = normalize_dtype(dtype)
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def resolve_device(device: str) -> torch.device:
    name = normalize_device(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was requested but CUDA is not available; "
                             "use --device cpu")
    return torch.device(name)


def resolve_model_dir(path_or_id: str | os.PathLike) -> Path:
    """A local directory, or a hub id downloaded with huggingface_hub when online."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise ModelLoadError(f"model directory not found: {text}")
    return _download(text)


def _download(repo_id: str) -> Path:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    hint = (f"place the files (config.json, *.safetensors, tokenizer files) in a local "
            f"directory and pass its path, e.g. {download_hint(repo_id)} on a machine with "
            f"network access")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, local_files_only=offline,
                                      allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                      "*.model", "*.jinja", "*.py"]))
    except Exception as exc:  # offline, unknown repo, no network: say so plainly
        raise ModelLoadError(f"could not download {repo_id!r} from the Hugging Face Hub "
                             f"({type(exc).__name__}); this machine may be offline. To use it, "
                             f"{hint}") from None


def read_config_json(model_dir: Path) -> dict:
    """config.json as a dict (a clear error when it is missing or not JSON)."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing: a model directory needs config.json")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return raw


def weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from None
        files = [model_dir / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"weight shard(s) listed in {index} are missing: "
                                 f"{', '.join(missing[:3])}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelLoadError(f"no weights in {model_dir}: expected model.safetensors or "
                         "model.safetensors.index.json (PyTorch .bin files are not supported)")


def iter_tensors(files: list[Path], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device=str(device)) as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)
        except Exception as exc:  # SafetensorError, OSError: the file is damaged
            raise ModelLoadError(f"cannot read weights from {f}: {exc}") from None


Rename = Callable[[str], str]     # a checkpoint tensor name -> ours


def load_native(model_dir: Path, config: CelerisConfig, rename: Rename, device: torch.device,
                dtype: torch.dtype, device_map: str | None = None, max_memory: dict | None = None,
                offload_folder: str | None = None) -> CelerisForMaskedDiffusion:
    """The native model of a checkpoint directory, evaluation mode, its tensors renamed by
    the family's ``rename``. With ``device_map="auto"`` its layers are spread over the GPUs,
    CPU memory and disk (``dispatch.py``; ``max_memory`` {GPU index | "cpu": bytes},
    ``offload_folder`` for disk)."""
    with torch.device("meta"):
        model = CelerisForMaskedDiffusion(config)
    files = weight_files(model_dir)
    if device_map is not None:      # read on the CPU, each tensor put on its planned device
        cpu = torch.device("cpu")
        load_dispatched(model, dtype, lambda place: _fill(model, files, cpu, dtype, model_dir,
                                                          rename, place),
                        max_memory, offload_folder)
    else:
        _fill(model, files, device, dtype, model_dir, rename, None)
    return model.eval()


def _fill(model: CelerisForMaskedDiffusion, files: list[Path], dev: torch.device,
          dt: torch.dtype, model_dir: Path, rename: Rename,
          place: Callable[[str, torch.Tensor], torch.Tensor] | None) -> None:
    """Stream the checkpoint's tensors (renamed, experts stacked, shapes checked) into the
    meta-device ``model``; ``place`` (a dispatched load) puts each on its device."""
    config = model.config
    expected = dict(model.state_dict())
    state: dict[str, torch.Tensor] = {}
    experts = ExpertStacker(expected, config, dev, dt, model_dir)
    for name, tensor in iter_tensors(files, dev):
        if experts.take(name, tensor):
            continue
        ours = rename(name)
        if ours not in expected:
            continue   # e.g. rotary caches or heads we do not use
        _check_shape(name, tensor, expected[ours], model_dir)
        state[ours] = tensor.to(dt) if place is None else place(ours, tensor.to(dt))
    stacks = experts.finish(state)
    state.update(stacks if place is None else {k: place(k, v) for k, v in stacks.items()})
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        state.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"weights in {model_dir} lack {len(missing)} tensor(s), e.g. "
                             f"{', '.join(missing[:3])}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def _check_shape(name: str, tensor: torch.Tensor, want: torch.Tensor, model_dir: Path) -> None:
    if tuple(tensor.shape) != tuple(want.shape):
        raise ModelLoadError(f"tensor {name} has shape {tuple(tensor.shape)} but the config "
                             f"in {model_dir / 'config.json'} implies {tuple(want.shape)}")


class ExpertStacker:
    """Copies per-expert checkpoint tensors into the stacked (E, 2I, C) gate/up and (E, C, I)
    down parameters as they stream past (one expert's slice at a time, so the stacked copy
    is the only full-size one), and names any expert tensor the checkpoint lacks."""

    def __init__(self, expected: dict[str, torch.Tensor], config: CelerisConfig,
                 device: torch.device, dtype: torch.dtype, model_dir: Path) -> None:
        self.expected, self.device, self.dtype, self.dir = expected, device, dtype, model_dir
        self.experts, self.inter = config.num_experts, config.moe_intermediate_size
        self.stacks: dict[str, torch.Tensor] = {}
        self.seen: set[str] = set()

    def take(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy ``name`` into its stack if it is one expert's tensor of a MoE layer."""
        match = _EXPERT.match(name)
        if match is None or f"{match[1]}.down_proj" not in self.expected:
            return False
        prefix, e, kind = match[1], int(match[2]), match[3]
        target = f"{prefix}.{'down_proj' if kind == 'down_proj' else 'gate_up_proj'}"
        stack = self.stacks.get(target)
        if stack is None:
            want = self.expected[target]
            stack = self.stacks[target] = torch.empty(want.shape, dtype=self.dtype,
                                                      device=self.device)
        if e >= self.experts:
            raise ModelLoadError(f"tensor {name} names expert {e} but the config in "
                                 f"{self.dir / 'config.json'} has {self.experts} experts")
        rows = {"gate_proj": slice(0, self.inter), "up_proj": slice(self.inter, None),
                "down_proj": slice(None)}[kind]
        _check_shape(name, tensor, stack[e, rows], self.dir)
        stack[e, rows].copy_(tensor)
        self.seen.add(name)
        return True

    def finish(self, stacked: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The stacks, after checking that every expert of every MoE layer whose stacks were
        not in the checkpoint already (``stacked``: our own layout) was there."""
        prefixes = sorted(k[:-len(".down_proj")] for k in self.expected
                          if k.endswith(".mlp.experts.down_proj") and k not in stacked)
        missing = [f"{p}.{e}.{kind}.weight" for p in prefixes for e in range(self.experts)
                   for kind in ("gate_proj", "up_proj", "down_proj")
                   if f"{p}.{e}.{kind}.weight" not in self.seen]
        if missing:
            raise ModelLoadError(f"weights in {self.dir} lack {len(missing)} expert tensor(s), "
                                 f"e.g. {', '.join(missing[:3])}")
        return self.stacks
