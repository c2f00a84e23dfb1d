"""`linnet export triton`: the model repository, and the real Triton Inference Server serving it.

- the repository: config.pbtxt parsed by Triton's own ModelConfig protobuf (tritonclient's `model_config_pb2`);
  refusals leave nothing behind; the model.py reads back the parameters config.pbtxt holds.
- the server (marked tritonserver and slow; they skip, saying why, without tools/tritonserver.sh's install): the
  repository of the embedded SmolLM2 with two model instances, served on free loopback ports by the
  nvidia-pytriton wheel's `tritonserver`, queried over HTTP (the generate extension: `/v2/models/<m>/generate`
  and `generate_stream`, with `requests`: tritonclient's HTTP client has no generate call; health and config with
  tritonclient) and gRPC streaming (tritonclient). The reference is Linnet's own `Generator`, which `linnet
  generate` runs: greedy text must be equal.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from linnet.errors import ExportError
from linnet.runtimes.export.triton import config_pbtxt, export_triton, find_tritonserver
from tests.conftest import EXAMPLES, ROOT

LLAMA = EXAMPLES / "llama.linnet"
MAX_POSITIONS = 256
NEW_TOKENS = 12
SEED = 7
# Looked up at import, before the suite points LINNET_CACHE_DIR at its private folder (tests/conftest.py): the
# server is a tool installed once per machine in the user's cache, like tools/llama_cpp_wheel.sh's wheel.
INSTALLED, WHY_NOT = find_tritonserver()
# The repository's model drives the serving engine, linnet.runtimes.serve (branch serve-engine until merged).
ENGINE = "linnet.runtimes.serve"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", "1, 2, 3, 4,")


def _model_config(path: Path):
    """config.pbtxt parsed by Triton's ModelConfig protobuf, and that protobuf's module."""
    text_format = pytest.importorskip("google.protobuf.text_format")
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    return text_format.Parse(path.read_text(encoding="utf-8"), pb2.ModelConfig()), pb2


def test_repository_is_a_decoupled_python_model(tmp_path):
    written = export_triton(
        LLAMA, tmp_path / "repo", max_batch=4, max_positions=128, instances=3, name="smol", python_path=["/np1"]
    )
    model = tmp_path / "repo" / "smol"
    assert written == [model / "config.pbtxt", model / "1" / "model.py"]
    config, pb2 = _model_config(model / "config.pbtxt")
    assert (config.name, config.backend, config.max_batch_size) == ("smol", "python", 0)
    assert config.model_transaction_policy.decoupled
    inputs = {i.name: i for i in config.input}
    assert not inputs["text_input"].optional and inputs["text_input"].data_type == pb2.TYPE_STRING
    assert all(i.optional for n, i in inputs.items() if n != "text_input")
    assert [o.name for o in config.output] == ["text_output"]
    assert [(g.count, g.kind) for g in config.instance_group] == [(3, pb2.ModelInstanceGroup.KIND_CPU)]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert (params["max_batch"], params["max_positions"], params["backend"]) == ("4", "128", "torch")
    assert (params["python_path"], params["source"], params["weights"]) == ("/np1", str(LLAMA.resolve()), "")


def test_source_and_weights_are_named_by_absolute_paths(tmp_path, monkeypatch):
    """A source that imports another file by a relative path is named where it is (a copy would lose the import);
    a relative weights path becomes absolute, an embedded id stays an id."""
    split = ROOT / "tests" / "fixtures" / "imports" / "causal_lm.linnet"
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    export_triton(split, "repo", weights="ckpt", python_path=[])
    config, _ = _model_config(tmp_path / "repo" / "ckpt" / "config.pbtxt")
    assert config.parameters["source"].string_value == str(split.resolve())
    assert config.parameters["weights"].string_value == str((tmp_path / "ckpt").resolve())
    export_triton(LLAMA, "other", weights="smollm2-135m-instruct", python_path=[])
    config, _ = _model_config(tmp_path / "other" / "smollm2-135m-instruct" / "config.pbtxt")
    assert config.parameters["weights"].string_value == "smollm2-135m-instruct"


def test_model_py_reads_the_parameters_config_pbtxt_holds():
    from linnet.runtimes.serve import triton_entry

    odd = 'C:\\dir with "quotes"/é'
    text = config_pbtxt("m", 1, {"python_path": "/a:/b", "site_packages": odd})
    assert triton_entry._parameter(text, "python_path") == "/a:/b"
    assert triton_entry._parameter(text, "site_packages") == odd
    assert triton_entry._parameter(text, "missing") == ""


def test_refusals_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("LINNET_TRITONSERVER_DIR", raising=False)
    monkeypatch.setenv("LINNET_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ExportError, match="no numpy < 2 folder for Triton's Python backend stub"):
        export_triton(LLAMA, tmp_path / "d")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    with pytest.raises(ExportError, match="not an empty folder"):
        export_triton(LLAMA, full, python_path=[])
    assert [p.name for p in full.iterdir()] == ["x"]
    with pytest.raises(ExportError, match="unknown backend 'tensorrt'"):
        export_triton(LLAMA, tmp_path / "a", backend="tensorrt", python_path=[])
    with pytest.raises(ExportError, match="serving needs a decoder with `entry fn step`"):
        export_triton(EXAMPLES / "bert.linnet", tmp_path / "b", python_path=[])
    with pytest.raises(ExportError, match="instances must be an integer >= 1"):
        export_triton(LLAMA, tmp_path / "c", instances=0, python_path=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # (the cache folder was never made)


def test_cli_exit_codes(tmp_path, capsys):
    from linnet.cli import main

    repo = ["-o", str(tmp_path / "repo"), "--python-path", "/np1"]
    assert main(["export", "triton", str(LLAMA), *repo, "--name", "smol", "--instances", "2"]) == 0
    config, _ = _model_config(tmp_path / "repo" / "smol" / "config.pbtxt")
    assert config.instance_group[0].count == 2 and config.parameters["python_path"].string_value == "/np1"
    assert main(["export", "triton", str(LLAMA), *repo]) == 1
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert main(["export", "triton", str(tmp_path / "missing.linnet"), "-o", str(tmp_path / "other")]) == 2
    assert not (tmp_path / "other").exists()


# ---- the real server ---------------------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The embedded SmolLM2's repository (two instances of two cache rows) served on loopback: yields
    (http url, grpc url, model name, server process)."""
    installed = INSTALLED
    if installed is None:
        pytest.skip(WHY_NOT)
    pytest.importorskip(ENGINE)
    pytest.importorskip("tritonclient.grpc")
    tmp = tmp_path_factory.mktemp("triton")
    export_triton(
        LLAMA, tmp / "repo", max_batch=2, max_positions=MAX_POSITIONS, instances=2, name="smol",
        python_path=[str(installed.stub_numpy)],
    )  # fmt: skip
    proc, http_port, grpc_port, log = _start(installed, tmp)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    try:
        deadline = time.monotonic() + 300
        while not _ready(client, "smol"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tritonserver did not get ready:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", "smol", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(installed, folder: Path):
    """tritonserver serving folder/repo on free loopback ports: (process, http port, grpc port, log path)."""
    http_port, grpc_port, metrics_port = _free_ports(3)
    log = folder / "tritonserver.log"
    cmd = installed.command(folder / "repo", http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    cmd.append("--exit-timeout-secs=5")  # the stubs take 5-30 s to exit after finalize; the test needs no wait
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=installed.env(), stdout=out, stderr=subprocess.STDOUT)
    return proc, http_port, grpc_port, log


def _ready(client, model: str) -> bool:
    try:
        return client.is_server_ready() and client.is_model_ready(model)
    except Exception:  # refused while it starts
        return False


@pytest.fixture(scope="module")
def reference():
    """prompt -> the text Linnet's Generator (what `linnet generate --prompt P --max-new-tokens 12` runs) gives
    greedily, on PyTorch with the source's default weights (the embedded SmolLM2); "seeded" -> the text of the
    third prompt at temperature 0.8, top_p 0.9, seed SEED."""
    pytest.importorskip("torch")
    import linnet.torch
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    model = linnet.torch.load(LLAMA, max_positions=MAX_POSITIONS, progress=False)
    tok = model.tokenizer()
    gen = Generator(model.step_model(), tok)
    texts = {p: "".join(gen.stream_text(tok.encode(p), SamplingParams(max_new_tokens=NEW_TOKENS))) for p in PROMPTS}
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=SEED, max_new_tokens=NEW_TOKENS)
    texts["seeded"] = "".join(gen.stream_text(tok.encode(PROMPTS[2]), seeded))
    return texts


def _generate(url: str, model: str, body: dict, stream: bool = False):
    import requests

    path = "generate_stream" if stream else "generate"
    return requests.post(f"{url}/v2/models/{model}/{path}", json=body, timeout=120, stream=stream)


def _sse_texts(response) -> list[str]:
    events = [json.loads(line[len(b"data: ") :]) for line in response.iter_lines() if line.startswith(b"data: ")]
    assert all("error" not in e for e in events), events
    return [e["text_output"] for e in events]


@pytest.mark.tritonserver
@pytest.mark.slow
def test_http_generate_and_generate_stream_give_linnets_text(server, reference):
    url, _, model, _ = server
    prompt = PROMPTS[0]
    whole = _generate(url, model, {"text_input": prompt, "max_tokens": NEW_TOKENS})
    assert whole.status_code == 200, whole.text
    assert whole.json()["text_output"] == reference[prompt]
    streamed = _sse_texts(_generate(url, model, {"text_input": prompt, "max_tokens": NEW_TOKENS, "stream": True}, True))
    assert len(streamed) > 1 and "".join(streamed) == reference[prompt]
    # a stop string (never emitted), and seeded sampling: the Generator's tokens for that seed
    stop = reference[prompt].split()[1]
    cut = _generate(url, model, {"text_input": prompt, "max_tokens": NEW_TOKENS, "stop": [stop, "never seen"]})
    assert cut.json()["text_output"] == reference[prompt][: reference[prompt].index(stop)]
    body = {"text_input": PROMPTS[2], "max_tokens": NEW_TOKENS, "temperature": 0.8, "top_p": 0.9, "seed": SEED}
    assert _generate(url, model, body).json()["text_output"] == reference["seeded"]


@pytest.mark.tritonserver
@pytest.mark.slow
def test_grpc_streams_concurrent_requests_over_two_instances(server, reference):
    """Four streams at once (two instances of two rows): each gets exactly its solo greedy text."""
    import tritonclient.grpc as grpcclient

    psutil = pytest.importorskip("psutil")
    _, grpc_url, model, proc = server
    config = grpcclient.InferenceServerClient(grpc_url).get_model_config(model, as_json=True)["config"]
    assert config["instance_group"][0]["count"] == 2
    stubs = [p for p in psutil.Process(proc.pid).children() if p.name().startswith("triton_python")]
    assert len(stubs) == 2  # one stub process, one engine, per instance
    texts: dict[str, list[str]] = {p: [] for p in PROMPTS}
    done: dict[str, threading.Event] = {p: threading.Event() for p in PROMPTS}
    errors: list[str] = []
    clients = []

    def run(prompt: str) -> None:
        def on_response(result, error):
            if error is not None:
                errors.append(str(error))
                done[prompt].set()
                return
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                done[prompt].set()
            if result.as_numpy("text_output") is not None:
                texts[prompt].extend(t.decode("utf-8") for t in result.as_numpy("text_output"))

        client = grpcclient.InferenceServerClient(grpc_url)
        clients.append(client)
        client.start_stream(callback=on_response)
        inputs = [
            _grpc_input(grpcclient, "text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
            _grpc_input(grpcclient, "max_tokens", np.array([NEW_TOKENS], dtype=np.int32), "INT32"),
            _grpc_input(grpcclient, "stream", np.array([True]), "BOOL"),
        ]
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)

    for prompt in PROMPTS:
        run(prompt)
    try:
        for prompt in PROMPTS:
            assert done[prompt].wait(timeout=180), f"no final response for {prompt!r}"
    finally:
        for client in clients:
            client.stop_stream()
    assert errors == []
    for prompt in PROMPTS:
        assert "".join(texts[prompt]) == reference[prompt], prompt
        assert len(texts[prompt]) > 1  # streamed, a response per piece


def _grpc_input(grpcclient, name: str, value: np.ndarray, datatype: str):
    tensor = grpcclient.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


@pytest.mark.tritonserver
@pytest.mark.slow
def test_bad_requests_are_answered_and_the_server_keeps_serving(server, reference):
    url, _, model, _ = server
    cases = {
        "temperature must be a number >= 0": {"text_input": "Hi", "temperature": -1.0},
        "more than the 256 positions": {"text_input": "Hi", "max_tokens": 1000},
        "the prompt is empty": {"text_input": ""},
        "unknown parameter max_new_tokens": {"text_input": "Hi", "max_new_tokens": 3},
        "input text_input is required": {"max_tokens": 3},  # was a TypeError and its Python traceback
    }
    for expected, body in cases.items():
        answer = _generate(url, model, body)
        assert answer.status_code == 400, (body, answer.text)
        assert expected in answer.json()["error"], answer.text
    prompt = PROMPTS[1]
    assert (
        _generate(url, model, {"text_input": prompt, "max_tokens": NEW_TOKENS}).json()["text_output"]
        == reference[prompt]
    )


@pytest.mark.tritonserver
@pytest.mark.slow
def test_models_that_cannot_load_say_why(tmp_path):
    """Two models that cannot load, in one repository: one exported without the numpy < 2 folder, whose stub would
    mangle arrays (docs/triton.md), refuses to load saying so rather than crash on the first request; one whose
    weights are missing names them. The server logs both and exits (--exit-on-error is on by default)."""
    if INSTALLED is None:
        pytest.skip(WHY_NOT)
    pytest.importorskip(ENGINE)
    export_triton(LLAMA, tmp_path / "repo", max_positions=MAX_POSITIONS, name="numpy2", python_path=[])
    stub_numpy = [str(INSTALLED.stub_numpy)]
    export_triton(LLAMA, tmp_path / "other", weights=tmp_path / "missing", name="noweights", python_path=stub_numpy)
    (tmp_path / "other" / "noweights").rename(tmp_path / "repo" / "noweights")
    proc, _, _, log = _start(INSTALLED, tmp_path)
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode != 0
    assert "this Triton Python backend stub mangles numpy 2." in text, text[-3000:]
    assert "[1, 2, 3] came back [1, 1, 1]" in text
    assert f"linnet: cannot load {LLAMA.resolve()} with weights {tmp_path / 'missing'}" in text, text[-3000:]
