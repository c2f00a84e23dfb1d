"""Ordinary mistakes end in one located line on stderr and exit 1 or 2, never a traceback: a safetensors
header whose dtype does not fit its data, an integer tensor where a parameter is, a prompt that is not UTF-8
(the device checks are in test_backends.py, sizes for `linnet run` in test_run_dims.py)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, installed, write_mlp_checkpoint

MLP = "examples/mlp.linnet"  # the `tiny` preset: fc1 [32, 8], fc2 [2, 32]


def linnet(*args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linnet", *args], cwd=ROOT, capture_output=True, text=True)


def one_line(r: subprocess.CompletedProcess, status: int) -> str:
    """The error line of a refused command (the last on stderr; notes may come before it), checked: the exit
    status, no traceback, nothing on stdout."""
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    return r.stderr.strip().splitlines()[-1]


def mlp_with_header_dtype(folder: Path, dtype: str) -> Path:
    """examples/mlp.linnet's weights in f32, then `fc1.weight`'s header dtype rewritten to `dtype` (the data and
    data_offsets unchanged), as a corrupt or hand-edited file would have it."""
    file = write_mlp_checkpoint(folder)
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["fc1.weight"]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(text) == n
    file.write_bytes(data[:8] + text + data[8 + n :])
    return file


BACKENDS = [
    pytest.param(backend, marks=pytest.mark.skipif(not installed(backend), reason=f"needs {backend}"))
    for backend in ("torch", "jax", "onnxruntime")
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_f16_header_over_f32_data_names_tensor_dtype_shape_and_bytes(tmp_path, backend):
    file = mlp_with_header_dtype(tmp_path / "mlp", "F16")
    line = one_line(linnet("run", MLP, "--weights", str(file.parent), "--backend", backend), 1)
    assert line == (
        f"linnet run: {file}: tensor 'fc1.weight' is declared F16 [32, 8], which takes 512 bytes, "
        "but its data_offsets hold 1024 bytes"
    )


def test_f16_header_over_f32_data_in_onnx_export(tmp_path):
    pytest.importorskip("onnx")
    file = mlp_with_header_dtype(tmp_path / "mlp", "F16")
    r = linnet("onnx", MLP, "--weights", str(file.parent), "-o", str(tmp_path / "mlp.onnx"))
    assert one_line(r, 1).startswith(f"linnet onnx: {file}: tensor 'fc1.weight' is declared F16 [32, 8]")
    assert not (tmp_path / "mlp.onnx").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_header_where_a_parameter_is_says_the_dtype(tmp_path, backend):
    """I32 over F32 data has the right size, so the file reads; the tensor was taken for an integer buffer and
    reported as "parameter missing"."""
    file = mlp_with_header_dtype(tmp_path / "mlp", "I32")
    line = one_line(linnet("run", MLP, "--weights", str(file.parent), "--backend", backend), 1)
    assert line == (
        f"linnet run: error[L504]: `fc1.weight` in {file.parent} is i32 [32, 8], but {MLP} declares `fc1.weight` "
        "as a parameter, which takes floating point (f32, f16, bf16)"
    )


def test_prompt_that_is_not_utf8_is_a_usage_error():
    """A byte that is not UTF-8 reaches Python as a lone surrogate; `tokenizers` raised
    `TypeError: TextInputSequence must be str`. Refused before anything loads."""
    r = linnet("generate", "examples/llama.linnet", "--prompt", b"caf\xe9 au lait", "--max-new-tokens", "1")
    assert one_line(r, 2) == (
        "linnet generate: --prompt is not valid UTF-8: byte 0xe9 at byte 3 of b'caf\\xe9 au lait'"
    )


def test_tokenizer_refuses_text_that_is_not_unicode():
    from linnet.errors import RunError
    from linnet.runtimes.formats.checkpoints import open_checkpoint

    with open_checkpoint("smollm2-135m-instruct") as ckpt:
        tok = ckpt.tokenizer()
        assert tok.encode("café") == tok.encode("caf\u00e9")
        with pytest.raises(RunError, match=r"not valid Unicode: '\\udce9' at character 3"):
            tok.encode("caf\udce9")
        with pytest.raises(RunError, match="must be a str, got bytes"):
            tok.encode(b"cafe")


def test_a_cache_too_big_for_memory_is_refused_before_allocating(tmp_path):
    """With a checkpoint, `--max-positions 10**9` asked the framework for a 119 GiB KV cache and died in its
    allocator with a traceback (or was killed); now it is refused against the memory available."""
    from tests.runtimes.test_corrupt_files import write_hf_folder

    folder = write_hf_folder(tmp_path / "tiny")
    step = ("run", "examples/llama.linnet", "--weights", str(folder), "--entry", "step")
    r = linnet(*step, "--max-positions", "1000000000")
    line = one_line(r, 1)
    assert line.startswith(
        "linnet run: the state (KV cache) of LlamaForCausalLM for max_batch 1 and max_positions 1000000000 needs "
        "119.2 GiB"
    ) and line.endswith("available: lower --max-positions or --max-batch")


@pytest.mark.parametrize(
    "args, message",
    [
        (("ir", MLP, "--config", "in_features"), "linnet ir: --config takes key=value, got 'in_features'"),
        (("onnx", MLP), "linnet onnx: give -o OUT (the .onnx file) or --text"),
        # a cache of no rows or positions: exit 1 ("max_batch and max_positions are at least 1") as a load failure
        *(
            ((command, MLP, flag, "0"), f"linnet {command}: error: argument {flag}: takes an integer >= 1, got '0'")
            for command in ("run", "generate", "serve")
            for flag in ("--max-batch", "--max-positions")
        ),
    ],
)
def test_option_values_a_command_cannot_take_are_usage_errors(args, message):
    """Exit 2, as argparse's own usage errors (they were exit 1, like a model that fails to load)."""
    assert one_line(linnet(*args), 2) == message


def test_a_chat_template_with_a_syntax_error_names_the_file_and_the_template_line(tmp_path):
    """A GGUF whose `tokenizer.chat_template` does not parse: `--chat` ended in a traceback from
    linnet/runtimes/inputs/chat.py (`ValueError: chat template error: expected token 'end of statement block'`)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from tests.runtimes.gguf_writing import write_llama_gguf

    tokens = [chr(c) for c in range(ord("a"), ord("a") + 15)] + ["ab"]
    config = transformers.LlamaConfig(
        vocab_size=len(tokens), hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    torch.manual_seed(0)
    path = tmp_path / "m.gguf"
    template = "{% for m in messages %}\n{{ m.content }}{% endfor %"
    extra = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.chat_template": template,
    }
    write_llama_gguf(path, transformers.LlamaForCausalLM(config), extra_metadata=extra)
    r = linnet("generate", "examples/llama.linnet", "--weights", str(path), "--chat", "--prompt", "hi")
    assert one_line(r, 1) == (
        f"linnet generate: {path}: chat template error at line 2: expected token 'end of statement block', got '%'"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("run", MLP, "--weights", b"t\xff.gguf"),
            "linnet run: --weights is not valid UTF-8: byte 0xff at byte 1 of b't\\xff.gguf'",
        ),
        (("run", b"m\xfe.linnet"), "linnet run: FILE is not valid UTF-8: byte 0xfe at byte 1 of b'm\\xfe.linnet'"),
        (("torch", b"m\xfe.linnet"), "linnet torch: FILE is not valid UTF-8: byte 0xfe at byte 1 of b'm\\xfe.linnet'"),
        (
            ("onnx", b"m\xfe.linnet", "--text"),
            "linnet onnx: FILE is not valid UTF-8: byte 0xfe at byte 1 of b'm\\xfe.linnet'",
        ),
        (
            ("run", MLP, "--config", b"in_features=\xff"),
            "linnet run: --config is not valid UTF-8: byte 0xff at byte 12 of b'in_features=\\xff'",
        ),
    ],
)
def test_paths_and_values_that_are_not_utf8_name_the_argument(args, message):
    """A bare "'utf-8' codec can't encode character '\\udcff' in position 102" named no argument (the generated
    code, ONNX metadata and JAX locations quote paths as text)."""
    assert one_line(linnet(*args), 2) == message


def test_generated_torch_source_of_a_non_utf8_path_is_valid_utf8(tmp_path):
    """From Python (no CLI check), `linnet.load` on torch compiled generated code that quotes the path; its lone
    surrogates made `compile` raise UnicodeEncodeError. Each such byte is U+FFFD in the generated text."""
    import os

    from linnet.compiler.torch import codegen
    from linnet.ir import build

    path = os.fsdecode(bytes(tmp_path) + b"/m\xfe.linnet")
    Path(path).write_text((ROOT / MLP).read_text())
    text = codegen.generate(build(path))
    compile(text, "<test>", "exec")
    assert "m\ufffd.linnet" in text


@pytest.mark.parametrize("command", ["run", "torch", "onnx"])
def test_a_source_that_is_a_folder_says_a_file_is_needed(command, tmp_path):
    """It was a bare `[Errno 21] Is a directory: '...'`."""
    extra = ("--text",) if command == "onnx" else ()
    r = linnet(command, str(tmp_path), *extra)
    assert one_line(r, 2) == f"linnet {command}: {tmp_path} is a folder: give a .linnet file"


@pytest.mark.parametrize(
    "command",
    [["check"], ["ir"], ["torch"], ["run"], ["generate", "--prompt", "hi"]],
    ids=["check", "ir", "torch", "run", "generate"],
)
def test_a_preset_the_source_does_not_declare_is_a_usage_error(command):
    """`--preset nope` exits 2 (usage) on every command, as `linnet check` does and docs/language.md says (`ir` and
    `run` exited 1: the loader took the unknown name for an error of the source)."""
    line = one_line(linnet(*command, MLP, "--preset", "nope"), 2)
    assert "`nope`" in line
    if command[0] != "check":
        assert line == f"linnet {command[0]}: {MLP} has no preset `nope` (presets: tiny)"
