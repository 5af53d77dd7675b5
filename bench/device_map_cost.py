"""What a denoising step costs when the model is dispatched with ``device_map="auto"``.

Reproduces docs/BENCHMARKS.md, "Big checkpoints: what --device-map costs per step"
(docs/results/device-map-cpu.json). On one CPU the loads compared are:

- ``one device``: the ordinary load (``device="cpu"``; the packed CPU decode path);
- ``module path``: the same model with packing turned off (``unpack_inference``): what every
  dispatched step runs, without accelerate's hooks, to separate the two costs;
- ``device_map auto``: on a CPU-only machine the whole model fits the CPU, so the map is
  ``{"": "cpu"}`` and no hook is attached (it should equal ``one device``);
- ``disk, N layers``: ``max_memory={"cpu": budget}`` small enough that N of the layers (and the
  final norm and head) go to ``offload_folder``: accelerate's hooks copy their weights in from
  the memory-mapped files on every forward. The files sit in the OS page cache after the first
  step, so this is the cost of the hooks and the copies, not of reading a disk.

Every load generates the same prompts greedily (the tokens are checked equal); per-step means
from ``Engine.step_timing``, medians over ``--repeats`` rounds, each round running every load
once, interleaved, so a slow moment of a shared machine hits all of them alike.

    python bench/device_map_cost.py --threads 2 --json docs/results/device-map-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris import Engine  # noqa: E402
from celeris.bench.common import machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Once upon a time", "The little robot went to the park", "Tom had a red ball"]


def loads(model: str, folder: str) -> dict[str, Engine]:
    out = {"one device": Engine.from_pretrained(model, device="cpu")}
    unpacked = Engine.from_pretrained(model, device="cpu")
    unpacked.model.unpack_inference()
    out["module path"] = unpacked
    out["device_map auto"] = Engine.from_pretrained(model, device_map="auto")
    for budget in (12_000_000, 4_000_000):
        engine = Engine.from_pretrained(model, device_map="auto", max_memory={"cpu": budget},
                                        offload_folder=f"{folder}/{budget}")
        layers = engine.model.config.num_hidden_layers
        placed = engine.model.hf_device_map
        n = sum(any(v == "disk" and (k == "" or f"model.layers.{i}.".startswith(k + "."))
                    for k, v in placed.items()) for i in range(layers))
        embed = "disk" in (placed.get(""), placed.get("model"), placed.get("model.embed_tokens"))
        out[f"disk, {n} of {layers} layers{' + embed' if embed else ''}"] = engine
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "celeris-tiny-bd"))
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        engines = loads(args.model, folder)
        first = next(iter(engines.values()))
        params = first.default_params().replace(
            gen_length=args.gen_length, temperature=0.0, seed=0,
            **({} if first.block_causal else {"steps": args.gen_length // 2,
                                              "block_length": 32}))
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        tokens: dict[str, list] = {}
        for engine in engines.values():                       # warm-up, untimed
            engine.generate(PROMPTS[0], params)
        for _ in range(args.repeats):
            for name, engine in engines.items():
                before = engine.step_timing.snapshot()
                results = [engine.generate(p, params) for p in PROMPTS]
                samples[name].append(engine.step_timing.since(before))
                tokens[name] = [r.token_ids for r in results]
        same = all(t == tokens["one device"] for t in tokens.values())
    rows = []
    base = statistics.median(s["step_ms"] for s in samples["one device"])
    for name, runs in samples.items():
        step = statistics.median(s["step_ms"] for s in runs)
        rows.append({"load": name, "steps_per_round": runs[0]["steps"], "step_ms": step,
                     "forward_ms": statistics.median(s["forward_ms"] for s in runs),
                     "host_ms": statistics.median(s["host_ms"] for s in runs),
                     "vs_one_device": step / base,
                     "device_map": getattr(engines[name].model, "hf_device_map", None)})
    print(f"{'load':30} {'step ms':>8} {'forward ms':>11} {'host ms':>8} {'x':>6}")
    for r in rows:
        print(f"{r['load']:30} {r['step_ms']:8.2f} {r['forward_ms']:11.2f} "
              f"{r['host_ms']:8.2f} {r['vs_one_device']:6.2f}")
    print(f"same tokens in every load: {same}")
    if args.json:
        report = {"command": "python bench/device_map_cost.py " + " ".join(sys.argv[1:]),
                  "machine": machine_info(), "model": Path(args.model).name,
                  "dtype": "float32", "batch": 1, "gen_length": args.gen_length,
                  "prompts": PROMPTS, "repeats": args.repeats, "same_tokens": same,
                  "rows": rows}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
