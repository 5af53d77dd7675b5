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

Before them all, within its own slice of the budget (``moe_budget_s``), the ``moe_step``
table: a LLaDA2.0-mini-shaped mixture of experts (``LLADA2_MINI``, read through the
llada2_moe config reader; 16.26B parameters, 1.43B active per token) with random bf16 weights
built on the GPU, block-causal with the exact cache: per-step latency, tokens/s at a fixed TPF
and peak memory at batch 1/8/32, and the HBM roofline of a step, the weight bytes it must
read (attention, norms, the dense first layer, routers, shared experts, the LM head, the
embedding rows of its tokens and, per MoE layer, the distinct experts the router chose for
the step's tokens, counted on the device in the untimed warm-up of the same requests) over
the device's HBM bandwidth, as ``roofline_ms`` and ``hbm_fraction`` = roofline / step. The
model is freed before the dense one is built.
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
# LLaDA2's architecture in its upstream keys (LLaDA2MoeConfig reads them as the checkpoint's
# config.json would be read): sigmoid routing within the best 4 of 8 expert groups, one shared
# expert, the first layer dense, fused q/k/v with per-head q/k RMSNorm, RoPE on half of each
# head, untied head; blocks of 32 (the reader's default, as the checkpoints have it).
_LLADA2_ARCH = dict(first_k_dense_replace=1, num_shared_experts=1, n_group=8, topk_group=4,
                    score_function="sigmoid", routed_scaling_factor=2.5, use_qkv_bias=False,
                    use_bias=False, use_qk_norm=True, partial_rotary_factor=0.5,
                    rope_theta=600000, rms_norm_eps=1e-6, tie_word_embeddings=False)
# inclusionAI/LLaDA2.0-mini's published shape. The repo holds only the key names
# (tests/test_families.py's _llada2); the values are those of the config.json of
# inclusionAI/LLaDA2.1-mini on the Hugging Face Hub (the same architecture and sizes as
# LLaDA2.0-mini; vocab 157184 is also LLaDA2.0-Uni's text vocabulary, its image_token_offset).
# Check: built on the meta device they make 16,255,643,392 parameters, 1,432,973,056 active
# per token (8 of 256 experts), 789,053,440 of them outside the embedding and head: the model
# card's "16B total, 1.4B active" (tests/test_bench.py counts them).
LLADA2_MINI = dict(_LLADA2_ARCH, vocab_size=157184, hidden_size=2048, intermediate_size=5120,
                   num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
                   head_dim=128, num_experts=256, num_experts_per_tok=8,
                   moe_intermediate_size=512)
TINY_MOE = dict(_LLADA2_ARCH, vocab_size=512, hidden_size=64, intermediate_size=128,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
                moe_intermediate_size=32, max_position_embeddings=512, block_size=8)
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
    # the MoE step (block-causal, exact cache, prompt_len, blocks of block_length): measured
    # first, within the first moe_budget_s of budget_s
    moe_batches: tuple[int, ...] = (1, 8, 32)
    moe_tokens_per_forward: int = 4
    moe_gen_length: int = 128
    moe_budget_s: float = 60.0
    # the quantized step (quant_step): block-causal, exact cache, one token a forward, each
    # --quantize mode against bfloat16, measured last within its own quant_budget_s
    quant_batches: tuple[int, ...] = (1, 8)
    quant_gen_length: int = 32
    quant_budget_s: float = 150.0


FULL_PLAN = GpuPlan(512, 32, 64, (1, 8, 32), (1, 4, 8), ("none", "prefix", "dual"), 240.0)
TINY_PLAN = GpuPlan(32, 8, 16, (1, 4), (1, 4, 8), ("none", "prefix", "dual"), 60.0, (1,),
                    moe_batches=(1, 4), moe_gen_length=16, moe_budget_s=20.0,
                    quant_batches=(1, 4), quant_gen_length=16, quant_budget_s=60.0)
STEP_KERNELS = ("torch", "fused", "compiled")
VARIANT_COLUMNS = (("kernels", "kernels", "s"), ("cache", "cache", "s"), ("batch", "batch", "d"),
                   ("steps", "steps", "d"), ("step_ms", "step ms", ".2f"),
                   ("tokens_per_s", "tok/s", ".1f"), ("vs_torch", "x torch", ".2f"),
                   ("compiled_calls", "compiled fwds", "d"), ("peak_mem_gib", "peak GiB", ".2f"))
BLOCK_CACHES = ("block/none", "block/exact")     # block-causal: recompute, exact KV cache
MOE_COLUMNS = (("batch", "batch", "d"), ("tokens_per_forward", "TPF", "d"),
               ("steps", "steps", "d"), ("step_ms", "step ms", ".2f"),
               ("tokens_per_s", "tok/s", ".1f"), ("routed_experts", "experts/layer", ".1f"),
               ("weight_gb_per_step", "GB/step", ".3f"), ("roofline_ms", "roofline ms", ".2f"),
               ("hbm_fraction", "HBM frac", ".3f"), ("flops_fraction", "FLOP frac", ".3f"),
               ("peak_mem_gib", "peak GiB", ".2f"))
GPU_QUANT_MODES = (None, "int8", "fp8", "int4")         # None: the model's dtype (full width)
QUANT_STEP_COLUMNS = (("model", "model", "s"), ("mode", "mode", "s"), ("batch", "batch", "d"),
                      ("step_ms", "step ms", ".2f"), ("tokens_per_s", "tok/s", ".1f"),
                      ("vs_full", "x full width", ".2f"), ("weight_gb", "weights GB", ".2f"),
                      ("read_gb_per_step", "GB/step", ".3f"), ("floor_ms", "read floor ms", ".2f"),
                      ("vs_floor", "x floor", ".2f"), ("peak_mem_gib", "peak GiB", ".2f"),
                      ("status", "status", "s"))
# the kinds of weight a MoE step reads, by parameter name (moe_costs)
WEIGHT_KINDS = ("embedding", "attention", "norms", "dense_mlp", "routers", "shared_experts",
                "experts", "head")
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


def build_random_model(dims: dict[str, Any], device: Any, dtype: Any,
                       config_cls: Any = None) -> Any:
    """Allocate straight on the device in ``dtype`` (meta first: no fp32 copy), then fill.
    ``config_cls`` reads ``dims`` (default: CelerisConfig, our own field names; e.g.
    LLaDA2MoeConfig for upstream llada2_moe keys). On the meta device the model is only
    shaped: nothing allocated, nothing filled."""
    import torch

    from celeris import CelerisConfig, CelerisForMaskedDiffusion

    vocab = dims["vocab_size"]
    cfg = (config_cls or CelerisConfig)(**dims, mask_token_id=vocab - 1,
                                        eos_token_id=vocab - 2, pad_token_id=0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = CelerisForMaskedDiffusion(cfg)
    finally:
        torch.set_default_dtype(previous)
    if device.type == "meta":
        return model.eval()
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0)
    return model.eval()


def random_engine(dims: dict[str, Any], device: Any, dtype_name: str, name: str,
                  config_cls: Any = None) -> Any:
    """An engine over ``build_random_model(dims)`` with an ids-only tokenizer."""
    import torch

    from celeris import Engine, EngineConfig

    model = build_random_model(dims, device, getattr(torch, dtype_name), config_cls)
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


def param_bytes(p: Any) -> int:
    """A parameter's bytes: numel x element size, or a quantized tensor's real storage (int
    data, scales, zero points)."""
    import torch

    from celeris import tensor_bytes
    plain = type(p) in (torch.Tensor, torch.nn.Parameter)
    return p.numel() * p.element_size() if plain else tensor_bytes(p)


def _model_costs(model: Any) -> dict[str, float]:
    layers = model.model.layers
    layer_params = sum(p.numel() for p in layers.parameters() if p.ndim >= 2)
    streamed = [p for n, p in model.named_parameters() if "embed_tokens" not in n]
    cfg = model.config
    return {"layer_matmul_params": layer_params,
            "weight_bytes": sum(param_bytes(p) for p in streamed),
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


def _weight_kind(name: str) -> str:
    if "embed_tokens" in name:
        return "embedding"
    if name.startswith("lm_head"):
        return "head"
    if ".self_attn." in name:                 # q/k/v, output projection, q/k norms
        return "attention"
    if ".mlp.experts." in name:               # the routed experts, stacked (E, ., .)
        return "experts"
    if ".mlp.shared_experts." in name:
        return "shared_experts"
    if ".mlp.gate." in name:                  # router weight and expert_bias
        return "routers"
    if ".mlp." in name:                       # a dense layer's SwiGLU
        return "dense_mlp"
    return "norms"                            # the blocks' RMSNorms and the final one


def moe_costs(model: Any) -> dict[str, Any]:
    """A mixture-of-experts model's parameters and weight bytes by kind (``WEIGHT_KINDS``),
    the bytes of one routed expert and of one embedding row, what a step reads whatever the
    routing (``step_fixed_bytes``: all but the routed experts and the embedding), the
    parameters active per token (k of the E routed experts) and, for the FLOP estimate, the
    layer matmul parameters a token passes through."""
    cfg = model.config
    numel = dict.fromkeys(WEIGHT_KINDS, 0)
    nbytes = dict.fromkeys(WEIGHT_KINDS, 0)
    matmul = 0                       # 2-D+ layer weights, the routed experts k of E
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    for name, p in model.named_parameters():
        kind = _weight_kind(name)
        numel[kind] += p.numel()
        nbytes[kind] += param_bytes(p)
        if name.startswith("model.layers.") and p.ndim >= 2:
            matmul += p.numel() * k // E if kind == "experts" else p.numel()
    moe_layers = len(cfg.moe_layer_ids)
    total = sum(numel.values())
    return {"parameters": total,
            "active_parameters": total - numel["experts"] + numel["experts"] * k // E,
            "parameters_by_kind": numel, "bytes_by_kind": nbytes,
            "weight_bytes": sum(nbytes.values()), "moe_layers": moe_layers,
            "num_experts": E, "experts_per_token": k,
            "expert_bytes": nbytes["experts"] // (moe_layers * E),
            "embedding_row_bytes": nbytes["embedding"] // cfg.vocab_size,
            "step_fixed_bytes": sum(b for kind, b in nbytes.items()
                                    if kind not in ("experts", "embedding")),
            "layer_matmul_params": matmul, "layers": cfg.num_hidden_layers,
            "hidden": cfg.hidden_size, "vocab": cfg.vocab_size}


def moe_step_bytes(costs: dict[str, Any], routed_experts: float, tokens: float) -> float:
    """The weight bytes one forward must read: every weight but the routed experts and the
    embedding, ``routed_experts`` distinct experts in each MoE layer (a mean over layers) and
    the embedding rows of its ``tokens``. KV-cache reads are not counted."""
    return (costs["step_fixed_bytes"]
            + routed_experts * costs["moe_layers"] * costs["expert_bytes"]
            + tokens * costs["embedding_row_bytes"])


class _RoutingCounter:
    """While on (``with counter:``), sums on the device, per MoE layer and forward, how many
    distinct experts the router chose for the forward's tokens; ``mean()`` (one host read,
    after the run) is the mean per layer and forward."""

    def __init__(self, model: Any) -> None:
        gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "experts")]
        self.handles = [g.register_forward_hook(self._hook) for g in gates]
        self.on, self.total, self.calls = False, None, 0

    def _hook(self, module: Any, args: tuple, out: tuple) -> None:
        if not self.on:
            return
        import torch
        idx = out[0]                                                    # (N, k) expert ids
        chosen = (torch.bincount(idx.flatten(), minlength=module.weight.shape[0]) > 0).sum()
        self.total = chosen if self.total is None else self.total + chosen
        self.calls += 1

    def __enter__(self) -> "_RoutingCounter":
        self.on, self.total, self.calls = True, None, 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.on = False

    def mean(self) -> float | None:
        return float(self.total) / self.calls if self.calls else None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _moe_row(row: dict[str, Any], costs: dict[str, Any], routed: float, bw: float | None,
             peak: float | None) -> dict[str, Any]:
    """A timed MoE run with its roofline: the bytes of a mean forward (``routed`` distinct
    experts a MoE layer, the run's mean tokens a forward) over the peak bandwidth."""
    step_bytes = moe_step_bytes(costs, routed, row["forward_tokens"] / row["forwards"])
    gb_per_s = step_bytes * row["forwards"] / row["wall_s"] / 1e9
    return dict(row, routed_experts=routed, weight_bytes_per_step=step_bytes,
                weight_gb_per_step=step_bytes / 1e9, weight_gb_per_s=gb_per_s,
                roofline_ms=1e3 * step_bytes / bw if bw else None,
                hbm_fraction=gb_per_s * 1e9 / bw if bw else None,
                flops_fraction=row["achieved_tflops"] * 1e12 / peak if peak else None)


def _measure_moe(dims: dict[str, Any], plan: GpuPlan, device: Any, dtype_name: str,
                 hooks: tuple, bar: Any, start: float, gpu: str | None,
                 tiny: bool) -> tuple[list[dict], dict[str, Any], list[str]]:
    """The MoE model (built here, dropped on return) block-causal with the exact cache at
    each of ``moe_batches``, within ``moe_budget_s`` of ``start``: an untimed run that also
    counts the routed experts, then the timed run of the same requests (temperature 0: the
    same tokens, so the same routing). A batch is skipped when, from the previous timed run
    scaled by batch size, its two runs would pass the slice, or when after its first run the
    timed one would."""
    from celeris import LLaDA2MoeConfig

    deadline = start + plan.moe_budget_s
    engine = random_engine(dims, device, dtype_name,
                           "random-tiny-moe" if tiny else "random-llada2-mini-shape",
                           LLaDA2MoeConfig)
    costs = moe_costs(engine.model)
    moe_plan = replace(plan, gen_length=plan.moe_gen_length, batches=plan.moe_batches)
    runner = _Runner(engine, moe_plan, costs, *hooks)
    routing = _RoutingCounter(engine.model)
    bw, peak = _peaks(gpu)
    tpf = plan.moe_tokens_per_forward
    rows, skipped, last = [], [], None
    try:
        for batch in plan.moe_batches:
            guess = last[1] * batch / last[0] if last else 0.0
            if time.perf_counter() + 2 * guess > deadline:
                skipped.append(f"moe batch {batch} (its two runs, predicted {2 * guess:.0f} s, "
                               f"pass the {plan.moe_budget_s:.0f} s MoE slice)")
            else:
                with routing:
                    warm = runner.time("block/exact", batch, tpf)     # untimed; counts routing
                if time.perf_counter() + warm["wall_s"] > deadline:
                    skipped.append(f"moe batch {batch} (predicted {warm['wall_s']:.0f} s past "
                                   f"the {plan.moe_budget_s:.0f} s MoE slice)")
                else:
                    row = runner.time("block/exact", batch, tpf)
                    rows.append(_moe_row(row, costs, routing.mean(), bw, peak))
                    last = (batch, row["wall_s"])   # the warm-up's wall holds first-call costs
            bar.update(1)
    finally:
        runner.counter.handle.remove()
        routing.remove()
    return rows, costs, skipped


def run_gpu(ctx: BenchContext) -> dict[str, Any]:
    import torch

    if not ctx.tiny and not torch.cuda.is_available():
        raise SuiteSkipped("no CUDA device; `--suite gpu --tiny` runs the same code on CPU")
    device = torch.device("cuda" if torch.cuda.is_available() and not ctx.tiny else "cpu")
    dtype_name = ctx.dtype if ctx.dtype != "auto" else (
        "bfloat16" if device.type == "cuda" else "float32")
    plan, dims, moe_dims = ((TINY_PLAN, TINY, TINY_MOE) if ctx.tiny
                            else (FULL_PLAN, LLADA_8B, LLADA2_MINI))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    kernels = run_kernel_tests(device.type)
    hooks = _device_hooks(device)
    bar = ctx.bar(len(plan.moe_batches)
                  + len(plan.batches) * (len(plan.caches) + len(BLOCK_CACHES))
                  * len(plan.tokens_per_forward)
                  + len(plan.variant_batches) * len(plan.variant_caches) * len(STEP_KERNELS)
                  + 2 * len(GPU_QUANT_MODES) * len(plan.quant_batches),
                  "step costs (batch x cache x tokens per forward)")
    start = time.perf_counter()
    # the MoE step first (the model is freed before the dense one is built); a failure there
    # is reported and the dense tables still run
    try:
        moe_rows, moe_costs_, skipped = _measure_moe(moe_dims, plan, device, dtype_name, hooks,
                                                     bar, start, gpu, ctx.tiny)
        moe_status = "ok"
    except Exception as exc:      # noqa: BLE001 - reported in the section, not raised
        moe_rows, moe_costs_, moe_status = [], None, f"failed: {type(exc).__name__}: {exc}"
        skipped = [f"moe_step: {moe_status}"]
    _free(device.type)
    engine = random_engine(dims, device, dtype_name,
                           "random-llada-8b-shape" if not ctx.tiny else "random-tiny")
    model = engine.model
    costs = _model_costs(model)
    variants, more_skipped = _measure_variants(engine, plan, costs, hooks, bar, start, ctx.tiny)
    skipped += more_skipped
    runner = _Runner(engine, plan, costs, *hooks)
    rows, more_skipped = _measure(runner, plan, bar, plan.caches, start)
    skipped += more_skipped
    # the same weights, attending block-causally (blocks of block_length): a new engine
    block_engine = block_causal_engine(engine, plan.block_length)
    more, more_skipped = _measure(_Runner(block_engine, plan, costs, *hooks), plan, bar,
                                  BLOCK_CACHES, start)
    model.config.attention = "bidirectional"
    rows, skipped = rows + more, skipped + more_skipped
    parameters = sum(p.numel() for p in model.parameters())
    del engine, block_engine, runner, model
    _free(device.type)
    from celeris import LLaDA2MoeConfig

    from .quant import measure_quant_step
    quant_rows, more_skipped = measure_quant_step(
        (("dense", dims, None), ("moe", moe_dims, LLaDA2MoeConfig)), plan, device, dtype_name,
        hooks, bar, gpu)
    skipped += more_skipped
    bar.close()
    _annotate(rows, costs, gpu)
    bw, peak = _peaks(gpu)
    moe_settings = {"model": ("tiny llada2_moe, random" if ctx.tiny else
                              "LLaDA2.0-mini-shaped (llada2_moe), random weights"),
                    "dims": moe_dims, "status": moe_status, "cache": "block/exact",
                    "prompt_len": plan.prompt_len, "block_length": plan.block_length,
                    "gen_length": plan.moe_gen_length,
                    "tokens_per_forward": plan.moe_tokens_per_forward,
                    "batches": list(plan.moe_batches), "budget_s": plan.moe_budget_s}
    if moe_costs_ is not None:
        moe_settings.update({k: moe_costs_[k] for k in (
            "parameters", "active_parameters", "parameters_by_kind", "bytes_by_kind",
            "weight_bytes", "moe_layers", "num_experts", "experts_per_token", "expert_bytes",
            "embedding_row_bytes", "step_fixed_bytes", "layer_matmul_params")})
    settings = {"model": "LLaDA-8B-shaped, random weights" if not ctx.tiny else "tiny, random",
                "dims": dims, "dtype": dtype_name, "device": str(device), "gpu": gpu,
                "plan": asdict(plan), "weight_bytes": costs["weight_bytes"],
                "parameters": parameters,
                "peak_hbm_bytes_per_s": bw, "peak_bf16_flops": peak, "kernel_tests": kernels,
                "moe": moe_settings}
    notes = [f"kernel tests (pytest -m gpu): {kernels['status']} "
             f"{kernels.get('summary') or kernels.get('reason', '')}".strip(),
             "decoding fixed with steps = gen_length / TPF, EOS suppressed, temperature 0; "
             "cache none = the reference forward; tok/s counts all batch rows",
             "block/*: the same weights with block-causal attention over blocks of "
             f"{plan.block_length}: block/none recomputes prompt + finished blocks + block "
             "every step, block/exact forwards only the block against the exact KV cache",
             "HBM frac = weight bytes (all but the embedding) x steps / wall / peak bandwidth; "
             "FLOP frac = estimated FLOPs (matmuls + attention + head) / wall / peak dense bf16",
             f"quant_step: the dense and the MoE shape rebuilt for each --quantize mode "
             f"(full width = {dtype_name}), block-causal over blocks of {plan.block_length}, "
             f"exact cache, prompt {plan.prompt_len}, {plan.quant_gen_length} tokens one a "
             f"forward, batch {'/'.join(map(str, plan.quant_batches))}, measured last within "
             f"{plan.quant_budget_s:.0f} s; weights GB = the real storage (int data, scales); "
             "GB/step = the quantized weights a forward reads (the MoE: fixed weights plus its "
             "routed experts); read floor = GB/step / peak HBM bandwidth; a refused or failed "
             "mode is a row with its reason",
             *(f"skipped: {s}" for s in skipped)]
    notes.insert(2, "step_variants (batch " + "/".join(map(str, plan.variant_batches))
                 + ", TPF 1): kernels torch = CELERIS_KERNELS=torch (module-path RMSNorm, RoPE, "
                 "cache copies), fused = Triton RMSNorm+residual, q/k RoPE and cache write "
                 "(the CUDA default, and what the rows above run on CUDA), compiled = "
                 "EngineConfig(compile=True) (torch.compile, reduce-overhead on CUDA), measured "
                 "first and side by side" + ("; tiny CPU smoke: fused = torch path, compiled = "
                                             "dynamo with the eager backend" if ctx.tiny else ""))
    notes.insert(3, f"moe_step ({moe_settings['model']}, {moe_status}): block-causal, exact "
                 f"cache, prompt {plan.prompt_len}, blocks of {plan.block_length}, "
                 f"{plan.moe_gen_length} tokens at TPF {plan.moe_tokens_per_forward}, measured "
                 f"first within {plan.moe_budget_s:.0f} s; GB/step = the weights a forward "
                 "reads (all but the routed experts and the embedding, plus the embedding rows "
                 "of its tokens and, per MoE layer, the distinct experts routed for its tokens: "
                 "experts/layer, counted in the untimed run of the same requests; KV reads not "
                 "counted), means over the run's forwards (the first holds the prompt); "
                 "roofline ms = GB/step / peak HBM bandwidth; HBM frac = roofline / step; "
                 "FLOP frac with the active parameters; random routers route near uniformly, "
                 "so a trained model's tokens may share more experts")
    out = section("gpu", "GPU: LLaDA-8B-shaped decoding step", GPU_COLUMNS, rows, settings,
                  notes)
    out["tables"] = [{"name": "step_variants", "rows": variants,
                      "title": "step_variants: the step with each kernel setting (TPF 1)",
                      "columns": [list(c) for c in VARIANT_COLUMNS]},
                     {"name": "moe_step", "rows": moe_rows,
                      "title": "moe_step: LLaDA2.0-mini-shaped MoE block step, exact cache, "
                               "against the HBM roofline" if not ctx.tiny else
                               "moe_step: tiny llada2_moe block step, exact cache",
                      "columns": [list(c) for c in MOE_COLUMNS]},
                     {"name": "quant_step", "rows": quant_rows,
                      "title": "quant_step: each --quantize mode's block step against the "
                               "weight-read floor (dense LLaDA-8B shape, LLaDA2.0-mini-shaped "
                               "MoE)" if not ctx.tiny else
                               "quant_step: each --quantize mode's block step (tiny models)",
                      "columns": [list(c) for c in QUANT_STEP_COLUMNS]}]
    return out
