"""A dtype's size is a fact of the `DType` (`itemsize`, bytes per element), the one place every layer
(the cost model, loading, the CLI) reads it from: no bytes-per-element table is kept anywhere else."""

from __future__ import annotations

import re

import pytest

from linnet.runtimes.formats.checkpoints import numpy_dtype
from linnet.types.core import DTYPES, WORK, dtype_var
from tests.conftest import ROOT


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_every_dtype_has_the_size_of_its_numpy_arrays(name):
    assert DTYPES[name].itemsize == numpy_dtype(name).itemsize


def test_the_working_dtype_and_dtype_variables_have_no_size_of_their_own():
    assert WORK.itemsize is None and dtype_var("T", "float").itemsize is None


def test_the_size_is_no_part_of_a_dtypes_identity():
    """Dtypes compare and hash by name and kind, as before they carried a size."""
    f32 = DTYPES["f32"]
    assert f32 == type(f32)("f32", "float") and hash(f32) == hash(type(f32)("f32", "float"))


# `"bf16": 2`, `'i64': 8`: a dtype name mapped to a size
SIZE_TABLE = re.compile(r"""["'](?:f64|f32|f16|bf16|i64|i32|bool)["']\s*:\s*[1248]\b""")


def test_no_module_keeps_its_own_table_of_dtype_sizes():
    tables = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "linnet").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
        if SIZE_TABLE.search(line)
    ]
    assert not tables, "read `DType.itemsize` instead:\n" + "\n".join(tables)
