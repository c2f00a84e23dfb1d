"""bench/weight_layouts.py's joined rows: the same weights apart (one `linear` each) and joined (adjacent in one
buffer held transposed, the module's `linears`), both the product over the group's weights, and the joined
arrangement one GEMV a group, so the row measures what an f32 `fast` module runs."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import ROOT

torch = pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "bench"))
import weight_layouts as wl  # noqa: E402  (bench/ is not a package)

GROUPS = {"q, k, v": [(32, 32), (16, 32), (16, 32)], "gate, up": [(64, 32), (64, 32)]}


@pytest.fixture(autouse=True)
def _threads_restored():
    """The bench's measure functions set torch's thread count for the process (a bench run is a process of its
    own); here they run inside a test worker, whose one thread (tests/conftest.py) is restored after, or the next
    test of the worker runs at two (test_torch_modes's bitwise check then meets the 2-thread block GEMV, which on
    an AVX-512 Xeon sums in another order than F.linear)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_apart_and_joined_compute_the_group_product_and_joined_is_one_gemv(monkeypatch):
    calls = []
    real = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda *args: calls.append(args[1].shape) or real(*args))
    rows = wl.measure_joined(rounds=2, threads=2, groups=GROUPS, copies=2)
    assert {(r["group"], r["rows"], r["arrangement"]) for r in rows} == {
        (g, n, a) for g in GROUPS for n in wl.JOINED_ROWS for a in wl.ARRANGEMENTS
    }
    assert all(r["max_rel_error"] < 1e-5 for r in rows)
    # joined: one bmm over each buffer as blocks of K, [2, K / 2, sum N]; apart: q as blocks of its rows
    # ([2, K, N / 2]), k and v too, gate and up (wide) each as blocks of K
    joined, apart = {(2, 16, 64), (2, 16, 128)}, {(2, 32, 16), (2, 32, 8), (2, 16, 64)}
    assert set(calls) == joined | apart
    lines = wl.joined_table(rows)
    assert len(lines) == 2 + len(GROUPS) * len(wl.JOINED_ROWS)
