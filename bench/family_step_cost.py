"""What one denoising step of each model family's tiny random checkpoint costs on this CPU.

Reproduces docs/BENCHMARKS.md, "Model families: step cost on CPU (tiny random checkpoints)".

Each family of tests/test_families.py (LLaDA2.x, SDAR-MoE, LLaDA-MoE, iLLaDA, Fast-dLLM v2)
is written to a temporary directory laid out as its published checkpoint (upstream config
keys, tensor names, special ids), and DiffusionGemma's tiny checkpoint is written by
transformers' own classes (tests/test_diffusion_gemma.py); each is loaded with
``Engine.from_pretrained(device="cpu")`` and run with the family's own default sampler at
temperature 0 (DiffusionGemma: its entropy-bound sampler's argmax limit, a canvas ending
once its argmax repeats), EOS suppressed so every request fills its ``--gen-length``. The engine's ``step_timing`` splits each step into the model forward and
host time (building inputs, choosing tokens, bookkeeping); medians over ``--repeats`` rounds,
each round one batch of 1 and one of 8, families interleaved so a slow moment of a shared
machine hits them alike. Random weights: the figures are cost, not accuracy.

The checkpoint builders are the tests' own (imported from tests/, so run this from the repo
root with the dev requirements installed):

    python bench/family_step_cost.py --threads 2
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
from tests.test_diffusion_gemma import write_tiny_diffusion_gemma  # noqa: E402
from tests.test_families import FAMILIES, write_family  # noqa: E402

GEMMA = "diffusion_gemma"

PROMPTS = ["Once upon a time", "def fib(n):", "the quick brown fox", "Tell me a story",
           "sort: 3 1 2", "café naïve", "A small model wrote", "jumps over the lazy dog"]


def write(path: Path, family: str) -> Path:
    return write_tiny_diffusion_gemma(path) if family == GEMMA else write_family(path, family)


def attention_kind(engine: Engine) -> str:
    cfg = engine.model.config
    if getattr(cfg, "canvas_length", None):
        moe = ", MoE" if getattr(cfg, "num_experts", 0) else ""
        return f"causal encoder + canvas decoder{moe}, canvas {cfg.canvas_length}"
    moe = " MoE" if cfg.moe_layer_ids else ""
    if engine.block_causal:
        return f"block-causal{moe}, block {engine.block_size}"
    return f"full{moe}"


def step_ms(engine: Engine, batch: int, gen_length: int) -> dict[str, float]:
    """Per-step means of one batch of ``batch`` requests (ms), and its step count."""
    params = engine.default_params().replace(gen_length=gen_length, temperature=0.0,
                                             suppress_eos=True)
    before = engine.step_timing.snapshot()
    engine.generate_batch(PROMPTS[:batch], params)
    return engine.step_timing.since(before)


def measure(engines: dict[str, Engine], batches: list[int], gen_length: int,
            repeats: int) -> dict[str, dict]:
    """Median per-step forward/host/step ms of each (family, batch), rounds interleaved."""
    samples: dict[tuple[str, int], list[dict]] = {(f, b): [] for f in engines for b in batches}
    for engine in engines.values():                   # warm-up
        step_ms(engine, 1, gen_length)
    for _ in range(repeats):
        for family, engine in engines.items():
            for b in batches:
                samples[family, b].append(step_ms(engine, b, gen_length))
    out: dict[str, dict] = {}
    for (family, b), runs in samples.items():
        out.setdefault(family, {})[f"batch{b}"] = {
            k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("steps", "step_ms", "forward_ms", "host_ms")}
    return out


def sampler_words(s: dict) -> str:
    if "entropy_bound" in s:
        return (f"entropy-bound {s['entropy_bound']:g}, at most {s['max_denoising_steps']} "
                f"steps a canvas, encoder cache")
    rule = f"threshold {s['threshold']:g}" if s["decoding"] == "threshold" else s["decoding"]
    cache = "no cache" if s["cache"] == "none" else f"{s['cache']} cache"
    block = "block" if s["cache"] == "none" else "sub-block"    # a full-attention canvas
    return f"{rule}, {block} {s['block_length']}, {cache}"


def markdown(report: dict) -> str:
    """The table of docs/BENCHMARKS.md: per batch, step ms (forward + host); the steps of
    each batch's run follow in a second table."""
    batches = [f"batch{b}" for b in report["batches"]]
    rows = ["| family | attention | parameters | forward path | sampler (family default) | "
            + " | ".join(f"{b[:5]} {b[5:]} ms" for b in batches) + " |",
            "|---|---|---:|---|---|" + "---:|" * len(batches)]
    steps = ["| family | " + " | ".join(f"{b[:5]} {b[5:]} steps" for b in batches) + " |",
             "|---|" + "---:|" * len(batches)]
    for family, info in report["families"].items():
        t = info["timing"]
        name = f"{family} (`llada2_moe`)" if family == "llada2" else family
        rows.append(f"| {name} | {info['attention']} | {info['parameters']:,} | "
                    f"{info['path']} | {sampler_words(info['sampler'])} | " + " | ".join(
                        f"{t[b]['step_ms']:.2f} ({t[b]['forward_ms']:.2f} + "
                        f"{t[b]['host_ms']:.2f})" for b in batches) + " |")
        steps.append(f"| {family} | " + " | ".join(f"{t[b]['steps']:g}" for b in batches)
                     + " |")
    return "\n".join(rows + [""] + steps)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        engines = {f: Engine.from_pretrained(write(Path(tmp) / f, f), device="cpu",
                                             dtype="float32") for f in (*FAMILIES, GEMMA)}
        timing = measure(engines, batches, args.gen_length, args.repeats)
    families = {f: {"attention": attention_kind(e),
                    "parameters": sum(p.numel() for p in e.model.parameters()),
                    "path": "packed" if e.packed else "modules",
                    "sampler": dict(e.layout.sampler) if f == GEMMA else {
                        k: getattr(e.default_params(), k)
                        for k in ("block_length", "decoding", "threshold", "cache")},
                    "timing": timing[f]} for f, e in engines.items()}
    for e in engines.values():
        e.stop()
    report = {"command": "python bench/family_step_cost.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "machine": machine_info(), "dtype": "float32", "gen_length": args.gen_length,
              "batches": batches, "repeats": args.repeats, "families": families}
    print(json.dumps(report, indent=1))
    print(markdown(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
