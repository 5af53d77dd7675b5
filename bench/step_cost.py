"""What one block-diffusion forward costs next to one token of the AR twin, on this machine.

Reproduces docs/BENCHMARKS.md, "What one forward costs (CPU)" (docs/results/step-cost-cpu.json).

Block decoding beats autoregression only if (tokens per forward) x (AR time per token) exceeds
the time of one block step. This script measures both sides of that inequality on the shipped
pair, so the tokens per forward a model needs to break even is a measured number, not a guess:

- the block model's cached forward (the engine's own ``SlotKVCache`` and model call, batch 1)
  over a window of W columns after a cached prefix of ``--prefix`` positions, for the widths a
  block step uses (block, block + the re-read column, finished block + new block, ...);
- the same forwards through the module path (``unpack_inference``: what every forward ran
  before the packed decode path of ``celeris/model/packed.py``);
- the AR twin's cached one-token forward (transformers, ``DynamicCache`` holding the same
  prefix) and its whole ``generate()`` time per token (what the bench's ``ar`` suite times);
- the twin's weights in Celeris's engine as a block-causal model of block size 1 (the bench's
  same-engine control): one step forwards the finished token and the next position.

Medians over ``--repeats`` rounds; each round runs every configuration once, interleaved, so a
slow moment of a shared machine hits all of them alike.

    python bench/step_cost.py --threads 2 --json docs/results/step-cost-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris import Engine  # noqa: E402
from celeris.ar_baseline import ARBaseline  # noqa: E402
from celeris.bench.common import machine_info  # noqa: E402
from celeris.families.layouts import new_slot_cache  # noqa: E402


def block_forward(engine: Engine, width: int, prefix: int):
    """A callable running one cached forward of ``width`` columns at positions
    [prefix, prefix + width), logits for the last min(width, block) columns, as a step does."""
    model = engine.model
    kv = new_slot_cache(model, 1)
    slot = kv.take()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size - 1, (1, prefix + width), generator=g)
    with torch.inference_mode():      # fill the prefix once
        view = kv.bind([slot], [prefix], [(0, 0, slot, 0, prefix)])
        model(ids[:, :prefix], position_ids=torch.arange(prefix)[None], kv=view)
    x = ids[:, prefix:]                                                      # (1, W)
    pos = torch.arange(prefix, prefix + width)[None]                         # (1, W)
    runs = [(0, 0, slot, prefix, width)]            # the window's columns, one run
    n_logits = min(width, engine.block_size or width)
    cols = torch.arange(width - n_logits, width)[None]                      # (1, N)

    def run() -> None:
        view = kv.bind([slot], [prefix + width], runs)
        model(x, position_ids=pos, kv=view, logits_index=cols)
    return run


def ar_forward(ar: ARBaseline, prefix: int):
    """A callable running the twin's cached forward of one token after ``prefix`` tokens."""
    from transformers import DynamicCache

    model = ar.model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size - 1, (1, prefix + 1), generator=g)
    with torch.inference_mode():
        past = DynamicCache()
        model(ids[:, :prefix], cache=past, use_cache=True)
    pos = torch.tensor([[prefix]])

    def run() -> None:
        model(ids[:, prefix:], cache=past, position_ids=pos, use_cache=True)
        past.crop(-1)                 # back to ``prefix`` positions for the next call
    return run


def ar_generate(ar: ARBaseline, tokens: int):
    prompt = [{"role": "user", "content": "Tell me a story about a brave fox called Pip."}]

    def run() -> float:
        (out,) = ar.generate_batch([prompt], tokens)
        return out["elapsed_s"] / max(1, out["completion_tokens"])
    return run


def measure(fns: dict, repeats: int, inner: int) -> dict[str, float]:
    """Median ms per call of each callable, rounds interleaved."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.inference_mode():
        for f in fns.values():         # warm-up
            f()
        for _ in range(repeats):
            for name, f in fns.items():
                start = time.perf_counter()
                for _ in range(inner):
                    f()
                samples[name].append(1e3 * (time.perf_counter() - start) / inner)
    return {k: round(statistics.median(v), 3) for k, v in samples.items()}


def matmul_ms(fn, calls: int = 10) -> float:
    """Milliseconds per call spent in matrix products (aten::mm/addmm, oneDNN's linear), by
    torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn()
    us = sum(e.self_cpu_time_total for e in prof.key_averages()
             if e.key in ("aten::mm", "aten::addmm", "aten::linear")
             or "linear_pointwise" in e.key)
    return round(us / calls / 1e3, 3)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/celeris-tiny-bd")
    ap.add_argument("--ar-model", default="models/celeris-tiny-ar")
    ap.add_argument("--prefix", type=int, default=160, help="cached positions before the window")
    ap.add_argument("--widths", default="1,4,5,8,9,16", help="window widths to time")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=20, help="calls per timed round")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    engine = Engine.from_pretrained(args.model, device="cpu", dtype="float32")
    if not engine.block_causal:
        raise SystemExit(f"{args.model} is not a block-causal model")
    ar = ARBaseline.from_pretrained(args.ar_model, device="cpu", dtype="float32")
    fns = {f"bd_forward_w{w}": block_forward(engine, w, args.prefix) for w in widths}
    # the module path (what every forward ran before the packed one) on the same weights
    modules = Engine.from_pretrained(args.model, device="cpu", dtype="float32")
    modules.model.unpack_inference()
    fns.update({f"bd_forward_w{w}_modules": block_forward(modules, w, args.prefix)
                for w in widths})
    fns["ar_forward_1"] = ar_forward(ar, args.prefix)
    # the twin in Celeris's engine (block size 1): its step is the finished token + the next
    twin = Engine.from_pretrained(args.ar_model, device="cpu", dtype="float32")
    fns["ar_engine_forward_w2"] = block_forward(twin, 2, args.prefix)
    ms = measure(fns, args.repeats, args.inner)
    # generate() times itself: the median of its seconds per answer token
    per_token = round(1e3 * statistics.median(ar_generate(ar, 64)() for _ in range(args.repeats)),
                      3)
    report = {"command": "python bench/step_cost.py " + " ".join(sys.argv[1:] if argv is None
                                                                   else argv),
              "machine": machine_info(), "model": args.model, "ar_model": args.ar_model,
              "prefix": args.prefix, "block_size": engine.block_size, "dtype": "float32",
              "ms": {**ms, "ar_generate_per_token": per_token},
              "break_even_tpf": {f"w{w}": round(ms[f"bd_forward_w{w}"] / per_token, 2)
                                 for w in widths},
              # profiled separately (the profiler slows every op): the matrix-product share
              "matmul_ms_profiled": {name: matmul_ms(fn) for name, fn in fns.items()}}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
