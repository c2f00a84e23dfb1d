#!/usr/bin/env bash
# Install (once per machine) a Triton Inference Server that serves `linnet export triton` repositories, and print
# its folder.
#
#   tools/tritonserver.sh [PYTHON]      # PYTHON defaults to .venv/bin/python; prints the folder on stdout
#
# The server is the one inside the PyPI wheel nvidia-pytriton 0.7.0 (Triton 2.51, manylinux_2_35): its
# `tritonserver` binary, the Python backend and one Python-backend stub per Python version. It goes into the
# Linnet cache folder (`$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`;
# linnet/runtimes/backends/caches.py), under tritonserver/ (or into $LINNET_TRITONSERVER_DIR), never into the venv: the wheel pins numpy < 2 (--no-deps keeps
# that pin out of the venv). The folder then holds:
#   pytriton-0.7.0/                  the unpacked wheel; the server's libraries are in nvidia_pytriton.libs/
#   pytriton-0.7.0/pytriton/tritonserver/backends/python/triton_python_backend_stub   the 3.11 stub, copied
#       where the Python backend looks for it (as pytriton's own Triton() does before it starts the server)
#   stub-numpy/                      numpy 1.26.4, for the stub process only (docs/triton.md says why)
# The stub embeds the system's libpython3.11 (Debian's python3.11, not the venv's interpreter), installed with
# apt-get when missing and apt-get is there.
#
# Never fails the caller: when something cannot be installed it says why, writes the reason to
# $ROOT/tritonserver/unavailable.txt and exits 0; the tests marked tritonserver then skip with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTRITON_VERSION=0.7.0
STUB_NUMPY_VERSION=1.26.4
PY=${1:-.venv/bin/python}

if [ -n "${LINNET_CACHE_DIR:-}" ]; then ROOT=$LINNET_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then ROOT=$XDG_CACHE_HOME/linnet
else ROOT=$HOME/.cache/linnet; fi
DIR=${LINNET_TRITONSERVER_DIR:-$ROOT/tritonserver}
WHEEL=$DIR/pytriton-$PYTRITON_VERSION
SERVER=$WHEEL/pytriton/tritonserver
STUB_NUMPY=$DIR/stub-numpy
REASON_FILE=$DIR/unavailable.txt

unavailable() {
    echo "tools/tritonserver.sh: $1; tests marked tritonserver will skip" >&2
    mkdir -p "$DIR" 2>/dev/null && echo "$1" >"$REASON_FILE"
    exit 0
}

mkdir -p "$DIR" || unavailable "cannot create $DIR"
[ "$(uname -m)" = x86_64 ] || unavailable "nvidia-pytriton $PYTRITON_VERSION has wheels for x86_64 Linux only, not $(uname -m)"

if [ ! -x "$SERVER/bin/tritonserver" ]; then
    echo "tools/tritonserver.sh: installing nvidia-pytriton $PYTRITON_VERSION (--no-deps) into $WHEEL" >&2
    TMP=$(mktemp -d "$DIR/.pytriton-XXXXXX")
    "$PY" -m pip install --quiet --no-deps --target "$TMP" "nvidia-pytriton==$PYTRITON_VERSION" >"$TMP.log" 2>&1 \
        || { tail -5 "$TMP.log" >&2; rm -rf "$TMP"; unavailable "pip could not install nvidia-pytriton==$PYTRITON_VERSION (log: $TMP.log)"; }
    rm -rf "$WHEEL" && mv "$TMP" "$WHEEL" && rm -f "$TMP.log"
fi
cp -p "$SERVER/python_backend_stubs/3.11/triton_python_backend_stub" "$SERVER/backends/python/" \
    || unavailable "the wheel has no Python 3.11 backend stub"

if [ ! -f "$STUB_NUMPY/numpy/__init__.py" ]; then
    TMP=$(mktemp -d "$DIR/.stub-numpy-XXXXXX")
    "$PY" -m pip install --quiet --no-deps --target "$TMP" "numpy==$STUB_NUMPY_VERSION" >"$TMP.log" 2>&1 \
        || { tail -5 "$TMP.log" >&2; rm -rf "$TMP"; unavailable "pip could not install numpy==$STUB_NUMPY_VERSION for the stub (log: $TMP.log)"; }
    rm -rf "$STUB_NUMPY" && mv "$TMP" "$STUB_NUMPY" && rm -f "$TMP.log"
fi

STUB=$SERVER/backends/python/triton_python_backend_stub
export LD_LIBRARY_PATH=$WHEEL/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd "$STUB" | grep -q "libpython3.11.* not found"; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "tools/tritonserver.sh: installing libpython3.11 (the stub embeds it)" >&2
        (apt-get update -qq && apt-get install -y -qq libpython3.11 >/dev/null) 2>&1 | tail -3 >&2
    fi
    ldd "$STUB" | grep -q "libpython3.11.* not found" && unavailable "the Python backend stub needs the system's libpython3.11 (apt-get install libpython3.11)"
fi
# (`tritonserver --help` exits 1, so the check is that every library it links is found)
MISSING=$(ldd "$SERVER/bin/tritonserver" 2>&1 | grep "not found" | head -3 | tr '\n' ' ')
[ -z "$MISSING" ] || unavailable "$SERVER/bin/tritonserver lacks libraries here: $MISSING"

rm -f "$REASON_FILE"
echo "$DIR"
