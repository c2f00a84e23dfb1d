"""Truncated and bit-flipped files of every format Linnet reads: each load either works (and is then what the
file says: a flipped bit in tensor data may load, as the value it now holds) or raises the runtime's documented
error (`LinnetError`; `CheckpointError` for checkpoints) with the file named, never another exception, never a
hang. The files are tiny models written here (numpy, `gguf`, `tokenizers`), so each sweep is a few seconds.

Mutations are drawn by hypothesis (derandomized, so a failure reproduces): a cut at any byte, or one to eight
flipped bits, most of them in the header or metadata, where a flip changes what the reader is told.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.errors import LinnetError
from linnet.runtimes.formats.checkpoints import open_checkpoint
from tests.conftest import EXAMPLES, installed
from tests.runtimes.gguf_writing import TO_GGUF

LLAMA = EXAMPLES / "llama.linnet"
TINY = {
    "model_type": "llama",
    "vocab_size": 297,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "max_position_embeddings": 64,
}
# LINNET_FUZZ_EXAMPLES=1000 sweeps longer (the default keeps each sweep to seconds)
SWEEP = settings(
    max_examples=int(os.environ.get("LINNET_FUZZ_EXAMPLES", "60")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- the tiny files ----------------------------------------------------------------------------------------------


def tokenizer_json() -> str:
    """A byte-level BPE tokenizer.json of 297 tokens (256 bytes, 40 merges, `<|endoftext|>`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 20, trainer)
    return tok.to_str()


def llama_tensors(seed: int = 3) -> dict[str, np.ndarray]:
    """Random f32 weights for examples/llama.linnet under `TINY`, by Hugging Face name."""
    from linnet.ir import build

    config = {k: v for k, v in TINY.items() if k != "model_type"}
    program = build(LLAMA, config=config, max_positions=32)
    rng = np.random.default_rng(seed)
    return {
        p.path: ((1.0 if p.path.endswith("norm.weight") else 0.0) + rng.standard_normal(p.shape) * 0.05).astype(
            np.float32
        )
        for p in program.params
    }


def write_hf_folder(folder: Path) -> Path:
    """A Hugging Face folder: config.json, model.safetensors, tokenizer.json."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file(llama_tensors(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(TINY, indent=2))
    (folder / "tokenizer.json").write_text(tokenizer_json())
    return folder


def write_gguf(path: Path, metadata: dict | None = None) -> Path:
    """The same model as a llama GGUF (F32 tensors, Q8_0 for the embedding) with the tokenizer in its metadata;
    `metadata` adds or replaces keys (ints as uint32, floats as float32, strings, lists as arrays)."""
    import gguf

    tok = json.loads(tokenizer_json())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {
        "context_length": 64,
        "embedding_length": 32,
        "feed_forward_length": 48,
        "block_count": 1,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
    }.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_merges([" ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(vocab[-1][1])
    for key, value in (metadata or {}).items():
        if key in w.kv_data[0]:
            del w.kv_data[0][key]
        add = {int: w.add_uint32, float: w.add_float32, str: w.add_string, list: w.add_array}[type(value)]
        add(key, value)
    for name, data in llama_tensors().items():
        if name == "model.embed_tokens.weight":
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor("token_embd.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            continue
        if name in ("model.norm.weight", "lm_head.weight"):
            w.add_tensor({"model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[name], data)
            continue
        _, _, layer, *rest = name.split(".")
        w.add_tensor(f"blk.{layer}.{TO_GGUF['.'.join(rest[:-1])]}.{rest[-1]}", data)  # Q/K rows as they are
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_stablehlo(path: Path) -> Path:
    """`linnet stablehlo --entry step --serialized` of the same model: the artifact and its JSON sidecar."""
    path.parent.mkdir(parents=True, exist_ok=True)
    config = [x for k, v in TINY.items() if k != "model_type" for x in ("--config", f"{k}={json.dumps(v)}")]
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "stablehlo", str(LLAMA), "--entry", "step", "--max-positions", "32"]
        + config
        + ["--serialized", str(path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("originals")
    write_hf_folder(root / "hf")
    if installed("gguf"):
        write_gguf(root / "tiny.gguf")
    if installed("jax"):
        write_stablehlo(root / "stablehlo" / "step.bin")
    return root


# -- mutations -----------------------------------------------------------------------------------------------------


@st.composite
def mutations(draw, size: int, hot: int):
    """A function bytes -> bytes: a cut at any byte, or 1-8 flipped bits, most in the first `hot` bytes."""
    if draw(st.booleans()):
        cut = draw(st.integers(0, size - 1))
        return lambda data: data[:cut]
    limit = draw(st.sampled_from([min(hot, size), size]))
    flips = draw(st.lists(st.tuples(st.integers(0, limit - 1), st.integers(0, 7)), min_size=1, max_size=8))

    def flip(data: bytes) -> bytes:
        b = bytearray(data)
        for i, bit in flips:
            b[i] ^= 1 << bit
        return bytes(b)

    return flip


def mutated_copy(original: Path, work: Path, name: str, mutation) -> Path:
    """A fresh copy of `original` (a file or folder) at `work`, with `name` inside it (or the file) mutated."""
    if work.exists():
        shutil.rmtree(work)
    if original.is_dir():
        shutil.copytree(original, work)
        target = work / name
    else:
        work.mkdir(parents=True)
        target = work / original.name
        shutil.copy(original, target)
    target.write_bytes(mutation(target.read_bytes()))
    return target


def assert_loads_or_refuses(load, target: Path, unnamed_ok=lambda err: False) -> None:
    """`load()` works, or raises a LinnetError naming `target` or its folder (or one `unnamed_ok` accepts);
    anything else fails the test."""
    try:
        load()
        OUTCOMES["loaded"] += 1
    except LinnetError as err:
        OUTCOMES[type(err).__name__] += 1
        named = str(target) in str(err) or str(target.parent) in str(err)
        assert named or unnamed_ok(err), f"the error does not name the file: {err}"


OUTCOMES: collections.Counter = collections.Counter()  # shown with -s, by `report_outcomes`


@pytest.fixture(autouse=True)
def report_outcomes(request):
    OUTCOMES.clear()
    yield
    print(f"{request.node.name}: {dict(OUTCOMES)}")


def read_everything(spec: Path) -> None:
    with open_checkpoint(spec) as ckpt:
        for name in ckpt.tensor_names:
            a = ckpt.load(name, "f32")
            assert a.shape == ckpt.shape(name)
        tok = ckpt.tokenizer()
        if tok is not None:
            tok.decode(tok.encode("hello world"))


def _size(path: Path) -> int:
    return path.stat().st_size


# -- the sweeps --------------------------------------------------------------------------------------------------


def test_safetensors(originals, tmp_path):
    weights = originals / "hf" / "model.safetensors"
    header = 8 + int.from_bytes(weights.read_bytes()[:8], "little")

    @SWEEP
    @given(mutations(_size(weights), header + 64))
    def sweep(mutation):
        target = mutated_copy(originals / "hf", tmp_path / "hf", "model.safetensors", mutation)
        assert_loads_or_refuses(lambda: read_everything(target.parent), target)

    sweep()


def test_config_json(originals, tmp_path):
    """Through `prepare` (the checkpoint's config merged into the source's): a config that still parses may be
    refused by the config type or the checker. (The unmutated llama.linnet `prepare` checks first is analysed once
    in the process: linnet/ir/analyses.py.)"""
    from linnet.runtimes.loading import LoadOptions, prepare

    config = originals / "hf" / "config.json"

    @SWEEP
    @given(mutations(_size(config), _size(config)))
    def sweep(mutation):
        target = mutated_copy(originals / "hf", tmp_path / "hf", "config.json", mutation)
        assert_loads_or_refuses(lambda: prepare(LLAMA, target.parent, LoadOptions(max_positions=32)), target)

    sweep()


def test_tokenizer_json(originals, tmp_path):
    tokenizer = originals / "hf" / "tokenizer.json"

    @SWEEP
    @given(mutations(_size(tokenizer), _size(tokenizer)))
    def sweep(mutation):
        target = mutated_copy(originals / "hf", tmp_path / "hf", "tokenizer.json", mutation)

        def load():
            with open_checkpoint(target.parent) as ckpt:
                tok = ckpt.tokenizer()
                tok.decode(tok.encode("hello world"))

        assert_loads_or_refuses(load, target)

    sweep()


def test_gguf(originals, tmp_path):
    pytest.importorskip("gguf")
    original = originals / "tiny.gguf"

    @SWEEP
    @given(mutations(_size(original), 16_384))
    def sweep(mutation):
        target = mutated_copy(original, tmp_path / "gguf", "", mutation)
        assert_loads_or_refuses(lambda: read_everything(target), target)

    sweep()


@pytest.mark.jax
@pytest.mark.parametrize("member", ["step.bin.json", "step.bin"])
def test_stablehlo_artifact(originals, tmp_path, member):
    """`load_exported` on a mutated sidecar JSON or artifact: the JSON's fields are checked and the artifact's
    bytes against the sha256 the JSON records, so a corrupt artifact is refused before jax parses it."""
    pytest.importorskip("jax")
    from linnet.runtimes.backends.jax_backend import load_exported

    original = originals / "stablehlo" / member

    @SWEEP
    @given(mutations(_size(original), _size(original)))
    def sweep(mutation):
        target = mutated_copy(originals / "stablehlo", tmp_path / "stablehlo", member, mutation)
        load = lambda: load_exported(target.parent / "step.bin", weights=originals / "hf")  # noqa: E731
        if member == "step.bin" and target.read_bytes() != original.read_bytes():  # (a bit flipped twice is not)
            with pytest.raises(LinnetError, match="do not match the sha256 in step.bin.json"):
                load()
        else:
            assert_loads_or_refuses(load, target)

    sweep()


@pytest.mark.jax
def test_stablehlo_artifact_without_checksum(originals, tmp_path):
    """An artifact whose JSON records no sha256 (written before it did) is parsed by jax: what its deserializer
    raises for malformed bytes (IndexError, struct.error, UnicodeDecodeError, ...) is a LoadError naming it."""
    pytest.importorskip("jax")
    from linnet.runtimes.backends.jax_backend import load_exported

    folder = tmp_path / "original"
    shutil.copytree(originals / "stablehlo", folder)
    meta = json.loads((folder / "step.bin.json").read_text())
    del meta["sha256"]
    (folder / "step.bin.json").write_text(json.dumps(meta))

    @SWEEP
    @given(mutations(_size(folder / "step.bin"), _size(folder / "step.bin")))
    def sweep(mutation):
        target = mutated_copy(folder, tmp_path / "stablehlo", "step.bin", mutation)
        assert_loads_or_refuses(lambda: load_exported(target, weights=originals / "hf"), target)

    sweep()


@pytest.mark.parametrize(
    "metadata, message",
    [
        ({"tokenizer.ggml.tokens": list(range(297))}, "GGUF metadata tokenizer.ggml.tokens is not a list of strings"),
        ({"tokenizer.ggml.merges": [1, 2]}, "GGUF metadata tokenizer.ggml.merges is not a list of strings"),
        ({"tokenizer.ggml.eot_token_id": [1, 2]}, "tokenizer.ggml.eot_token_id must be an integer"),
        ({"llama.attention.head_count": 0}, "llama.attention.head_count is 0, expected a positive integer"),
        ({"llama.attention.head_count": "4"}, "llama.attention.head_count is '4', expected a positive integer"),
        ({"general.alignment": 3}, "general.alignment is 3, not a power of two"),
        ({"general.alignment": "x"}, "general.alignment is 'x', not a power of two"),
    ],
)
def test_gguf_metadata_of_the_wrong_type(tmp_path, metadata, message):
    """Metadata that parses but has the wrong type or value for its key (each of these was a TypeError,
    AttributeError or ZeroDivisionError, or with alignment 3 read tensors at the wrong offsets)."""
    pytest.importorskip("gguf")
    from linnet.errors import CheckpointError

    path = write_gguf(tmp_path / "odd.gguf", metadata)
    with pytest.raises(CheckpointError) as e:
        read_everything(path)
    assert str(path) in str(e.value) and message in str(e.value)


def test_gguf_float_metadata_of_the_wrong_type_is_a_config_error(tmp_path):
    """A string where the GGUF spec has a float is refused naming the metadata key (was a ValueError from
    float())."""
    pytest.importorskip("gguf")
    from linnet.runtimes.loading import LoadOptions, prepare

    path = write_gguf(tmp_path / "odd.gguf", {"llama.attention.layer_norm_rms_epsilon": "x"})
    expected = r"odd\.gguf: GGUF metadata llama\.attention\.layer_norm_rms_epsilon is 'x', expected a finite number"
    with pytest.raises(LinnetError, match=expected):
        prepare(LLAMA, path, LoadOptions(max_positions=32))


def test_gguf_integer_tensor_where_a_parameter_is(tmp_path):
    """A GGUF tensor stored as I32 where the source declares a parameter: error[L504] with its dtype (it loaded
    as integers, which the backends then used or choked on)."""
    gguf = pytest.importorskip("gguf")
    from linnet.runtimes.loading import LoadOptions, prepare

    path = write_gguf(tmp_path / "int.gguf")
    data = bytearray(path.read_bytes())
    with open_checkpoint(path) as ckpt:
        info = ckpt._file.tensors["output_norm.weight"]
    f32, i32 = (int(t).to_bytes(4, "little") for t in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.I32))
    at = data.index(b"output_norm.weight") + len(b"output_norm.weight") + 4 + 8 * len(info.shape)
    assert data[at : at + 4] == f32  # the tensor's ggml type, after its name, rank and dims
    data[at : at + 4] = i32
    path.write_bytes(bytes(data))
    with pytest.raises(LinnetError, match=r"error\[L504\]: `model\.norm\.weight` in .*int\.gguf is i32 \[32\]"):
        prepare(LLAMA, path, LoadOptions(max_positions=32))
