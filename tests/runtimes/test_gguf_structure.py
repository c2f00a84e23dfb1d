"""The GGUF reader checks the file's structure, not only its bounds (issue 43, item 2): the tensor data ends where
the file ends but for the padding to the alignment, offsets are aligned, in table order and non-overlapping, and
what the architecture needs is there. A tensor count one too small at byte 8 used to load: the last table entry
was read as padding, every tensor read from the wrong place (logits off by up to 1.6e32) and the untied
`output.weight` dropped, so the model was taken as tied; `linnet generate` printed tokens and exited 0."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from linnet.errors import CheckpointError, LinnetError
from linnet.runtimes.formats.checkpoints import open_checkpoint
from linnet.runtimes.formats.gguf_reader import GGUFFile
from tests.conftest import ROOT
from tests.runtimes.test_corrupt_files import LLAMA, write_gguf

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("structure") / "tiny.gguf")


def mutated(original: Path, target: Path, edit) -> Path:
    data = bytearray(original.read_bytes())
    data = edit(data) or data
    target.write_bytes(bytes(data))
    return target


def with_count(delta: int):
    def edit(data: bytearray) -> None:
        (n,) = struct.unpack_from("<Q", data, 8)
        struct.pack_into("<Q", data, 8, n + delta)

    return edit


def test_the_original_reads_as_gguf_reads_it(original):
    reader = gguf.GGUFReader(str(original))
    with GGUFFile(original) as ours:
        assert list(ours.tensors) == [t.name for t in reader.tensors]
        for t in reader.tensors:
            assert np.array_equal(np.asarray(ours.raw(t.name)).reshape(-1), np.asarray(t.data).reshape(-1)), t.name


def test_a_tensor_count_one_too_small_is_refused(original, tmp_path):
    target = mutated(original, tmp_path / "minus1.gguf", with_count(-1))
    with pytest.raises(CheckpointError) as e:  # was: loaded, the last table entry read as padding
        open_checkpoint(target)
    message = str(e.value)
    assert (
        str(target) in message
        and "tensor count at byte 8" in message
        and f"file has {target.stat().st_size}" in message
    )


def test_the_cli_says_so_and_prints_no_token(original, tmp_path):
    target = mutated(original, tmp_path / "minus1.gguf", with_count(-1))
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "generate", str(LLAMA), "--weights", str(target)]
        + ["--prompt-ids", "1,2,3", "--print-ids", "--max-new-tokens", "2"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 1 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"linnet generate: {target}: corrupt GGUF file: the header's ")


@pytest.mark.parametrize("delta", [1, 2, 10**6])
def test_a_tensor_count_too_large_is_refused(original, tmp_path, delta):
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        open_checkpoint(mutated(original, tmp_path / "plus.gguf", with_count(delta)))


@pytest.mark.parametrize("extra", [1, 31, 32, 4096])
def test_bytes_after_the_padding_are_refused(original, tmp_path, extra):
    target = mutated(original, tmp_path / "long.gguf", lambda d: d + bytes(extra))
    with pytest.raises(CheckpointError, match="or the file was cut or appended to"):
        open_checkpoint(target)


def test_only_the_last_padding_may_be_missing(original, tmp_path):
    """A writer that does not pad after the last tensor (allowed); a cut into the last tensor is refused."""
    with GGUFFile(original) as f:
        last = list(f.tensors.values())[-1]
        end = last.offset + last.nbytes
    assert original.stat().st_size >= end
    unpadded = mutated(original, tmp_path / "unpadded.gguf", lambda d: d[:end])
    with open_checkpoint(unpadded) as ckpt:
        assert len(ckpt.tensor_names) == len(gguf.GGUFReader(str(original)).tensors)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        open_checkpoint(mutated(original, tmp_path / "cut.gguf", lambda d: d[: end - 1]))


@pytest.mark.parametrize("shift", [4, 32, -32], ids=["misaligned", "gap", "overlap"])
def test_offsets_are_aligned_in_order_and_non_overlapping(original, tmp_path, shift):
    reader = gguf.GGUFReader(str(original))
    second = reader.tensors[1].field  # its parts: name length, name, n_dims, dims, type, offset
    where = int(second.offset) + sum(int(np.asarray(p).nbytes) for p in second.parts[:-1])
    (offset,) = struct.unpack_from("<Q", original.read_bytes(), where)
    assert offset == int(reader.tensors[1].data_offset - reader.data_offset)

    def edit(data: bytearray) -> None:
        struct.pack_into("<Q", data, where, offset + shift)

    with pytest.raises(CheckpointError, match=f"tensor '{reader.tensors[1].name}' has data offset {offset + shift}"):
        open_checkpoint(mutated(original, tmp_path / "offset.gguf", edit))


def test_a_tensor_the_architecture_needs_is_named_when_missing(original, tmp_path):
    """A well-formed file without `blk.0.attn_q.weight`: the load names the missing parameter."""
    import linnet.torch as lt

    pytest.importorskip("torch")
    reader = gguf.GGUFReader(str(original))
    target = tmp_path / "no_q.gguf"
    w = gguf.GGUFWriter(str(target), "llama")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name != "blk.0.attn_q.weight":
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(LinnetError, match=r"missing from the checkpoint: `model.layers.0.self_attn.q_proj.weight`"):
        lt.load(LLAMA, weights=target, progress=False)
