#!/usr/bin/env bash
# GPU readiness check (benchmarks/gpu_check.py): ~300 mixed-precision (bf16) training steps of our Diffusion Policy
# on synthetic state + 96x96 image episodes, a checkpoint saved and loaded back, chunk-inference and corrector-monitor
# latency; PASS/FAIL per check, within 5 minutes. Without CUDA the same path runs on the CPU with fewer steps.
# Installs nothing, downloads nothing (random init, synthetic data, Hugging Face hubs offline).
#
#   benchmarks/gpu_check.sh                   # CUDA when present, else CPU
#   benchmarks/gpu_check.sh --device cpu      # any option of benchmarks/gpu_check.py (--steps, --batch, --out)
#   PYTHON=/path/to/python benchmarks/gpu_check.sh
#
# Exit status: 0 all checks passed, 1 a check failed, 2 bad usage / no Python, 124 killed at the time limit
# (GPU_CHECK_TIMEOUT seconds, default 330: the 300 s budget plus time to report).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
    echo "gpu_check: no Python at '$PY' (run 'make install', or set PYTHON=...)" >&2
    exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu --format=csv,noheader || true
else
    echo "gpu_check: nvidia-smi not found (no NVIDIA driver): the check runs on the CPU unless CUDA is visible"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-330}" "$PY" benchmarks/gpu_check.py "$@"
