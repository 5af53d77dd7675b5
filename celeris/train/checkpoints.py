"""A training run's files: checkpoints under ``out/checkpoints/`` (everything a resumed run
needs: weights, optimizer, schedule, data and masking RNG state), the final model directory
(weights + the generation defaults of its kind), and the start of a run from another model's
weights (``init_from``: AR-to-diffusion adaptation or continued training).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from celeris.train import tokenizer_train as tt

DIFFUSION_DEFAULTS = {"gen_length": 64, "block_length": 32, "steps": 64, "temperature": 0.0,
                      "remasking": "low_confidence", "decoding": "fixed"}
# Block diffusion: a cap rather than a canvas, sub-blocks = the model's blocks, the exact cache
# and left-to-right threshold decoding (plain threshold decoding drops and doubles words).
BLOCK_DEFAULTS = {"gen_length": 256, "temperature": 0.0, "remasking": "low_confidence",
                  "decoding": "ltr", "threshold": 0.85, "cache": "prefix"}


# ----------------------------------------------------------------------------- checkpoints
def checkpoint_dir(out: Path) -> Path:
    return out / "checkpoints"


def latest_checkpoint(out: str | Path) -> Path | None:
    files = sorted(checkpoint_dir(Path(out)).glob("step_*.pt"))
    return files[-1] if files else None


def save_checkpoint(out: Path, state: dict[str, Any], keep: int) -> Path:
    d = checkpoint_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{state['step']:07d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in sorted(d.glob("step_*.pt"))[:-keep]:
        old.unlink()
    return path


def open_checkpoint(out: Path, want: dict[str, Any], steps: int) -> dict[str, Any] | None:
    """The latest checkpoint of ``out``, refused when it was trained with other settings
    (``want``: kind, preset, seed, init_from) or another step budget."""
    path = latest_checkpoint(out)
    if path is None:
        print(f"note: no checkpoint under {checkpoint_dir(out)}; starting from scratch",
              file=sys.stderr)
        return None
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    meta = ckpt["meta"]
    for key, value in want.items():
        if meta.get(key) != value:
            raise ValueError(f"cannot resume {path}: it was trained with "
                             f"{key}={meta.get(key)!r}, not {value!r}")
    if steps != meta["schedule_steps"]:
        raise ValueError(f"cannot resume {path} with steps={steps}: the run's cosine "
                         f"schedule spans {meta['schedule_steps']} steps")
    return ckpt


# ----------------------------------------------------------------------------- saving
def write_generation_config(out: Path, kind: str) -> None:
    if kind in ("diffusion", "bd"):
        cfg = dict(DIFFUSION_DEFAULTS if kind == "diffusion" else BLOCK_DEFAULTS)
        cfg.update(eos_token_id=tt.SPECIAL_IDS["eos"], pad_token_id=tt.SPECIAL_IDS["pad"],
                   mask_token_id=tt.SPECIAL_IDS["mask"])
        (out / "generation_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    else:
        from transformers import GenerationConfig
        GenerationConfig(bos_token_id=tt.SPECIAL_IDS["bos"],
                         eos_token_id=[tt.SPECIAL_IDS["eos"], tt.SPECIAL_IDS["eot"]],
                         pad_token_id=tt.SPECIAL_IDS["pad"], do_sample=False,
                         max_new_tokens=64).save_pretrained(str(out))


def save_final(model, out: Path, kind: str) -> None:
    model = model.float()
    model.save_pretrained(str(out))
    write_generation_config(out, kind)


def load_init_weights(model, src: Path) -> dict[str, Any]:
    """Copy a trained model's weights (same parameter names and shapes: our AR twin is a Llama
    with the diffusion model's layout) into ``model``. Returns what the source's own training
    log says about it (steps, tokens), for this run's log."""
    from safetensors.torch import load_file

    state = load_file(str(src / "model.safetensors"))
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"init_from: {src} lacks {len(missing)} weight(s) the model needs, "
                         f"e.g. {missing[0]!r}; it must be a model of the same preset")
    for name, t in own.items():
        if tuple(state[name].shape) != tuple(t.shape):
            raise ValueError(f"init_from: {name} has shape {tuple(state[name].shape)} in {src}, "
                             f"the model needs {tuple(t.shape)}; use a model of the same preset")
    model.load_state_dict({k: state[k] for k in own}, strict=True)
    return describe_init(src)


# What the train log records of the model a run started from, and (nested) where *it* started.
INIT_KEYS = ("kind", "steps", "tokens_seen", "wall_time_s", "seed", "threads", "out", "preset",
             "init_from", "train_config", "init_info")


def describe_init(src: Path) -> dict[str, Any]:
    info: dict[str, Any] = {"path": str(src)}
    log_path = src / "train_log.json"
    if log_path.is_file():
        log = json.loads(log_path.read_text())
        info.update({k: log.get(k) for k in INIT_KEYS})
    return info
