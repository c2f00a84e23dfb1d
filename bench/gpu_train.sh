#!/usr/bin/env bash
# The prepared GPU run of issue 19's 8B rows: LoRA SFT, DPO and GRPO on a Llama-3.1-8B-shaped model with random
# weights (made on the GPU by transformers, seed 0: nothing is downloaded), Linnet on PyTorch against TRL + PEFT,
# bf16 autocast over f32 weights on both sides, through bench/train_speed.py (one process per configuration,
# the same initial adapter and rows on both sides, losses and mean rewards recorded).
#
# One device call, bounded under 8 minutes (`timeout`): model creation and the bf16 save (~16 GB) about a
# minute, then six configurations of 4 steps, each loading the model in f32 (~32 GB of the GPU's memory).
#
#   bench/gpu_train.sh             on a machine with CUDA: writes $OUT/train_speed_gpu.{json,md}
#   bench/gpu_train.sh --dry-run   the same script path on the CPU with the tiny shape, f32 (proves it runs)
#
# OUT defaults to bench/results; the device run keeps its results in $OUT for the lead to copy back.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
WORKLOADS=sft-shrunk,dpo-shrunk,grpo-shrunk

if [[ "${1:-}" == "--dry-run" ]]; then
    exec "$PYTHON" bench/train_speed.py --shape tiny --device cpu --steps 2 --quiet-wait 0 \
        --only "$WORKLOADS" --out "$OUT/train_speed_gpu_dry_run"
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: use --dry-run")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
exec timeout 470 "$PYTHON" bench/train_speed.py --shape llama3-8b --device cuda --bf16 --steps 4 --quiet-wait 0 \
    --only "$WORKLOADS" --out "$OUT/train_speed_gpu"
