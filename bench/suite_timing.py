"""A pytest plugin that records each test's wall and CPU seconds (and each fixture's setup), for
finding what makes the suite slow. CPU seconds (resource.getrusage, self + waited-for children) are
far less sensitive to a busy machine than wall seconds.

    .venv/bin/python -m pytest -q -p bench.suite_timing --timing-log=/tmp/timing.jsonl
    .venv/bin/python bench/suite_timing.py /tmp/timing.jsonl     # tables by directory, file, test, fixture
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

import pytest


def _cpu() -> float:
    self_, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.addoption("--timing-log", default=None, help="write per-test wall/CPU seconds here (JSON lines)")


_log = None


def pytest_configure(config):
    global _log
    path = config.getoption("--timing-log")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:
            path = f"{path}.{worker}"
        _log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole session)


def _write(record):
    if _log is not None:
        _log.write(json.dumps(record) + "\n")
        _log.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.perf_counter(), _cpu()
    yield
    _write({"kind": "test", "id": item.nodeid, "wall": time.perf_counter() - wall, "cpu": _cpu() - cpu})


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    wall, cpu = time.perf_counter(), _cpu()
    yield
    _write(
        {
            "kind": "fixture",
            "id": f"{fixturedef.baseid}::{fixturedef.argname}[{fixturedef.scope}]",
            "test": request.node.nodeid,
            "wall": time.perf_counter() - wall,
            "cpu": _cpu() - cpu,
        }
    )


def _table(title, rows, limit):
    print(f"\n## {title}\n{'cpu s':>9} {'wall s':>9} {'n':>5}  name")
    for name, (cpu, wall, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:limit]:
        print(f"{cpu:9.1f} {wall:9.1f} {n:5d}  {name}")


def main(paths):
    tests, fixtures = {}, defaultdict(lambda: [0.0, 0.0, 0])
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                if record["kind"] == "test":
                    tests[record["id"]] = (record["cpu"], record["wall"], 1)
                else:
                    row = fixtures[record["id"]]
                    row[0] += record["cpu"]
                    row[1] += record["wall"]
                    row[2] += 1
    by_dir, by_file = defaultdict(lambda: [0.0, 0.0, 0]), defaultdict(lambda: [0.0, 0.0, 0])
    for nodeid, (cpu, wall, _) in tests.items():
        file = nodeid.split("::")[0]
        for table, key in ((by_dir, os.path.dirname(file)), (by_file, file)):
            table[key][0] += cpu
            table[key][1] += wall
            table[key][2] += 1
    total = [sum(v[0] for v in tests.values()), sum(v[1] for v in tests.values()), len(tests)]
    _table("total", {"all tests": total}, 1)
    _table("by directory", by_dir, 100)
    _table("by file (top 40)", by_file, 40)
    _table("by test (top 40)", tests, 40)
    _table("by fixture setup (top 30, summed over setups)", fixtures, 30)


if __name__ == "__main__":
    main(sys.argv[1:])
