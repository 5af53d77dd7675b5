#!/usr/bin/env bash
# The prepared GPU check (issue 7 point 3, issue 4): CUDA kernel tests, then a LLaDA-8B-shaped
# model with random bf16 weights built on the GPU (nothing downloaded): reference vs cached
# decoding step latency and tokens/s at 1/4/8 tokens per forward, batch 1/8/32, prompt 512,
# full attention (none/prefix/dual caches) and the same weights block-causal (block/none vs
# block/exact: the exact append-only KV cache),
# block 32; peak memory; fraction of HBM bandwidth and of bf16 FLOP/s.
# Sized for <= 6 minutes on one H200 (runs predicted past 4 minutes of measuring are skipped
# and listed), so it fits a 15-minute device lease with the tiny-model bench beside it.
#
#   bench/gpu.sh [OUTDIR]        # default: docs/gpu; writes gpu.json, gpu.log (+ gpu.html)
#
# On a machine without CUDA, `python -m celeris bench --suite gpu --tiny` runs the same code
# on a tiny config (that is what tests/test_bench.py covers).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/gpu}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
html=()
if "$py" -c "import plotly" 2>/dev/null; then html=(--html "$out/gpu.html"); fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    2>&1 | tee "$out/gpu.log" || true
timeout 400 "$py" -m celeris bench --suite gpu --no-progress --json "$out/gpu.json" \
    "${html[@]}" 2>&1 | tee -a "$out/gpu.log"
