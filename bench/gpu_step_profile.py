"""Where does a batch-1 cached decoding step of an 8B-shaped model spend its time on one GPU?

Reproduces docs/BENCHMARKS.md, "GPU: LLaDA-8B-shaped decoding", its step profile and the peak
memory of the block-causal exact cache at batch 32 (docs/results/gpu-step-profile.json). Kept
because no other command measures those two figures. It profiles one cached step (prefix
cache, prompt 512, block 32, random bf16 weights built on the GPU) with torch.profiler and
reports the wall time per step, the time the GPU was busy per step (sum of kernel times),
kernel launches per step and the top operators by GPU and by CPU time; then it measures the
peak memory of block-causal exact-cache decoding at batch 32.

    python bench/gpu_step_profile.py --out runs/gpu     # on a CUDA machine
    python bench/gpu_step_profile.py --tiny             # the same code on CPU, tiny config
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from celeris import GenerationParams  # noqa: E402
from celeris.bench.gpu import LLADA_8B, TINY, block_causal_engine, random_engine  # noqa: E402


def _device_us(evt) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(evt, name, None)
        if v:
            return float(v)
    return 0.0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke run)")
    ap.add_argument("--out", default=None, help="folder for step_profile.json / .txt")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    dims = TINY if args.tiny else LLADA_8B
    prompt_len, block, gen = (32, 8, 16) if args.tiny else (512, 32, 64)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    engine = random_engine(dims, device, str(dtype).removeprefix("torch."), "random")
    vocab = dims["vocab_size"]
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab - 2, (prompt_len,), generator=g).tolist()
               for _ in range(32)]
    params = GenerationParams(gen_length=gen, block_length=block, steps=gen, decoding="fixed",
                              cache="prefix", suppress_eos=True, temperature=0.0, seed=0)

    engine.generate_batch(prompts[:1], params)                        # warm-up
    sync()
    t0 = time.perf_counter()
    steps = engine.generate_batch(prompts[:1], params)[0].steps
    sync()
    wall_ms = 1e3 * (time.perf_counter() - t0) / steps

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        engine.generate_batch(prompts[:1], params)
        sync()
    events = prof.key_averages()
    # device-side events only: an aten op's self device time repeats its kernels' time
    kernels = [e for e in events if _device_us(e) > 0
               and getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(_device_us(e) for e in kernels) / 1e3 / steps
    launches = sum(e.count for e in kernels) / steps
    by_gpu = sorted(kernels, key=_device_us, reverse=True)[:15]
    by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]

    # block-causal exact cache, batch 32: peak memory (slots now grow on demand)
    block_engine = block_causal_engine(engine, block)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    block_engine.generate_batch(prompts, params.replace(steps=gen // 8))
    sync()
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    slot_len = block_engine._kv.length if block_engine._kv is not None else None

    report = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "dtype": str(dtype),
        "torch": torch.__version__, "dims": dims, "prompt_len": prompt_len, "block": block,
        "gen_length": gen, "steps": steps, "wall_ms_per_step": wall_ms,
        "gpu_busy_ms_per_step": busy_ms if cuda else None,
        "kernel_launches_per_step": launches if cuda else None,
        "top_gpu_ops": [{"name": e.key, "count": e.count, "device_ms": _device_us(e) / 1e3}
                        for e in by_gpu],
        "top_cpu_ops": [{"name": e.key, "count": e.count,
                         "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in by_cpu],
        "block_exact_batch32_peak_gib": peak_gib, "block_exact_slot_length": slot_len,
    }
    try:
        table = events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                             row_limit=30)
    except Exception:                             # newer torch names the column by device
        table = events.table(sort_by="self_device_time_total", row_limit=30)
    text = (f"{report['device']} {dtype}: batch 1 prefix-cache step {wall_ms:.2f} ms wall, "
            f"GPU busy {busy_ms:.2f} ms, {launches:.0f} kernel launches per step\n"
            f"block/exact batch 32: peak {peak_gib} GiB, slot length {slot_len}\n\n" + table)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "step_profile.json").write_text(json.dumps(report, indent=1))
        (out / "step_profile.txt").write_text(text)
    return report


if __name__ == "__main__":
    main()
