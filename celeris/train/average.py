"""The uniform average of the weights of several runs that share a start and a shape (a
"model soup", Wortsman et al. 2022): ``celeris average --out DIR RUN RUN ...``.

Runs fine-tuned from one model on the same batches with different objectives (for the block
model: random and suffix masking) land near each other, and their mean can score at least as
well as either. Shipping such a mean is a choice: confirm it on problems that did not make the
choice (``celeris eval --second-sample``). The destination gets the first run's config,
tokenizer, generation defaults and training log, the averaged weights, and ``average.json``
naming every source.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

SAME_FILES = ("config.json", "tokenizer.json")       # must match byte for byte, as JSON
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "train_log.json")


def _check_sources(sources: list[Path], dest: Path) -> None:
    if len(sources) < 2:
        raise ValueError(f"average needs at least 2 models, got {len(sources)}")
    if len({s.resolve() for s in sources}) < len(sources):
        raise ValueError("average: a model is named twice")
    for src in sources:
        for name in ("config.json", "model.safetensors"):
            if not (src / name).is_file():
                raise FileNotFoundError(f"average: no {name} in {src}")
        if src.resolve() == dest.resolve():
            raise ValueError(f"average: --out {dest} is one of the models averaged")
    for name in SAME_FILES:
        first = json.loads((sources[0] / name).read_text()) if (sources[0] / name).is_file() \
            else None
        for src in sources[1:]:
            other = json.loads((src / name).read_text()) if (src / name).is_file() else None
            if other != first:
                diff = ""
                if isinstance(first, dict) and isinstance(other, dict):
                    keys = sorted(k for k in set(first) | set(other)
                                  if first.get(k) != other.get(k))
                    diff = f" (first difference: {keys[0]!r})" if keys else ""
                raise ValueError(f"average: {src}/{name} differs from {sources[0]}/{name}"
                                 f"{diff}; only runs of one architecture and tokenizer average")


def average(sources: list[str | Path], dest: str | Path) -> dict[str, Any]:
    """Write the mean of ``sources``' weights to ``dest`` (see the module docstring)."""
    from safetensors.torch import load_file, save_file

    srcs, out = [Path(s) for s in sources], Path(dest)
    _check_sources(srcs, out)
    states = [load_file(str(s / "model.safetensors")) for s in srcs]
    names = set(states[0])
    for src, state in zip(srcs[1:], states[1:]):
        if set(state) != names:
            extra = sorted(set(state) ^ names)[0]
            raise ValueError(f"average: {src} and {srcs[0]} hold different weights "
                             f"(e.g. {extra!r})")
    mean: dict[str, torch.Tensor] = {}
    for name in sorted(names):
        ts = [s[name] for s in states]
        if any(t.shape != ts[0].shape or t.dtype != ts[0].dtype for t in ts):
            raise ValueError(f"average: {name} differs in shape or dtype between the models")
        if ts[0].is_floating_point():
            mean[name] = (sum(t.double() for t in ts) / len(ts)).to(ts[0].dtype)
        elif all(torch.equal(t, ts[0]) for t in ts):
            mean[name] = ts[0].clone()
        else:
            raise ValueError(f"average: the integer tensor {name} differs between the models")
    out.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (srcs[0] / name).is_file():
            shutil.copyfile(srcs[0] / name, out / name)
    save_file(mean, str(out / "model.safetensors"), metadata={"format": "pt"})
    info = {"method": "uniform mean of the weights", "sources": [str(s) for s in srcs],
            "tensors": len(mean), "copied_from": str(srcs[0])}
    (out / "average.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
