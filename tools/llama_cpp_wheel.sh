#!/usr/bin/env bash
# Build (once per machine) or reuse a llama-cpp-python wheel, then install it into the venv.
#
#   tools/llama_cpp_wheel.sh [PYTHON]      # PYTHON defaults to .venv/bin/python
#
# llama.cpp is the reference engine of the GGUF export tests (tests marked `llama_cpp`). PyPI has
# only the sdist, which compiles llama.cpp (minutes). The wheel is cached in the Linnet cache folder
# (`$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`, else `~/.cache/linnet`; linnet/runtimes/backends/caches.py),
# under wheels/, keyed by the version, the compiler and the CPU's feature flags, since the build is
# -march=native.
#
# AMX is turned off: on an AMX CPU the native build crashes in ggml_backend_amx_mul_mat on the first
# decode. GGML_AMX_*=OFF alone is not enough: GGML_NATIVE compiles with -march=native, which defines
# __AMX_INT8__ and switches the AMX backend back on, so the compiler flags also say -mno-amx-* (GCC
# and Clang let an explicit -mno-X win over -march whatever the order).
#
# Never fails the caller: without a compiler (or when the build fails) it says why, writes the reason
# to $VENV/llama-cpp-unavailable.txt and exits 0; the llama_cpp tests then skip with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
PY=${1:-.venv/bin/python}
VENV_DIR=$(dirname "$(dirname "$PY")")
REASON_FILE="$VENV_DIR/llama-cpp-unavailable.txt"

unavailable() {
    echo "tools/llama_cpp_wheel.sh: $1; tests marked llama_cpp will skip" >&2
    echo "$1" >"$REASON_FILE"
    exit 0
}

if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '$VERSION')" 2>/dev/null; then
    rm -f "$REASON_FILE"
    exit 0
fi

CC_BIN=${CC:-cc}
CXX_BIN=${CXX:-c++}
command -v "$CC_BIN" >/dev/null 2>&1 || unavailable "no C compiler ($CC_BIN) to build llama-cpp-python $VERSION"
command -v "$CXX_BIN" >/dev/null 2>&1 || unavailable "no C++ compiler ($CXX_BIN) to build llama-cpp-python $VERSION"

NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if ! echo 'int main(void){return 0;}' | "$CC_BIN" $NO_AMX -x c -o /dev/null - 2>/dev/null; then
    NO_AMX=""   # a compiler or CPU without AMX options: nothing to turn off
fi
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_FLAGS='$NO_AMX' -DCMAKE_CXX_FLAGS='$NO_AMX'"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

if [ -n "${LINNET_CACHE_DIR:-}" ]; then ROOT=$LINNET_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then ROOT=$XDG_CACHE_HOME/linnet
else ROOT=$HOME/.cache/linnet; fi
KEY=$( { echo "$VERSION $CMAKE_ARGS"; "$CXX_BIN" --version | head -1; grep -m1 '^flags' /proc/cpuinfo 2>/dev/null; \
    "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
WHEEL_DIR="$ROOT/wheels/llama-cpp-python-$VERSION-$KEY"

if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "tools/llama_cpp_wheel.sh: building llama-cpp-python $VERSION (AMX off) into $WHEEL_DIR; this takes minutes" >&2
    mkdir -p "$ROOT/wheels" || unavailable "cannot create the wheel cache $ROOT/wheels"
    BUILD=$(mktemp -d "$ROOT/wheels/.build-XXXXXX")
    if "$PY" -m pip wheel --no-deps --no-binary llama-cpp-python -w "$BUILD" "llama-cpp-python==$VERSION" >"$BUILD/build.log" 2>&1 \
        && ls "$BUILD"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        mkdir -p "$WHEEL_DIR" && mv "$BUILD"/llama_cpp_python-*.whl "$WHEEL_DIR"/ && rm -rf "$BUILD"
    else
        tail -20 "$BUILD/build.log" >&2
        unavailable "building llama-cpp-python $VERSION failed (log: $BUILD/build.log)"
    fi
fi

"$PY" -m pip install --quiet "$WHEEL_DIR"/llama_cpp_python-*.whl \
    || unavailable "installing $WHEEL_DIR failed"
rm -f "$REASON_FILE"
echo "tools/llama_cpp_wheel.sh: llama-cpp-python $VERSION installed from $WHEEL_DIR" >&2
