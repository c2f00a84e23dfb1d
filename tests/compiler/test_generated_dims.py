"""A generated function that reads one symbolic dim of an input binds it to an int
(`B = x.shape[0]`), not to a one-element shape (`x.shape[:1]`, or `positions.shape` for a
rank-1 input), which reshapes and broadcasts then refused."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from linnet.compiler.jax.codegen import generate as generate_jax
from linnet.compiler.torch.codegen import generate as generate_torch
from linnet.ir import build

SOURCE = """config C {
    d: int = 4
}

fn first(x: [B, S, D]) -> [B, D] {
    reshape(x[:, :1], [B, D])
}

fn count(positions: i64[B]) -> i64[B] {
    positions + reshape(arange(B), [B])
}

model M(c: C) {
    entry fn forward(x: [B, S, c.d], positions: i64[B]) -> [B, c.d] {
        first(x) + cast(unsqueeze(count(positions), 1), x.dtype)
    }
}
"""


@pytest.mark.parametrize("generate", [generate_torch, generate_jax], ids=["torch", "jax"])
def test_one_dim_of_an_input_is_read_as_an_int(generate):
    text = generate(build(SOURCE))
    assert "B = x.shape[0]" in text and "B = positions.shape[0]" in text
    assert "shape[:1]" not in text and "B = positions.shape\n" not in text


BACKENDS = [b for b, module in (("torch", "torch"), ("jax", "jax")) if importlib.util.find_spec(module)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_it_runs(backend, tmp_path):
    import linnet

    path = tmp_path / "dims.linnet"
    path.write_text(SOURCE)
    model = linnet.load(path, backend=backend, random_weights=True, progress=False)
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    (out,) = model.run("forward", x, np.array([10, 20]))
    np.testing.assert_array_equal(out, x[:, 0] + np.array([[10.0], [21.0]], dtype=np.float32))


# A patch convolution's output size is written as PyTorch's `(H - 8) // 8 + 1`; a dim built on it
# (`S + 1` tokens after a [CLS] token, in a function lowered in its caller) holds the floor
# division `(H - 8) // 8`, which no input axis is. ONNX computes it from `H`'s axis; JAX's export
# needs it as `H // 8` (`(H - 8) // 8` may be negative for all it knows).
PATCHES = """config C {
    d: int = 4
}

fn tokens(x: [B, S, 4]) -> [B, S, 4] {
    rearrange(rearrange(x, "b s (h e) -> b h s e", h=2), "b h s e -> b s (h e)")
}

model M(c: C) {
    projection: Conv2d(3, c.d, 8, stride=8)

    entry fn forward(pixels: [B, 3, H, W]) -> [B, (H // 8) * (W // 8) + 1, c.d] {
        let patches = rearrange(projection(pixels), "b d h w -> b (h w) d")
        tokens(concat([patches[:, :1], patches], 1))
    }
}
"""


PATCH_BACKENDS = [
    backend
    for backend, module in (("torch", "torch"), ("jax", "jax"), ("xla", "jax"), ("onnxruntime", "onnxruntime"))
    if importlib.util.find_spec(module) and importlib.util.find_spec("torch")
]


def _code(generate, source: str) -> list[str]:
    """The lines `generate` (torch's or JAX's code generator) writes for `source`, without comments."""
    return [line.split("#")[0].strip() for line in generate(build(source)).splitlines()]


def test_floor_division_dims_are_written_in_canonical_form():
    code = [line.split("#")[0] for line in generate_jax(build(PATCHES)).splitlines()]  # not comments
    assert any(".reshape(B, (H // 8) * (W // 8) + 1, 4)" in line for line in code)
    assert not any("(H - 8) // 8" in line for line in code if ".reshape(" in line)


@pytest.mark.parametrize("backend", PATCH_BACKENDS)
def test_floor_division_dims_run(backend, tmp_path):
    import linnet

    path = tmp_path / "patches.linnet"
    path.write_text(PATCHES)
    ref = linnet.load(path, backend="torch-interpret", random_weights=True, progress=False)
    model = linnet.load(path, backend=backend, random_weights=True, progress=False)
    pixels = np.random.default_rng(0).standard_normal((2, 3, 24, 17)).astype(np.float32)
    (want,) = ref.run("forward", pixels)
    (out,) = model.run("forward", pixels)
    assert out.shape == (2, 3 * 2 + 1, 4)
    np.testing.assert_allclose(out, want, atol=1e-5)


# A slice bound a known number below a symbolic size's negative (`1 - S`, `-S`) counts from the end, as the checker
# types it ([B, S - 1], [B, S]). Emitted as written, `x[:, -S + 1:]` made jax.export compare `-S + 1` with 0
# (InconclusiveDimensionOperation), and every entry of the file failed on xla; and where `S` is 1, `1 - S` is 0 to
# Python, so torch gave [B, 1] where the type says [B, 0]. The lowering emits the checker's bound (1, 0).
FROM_THE_END = """config C {
    n: int = 1
}

model M(c: C) {
    entry fn a(x: [B, S]) -> [B, S - 1] {
        x[:, 1 - S:]
    }

    entry fn d(x: [B, S]) -> [B, S] {
        x[:, -S:]
    }
}
"""


def test_slice_bounds_from_the_end_are_emitted_as_the_checker_reads_them():
    code = _code(generate_jax, FROM_THE_END)
    assert "t = x[:, 1:]" in code and "t = x[:, :]" in code


@pytest.mark.parametrize("backend", PATCH_BACKENDS)
@pytest.mark.parametrize("seq", [1, 5])
def test_slice_bounds_from_the_end_run(backend, seq, tmp_path):
    import linnet

    path = tmp_path / "from_the_end.linnet"
    path.write_text(FROM_THE_END)
    model = linnet.load(path, backend=backend, random_weights=True, progress=False)
    x = np.arange(2 * seq, dtype=np.float32).reshape(2, seq)
    (a,) = model.run("a", x)
    (d,) = model.run("d", x)
    np.testing.assert_array_equal(a, x[:, 1:])
    np.testing.assert_array_equal(d, x)


# A slice bound a dim of symbolic size may not reach is clamped to the size, as numpy, torch, JAX and ONNX clamp it:
# `x[:, :4]` of [B, S, 3] is [B, min(4, S), 3] (was [B, 4, 3], and where S is 2 every backend failed to reshape the
# slice to the 12 columns the type promised). A shape that holds the clamped dim is computed with it: `min` in
# generated torch, `jax.core.min_dim` in generated JAX (Python's `min` cannot compare jax.export's symbolic dims), a
# Min node in ONNX.
CLAMPED = """config C {
    d: int = 3
}

model M(c: C) {
    entry fn forward(x: [B, S, c.d]) -> [B, c.d] {
        let first = rearrange(x[:, :4], "b s d -> b (s d)")
        let last = rearrange(x[:, -4:], "b s d -> b (d s)")
        sum(rearrange(first + last, "b (s d) -> b s d", d=c.d), dim=1)
    }
}
"""


def test_clamped_slice_dims_are_computed_with_min():
    torch_code = _code(generate_torch, CLAMPED)
    jax_code = _code(generate_jax, CLAMPED)
    assert "first = t.reshape(B, 3 * min(4, S))" in torch_code
    assert "t_3 = t_2.reshape(B, jax.core.min_dim(4, S), 3)" in jax_code


def _load(source: str, backend: str, tmp_path):
    """`source` loaded on `backend` with random weights."""
    import linnet

    path = tmp_path / "model.linnet"
    path.write_text(source)
    return linnet.load(path, backend=backend, random_weights=True, progress=False)


def _tokens(seq: int) -> np.ndarray:
    """An input [2, seq, 3] of distinct values."""
    return np.arange(2 * seq * 3, dtype=np.float32).reshape(2, seq, 3)


@pytest.mark.parametrize("backend", PATCH_BACKENDS)
@pytest.mark.parametrize("seq", [2, 6])
def test_clamped_slices_run(backend, seq, tmp_path):
    x = _tokens(seq)
    (out,) = _load(CLAMPED, backend, tmp_path).run("forward", x)
    first = x[:, :4].reshape(2, -1)
    last = np.swapaxes(x[:, -4:], 1, 2).reshape(2, -1)
    np.testing.assert_allclose(out, (first + last).reshape(2, -1, 3).sum(axis=1), rtol=1e-6)


# A slice's start a symbolic dim may not reach is clamped too, as numpy's is: `x[:, 4:]` of [B, S, 3] is
# [B, S - min(4, S), 3] (was [B, S - 4, 3], negative where S < 4: every backend gave 0 rows, which the reshapes to the
# checker's sizes refused). A bound written `S - 4` is emitted as the checker reads it, `S - min(4, S)`: as written,
# where S is 3 it is -1, which every backend counts from the end (2 rows where the checker says 0).
STARTS = """config C {
    d: int = 3
}

fn flat(x: [B, N, D]) -> [B, N * D] {
    rearrange(x, "b s d -> b (s d)")
}

model M(c: C) {
    entry fn forward(x: [B, S, c.d]) -> [B, c.d] {
        let front = concat([flat(x[:, 4:]), flat(x[:, :-4]), flat(x[:, 2:-2]), flat(x[:, 2:6])], 1)
        let back = concat([flat(x[:, :S - 4]), flat(x[:, S - 4:]), flat(x[:, -4:6])], 1)
        sum(rearrange(concat([front, back], 1), "b (s d) -> b s d", d=c.d), dim=1)
    }
}
"""


def _starts_in_numpy(x: np.ndarray) -> np.ndarray:
    s = x.shape[1]
    parts = [x[:, 4:], x[:, :-4], x[:, 2:-2], x[:, 2:6], x[:, : s - 4 if s >= 4 else 0], x[:, max(s - 4, 0) :]]
    parts.append(x[:, -4:6])
    return np.concatenate(parts, axis=1).sum(axis=1)


def test_clamped_slice_starts_are_emitted_and_computed_with_min():
    torch_code = _code(generate_torch, STARTS)
    jax_code = _code(generate_jax, STARTS)
    assert "t_8 = x[:, :S - min(4, S)]" in torch_code and "t_10 = x[:, S - min(4, S):]" in torch_code
    assert "t_1 = t.reshape(B, 3 * S - 3 * min(4, S))" in torch_code
    assert any(line.endswith("x[:, :S - jax.core.min_dim(4, S)]") for line in jax_code)


@pytest.mark.parametrize("backend", PATCH_BACKENDS)
@pytest.mark.parametrize("seq", [2, 3, 8])
def test_clamped_slice_starts_run(backend, seq, tmp_path):
    x = _tokens(seq)
    (out,) = _load(STARTS, backend, tmp_path).run("forward", x)
    np.testing.assert_allclose(out, _starts_in_numpy(x), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.torch
def test_clamped_slice_starts_run_compiled(tmp_path):
    """torch.compile (~30 s here for the three lengths, each a recompile) computes the same clamped dims."""
    pytest.importorskip("torch")
    model = _load(STARTS, "torch-compile", tmp_path)
    for seq in (2, 3, 8):
        x = _tokens(seq)
        (out,) = model.run("forward", x)
        np.testing.assert_allclose(out, _starts_in_numpy(x), rtol=1e-6)


@pytest.mark.torch
@pytest.mark.slow  # ~9 s here: two inductor compiles
def test_clamped_slices_run_under_torch_compile(tmp_path):
    """`min(4, S)` under torch.compile (inductor): S = 2 (the slice keeps both rows) compiles with S fixed, S = 8
    (four of eight) recompiles with S dynamic, and S = 3 is on the other side of the clamp again (that graph guards
    `min(4, S) == 4`: dynamo's slice of a symbolic dim decides its clamp when it traces, so it compiles once more);
    each equals eager PyTorch's result."""
    pytest.importorskip("torch")
    import torch._dynamo

    import linnet

    torch._dynamo.reset()
    path = tmp_path / "clamped.linnet"
    path.write_text(CLAMPED)
    compiled = linnet.load(path, backend="torch-compile", random_weights=True, progress=False)
    eager = linnet.load(path, backend="torch", random_weights=True, progress=False)

    def check(seq: int) -> None:
        x = np.arange(2 * seq * 3, dtype=np.float32).reshape(2, seq, 3)
        (out,) = compiled.run("forward", x)
        (expected,) = eager.run("forward", x)
        assert out.shape == expected.shape == (2, 3)
        np.testing.assert_allclose(out, expected, rtol=1e-6)

    for seq in (2, 8, 3):
        check(seq)


# A symbolic bound negative for every size counts from the end, as Python's does: `x[:, -K:]` of [B, S, 3] is
# [B, min(K, S), 3] and `x[:, :-K]` is [B, S - min(K, S), 3] (a dim variable is at least 1, so `-K` is at least one
# from the end). They were typed as written ([B, S + K, 3], [B, -K, 3]), which every backend's reshape refused. Each
# is emitted as the checker reads it, `S - min(K, S)`; a symbolic bound over a known size is clamped too (`z[:, :K]`
# of [B, 4, 3] is [B, min(K, 4), 3], was [B, K, 3]).
SYMBOLIC_FROM_THE_END = """config C {
    d: int = 3
}

fn flat(x: [B, N, D]) -> [B, N * D] {
    rearrange(x, "b s d -> b (s d)")
}

model M(c: C) {
    entry fn forward(x: [B, S, c.d], z: [B, 4, c.d], k: [B, K]) -> [B, c.d] {
        let parts = concat([flat(x[:, -K:]), flat(x[:, :-K]), flat(x[:, -K - 1:]), flat(x[:, 1:-K])], 1)
        let known = concat([flat(z[:, :-K]), flat(z[:, -K:]), flat(z[:, :K]), flat(z[:, K:])], 1)
        sum(rearrange(concat([parts, known], 1), "b (s d) -> b s d", d=c.d), dim=1)
    }
}
"""


def _from_the_end_in_numpy(x: np.ndarray, z: np.ndarray, k: int) -> np.ndarray:
    parts = [x[:, -k:], x[:, :-k], x[:, -k - 1 :], x[:, 1:-k], z[:, :-k], z[:, -k:], z[:, :k], z[:, k:]]
    return np.concatenate(parts, axis=1).sum(axis=1)


def test_symbolic_bounds_from_the_end_are_emitted_with_min():
    torch_code = _code(generate_torch, SYMBOLIC_FROM_THE_END)
    jax_code = _code(generate_jax, SYMBOLIC_FROM_THE_END)
    assert "t = x[:, S - min(K, S):]" in torch_code and "t_2 = x[:, :S - min(K, S)]" in torch_code
    assert "t_7 = t_6.reshape(B, 3 * S - 3 * min(K + 1, S))" in torch_code
    assert any(line.endswith("x[:, S - jax.core.min_dim(K, S):]") for line in jax_code)


@pytest.mark.parametrize("backend", PATCH_BACKENDS)
@pytest.mark.parametrize(("seq", "k"), [(2, 1), (2, 3), (6, 2), (3, 8), (1, 1)])
def test_symbolic_bounds_from_the_end_run(backend, seq, k, tmp_path):
    x, z = _tokens(seq), _tokens(4) + 100
    (out,) = _load(SYMBOLIC_FROM_THE_END, backend, tmp_path).run("forward", x, z, np.zeros((2, k), np.float32))
    np.testing.assert_allclose(out, _from_the_end_in_numpy(x, z, k), rtol=1e-6)
