"""`linnet export triton`: a Triton Inference Server model repository that serves a Linnet model.

    from linnet.runtimes.export.triton import export_triton
    export_triton("examples/llama.linnet", "models", max_batch=8, instances=2)
    # tritonserver --model-repository=models ...   (docs/triton.md: the command, with the wheel's paths)

What is written (Triton's Python backend; triton-inference-server/python_backend README):

    REPO/<name>/config.pbtxt      backend "python", max_batch_size 0, a decoupled model_transaction_policy (0..N
                                  responses per request: streaming), the inputs and outputs below, instance_group
                                  [{count: N, kind: KIND_CPU}], and `parameters` saying what to load (below)
    REPO/<name>/1/model.py        `TritonPythonModel` (linnet/runtimes/serve/triton_entry.py, copied): puts Linnet's
                                  Python environment on sys.path, then hands over to `linnet.runtimes.serve.triton`

Inputs (the names of Triton's vLLM backend, so its clients and `genai-perf` work unchanged): `text_input`
(TYPE_STRING [1], the prompt as text, encoded as `linnet generate --prompt` encodes it); optional `max_tokens`
(INT32), `temperature`, `top_p` (FP32), `top_k` (INT32), `seed` (INT64), `stop` (TYPE_STRING [-1], stop strings),
`ignore_eos` (BOOL), `stream` (BOOL: one response per piece of new text; default false: one response with the
whole text). Output `text_output` (TYPE_STRING [-1]), the new text only (not the prompt).

`parameters` (strings; edit them in config.pbtxt to move the repository): `source` (the .linnet file, as an absolute
path: a source may import other files by relative paths, so it is named where it is rather than copied), `weights`
(an HF folder or GGUF file, as an absolute path, or an embedded id; empty: the source's default weights),
`preset`, `backend` (a name of `linnet backends`), `dtype`, `max_batch` (cache rows per instance),
`max_positions`, `python_path` (folders put first on the stub's sys.path, ':'-separated: the numpy < 2 folder of
tools/tritonserver.sh) and `site_packages` (the environment with Linnet installed, added with `site.addsitedir`;
the Python backend's stub ignores PYTHONPATH).

Everything is written into a temporary folder beside the target, which is renamed to the target at the end: a
failure leaves nothing behind. Imports no framework (the server loads the model).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from linnet.errors import ExportError
from linnet.runtimes.backends.caches import cache_root
from linnet.runtimes.export.hf import check_target
from linnet.runtimes.serve.triton import INPUTS

__all__ = ["TritonServer", "config_pbtxt", "export_triton", "find_tritonserver", "PYTRITON_VERSION"]

# The nvidia-pytriton wheel tools/tritonserver.sh unpacks (Triton 2.51); its folder names are the script's.
PYTRITON_VERSION = "0.7.0"
ENTRY = Path(__file__).parents[1] / "serve" / "triton_entry.py"  # a file to copy, not imported here
# Where tools/tritonserver.sh installs (default: the Linnet cache's tritonserver/).
ENV_DIR = "LINNET_TRITONSERVER_DIR"


@dataclass(frozen=True)
class TritonServer:
    """A Triton Inference Server installed by tools/tritonserver.sh under `root` (the cache's tritonserver/)."""

    root: Path

    @property
    def wheel(self) -> Path:
        return self.root / f"pytriton-{PYTRITON_VERSION}"

    @property
    def binary(self) -> Path:
        """The `tritonserver` executable."""
        return self.wheel / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def backend_dir(self) -> Path:
        """`--backend-directory`: holds python/libtriton_python.so and the 3.11 stub beside it."""
        return self.wheel / "pytriton" / "tritonserver" / "backends"

    @property
    def lib_dir(self) -> Path:
        """The server's shared libraries (`LD_LIBRARY_PATH`)."""
        return self.wheel / "nvidia_pytriton.libs"

    @property
    def stub_numpy(self) -> Path:
        """numpy 1.26, first on the stub's sys.path (docs/triton.md: why the stub needs numpy < 2)."""
        return self.root / "stub-numpy"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (default os.environ) with the server's libraries first on `LD_LIBRARY_PATH`."""
        env = dict(os.environ if base is None else base)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(self.lib_dir), env.get("LD_LIBRARY_PATH")) if p)
        return env

    def command(
        self, repository: str | os.PathLike[str], *, http_port: int = 8000, grpc_port: int = 8001,
        metrics_port: int = 8002, host: str = "127.0.0.1",
    ) -> list[str]:  # fmt: skip
        """The argv that serves `repository` over HTTP and gRPC on `host` (loopback by default; Triton's own
        default is every interface), with metrics on `metrics_port`. Run it with `env()`."""
        return [
            str(self.binary),
            f"--model-repository={repository}",
            f"--backend-directory={self.backend_dir}",
            f"--http-address={host}",
            f"--http-port={http_port}",
            f"--grpc-address={host}",
            f"--grpc-port={grpc_port}",
            f"--metrics-address={host}",
            f"--metrics-port={metrics_port}",
        ]


def find_tritonserver() -> tuple[TritonServer | None, str]:
    """(the installation of tools/tritonserver.sh, "") or (None, why there is none: the script's reason, or
    that it has not run). It is in `$LINNET_TRITONSERVER_DIR`, else in the Linnet cache's tritonserver/."""
    if os.environ.get(ENV_DIR):
        server = TritonServer(Path(os.environ[ENV_DIR]).expanduser())
    elif (root := cache_root()) is not None:
        server = TritonServer(root / "tritonserver")
    else:
        return None, f"the Linnet cache is off (LINNET_NO_CACHE), where tools/tritonserver.sh installs; set {ENV_DIR}"
    reason_file = server.root / "unavailable.txt"
    if reason_file.is_file():
        return None, reason_file.read_text(encoding="utf-8").strip()
    stub = server.backend_dir / "python" / "triton_python_backend_stub"
    if not (server.binary.is_file() and stub.is_file() and (server.stub_numpy / "numpy").is_dir()):
        return None, f"no Triton Inference Server in {server.root}: run `make tritonserver` (tools/tritonserver.sh)"
    return server, ""


def export_triton(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    preset: str | None = None,
    backend: str = "torch",
    dtype: str = "f32",
    max_batch: int = 8,
    max_positions: int = 768,
    instances: int = 1,
    name: str | None = None,
    python_path: list[str] | None = None,
    site_packages: str | None = None,
) -> list[Path]:
    """Write a Triton model repository `out_dir` whose one model, `name` (default: the weights' or the source's
    file stem), serves `source` with `weights` on `backend` through Linnet's serving engine: `instances` model
    instances (KIND_CPU; each a process with its own engine of `max_batch` cache rows of `max_positions` positions).
    `python_path` (folders first on the stub's sys.path) defaults to the numpy < 2 folder of tools/tritonserver.sh
    (docs/triton.md: why), `site_packages` to this interpreter's (where Linnet is installed). Returns the files
    written.

    The source is checked (it must have a `step` entry) but no weights are read: the server loads them, and says
    in its log (and the model's load status) what is wrong with them. Raises ExportError for an `out_dir` that
    exists and is not empty, a backend that is not in the registry, a count below 1, or no `python_path` given
    and tools/tritonserver.sh's install missing; ProgramError for a source
    with errors; OSError for an unreadable source. Nothing is left on disk after an error."""
    from linnet.ir import build
    from linnet.runtimes.backends import BACKENDS

    target = check_target(out_dir)
    if backend not in BACKENDS:
        raise ExportError(f"unknown backend {backend!r}; `linnet backends` lists them: {', '.join(BACKENDS)}")
    for what, value in (("max_batch", max_batch), ("max_positions", max_positions), ("instances", instances)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (2 if what == "max_positions" else 1):
            raise ExportError(f"{what} must be an integer >= {2 if what == 'max_positions' else 1}, got {value!r}")
    program = build(source, preset=preset, dtype=dtype, max_batch=1, max_positions=max_positions)
    if "step" not in program.entries:
        raise ExportError(f"{source}: serving needs a decoder with `entry fn step` (has {', '.join(program.entries)})")
    if weights is not None and Path(weights).exists():
        weights = str(Path(weights).resolve())
    name = _model_name(name, weights, source)
    if python_path is None:
        server, why = find_tritonserver()
        if server is None:
            raise ExportError(
                f"no numpy < 2 folder for Triton's Python backend stub ({why}); give python_path (--python-path), "
                "'' where the server's stub works with numpy 2"
            )
        python_path = [str(server.stub_numpy)]
    parameters = {
        "source": str(Path(source).resolve()),
        "weights": "" if weights is None else str(weights),
        "preset": preset or "",
        "backend": backend,
        "dtype": dtype,
        "max_batch": str(max_batch),
        "max_positions": str(max_positions),
        "python_path": os.pathsep.join(python_path),
        "site_packages": site_packages or sysconfig.get_paths()["purelib"],
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the repository from a server running as another user
        version = tmp / name / "1"
        version.mkdir(parents=True)
        (tmp / name / "config.pbtxt").write_text(config_pbtxt(name, instances, parameters), encoding="utf-8")
        shutil.copyfile(ENTRY, version / "model.py")
        if target.exists():
            target.rmdir()  # empty (check_target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [target / name / "config.pbtxt", target / name / "1" / "model.py"]


def config_pbtxt(name: str, instances: int, parameters: dict[str, str]) -> str:
    """The model's config.pbtxt (protobuf text format of Triton's ModelConfig): a decoupled Python-backend model
    with `INPUTS`, the output `text_output` and `instances` CPU instances; `parameters` as string values."""

    def quoted(text: str) -> str:  # protobuf text strings take C escapes; JSON's \" \\ \n are among them
        return json.dumps(text, ensure_ascii=False)

    inputs = ",\n".join(
        f"  {{ name: {quoted(n)} data_type: {t} dims: {d}{'' if n == 'text_input' else ' optional: true'} }}"
        for n, t, d in INPUTS
    )
    params = "\n".join(
        f"parameters: {{ key: {quoted(k)} value: {{ string_value: {quoted(v)} }} }}" for k, v in parameters.items()
    )
    return (
        f"# Written by `linnet export triton` (docs/triton.md). Served by Triton's Python backend: 1/model.py.\n"
        f"name: {quoted(name)}\n"
        'backend: "python"\n'
        "max_batch_size: 0  # the engine batches (continuous batching), not Triton's dynamic batcher\n"
        "model_transaction_policy { decoupled: true }  # 0..N responses per request: streaming\n"
        f"input [\n{inputs}\n]\n"
        'output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]  # KIND_GPU on a GPU node\n"
        f"{params}\n"
    )


def _model_name(name: str | None, weights: str | os.PathLike[str] | None, source: str | os.PathLike[str]) -> str:
    """`name`, or the weights' (else the source's) file stem with characters other than letters, digits, `_`,
    `-` and `.` replaced by `_` (Triton's model name is the folder's, and a URL path segment)."""
    if name is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (".", ".."):
            raise ExportError(f"model name must be letters, digits, '_', '-' or '.', got {name!r}")
        return name
    stem = Path(str(weights)).stem if weights else Path(source).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem).strip(".") or "model"
