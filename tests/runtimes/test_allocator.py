"""`linnet.runtimes.backends.allocator.keep_freed_heap`: freed activations stay in the heap, so the next op's tensors
reuse pages instead of faulting in fresh ones; a user's own malloc settings are left alone. Each case runs in its own
process (the settings are the process's)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")

# An eager op's pattern: 20 activations of 4 MiB written, then freed, four times over; the minor page faults of a
# round after the first.
PROBE = textwrap.dedent(
    """
    import resource
    import numpy as np
    from linnet.runtimes.backends.allocator import keep_freed_heap

    applied = keep_freed_heap()

    def one_round():
        blocks = [np.ones(1 << 20, dtype=np.float32) for _ in range(20)]
        del blocks

    one_round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        one_round()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4)
    """
)


def probe(**env: str) -> tuple[bool, int]:
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=environment | env, capture_output=True, text=True, check=True)
    applied, faults = r.stdout.split()
    return applied == "True", int(faults)


def test_freed_blocks_are_reused_without_page_faults():
    applied, faults = probe()
    assert applied
    assert faults < 200  # 80 MiB a round is 20,480 pages of 4 KiB: none of them fresh


def test_glibc_defaults_fault_the_pages_in_again():
    """The reference the first test is measured against: with glibc's defaults the freed top of the heap goes back
    to the kernel and every round faults its pages in again."""
    applied, faults = probe(LINNET_MALLOC="default")
    assert not applied
    assert faults > 5000


@pytest.mark.parametrize(
    "env", [{"MALLOC_TRIM_THRESHOLD_": "1000000"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}]
)
def test_a_users_own_malloc_settings_are_kept(env):
    applied, _ = probe(**env)
    assert not applied


# Heap memory freed below a block still in use: 1,000 blocks of 64 KiB (below glibc's mmap threshold, so on the heap),
# one kept at the top, the rest freed; the anonymous memory resident before and after `release_freed_heap`.
TRIM_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from linnet.runtimes.backends.allocator import release_freed_heap
    sys.path.insert(0, sys.argv[1])
    from generate_speed import proc_status_mb  # bench/

    blocks = [np.ones(1 << 14, dtype=np.float32) for _ in range(1000)]
    top = blocks.pop()
    del blocks
    before = proc_status_mb("RssAnon")
    released = release_freed_heap()
    print(json.dumps({"released": released, "freed_mib": before - proc_status_mb("RssAnon")}))
    """
)


def trim_probe(**env: str) -> dict:
    import json
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    probe = [sys.executable, "-c", TRIM_PROBE, str(ROOT / "bench")]
    r = subprocess.run(probe, env=environment | env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_freed_heap_below_live_blocks_goes_back_to_the_kernel():
    got = trim_probe()
    assert got["released"] and got["freed_mib"] > 40, got  # 62 MiB freed into the heap


def test_release_is_left_alone_under_linnet_malloc_default():
    got = trim_probe(LINNET_MALLOC="default")
    assert not got["released"] and got["freed_mib"] < 10, got
