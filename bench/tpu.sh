#!/usr/bin/env bash
# Issue 41's TPU rows in one device call (bench/tpu.py says what each row measures), bounded under 9 minutes.
#
#   bench/tpu.sh             on the TPU machine: installs Linnet and what it needs from the wheels carried in
#                            .whl-tpu (see below), then runs bench/tpu.py into $OUT (tpu_<date>.{json,md})
#   bench/tpu.sh --dry-run   the same path on this machine's CPU at tiny sizes, into $OUT (default /tmp/tpu-dry-run)
#
# The wheels (made here, carried with `carry: [".whl-tpu"]`; .git/info/exclude ignores the folder):
#   .venv/bin/pip wheel --no-deps -w .whl-tpu .
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl-tpu \
#       lark gguf safetensors tqdm jinja2 markupsafe tokenizers pyyaml optax absl-py
#       (the versions constraints.txt and .venv hold; optax and its dependencies for `--only train`)
# The machine's own JAX stays first on PYTHONPATH; they go under /tmp/site, after it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--dry-run" ]]; then
    PYTHON=${PYTHON:-.venv/bin/python}
    OUT=${OUT:-/tmp/tpu-dry-run}
    PYTHONPATH=. exec "$PYTHON" bench/tpu.py --dry-run --out "$OUT" "${@:2}"
fi
OUT=${OUT:?set OUT to the folder for the results}
if [[ -d .whl-tpu ]]; then  # (the tree's own linnet/ is not a mapped install: `linnet.runtimes` needs the wheel)
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl-tpu/*.whl
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
fi
python3 -c 'import jax; print(jax.__version__, jax.devices())'
export PYTHONUNBUFFERED=1
timeout 520 python3 bench/tpu.py --out "$OUT" --budget-s 400 "${@}" 2>&1 | tee "$OUT/tpu_bench.log"
