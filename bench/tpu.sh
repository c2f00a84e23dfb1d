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
#       lark gguf safetensors tqdm jinja2 markupsafe tokenizers pyyaml      (the versions constraints.txt and .venv hold)
# `--only train` (bench/tpu_train.py) also needs optax and absl-py (optax imports it) in .whl-tpu:
#       optax==0.2.8 absl-py==2.5.1
# `--only peer` (bench/tpu_peer.py) also needs KerasHub's wheels, carried as .whl-peer (`carry: [".whl-tpu",
# ".whl-peer"]`; ignored as .whl-tpu is): keras-hub and keras with what `import keras_hub` and its Llama path import
# (not tensorflow-text nor TensorFlow, which keras-hub declares; tokenizers comes from .whl-tpu):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl-peer \
#       keras-hub==0.32.0 keras==3.15.1 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 \
#       pygments==2.21.0 namex==0.1.0 h5py==3.14.0 optree==0.16.0 typing-extensions==4.16.0 packaging==26.4 \
#       regex==2026.12.2 sentencepiece==0.2.0       (absl-py comes from .whl-tpu: pip refuses the same wheel twice)
# The machine's own JAX stays first on PYTHONPATH; they go under /tmp/site, after it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--dry-run" ]]; then
    shift
    PYTHON=${PYTHON:-.venv/bin/python}
    OUT=${OUT:-/tmp/tpu-dry-run}
    PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} exec "$PYTHON" bench/tpu.py --dry-run --out "$OUT" "$@"
fi
OUT=${OUT:?set OUT to the folder for the results}
if [[ -d .whl-tpu ]]; then  # (the tree's own linnet/ is not a mapped install: `linnet.runtimes` needs the wheel)
    PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl-tpu/*.whl $(ls .whl-peer/*.whl 2>/dev/null)
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site
fi
python3 -c 'import jax; print(jax.__version__, jax.devices())'
export PYTHONUNBUFFERED=1
timeout 520 python3 bench/tpu.py --out "$OUT" --budget-s 400 "${@}" 2>&1 | tee "$OUT/tpu_bench.log"
