#!/usr/bin/env bash
# The tests marked tpu (issue 41, goal 1) on one TPU, in one process, in one device call: the conformance suite on
# JAX's backends (`jax`, `xla`) against the torch-interpret reference, and the parity of a SmolLM2-shaped decoder
# (f32 and bf16), BERT, ViT and Whisper against transformers, each a seeded shrunk checkpoint that transformers makes
# there (nothing is downloaded; no embedded checkpoint is needed). The marker, the device and the bounds:
# tests/conftest.py (`tpu_device`) and tests/runtimes/conftest.py (`on_devices`, TPU_LOGITS_ATOL).
#
# It installs nothing: the machine needs JAX with libtpu, numpy, pytest, torch (a CPU build), transformers,
# safetensors, tokenizers, lark and gguf, with this tree's `linnet` importable (run from the repository root).
# LINNET_TPU_TESTS_DEVICE=tpu makes every test fail, not skip, where JAX sees no TPU (a run that skipped everything
# would read as a pass). pytest gets SIGINT at TPU_TESTS_TIMEOUT_S (540 s), so it stops inside the device's 10-minute
# limit and still writes its summary and XML.
#
#   OUT=DIR bench/tpu_tests.sh             on the TPU machine
#   OUT=DIR bench/tpu_tests.sh --dry-run   the same tests on this machine's CPU (LINNET_TPU_TESTS_DEVICE=cpu)
#
# Writes into $OUT: tpu_tests.log (pytest's output: the device and versions in its header, each test, the 30 slowest
# steps, each max|Δ| in the captured output of a failure; then every recorded distance), tpu_tests.xml (JUnit XML),
# tpu_distances.json (every distance the tests recorded, one row each: tests/runtimes/conftest.py `record`). Exits with
# pytest's status.
# PYTHON defaults to python3.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder for the log, the JUnit XML and the distances}
PYTHON=${PYTHON:-python3}
device=tpu
if [[ ${1:-} == --dry-run ]]; then device=cpu; fi
mkdir -p "$OUT"
rm -f "$OUT/tpu_distances.json"  # `record` adds to an existing file

LINNET_TPU_TESTS_DEVICE=$device LINNET_RECORD_ZOO="$OUT/tpu_distances.json" \
    timeout -s INT "${TPU_TESTS_TIMEOUT_S:-540}" \
    "$PYTHON" -m pytest -m tpu -p no:xdist -p no:cacheprovider -v --durations=30 \
    --junitxml="$OUT/tpu_tests.xml" 2>&1 | tee "$OUT/tpu_tests.log"
status=${PIPESTATUS[0]}
if [[ -f "$OUT/tpu_distances.json" ]]; then
    "$PYTHON" - "$OUT/tpu_distances.json" <<'EOF' 2>&1 | tee -a "$OUT/tpu_tests.log"
import json, sys

rows = json.load(open(sys.argv[1], encoding="utf-8"))["rows"]
print(f"\n{len(rows)} distances recorded (max|Δ|, against, what):")
for r in sorted(rows, key=lambda r: (r["test"], r["what"])):
    print(f"{r['max_abs_diff']:9.2e}  {r['against']:15s}  {r['what']}")
EOF
fi
echo "bench/tpu_tests.sh: pytest exited with $status" | tee -a "$OUT/tpu_tests.log"
exit "$status"
