"""``bench --suite quant``: what ``--quantize`` saves and costs on the CPU, side by side.

Three tables, every mode measured in this process:

- ``step`` (the main table): ms per denoising step of a random LLaDA-shaped model
  (``STEP_DIMS``: 16 layers of width 1536, 0.49B parameters in the layers, 0.59B with the
  embedding and head) in float32, int8 and int4, at batch 1 and 8, on the module path (what
  the engine runs for a model this size) and on the packed CPU path (``pack_for_inference``
  without its size cap: float32 through oneDNN, int8 through ``torch._weight_int8pack_mm``,
  int4 through torchao's kernel), with each model's weight bytes. The model attends
  block-causally in blocks of 4 with the exact cache, one token committed per step, EOS
  suppressed: a step forwards the current block and the block just finished (4-8 columns a
  row), the memory-bound case weight-only quantization is for. Every system runs each
  repeat in turn, the order rotating (``timed_side_by_side``), so the ratios hold on a
  machine whose speed drifts.
- ``accuracy``: the shipped models (celeris-tiny-bd, celeris-tiny) at full width, int8 and
  int4 on the held-out checkable tasks (``--n`` problems a task, temperature 0): exact-match
  accuracy and the share of answer positions whose token equals the full-width run's.
- ``fit``: weight bytes of published configs (LLaDA-8B, Dream-7B, LLaDA2.0-mini) per mode on a
  CUDA GPU, computed from the configs on the meta device (``config_weight_bytes``; the same
  counting the tests hold equal to loaded models' real bytes). int4 on a mixture-of-experts
  model is what ``--quantize int4`` refuses.

``--tiny`` runs the same code on a tiny random model (and ``--model``, or the shipped
celeris-tiny-bd, for the accuracy table), for the test suite.

``measure_quant_step`` is the GPU suite's ``quant_step`` table (``bench --suite gpu``): each
mode's block step on a CUDA device against its weight-read floor.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from .common import BenchContext, accuracy, messages, section, spread, task_examples
from .common import REPO_ROOT, timed_side_by_side
from .gpu import (GPU_QUANT_MODES, LLADA2_MINI, IdsOnlyTokenizer, _free, _model_costs, _peaks,
                  _RoutingCounter, _Runner, build_random_model, moe_costs, moe_step_bytes)

MODES = (None, "int8", "int4")              # what runs on a CPU (fp8 needs a GPU)
FP8 = "fp8"
# LLaDA-8B's shape (width 4096, 32 layers, SwiGLU of 3x the width, 32 heads of 128) scaled
# to ~0.5B parameters in its layers: width 1536, 16 layers, 12 heads of 128
STEP_DIMS = dict(vocab_size=32000, hidden_size=1536, intermediate_size=4608,
                 num_hidden_layers=16, num_attention_heads=12, max_position_embeddings=512,
                 attention="block_causal", block_size=4)
TINY_DIMS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, max_position_embeddings=256, attention="block_causal",
                 block_size=4)
PROMPT, GEN, BLOCK = 32, 16, 4              # step table: tokens of prompt, answer, block
BATCHES = (1, 8)
SHIPPED = ("celeris-tiny-bd", "celeris-tiny")
ACCURACY_BATCH = 8
# Published config.json values (the keys each family's checkpoints use):
# GSAI-ML/LLaDA-8B-Instruct (bench/gpu.py's LLADA_8B), Dream-org/Dream-v0-Instruct-7B (the
# Qwen2.5-7B shape: width 3584, 28 layers, 28 query / 4 key-value heads, SwiGLU 18944,
# vocab 152064, untied head, q/k/v biases) and inclusionAI/LLaDA2.0-mini (bench/gpu.py).
FIT_CONFIGS = {
    "LLaDA-8B": {"model_type": "llada", "d_model": 4096, "n_heads": 32, "n_kv_heads": 32,
                 "n_layers": 32, "mlp_hidden_size": 12288, "vocab_size": 126464,
                 "embedding_size": 126464, "max_sequence_length": 4096,
                 "rope_theta": 500000.0, "weight_tying": False, "include_bias": False,
                 "mask_token_id": 126336},
    "Dream-7B": {"model_type": "Dream", "hidden_size": 3584, "intermediate_size": 18944,
                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "vocab_size": 152064, "max_position_embeddings": 131072,
                 "rope_theta": 1000000.0, "tie_word_embeddings": False,
                 "mask_token_id": 151666},
    "LLaDA2.0-mini": {"model_type": "llada2_moe", **LLADA2_MINI},
}
STEP_COLUMNS = (("mode", "mode", "s"), ("path", "path", "s"), ("batch", "batch", "d"),
                ("step_ms", "ms/step", ".1f"), ("vs_float32", "x float32", ".2f"),
                ("weight_mb", "weights MB", ".1f"), ("weight_ratio", "x bf16", ".3f"))
ACCURACY_COLUMNS = (("model", "model", "s"), ("mode", "mode", "s"),
                    ("accuracy", "accuracy", ".3f"), ("token_agreement", "same tokens", ".3f"),
                    ("weight_mb", "weights MB", ".2f"), ("n", "n", "d"))
FIT_COLUMNS = (("model", "model", "s"), ("parameters_b", "params (B)", ".2f"),
               ("bf16_gb", "bf16 GB", ".1f"), ("int8_gb", "int8 GB", ".1f"),
               ("int4_gb", "int4 GB", "s"), ("fp8_gb", "fp8 GB", ".1f"))


def _name(mode: str | None) -> str:
    return mode or "float32"


# ---------------------------------------------------------------------- the step table
def _engines(dims: dict[str, Any], mode: str | None) -> dict[str, Any]:
    """{"module": engine, "packed": engine} over one random model quantized with ``mode``:
    the packed engine runs a shallow copy of the model (the same parameters) packed
    without the engine's size cap."""
    import torch

    from celeris import Engine, EngineConfig, quantize_model

    cpu = torch.device("cpu")
    model = build_random_model(dims, cpu, torch.float32)
    if mode is not None:
        model.celeris_quantization = quantize_model(model, mode, cpu, torch.float32)
    model.unpack_inference()
    vocab = dims["vocab_size"]
    tok = IdsOnlyTokenizer(vocab - 1, vocab - 2, 0)
    config = EngineConfig(device="cpu", dtype="float32", max_running=max(BATCHES))
    module = Engine(model, tok, REPO_ROOT / f"random-{_name(mode)}", config)
    module.model.unpack_inference()          # Engine packs a model under the size cap
    twin = copy.copy(model)                  # same parameters, its own packed copy
    packed = Engine(twin, tok, REPO_ROOT / f"random-{_name(mode)}-packed", config)
    twin.pack_for_inference(max_bytes=1 << 62)   # after Engine, which packs under its cap
    return {"module": module, "packed": packed}


def _step_params(gen: int) -> Any:
    from celeris import GenerationParams
    return GenerationParams(gen_length=gen, block_length=BLOCK, steps=gen, decoding="fixed",
                            cache="prefix", suppress_eos=True, temperature=0.0, seed=0)


def _step_table(ctx: BenchContext, dims: dict[str, Any]) -> tuple[list[dict], dict]:
    import torch

    from celeris import weight_bytes

    gen = GEN if not ctx.tiny else 8
    repeats = max(1, min(ctx.repeats, 2))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, dims["vocab_size"] - 2, (PROMPT,), generator=g).tolist()
               for _ in range(max(BATCHES))]
    systems: dict[str, Any] = {}
    sizes: dict[str | None, dict[str, int]] = {}
    ctx.say(f"building the random {'tiny' if ctx.tiny else '0.5B LLaDA-shaped'} model in "
            f"{', '.join(_name(m) for m in MODES)}")
    for mode in MODES:
        engines = _engines(dims, mode)
        sizes[mode] = weight_bytes(engines["module"].model)
        for path, engine in engines.items():
            systems[f"{_name(mode)}/{path}"] = engine
    params = _step_params(gen)
    rows: list[dict[str, Any]] = []
    bar = ctx.bar(sum(BATCHES) * (repeats + 1) * len(systems), "ms per step (mode x path)")
    for batch in BATCHES:
        runs = {name: (lambda chunk, e=engine: e.generate_batch(chunk, params))
                for name, engine in systems.items()}
        timed_side_by_side(runs, prompts[:batch], batch, bar)               # warm-up
        out = timed_side_by_side(runs, prompts[:batch] * repeats, batch, bar)
        for name, (results, walls) in out.items():
            steps = max(r.steps for r in results[:batch])
            mode_name, path = name.split("/")
            mode = None if mode_name == "float32" else mode_name
            wb = sizes[mode]
            rows.append({"mode": mode_name, "path": path, "batch": batch,
                         "step_ms": 1e3 * spread(walls)["median"] / steps, "steps": steps,
                         "wall_s": walls, "weight_mb": wb["total"] / 1e6,
                         "weight_bytes": wb,
                         "weight_ratio": (wb["quantized"] / wb["quantized_bf16"]
                                          if wb["quantized_bf16"] else None)})
    bar.close()
    for row in rows:
        base = next(r for r in rows if r["mode"] == "float32" and r["path"] == row["path"]
                    and r["batch"] == row["batch"])
        row["vs_float32"] = row["step_ms"] / base["step_ms"]
    settings = {"dims": dims, "prompt_len": PROMPT, "gen_length": gen, "block_length": BLOCK,
                "steps": gen, "cache": "prefix (exact block cache)", "repeats": repeats,
                "parameters": sum(p.numel() for p in systems["float32/module"].model
                                  .parameters())}
    return rows, settings


# ---------------------------------------------------------------------- the accuracy table
def _accuracy_table(ctx: BenchContext) -> list[dict[str, Any]]:
    from celeris import Engine, weight_bytes

    models = ([ctx.model] if ctx.model else [str(REPO_ROOT / "models" / SHIPPED[0])]) \
        if ctx.tiny else [str(REPO_ROOT / "models" / name) for name in SHIPPED]
    examples = task_examples(ctx.n)
    rows = []
    bar = ctx.bar(len(models) * len(MODES) * len(examples), "held-out tasks (model x mode)")
    for path in models:
        reference: list[list[int]] | None = None
        for mode in MODES:
            engine = Engine.from_pretrained(path, device="cpu", quantize=mode)
            prompts = [messages(ex.prompt) for ex in examples]
            params = engine.default_params().replace(temperature=0.0, seed=0, stop=())
            results = []
            for i in range(0, len(prompts), ACCURACY_BATCH):
                results += engine.generate_batch(prompts[i:i + ACCURACY_BATCH], params)
                bar.update(len(prompts[i:i + ACCURACY_BATCH]), system=_name(mode))
            texts = [r.text for r in results]
            acc, per_task = accuracy(examples, texts)
            tokens = [list(r.token_ids) for r in results]
            reference = tokens if reference is None else reference
            rows.append({"model": engine.model_dir.name, "mode": _name(mode),
                         "accuracy": acc, "per_task": per_task, "n": len(examples),
                         "token_agreement": _agreement(reference, tokens),
                         "weight_mb": weight_bytes(engine.model)["total"] / 1e6})
    bar.close()
    return rows


def _agreement(reference: list[list[int]], tokens: list[list[int]]) -> float:
    """Share of answer positions (up to the longer answer of each pair) holding the same
    token in both runs."""
    same = total = 0
    for a, b in zip(reference, tokens):
        total += max(len(a), len(b))
        same += sum(x == y for x, y in zip(a, b))
    return same / total if total else 1.0


# ---------------------------------------------------------------------- the fit table
def fit_rows() -> list[dict[str, Any]]:
    """Weight bytes of FIT_CONFIGS per mode, CUDA layouts, bfloat16 (GB = 1e9 bytes)."""
    from celeris import config_weight_bytes

    rows = []
    for name, raw in FIT_CONFIGS.items():
        full = config_weight_bytes(raw, None, "bfloat16", "cuda")
        moe = bool(raw.get("num_experts"))
        row = {"model": name, "parameters_b": full / 2 / 1e9, "bf16_gb": full / 1e9,
               "bytes": {"bf16": full}}
        for mode in ("int8", "int4", FP8):
            size = config_weight_bytes(raw, mode, "bfloat16", "cuda")
            row["bytes"][mode] = size
            row[f"{mode}_gb"] = size / 1e9
        if moe:
            row["int4_gb"] = "refused (MoE)"
        else:
            row["int4_gb"] = f"{row['int4_gb']:.1f}"
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- the suite
def run_quant(ctx: BenchContext) -> dict[str, Any]:
    import importlib.util

    from .common import SuiteSkipped

    if importlib.util.find_spec("torchao") is None:
        raise SuiteSkipped("--quantize needs torchao: pip install -r requirements-quant.txt")
    start = time.perf_counter()
    dims = TINY_DIMS if ctx.tiny else STEP_DIMS
    step_rows, step_settings = _step_table(ctx, dims)
    accuracy_rows = _accuracy_table(ctx)
    fits = fit_rows()
    settings = {"model": "random LLaDA-shaped, block-causal" + (" (tiny)" if ctx.tiny else
                                                                "") + ", float32, CPU",
                "dtype": "float32", "batch": "/".join(map(str, BATCHES)),
                "gen_length": step_settings["gen_length"], "block_length": BLOCK,
                "step": step_settings, "accuracy_models": sorted({r["model"]
                                                                  for r in accuracy_rows}),
                "seconds": round(time.perf_counter() - start, 1)}
    notes = [
        "step: ms per denoising step (median wall of a request over its steps), the exact "
        f"block cache, blocks of {BLOCK}, one token a step, EOS suppressed, prompt {PROMPT}; "
        "x float32 = the mode's step over float32's on the same path and batch; module = the "
        "model's nn.Linear calls (int8: torchao dequantizes the weight in each product; int4: "
        "aten._weight_int4pack_mm_for_cpu), packed = model/packed.py (float32: oneDNN; int8: "
        "torch._weight_int8pack_mm, bfloat16 inputs; int4: torchao's kernel per projection)",
        "weights MB: the parameters' real storage (int data, scales, zero points); x bf16 = "
        "the quantized tensors' bytes over the same values in bfloat16 (goal: int8 <= 0.52, "
        "int4 <= 0.30)",
        "accuracy: held-out checkable tasks, exact match, temperature 0, the model's decoding "
        "defaults; same tokens = share of answer positions equal to the full-width run's",
        "fit: weight bytes only (no KV cache, no activations), bfloat16, CUDA layouts (int4: "
        "tinygemm pads the input width to 1024), computed from the configs on the meta device; "
        "DiffusionGemma: config_weight_bytes(its config.json, mode) (no config in this repo)",
    ]
    out = section("quant", "--quantize on the CPU: step time, weight bytes, accuracy",
                  STEP_COLUMNS, step_rows, settings, notes)
    out["tables"] = [
        {"name": "accuracy", "rows": accuracy_rows, "columns": [list(c) for c in ACCURACY_COLUMNS],
         "title": "accuracy: shipped models quantized vs full width, held-out tasks"},
        {"name": "fit", "rows": fits, "columns": [list(c) for c in FIT_COLUMNS],
         "title": "fit: weight bytes per mode from published configs (CUDA, bfloat16)"}]
    return out


# ---------------------------------------------------------------------- the GPU suite's quant_step
def _quant_row(runner: _Runner, batch: int, model_label: str, mode: str | None,
               weights: int, read_bytes: float, bw: float | None,
               warm: bool = True) -> dict[str, Any]:
    """One timed quant_step run (after an untimed one unless ``warm`` is False: the caller
    ran it) with its weight-read floor."""
    if warm:
        runner.time("block/exact", batch, 1)                                   # untimed
    row = runner.time("block/exact", batch, 1)
    floor = 1e3 * read_bytes / bw if bw else None
    return dict(row, model=model_label, mode=mode or "full width", status="ok",
                weight_gb=weights / 1e9, read_gb_per_step=read_bytes / 1e9, floor_ms=floor,
                vs_floor=row["step_ms"] / floor if floor else None)


def measure_quant_step(models: Sequence[tuple[str, dict[str, Any], Any]], plan: Any,
                   device: Any, dtype_name: str, hooks: tuple, bar: Any, gpu: str | None
                   ) -> tuple[list[dict], list[str]]:
    """Each ``--quantize`` mode's step against the model's dtype: for every (label, dims,
    config class) of ``models``, a random model built, quantized in place, block-causal with
    the exact cache, one token a forward, at each of ``quant_batches``, within
    ``quant_budget_s``. A mode the device or the model refuses (fp8 without the hardware,
    int4 on a mixture of experts) or that fails gets a row saying why. The read floor is the
    weight bytes a forward must read (all but the embedding; a MoE: its fixed weights plus
    the distinct experts routed for the forward's tokens, counted in the untimed run) over the
    peak HBM bandwidth."""
    import torch

    from celeris import Engine, EngineConfig, QuantizeError, quantize_model, weight_bytes

    deadline = time.perf_counter() + plan.quant_budget_s
    bw, _ = _peaks(gpu)
    qplan = replace(plan, gen_length=plan.quant_gen_length, batches=plan.quant_batches)
    rows, skipped = [], []
    dtype = getattr(torch, dtype_name)
    for label, dims, config_cls in models:
        full: dict[int, float] = {}
        for mode in GPU_QUANT_MODES:
            name = f"{label} {mode or 'full width'}"
            if time.perf_counter() > deadline:
                skipped.append(f"quant_step {name} (past the {plan.quant_budget_s:.0f} s slice)")
                bar.update(len(plan.quant_batches))
                continue
            engine = runner = routing = model = None
            try:
                model = build_random_model(dict(dims, attention="block_causal",
                                                block_size=plan.block_length),
                                           device, dtype, config_cls)
                if mode is not None:
                    model.celeris_quantization = quantize_model(model, mode, device, dtype)
                vocab = dims["vocab_size"]
                engine = Engine(model, IdsOnlyTokenizer(vocab - 1, vocab - 2, 0),
                                Path(f"random-{label}-{mode or 'full'}"),
                                EngineConfig(device=device.type, dtype=dtype_name,
                                             max_running=max(plan.quant_batches)))
                moe = bool(getattr(model.config, "num_experts", 0))
                costs = moe_costs(model) if moe else _model_costs(model)
                weights = weight_bytes(model)["total"]
                runner = _Runner(engine, qplan, costs, *hooks)
                routing = _RoutingCounter(model) if moe else None
                for batch in plan.quant_batches:
                    bar.update(1)
                    if time.perf_counter() > deadline:
                        skipped.append(f"quant_step {name} batch {batch} (past the slice)")
                        continue
                    if routing is None:
                        row = _quant_row(runner, batch, label, mode, weights,
                                         costs["weight_bytes"], bw)
                    else:
                        with routing:
                            runner.time("block/exact", batch, 1)   # counts the routing
                        read = moe_step_bytes(costs, routing.mean(), runner.counter.tokens
                                              / max(1, runner.counter.forwards))
                        row = _quant_row(runner, batch, label, mode, weights, read, bw,
                                         warm=False)
                    rows.append(row)
                    if mode is None:
                        full[batch] = row["step_ms"]
            except Exception as exc:      # noqa: BLE001 - a refusal or failure is a row
                why = (str(exc).splitlines() or [type(exc).__name__])[0].split("; ")[0]
                kind = "refused" if isinstance(exc, QuantizeError) else "failed"
                rows.append({"model": label, "mode": mode or "full width", "batch": None,
                             "status": f"{kind}: {why}"})
                bar.update(len(plan.quant_batches))
            finally:
                if runner is not None:
                    runner.counter.handle.remove()
                if routing is not None:
                    routing.remove()
                del engine, runner, routing, model
                _free(device.type)
        for r in rows:
            if r["model"] == label and r.get("batch") in full:
                r["vs_full"] = r["step_ms"] / full[r["batch"]]
    return rows, skipped
