"""Run-in-editor (code lenses, `linnet.run` in a worker process), `linnet/showIR`,
`linnet/showGenerated`, `linnet/presets`, and that the server itself never loads a framework."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
from pathlib import Path

import pytest
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_code_lenses_on_entry_functions(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    lenses = await client.text_document_code_lens_async(T.CodeLensParams(doc.id))
    compare = "Compare ▸ PyTorch · XLA · ONNX Runtime"
    assert [(doc.slice(lens.range), lens.command.title) for lens in lenses] == [
        ("forward", "Run ▸ PyTorch"),
        ("forward", "Run ▸ XLA"),
        ("forward", compare),
        ("step", "Run ▸ PyTorch"),
        ("step", "Run ▸ XLA"),
        ("step", compare),
        ("LlamaForCausalLM", "Verify"),
        ("LlamaForCausalLM", "Diff against transformers"),  # its preset names weights (`@weights`)
    ]
    assert lenses[-1].command.command == "linnet.diff" and lenses[-2].command.command == "linnet.verify"
    assert list(lenses[-1].command.arguments) == [{"uri": doc.uri, "preset": "smollm2_135m"}]
    assert lenses[0].range.start == doc.pos("entry fn forward", 9)
    (args,) = lenses[1].command.arguments
    assert lenses[1].command.command == "linnet.run"
    # runs use the preset hovers quote (here the first), so what runs is what the editor shows
    assert args == {"uri": doc.uri, "entry": "forward", "backend": "xla", "preset": "smollm2_135m"}
    assert lenses[5].command.command == "linnet.compare"
    (args,) = lenses[5].command.arguments
    backends = ["torch", "xla", "onnxruntime"]
    assert args == {"uri": doc.uri, "entry": "step", "backends": backends, "preset": "smollm2_135m"}
    doc.close()
    # a library file (no model) has none
    doc = await open_doc(client, WORKSPACE / "lib.linnet", "fn double(x: [N]) -> [N] {\n    x + x\n}\n")
    assert not await client.text_document_code_lens_async(T.CodeLensParams(doc.id))
    doc.close()


async def test_backends_request_serves_the_registry(client):
    """The editor's backend list is the registry's, with what each supports and whether it can run."""
    from linnet.runtimes.backends import BACKENDS

    listed = await client.protocol.send_request_async("linnet/backends", {})
    assert [b["name"] for b in listed] == list(BACKENDS)
    by_name = {b["name"]: b for b in listed}
    assert by_name["torch"]["label"] == "PyTorch" and by_name["torch"]["codeView"] == "torch"
    assert by_name["xla"]["codeView"] == "stablehlo" and by_name["torch-interpret"]["codeView"] is None
    assert by_name["onnxruntime"]["dtypes"] == ["f32", "f16", "bf16"]
    assert by_name["cuda-graphs"]["devices"] == ["cuda"] and not by_name["cuda-graphs"]["available"]
    assert "runs on cuda" in by_name["cuda-graphs"]["reason"]
    assert all(b["numerics"] == ["equivalent", "fast"] for b in listed)
    assert {b["name"] for b in listed if b["canTrain"]} == {name for name, b in BACKENDS.items() if b.can_train}
    assert by_name["torch"]["canTrain"] and by_name["jax"]["canTrain"] and not by_name["onnxruntime"]["canTrain"]
    assert by_name["torch"]["available"] == (importlib.util.find_spec("torch") is not None)


async def run(client, doc, entry, backend, preset=None) -> dict:
    args = {"uri": doc.uri, "entry": entry, "backend": backend, "preset": preset}
    return await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.run", [args]))


@pytest.mark.slow
async def test_run_entry_on_pytorch_and_xla_in_a_worker(client):
    # unsaved edits count: the worker runs the editor's text (here with a preset that exists
    # only in the buffer)
    text = (
        EXAMPLES / "mlp.linnet"
    ).read_text() + "\npreset wide = MlpConfig { in_features = 3, hidden_features = 5 }\n"
    doc = await open_doc(client, EXAMPLES / "mlp.linnet", text)
    before = len(client.messages)
    for backend in ("torch", "xla"):
        report = await run(client, doc, "forward", backend, "wide")
        assert report["entry"] == "forward" and report["backend"] == backend and report["preset"] == "wide"
        assert report["inputs"] == [{"name": "x", "shape": [1, 3], "dtype": "float32"}]
        (out,) = report["outputs"]
        assert out["shape"] == [1, 4] == out["checker_shape"]
        assert out["dtype"] == "float32" and out["min"] <= out["mean"] <= out["max"]
        assert report["disagreements"] == [] and report["time_ms"] > 0
        assert report["file"] == doc.uri.removeprefix("file://")  # the worker's copy is not shown
    shown = [m.message for m in client.messages[before:]]
    assert shown[0].startswith("forward on PyTorch under preset `wide`: [1, 4] float32 (mean ")
    assert shown[1].startswith("forward on XLA under preset `wide`: [1, 4] float32")
    assert any(reports and reports[-1].kind == "end" for reports in client.progress_reports.values())
    doc.close()


@pytest.mark.slow
async def test_compare_lens_shows_a_read_only_report_with_a_row_per_backend(client):
    """The "Compare" lens's command runs the editor's text (here with a preset only in the buffer)
    on PyTorch, XLA and ONNX Runtime and the reference in a worker, writes the report read-only and
    shows it with window/showDocument."""
    import os
    import stat

    for framework in ("torch", "jax", "onnxruntime"):
        pytest.importorskip(framework)
    wide = "\npreset wide = MlpConfig { in_features = 3, hidden_features = 5 }\n"
    text = (EXAMPLES / "mlp.linnet").read_text() + wide
    doc = await open_doc(client, EXAMPLES / "mlp.linnet", text)
    lenses = await client.text_document_code_lens_async(T.CodeLensParams(doc.id))
    (lens,) = [lens for lens in lenses if lens.command.command == "linnet.compare"]
    args = lens.command.arguments[0] | {"preset": "wide"}
    before = len(client.shown_documents)
    report = await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.compare", [args]))
    rows = {r["backend"]: r for r in report["backends"]}
    assert list(rows) == ["torch-interpret", "torch", "xla", "onnxruntime"]
    for row in rows.values():
        assert row["status"] == "ok" and row["outputs"][0]["shape"] == row["outputs"][0]["checker_shape"] == [1, 4]
    assert report["preset"] == "wide" and report["disagreements"] == [] and len(report["pairs"]) == 6
    assert all(p["max_abs_diff"] < 1e-6 for p in report["pairs"])
    (shown,) = client.shown_documents[before:]
    assert shown.uri == report["reportUri"] and shown.take_focus
    path = shown.uri.removeprefix("file://")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o444, "read-only on disk"
    markdown = Path(path).read_text()
    assert markdown.startswith("# `forward` compared across backends\n")
    assert "preset `wide`" in markdown and doc.uri.removeprefix("file://") in markdown
    for name in ("torch-interpret", "torch", "xla", "onnxruntime"):
        assert f"(`{name}`) | ok | [1, 4] float32 |" in markdown
    assert "None: every backend that ran agrees." in markdown
    doc.close()


async def test_run_reports_a_source_that_does_not_check(client):
    doc = await open_doc(client, WORKSPACE / "faults.linnet")
    with pytest.raises(JsonRpcException, match="has errors"):
        await run(client, doc, "forward", "torch")
    assert "L204" in client.messages[-1].message
    doc.close()


async def test_show_ir_and_generated_sources(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    ir = await client.protocol.send_request_async("linnet/showIR", {"uri": doc.uri, "preset": "tiny"})
    assert ir.startswith(f"# {doc.uri.removeprefix('file://')}: model Mlp, preset tiny, dtype f32")
    assert "entry forward(%x: f32[B, 8]) -> (f32[B, 2]) {" in ir
    torch_src = await client.protocol.send_request_async(
        "linnet/showGenerated", {"uri": doc.uri, "target": "torch", "preset": "tiny"}
    )
    ast.parse(torch_src)
    assert "import torch" in torch_src and "class Mlp(Module):" in torch_src and "def forward(self, x):" in torch_src
    jax_src = await client.protocol.send_request_async("linnet/showGenerated", {"uri": doc.uri, "target": "jax"})
    ast.parse(jax_src)
    assert "import jax" in jax_src
    with pytest.raises(JsonRpcException, match="unknown target"):
        await client.protocol.send_request_async("linnet/showGenerated", {"uri": doc.uri, "target": "tflite"})
    with pytest.raises(JsonRpcException, match="not open"):
        await client.protocol.send_request_async("linnet/showIR", {"uri": "file:///nowhere.linnet"})
    doc.close()


@pytest.mark.slow
async def test_show_stablehlo_and_onnx_from_a_worker(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    hlo = await client.protocol.send_request_async("linnet/showGenerated", {"uri": doc.uri, "target": "stablehlo"})
    assert "stablehlo" in hlo and "func.func public @main" in hlo
    graph = await client.protocol.send_request_async("linnet/showGenerated", {"uri": doc.uri, "target": "onnx"})
    assert "Mlp_forward (float[B,8] x" in graph and "Gelu" in graph  # preset `tiny`, the first
    doc.close()


async def test_presets_request_and_preset_picker(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    names = await client.protocol.send_request_async("linnet/presets", {"uri": doc.uri})
    assert names == ["smollm2_135m", "smollm2_1_7b_instruct", "tinyllama_1_1b", "llama_3_1_8b"]
    # no argument: the server asks (the test client picks the last action)
    chosen = await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.selectPreset"))
    assert chosen == "llama_3_1_8b"
    assert [a.title for a in client.message_requests[-1].actions] == names
    lenses = await client.text_document_code_lens_async(T.CodeLensParams(doc.id))
    assert lenses[0].command.arguments[0]["preset"] == "llama_3_1_8b"
    await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.selectPreset", [""]))
    doc.close()


def _mapped_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


async def test_the_server_process_loads_no_framework(client):
    """After showing generated PyTorch and JAX and running entries (in workers), the server's
    own process has mapped none of torch, jax or onnxruntime."""
    pid = client._server.pid
    if not Path(f"/proc/{pid}/maps").exists():
        pytest.skip("needs /proc")
    maps = _mapped_libraries(pid)
    for lib in ("libtorch", "jaxlib", "onnxruntime", "xla_extension"):
        assert lib not in maps, lib


async def test_bad_presets_and_entries_are_refused_clearly(client):
    doc = await open_doc(client, EXAMPLES / "mlp.linnet")
    with pytest.raises(JsonRpcException, match="declares no preset `tin` \\(presets: `tiny`\\)"):
        await client.protocol.send_request_async("linnet/showIR", {"uri": doc.uri, "preset": "tin"})
    for entry, why in ((5, "an entry is a function name"), ("--help", "an entry is a function name")):
        with pytest.raises(JsonRpcException, match=why):
            await run(client, doc, entry, "torch")
    with pytest.raises(JsonRpcException, match="no entry `nope` \\(entries: forward\\)"):
        await run(client, doc, "nope", "torch")
    assert client.messages[-1].message.startswith("linnet run: no entry `nope`")
    compare = {"uri": doc.uri, "entry": "forward", "backends": ["torch", "tpu"]}
    with pytest.raises(JsonRpcException, match="backends are a list of registry names \\(torch-interpret, "):
        await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.compare", [compare]))
    with pytest.raises(JsonRpcException, match="no entry `nope` \\(entries: forward\\)"):
        await client.workspace_execute_command_async(
            T.ExecuteCommandParams("linnet.compare", [compare | {"entry": "nope", "backends": None}])
        )
    before = len(client.messages)
    kept = await client.workspace_execute_command_async(T.ExecuteCommandParams("linnet.selectPreset", ["nope"]))
    assert kept is None and "no open file declares preset `nope`" in client.messages[before].message
    doc.close()


@pytest.mark.slow
async def test_cancelling_a_runs_progress_stops_its_worker(client):
    doc = await open_doc(client, EXAMPLES / "llama.linnet")
    tokens = set(client.progress_reports)
    task = asyncio.ensure_future(run(client, doc, "forward", "torch"))
    for _ in range(1000):
        new = [t for t in set(client.progress_reports) - tokens if client.progress_reports[t]]
        if new:
            break
        await asyncio.sleep(0.01)
    (token,) = new  # the run has begun
    assert client.progress_reports[token][0].cancellable
    for _ in range(500):
        if _workers(client._server.pid):
            break
        await asyncio.sleep(0.01)
    assert _workers(client._server.pid), "the worker is running"
    client.protocol.notify(T.WINDOW_WORK_DONE_PROGRESS_CANCEL, T.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException, match="cancelled"):
        await asyncio.wait_for(task, 20)
    assert _workers(client._server.pid) == [], "the worker is killed, not left running"
    doc.close()


def _workers(pid: int) -> list[str]:
    """Command lines of `linnet run` processes whose parent is `pid` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == pid and " run " in cmdline:
            out.append(cmdline)
    return out


IMPORTED = "fn head(x: [B, N]) -> [B, N] {\n    x\n}\n"
IMPORTER = """from "head.linnet" import head

config C {
    d: int = 4
}

preset p = C { d = 4 }

model M(c: C) {
    w: Linear(c.d, c.d)

    entry fn forward(x: [B, c.d]) -> [B, c.d] {
        head(w(x))
    }
}
"""
# an edit of the imported function that is not saved: what the IR and a run show must follow it
UNSAVED = IMPORTED.replace("    x\n", "    x * 2.0\n")


async def test_the_ir_view_reads_the_unsaved_text_of_an_imported_file(client, tmp_path):
    """The IR view lowers the files the document imports as the editor holds them, as diagnostics and the cost
    hover do (before: as saved on disk)."""
    (tmp_path / "head.linnet").write_text(IMPORTED, encoding="utf-8")
    (tmp_path / "model.linnet").write_text(IMPORTER, encoding="utf-8")
    lib = await open_doc(client, tmp_path / "head.linnet", UNSAVED)
    doc = await open_doc(client, tmp_path / "model.linnet")
    ir = await client.protocol.send_request_async("linnet/showIR", {"uri": doc.uri})
    assert " mul(" in ir
    torch_src = await client.protocol.send_request_async("linnet/showGenerated", {"uri": doc.uri, "target": "torch"})
    assert "* 2.0" in torch_src
    lib.close()
    ir = await client.protocol.send_request_async("linnet/showIR", {"uri": doc.uri})
    assert " mul(" not in ir  # closed unsaved: the file on disk again
    doc.close()


async def test_a_worker_reads_the_unsaved_text_of_an_imported_file(tmp_path):
    """A worker (`linnet ir` here: no framework needed) reads the imported files from the buffers it is given,
    the document's own text from its copy; without buffers, from disk."""
    from linnet.lsp import views

    (tmp_path / "head.linnet").write_text(IMPORTED, encoding="utf-8")
    path = str(tmp_path / "model.linnet")
    buffers = {str(tmp_path / "head.linnet"): UNSAVED, path: "not this: the document's text is the copy's"}
    given = await views.run_worker(None, ["ir", "{file}"], path, IMPORTER, 120, buffers)
    assert given.returncode == 0, given.stderr
    assert " mul(" in given.stdout and given.stdout.startswith(f"# {path}:")
    on_disk = await views.run_worker(None, ["ir", "{file}"], path, IMPORTER, 120)
    assert on_disk.returncode == 0, on_disk.stderr
    assert " mul(" not in on_disk.stdout


async def test_a_run_reads_the_unsaved_text_of_an_imported_file(client, tmp_path):
    """`linnet.run` checks the files the document imports as the editor holds them: an unsaved edit that breaks
    the imported function is what the worker reports (before: it ran the file as saved)."""
    (tmp_path / "head.linnet").write_text(IMPORTED, encoding="utf-8")
    (tmp_path / "model.linnet").write_text(IMPORTER, encoding="utf-8")
    lib = await open_doc(client, tmp_path / "head.linnet", IMPORTED.replace("    x\n", "    x[:, :1]\n"))
    doc = await open_doc(client, tmp_path / "model.linnet")
    with pytest.raises(JsonRpcException, match=r"head\.linnet:2:5: error\[L204\]: `head` returns \[B, 1\]"):
        await run(client, doc, "forward", "torch")
    lib.close()
    doc.close()
