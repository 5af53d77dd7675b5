"""gpu: the prepared device check. CUDA kernel tests, then a LLaDA-8B-shaped model with random
bf16 weights built on the GPU (nothing downloaded): per-step latency and tokens/s of the
reference (no cache) and the cached forwards at fixed tokens per forward, for several batch
sizes; then the same weights as a block-causal model (blocks of 32: recompute vs the exact
append-only cache, rows "block/none" and "block/exact"); peak memory; achieved fraction of HBM
bandwidth and of bf16 FLOP/s.

Random weights rarely produce EOS, and EOS is suppressed anyway, so every row generates exactly
gen_length tokens: the step count is gen_length / tokens-per-forward by construction.

First, side by side, the step with each kernel setting (``step_variants``: batch 1 and 8, one
token per forward, the prefix and exact caches): ``torch`` (CELERIS_KERNELS=torch: the module
path's RMSNorm, RoPE and cache copies), ``fused`` (the Triton kernels, the CUDA default) and
``compiled`` (EngineConfig(compile=True): torch.compile, CUDA graphs). Its compile time counts
against the budget. ``--tiny`` runs the same code on a tiny config on CPU (that is what the
test covers; there ``fused`` is the torch path and ``compiled`` is dynamo's capture with the
eager backend, a smoke of the wiring with no speed meaning).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from .common import REPO_ROOT, BenchContext, SuiteSkipped, section

LLADA_8B = dict(vocab_size=126464, hidden_size=4096, intermediate_size=12288,
                num_hidden_layers=32, num_attention_heads=32, max_position_embeddings=4096,
                rope_theta=500000.0)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=512)
# (name fragment, HBM bytes/s, dense bf16 FLOP/s): vendor datasheet peaks.
PEAKS = (("H200", 4.8e12, 989e12), ("H100", 3.35e12, 989e12), ("A100", 2.039e12, 312e12))


@dataclass(frozen=True)
class GpuPlan:
    prompt_len: int
    block_length: int
    gen_length: int
    batches: tuple[int, ...]
    tokens_per_forward: tuple[int, ...]
    caches: tuple[str, ...]
    budget_s: float                 # runs predicted to end after this are skipped, not cut
    variant_batches: tuple[int, ...] = (1, 8)      # the step-variant comparison (TPF 1)
    variant_caches: tuple[str, ...] = ("prefix", "block/exact")


FULL_PLAN = GpuPlan(512, 32, 64, (1, 8, 32), (1, 4, 8), ("none", "prefix", "dual"), 240.0)
TINY_PLAN = GpuPlan(32, 8, 16, (1, 4), (1, 4, 8), ("none", "prefix", "dual"), 60.0, (1,))
STEP_KERNELS = ("torch", "fused", "compiled")
VARIANT_COLUMNS = (("kernels", "kernels", "s"), ("cache", "cache", "s"), ("batch", "batch", "d"),
                   ("steps", "steps", "d"), ("step_ms", "step ms", ".2f"),
                   ("tokens_per_s", "tok/s", ".1f"), ("vs_torch", "x torch", ".2f"),
                   ("compiled_calls", "compiled fwds", "d"), ("peak_mem_gib", "peak GiB", ".2f"))
BLOCK_CACHES = ("block/none", "block/exact")     # block-causal: recompute, exact KV cache
GPU_COLUMNS = (("cache", "cache", "s"), ("batch", "batch", "d"),
               ("tokens_per_forward", "TPF", "d"), ("steps", "steps", "d"),
               ("step_ms", "step ms", ".2f"), ("tokens_per_s", "tok/s", ".1f"),
               ("vs_none", "x none", ".2f"), ("hbm_fraction", "HBM frac", ".3f"),
               ("flops_fraction", "FLOP frac", ".3f"), ("peak_mem_gib", "peak GiB", ".2f"))


class IdsOnlyTokenizer:
    """The three tokenizer calls the engine makes, for token-id prompts and a random model
    (no detokenisation cost is timed)."""

    def __init__(self, mask: int, eos: int, pad: int) -> None:
        self.special = SimpleNamespace(mask=mask, eos=eos, pad=pad, eot=None, stop=(eos,))

    def answer_ids(self, canvas: Sequence[int]) -> list[int]:
        out = []
        for t in canvas:
            if t in (self.special.eos, self.special.mask):
                break
            out.append(t)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return ""

    def encode(self, text: str) -> list[int]:
        return []


def build_random_model(dims: dict[str, Any], device: Any, dtype: Any) -> Any:
    """Allocate straight on the device in ``dtype`` (meta first: no fp32 copy), then fill."""
    import torch

    from celeris import CelerisConfig, CelerisForMaskedDiffusion

    vocab = dims["vocab_size"]
    cfg = CelerisConfig(**dims, mask_token_id=vocab - 1, eos_token_id=vocab - 2, pad_token_id=0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = CelerisForMaskedDiffusion(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0)
    return model.eval()


def random_engine(dims: dict[str, Any], device: Any, dtype_name: str, name: str) -> Any:
    """An engine over ``build_random_model(dims)`` with an ids-only tokenizer."""
    import torch

    from celeris import Engine, EngineConfig

    model = build_random_model(dims, device, getattr(torch, dtype_name))
    vocab = dims["vocab_size"]
    return Engine(model, IdsOnlyTokenizer(vocab - 1, vocab - 2, 0), Path(name),
                  EngineConfig(device=device.type, dtype=dtype_name))


def block_causal_engine(engine: Any, block_size: int) -> Any:
    """A new engine over the same weights attending block-causally in blocks of ``block_size``
    (the model's config is switched in place; set ``attention`` back to use ``engine`` again)."""
    from celeris import Engine

    model = engine.model
    model.config.attention, model.config.block_size = "block_causal", block_size
    return Engine(model, engine.tokenizer, engine.model_dir, engine.config)


def _model_costs(model: Any) -> dict[str, float]:
    layers = model.model.layers
    layer_params = sum(p.numel() for p in layers.parameters() if p.ndim >= 2)
    streamed = [p for n, p in model.named_parameters() if "embed_tokens" not in n]
    cfg = model.config
    return {"layer_matmul_params": layer_params,
            "weight_bytes": sum(p.numel() * p.element_size() for p in streamed),
            "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size}


class _ForwardCounter:
    """Counts tokens per forward from shapes only (no device sync inside the timed loop)."""

    def __init__(self, model: Any) -> None:
        self.tokens = self.forwards = 0
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = args[0] if args else kwargs["input_ids"]
        self.tokens += ids.numel()
        self.forwards += 1

    def reset(self) -> None:
        self.tokens = self.forwards = 0


def _flops(costs: dict[str, float], tokens: int, logit_rows: int, keys: int) -> float:
    """Matmuls (2 x params x tokens), attention (QK^T and AV: 4 x layers x hidden x tokens x
    keys) and the vocabulary head on the active-block rows only."""
    return (2 * costs["layer_matmul_params"] * tokens
            + 4 * costs["layers"] * costs["hidden"] * tokens * keys
            + 2 * costs["hidden"] * costs["vocab"] * logit_rows)


def _peaks(gpu: str | None) -> tuple[float | None, float | None]:
    for name, bw, flops in PEAKS:
        if gpu and name in gpu:
            return bw, flops
    return None, None


def run_kernel_tests(device_type: str) -> dict[str, Any]:
    tests = REPO_ROOT / "tests"
    if device_type != "cuda":
        return {"status": "skipped", "reason": "no CUDA device"}
    if not tests.is_dir():
        return {"status": "skipped", "reason": f"{tests} not found"}
    # Only the files that hold GPU tests: the others import the UI stack (gradio,
    # playwright), which a bare GPU machine does not have.
    files = [str(f) for f in sorted(tests.glob("test_*.py")) if "mark.gpu" in f.read_text()]
    if not files:
        return {"status": "skipped", "reason": "no test file has a gpu marker"}
    env = dict(os.environ, TRITON_INTERPRET="0")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                           "no:cacheprovider", *files], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return {"status": "passed" if proc.returncode in (0, 5) else "failed",
            "returncode": proc.returncode, "seconds": round(time.perf_counter() - start, 1),
            "summary": tail[-1] if tail else "", "tail": tail}


class _Runner:
    def __init__(self, engine: Any, plan: GpuPlan, costs: dict[str, float], sync: Any,
                 peak_mem: Any, reset_mem: Any) -> None:
        import torch

        self.engine, self.plan, self.costs = engine, plan, costs
        self.sync, self.peak_mem, self.reset_mem = sync, peak_mem, reset_mem
        self.counter = _ForwardCounter(engine.model)
        g = torch.Generator().manual_seed(1)
        vocab = costs["vocab"]
        self.prompts = [torch.randint(1, int(vocab) - 2, (plan.prompt_len,), generator=g)
                        .tolist() for _ in range(max(plan.batches))]

    def params(self, cache: str, tpf: int) -> Any:
        from celeris import GenerationParams
        p = self.plan
        cache = {"block/none": "none", "block/exact": "prefix"}.get(cache, cache)
        return GenerationParams(gen_length=p.gen_length, block_length=p.block_length,
                                steps=p.gen_length // tpf, decoding="fixed", cache=cache,
                                suppress_eos=True, temperature=0.0, seed=0)

    def time(self, cache: str, batch: int, tpf: int) -> dict[str, Any]:
        params = self.params(cache, tpf)
        self.counter.reset()
        self.reset_mem()
        self.sync()
        start = time.perf_counter()
        results = self.engine.generate_batch(self.prompts[:batch], params)
        self.sync()
        wall = time.perf_counter() - start
        steps = max(r.steps for r in results)
        tokens = sum(r.usage.completion_tokens for r in results)
        keys = self.plan.prompt_len + self.plan.gen_length
        logit_rows = self.counter.forwards * batch * self.plan.block_length
        flops = _flops(self.costs, self.counter.tokens, logit_rows, keys)
        return {"cache": cache, "batch": batch, "tokens_per_forward": tpf, "steps": steps,
                "forwards": self.counter.forwards, "forward_tokens": self.counter.tokens,
                "wall_s": wall, "step_ms": 1e3 * wall / steps, "tokens": tokens,
                "tokens_per_s": tokens / wall, "achieved_tflops": flops / wall / 1e12,
                "weight_gb_per_s": self.costs["weight_bytes"] * steps / wall / 1e9,
                "peak_mem_gib": self.peak_mem() / 2**30}


def _device_hooks(device: Any) -> tuple[Any, Any, Any]:
    import torch

    if device.type == "cuda":
        return (torch.cuda.synchronize, torch.cuda.max_memory_allocated,
                torch.cuda.reset_peak_memory_stats)
    from celeris import memory_info
    return (lambda: None), (lambda: memory_info(device)["memory_bytes"]), (lambda: None)


def _measure(runner: _Runner, plan: GpuPlan, bar: Any, caches: Sequence[str],
             start: float) -> tuple[list[dict], list[str]]:
    rows, skipped = [], []
    for batch in plan.batches:
        for cache in caches:
            warm = runner.time(cache, batch, max(plan.tokens_per_forward))   # untimed warm-up
            per_step = warm["wall_s"] / warm["steps"]
            for tpf in plan.tokens_per_forward:
                predicted = per_step * plan.gen_length / tpf
                if time.perf_counter() - start + predicted > plan.budget_s:
                    skipped.append(f"{cache} batch {batch} TPF {tpf} (predicted "
                                   f"{predicted:.0f} s past the {plan.budget_s:.0f} s budget)")
                else:
                    rows.append(runner.time(cache, batch, tpf))
                bar.update(1)
    return rows, skipped


@contextmanager
def _kernel_setting(kernels: str, tiny: bool):
    """CELERIS_KERNELS for the variant (torch: the twins; otherwise auto), and on the tiny CPU
    smoke dynamo's eager backend for the compiled one; restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("CELERIS_KERNELS", "CELERIS_COMPILE_BACKEND")}
    os.environ["CELERIS_KERNELS"] = "torch" if kernels == "torch" else "auto"
    if tiny and kernels == "compiled":
        os.environ["CELERIS_COMPILE_BACKEND"] = "eager"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _variant_engine(engine: Any, kernels: str, cache: str, plan: GpuPlan) -> Any:
    """A new engine over the same weights for one variant: compile=True for ``compiled``,
    seats (and so KV slots) for the largest variant batch only; block caches attend
    block-causally (the config switched in place, as for the block rows)."""
    from celeris import Engine

    engine.model.config.attention = "bidirectional"
    config = replace(engine.config, compile=kernels == "compiled",
                     max_running=max(plan.variant_batches))
    engine = Engine(engine.model, engine.tokenizer, engine.model_dir, config)
    return block_causal_engine(engine, plan.block_length) if cache.startswith("block") \
        else engine


def _free(device_type: str) -> None:
    """Give a dropped engine's KV cache back before the next one is built."""
    import gc

    import torch
    gc.collect()
    if device_type == "cuda":
        torch.cuda.empty_cache()


def _measure_variants(engine: Any, plan: GpuPlan, costs: dict[str, float], hooks: tuple,
                      bar: Any, start: float, tiny: bool) -> tuple[list[dict], list[str]]:
    """Batch 1 and 8 at one token per forward with each kernel setting, side by side. A
    compiled variant compiles in its first (untimed) run and runs at the first batch size
    only; a second compile is skipped if, at the first one's cost, it would pass half the
    budget (the rest is the main table's)."""
    rows, skipped = [], []
    compile_s = 0.0
    for batch in plan.variant_batches:
        for cache in plan.variant_caches:
            for kernels in STEP_KERNELS:
                if kernels == "compiled" and (
                        batch != plan.variant_batches[0]
                        or time.perf_counter() - start + compile_s > plan.budget_s / 2):
                    skipped.append(f"compiled {cache} batch {batch} (compiled runs at batch "
                                   f"{plan.variant_batches[0]}, within half the budget)")
                    bar.update(1)
                    continue
                with _kernel_setting(kernels, tiny):
                    runner = _Runner(_variant_engine(engine, kernels, cache, plan),
                                     plan, costs, *hooks)
                    try:
                        warm = runner.time(cache, batch, 1)                      # untimed
                        if kernels == "compiled":     # the first run compiled: run again
                            compile_s = max(compile_s, warm["wall_s"])
                            warm = runner.time(cache, batch, 1)
                        predicted = warm["wall_s"]
                        if time.perf_counter() - start + predicted > plan.budget_s:
                            skipped.append(f"{kernels} {cache} batch {batch} (predicted "
                                           f"{predicted:.0f} s past the budget)")
                        else:
                            before = _compiled_calls(runner.engine)
                            row = runner.time(cache, batch, 1)
                            after = _compiled_calls(runner.engine)
                            rows.append(dict(row, kernels=kernels, compiled_calls=None
                                             if after is None else after - before))
                    finally:
                        runner.counter.handle.remove()
                        del runner
                        _free(engine.device.type)
                bar.update(1)
    engine.model.config.attention = "bidirectional"
    base = {(r["cache"], r["batch"]): r["tokens_per_s"] for r in rows if r["kernels"] == "torch"}
    for r in rows:
        ref = base.get((r["cache"], r["batch"]))
        r["vs_torch"] = r["tokens_per_s"] / ref if ref else None
    return rows, skipped


def _compiled_calls(engine: Any) -> int | None:
    """Forwards that ran compiled (None: not a compiled engine)."""
    return getattr(engine.runner.model, "compiled_calls", None)


def _annotate(rows: list[dict], costs: dict[str, float], gpu: str | None) -> None:
    bw, peak = _peaks(gpu)
    ref = {(r["cache"].startswith("block"), r["batch"], r["tokens_per_forward"]):
           r["tokens_per_s"] for r in rows if r["cache"] in ("none", "block/none")}
    for r in rows:
        base = ref.get((r["cache"].startswith("block"), r["batch"], r["tokens_per_forward"]))
        r["vs_none"] = r["tokens_per_s"] / base if base else None
        r["hbm_fraction"] = r["weight_gb_per_s"] * 1e9 / bw if bw else None
        r["flops_fraction"] = r["achieved_tflops"] * 1e12 / peak if peak else None


def run_gpu(ctx: BenchContext) -> dict[str, Any]:
    import torch

    if not ctx.tiny and not torch.cuda.is_available():
        raise SuiteSkipped("no CUDA device; `--suite gpu --tiny` runs the same code on CPU")
    device = torch.device("cuda" if torch.cuda.is_available() and not ctx.tiny else "cpu")
    dtype_name = ctx.dtype if ctx.dtype != "auto" else (
        "bfloat16" if device.type == "cuda" else "float32")
    plan, dims = (TINY_PLAN, TINY) if ctx.tiny else (FULL_PLAN, LLADA_8B)
    kernels = run_kernel_tests(device.type)
    engine = random_engine(dims, device, dtype_name,
                           "random-llada-8b-shape" if not ctx.tiny else "random-tiny")
    model = engine.model
    costs = _model_costs(model)
    hooks = _device_hooks(device)
    bar = ctx.bar(len(plan.batches) * (len(plan.caches) + len(BLOCK_CACHES))
                  * len(plan.tokens_per_forward)
                  + len(plan.variant_batches) * len(plan.variant_caches) * len(STEP_KERNELS),
                  "gpu")
    start = time.perf_counter()
    variants, skipped = _measure_variants(engine, plan, costs, hooks, bar, start, ctx.tiny)
    runner = _Runner(engine, plan, costs, *hooks)
    rows, more_skipped = _measure(runner, plan, bar, plan.caches, start)
    skipped += more_skipped
    # the same weights, attending block-causally (blocks of block_length): a new engine
    block_engine = block_causal_engine(engine, plan.block_length)
    more, more_skipped = _measure(_Runner(block_engine, plan, costs, *hooks), plan, bar,
                                  BLOCK_CACHES, start)
    model.config.attention = "bidirectional"
    rows, skipped = rows + more, skipped + more_skipped
    bar.close()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    _annotate(rows, costs, gpu)
    bw, peak = _peaks(gpu)
    settings = {"model": "LLaDA-8B-shaped, random weights" if not ctx.tiny else "tiny, random",
                "dims": dims, "dtype": dtype_name, "device": str(device), "gpu": gpu,
                "plan": asdict(plan), "weight_bytes": costs["weight_bytes"],
                "parameters": sum(p.numel() for p in model.parameters()),
                "peak_hbm_bytes_per_s": bw, "peak_bf16_flops": peak, "kernel_tests": kernels}
    notes = [f"kernel tests (pytest -m gpu): {kernels['status']} "
             f"{kernels.get('summary') or kernels.get('reason', '')}".strip(),
             "decoding fixed with steps = gen_length / TPF, EOS suppressed, temperature 0; "
             "cache none = the reference forward; tok/s counts all batch rows",
             "block/*: the same weights with block-causal attention over blocks of "
             f"{plan.block_length}: block/none recomputes prompt + finished blocks + block "
             "every step, block/exact forwards only the block against the exact KV cache",
             "HBM frac = weight bytes (all but the embedding) x steps / wall / peak bandwidth; "
             "FLOP frac = estimated FLOPs (matmuls + attention + head) / wall / peak dense bf16",
             *(f"skipped: {s}" for s in skipped)]
    notes.insert(2, "step_variants (batch " + "/".join(map(str, plan.variant_batches))
                 + ", TPF 1): kernels torch = CELERIS_KERNELS=torch (module-path RMSNorm, RoPE, "
                 "cache copies), fused = Triton RMSNorm+residual, q/k RoPE and cache write "
                 "(the CUDA default, and what the rows above run on CUDA), compiled = "
                 "EngineConfig(compile=True) (torch.compile, reduce-overhead on CUDA), measured "
                 "first and side by side" + ("; tiny CPU smoke: fused = torch path, compiled = "
                                             "dynamo with the eager backend" if ctx.tiny else ""))
    out = section("gpu", "GPU: LLaDA-8B-shaped decoding step", GPU_COLUMNS, rows, settings,
                  notes)
    out["tables"] = [{"name": "step_variants", "rows": variants,
                      "title": "step_variants: the step with each kernel setting (TPF 1)",
                      "columns": [list(c) for c in VARIANT_COLUMNS]}]
    return out
