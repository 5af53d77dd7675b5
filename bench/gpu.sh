#!/usr/bin/env bash
# Reproduces docs/BENCHMARKS.md, "GPU: LLaDA-8B-shaped decoding" (docs/results/gpu.json): the
# CUDA kernel tests, then models with random bf16 weights built on the GPU (nothing downloaded).
# First, within 60 s of the budget, the "moe_step" table: a LLaDA2.0-mini-shaped MoE
# (llada2_moe: hidden 2048, 20 layers, 256 experts, 8 routed + 1 shared; 16.26B parameters,
# 1.43B active), block-causal with the exact cache, prompt 512, blocks of 32, TPF 4: step
# latency, tokens/s and peak memory at batch 1/8/32, and the weights a step must read
# (attention, head, dense and shared layers, the experts routed for its tokens) over the HBM
# bandwidth (roofline ms, HBM frac). Then a LLaDA-8B-shaped model: the step with each kernel
# setting side by side (the "step_variants" table: torch = CELERIS_KERNELS=torch, fused = the
# Triton RMSNorm/RoPE/KV-write kernels, compiled = torch.compile with CUDA graphs; batch 1 and
# 8, one token per forward, prefix and exact caches; compile time is spent inside the budget);
# then per-step latency, tokens/s, peak memory and fractions of HBM bandwidth and bf16 FLOP/s
# at 1/4/8 tokens per forward, batch 1/8/32, prompt 512, block 32, full attention
# (none/prefix/dual caches) and the same weights block-causal (block/none vs block/exact),
# with the CUDA default kernels. Last, the "quant_step" table: both shapes rebuilt for each
# --quantize mode (int8, fp8, int4; int4 is refused on the MoE) and timed block-causal with
# the exact cache at batch 1 and 8 against the weight-read floor (the quantized bytes a
# forward reads over the HBM bandwidth), within its own 150 s; it needs torchao
# (requirements-quant.txt; without network: pip install the wheels brought along), else its
# rows say why. Sized for <= 8 minutes on one H200 (runs predicted past 4 minutes of
# measuring, the MoE table's included, are skipped and listed). If compiling fails,
# the compiled rows run eagerly and the log says why; rerun with
# CELERIS_COMPILE_BACKEND=aot_eager to tell a tracing problem from an inductor one. If the MoE
# table fails, the log's notes say why and the dense tables still run.
#
#   bench/gpu.sh [OUTDIR]        # default: runs/gpu; writes gpu.json, gpu.log (+ gpu.html)
#   cp runs/gpu/gpu.json docs/results/gpu.json     # when the figure is replaced
#
# On a machine without CUDA, `python -m celeris bench --suite gpu --tiny` runs the same code
# on a tiny config (that is what tests/test_bench.py covers).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
html=()
if "$py" -c "import plotly" 2>/dev/null; then html=(--html "$out/gpu.html"); fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    2>&1 | tee "$out/gpu.log" || true
timeout 540 "$py" -m celeris bench --suite gpu --no-progress --json "$out/gpu.json" \
    "${html[@]}" 2>&1 | tee -a "$out/gpu.log"
