"""The timing lines of `linnet generate` and `linnet run`: load, compile (or session build), time to first token and
decode rate, each reported on its own and each excluding the others (issue 14). Tests assert what the lines say
and that every figure is there and non-negative, never how large a figure is."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from linnet.runtimes.backends import threads
from linnet.runtimes.backends.threads import usable_cores
from tests.conftest import ROOT

PROMPT = "The capital of France is a city with a long history, and"
LOAD = re.compile(r"^loaded \S+ with \S+ in (?P<load>[\d.]+) s \((?P<detail>.*)\)$")
COMPILE = re.compile(r"^(?P<what>compile|session build|graph capture) (?P<seconds>[\d.]+) s \((?P<cache>[^)]*)\)$")
TIMING = re.compile(
    r"^prompt (?P<prompt>\d+) tokens, (?P<generated>\d+) generated \((?P<reason>length[^)]*|stop)\); "
    r"time to first token (?P<ttft>\d+) ms, decode (?P<rate>[\d.]+) tokens/s \((?P<steps>\d+) steps in "
    r"(?P<decode>[\d.]+) s\)$"
)


def generate(backend: str, cache_dir, *extra: str) -> subprocess.CompletedProcess:
    """`linnet generate` of the embedded SmolLM2 in a fresh process, its caches in `cache_dir`."""
    env = dict(os.environ, LINNET_CACHE_DIR=str(cache_dir), NO_COLOR="1", PYTHONPATH=str(ROOT))
    env.pop("LINNET_NO_CACHE", None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # torch sets it in this process when it first compiles; a user's is kept
    args = ["generate", "examples/llama.linnet", "--prompt", PROMPT, "--max-new-tokens", "3", "--max-positions", "64"]
    return subprocess.run(
        [sys.executable, "-m", "linnet", *args, "--backend", backend, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


def generated_lines(backend: str, cache_dir, *extra: str) -> dict:
    """`generate` on `backend` (see `generate`), which must succeed; its timing lines parsed (`timing_lines`)."""
    pytest.importorskip({"jax": "jax", "xla": "jax", "onnxruntime": "onnxruntime"}.get(backend, "torch"))
    r = generate(backend, cache_dir, *extra)
    assert r.returncode == 0, r.stderr
    lines = timing_lines(r.stderr)
    lines["stdout"] = r.stdout
    assert_honest(lines)
    return lines


def timing_lines(stderr: str) -> dict:
    """The load, compile and timing lines of `generate`'s stderr, parsed (each must be there, in this order)."""
    lines = [line for line in stderr.splitlines() if not line.startswith("note: ")]
    found = {}
    for name, pattern in (("load", LOAD), ("compile", COMPILE), ("timing", TIMING)):
        match = next((m for line in lines if (m := pattern.match(line))), None)
        if name == "compile" and match is None and "no compile (eager)" in lines:
            found[name] = None
            continue
        assert match is not None, f"no {name} line in:\n{stderr}"
        found[name] = match.groupdict()
    return found


def assert_honest(lines: dict) -> None:
    """Every figure present and non-negative; decode figures consistent with each other."""
    assert float(lines["load"]["load"]) >= 0
    if lines["compile"] is not None:
        assert float(lines["compile"]["seconds"]) >= 0
    t = lines["timing"]
    assert int(t["ttft"]) >= 0 and float(t["rate"]) >= 0 and float(t["decode"]) >= 0
    assert int(t["steps"]) == int(t["generated"]) - 1  # one decode step per token after the first


@pytest.mark.torch
def test_generate_on_eager_torch_says_it_does_not_compile_and_its_threads(tmp_path):
    lines = generated_lines("torch", tmp_path)
    assert lines["compile"] is None
    if "OMP_NUM_THREADS" not in os.environ:
        cores = len(usable_cores())
        chosen = re.search(r"torch threads (\d+) \((.*)\)$", lines["load"]["detail"])
        assert chosen is not None, lines["load"]["detail"]
        assert 1 <= int(chosen[1]) <= cores
        assert chosen[2] == "the cores this process may use" or chosen[2].endswith(
            f" of the {cores} cores this process may use are idle"
        )


@pytest.mark.torch
def test_a_stop_at_the_cache_s_last_position_names_max_positions(tmp_path):
    """`--max-new-tokens 2000 --max-positions 16` generated 15 tokens and said "(length)", as if 2000 were
    reached; and the load line said "compiled for 16 positions" on eager PyTorch, which compiles nothing."""
    pytest.importorskip("torch")
    r = generate("torch", tmp_path, "--max-new-tokens", "2000", "--max-positions", "16")
    assert r.returncode == 0, r.stderr
    lines = timing_lines(r.stderr)
    prompt, generated = int(lines["timing"]["prompt"]), int(lines["timing"]["generated"])
    assert prompt + generated == 16
    assert lines["timing"]["reason"] == "length: the cache's 16 positions are full; raise --max-positions"
    assert lines["load"]["detail"].startswith("torch, f32, cache for 16 positions; ")
    r = generate("torch", tmp_path, "--max-new-tokens", "2")  # max_new_tokens reached: a plain "length"
    assert timing_lines(r.stderr)["timing"]["reason"] == "length"


@pytest.mark.slow
@pytest.mark.torch
def test_torch_compile_reports_its_compile_apart_and_caches_it(tmp_path):
    cold = generated_lines("torch-compile", tmp_path)
    assert cold["compile"]["what"] == "compile"
    assert cold["compile"]["cache"].startswith("cache miss: ")
    assert f"compiled and written to {tmp_path / 'inductor'}" in cold["compile"]["cache"]
    warm = generated_lines("torch-compile", tmp_path)
    assert warm["compile"]["cache"].startswith("cache hit: ")
    assert warm["stdout"] == cold["stdout"]


@pytest.mark.torch
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_torch_threads_follow_the_cpu_affinity_not_the_machine():
    pytest.importorskip("torch")
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from linnet.runtimes.backends.threads import set_torch_threads; import torch; "
        "print(set_torch_threads(), torch.get_num_threads())"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch threads 1 (the cores this process may use) 1"
    env["OMP_NUM_THREADS"] = "1"
    code = code.replace("{min(os.sched_getaffinity(0))}", "os.sched_getaffinity(0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.stdout.strip() == "torch threads 1 (OMP_NUM_THREADS) 1", r.stderr


@pytest.mark.torch
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
@pytest.mark.parametrize(
    "value, line",
    [
        (
            "abc",
            "torch threads 1 (the cores this process may use; warning: OMP_NUM_THREADS='abc' is not a positive "
            "integer, ignored) 1",
        ),
        (
            "0",
            "torch threads 1 (the cores this process may use; warning: OMP_NUM_THREADS='0' is not a positive "
            "integer, ignored) 1",
        ),
        ("7", "torch threads {n} (OMP_NUM_THREADS=7, capped by PyTorch at {n}) {n}"),
    ],
)
def test_omp_num_threads_is_reported_as_pytorch_took_it(value, line):
    """OMP_NUM_THREADS=abc, 0 and 7 each printed `torch threads 2 (OMP_NUM_THREADS)` on 2 cores: an invalid value
    was reported as the user's choice, and a capped one as taken."""
    pytest.importorskip("torch")
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from linnet.runtimes.backends.threads import set_torch_threads; import torch; "
        "print(set_torch_threads(follow_load=False), torch.get_num_threads())"
    )
    env = dict(os.environ, OMP_NUM_THREADS=value)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    if value == "7":
        n = int(r.stdout.split()[-1])
        if n == 7:
            pytest.skip("PyTorch took all 7 threads here")
        line = line.format(n=n)
    assert r.stdout.strip() == line


def fake_cpu_times(monkeypatch, busy: dict[int, float]):
    """/proc/stat as if CPU n had been busy `busy[n]` of the sample (100 ticks) and idle the rest."""
    samples = iter([{n: (0, 0) for n in busy}, {n: (round(100 * (1 - b)), 100) for n, b in busy.items()}])
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads, "usable_cores", lambda: set(busy))


@pytest.mark.parametrize(
    "busy, chosen",
    [
        ({0: 0.0, 1: 0.0}, (2, "the cores this process may use")),
        ({0: 1.0, 1: 0.0}, (1, "1.0 of the 2 cores this process may use are idle")),
        ({0: 1.0, 1: 1.0}, (1, "0.0 of the 2 cores this process may use are idle")),
        ({2: 0.0, 3: 0.5, 4: 1.0, 5: 1.0}, (2, "1.5 of the 4 cores this process may use are idle")),
    ],
)
def test_torch_threads_leave_out_the_cores_other_processes_keep_busy(monkeypatch, busy, chosen):
    fake_cpu_times(monkeypatch, busy)
    assert threads.choose_torch_threads() == chosen


def test_torch_threads_without_per_cpu_counters_are_the_affinity(monkeypatch):
    def unreadable():
        raise OSError("no /proc/stat")

    monkeypatch.setattr(threads, "_cpu_times", unreadable)
    assert threads.choose_torch_threads() == (len(usable_cores()), "the cores this process may use")


def test_torch_threads_for_thread_specific_kernels_ignore_the_load(monkeypatch):
    """torch.compile's cached kernels depend on the thread count: it must not change with the load."""
    fake_cpu_times(monkeypatch, {cpu: 1.0 for cpu in usable_cores()})
    assert threads.choose_torch_threads(follow_load=False) == (len(usable_cores()), "the cores this process may use")
    from linnet.runtimes.backends import BACKENDS

    assert [b.name for b in BACKENDS.values() if b.thread_specific] == ["torch-compile", "cuda-graphs"]


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat")
def test_proc_stat_names_the_cpus_of_the_affinity():
    times = threads._cpu_times()
    assert usable_cores() <= set(times) and all(0 <= idle <= total for idle, total in times.values())
    assert 0.0 <= threads.idle_cores(usable_cores(), 0.05) <= len(usable_cores())


@pytest.mark.torch
def test_run_json_reports_load_and_the_first_call_apart(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, LINNET_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "linnet", "run", "examples/mlp.linnet", "--preset", "tiny", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    import json

    report = json.loads(r.stdout)
    assert report["load_s"] >= 0 and report["time_ms"] >= 0
    first = report["first_call"]
    assert first["what"] == "" and first["seconds"] >= 0  # eager PyTorch compiles nothing


class RecordingStepModel:
    """A StepModel whose logits favour token (last input + 1), recording what `warm_up` was asked to compile."""

    max_batch, max_positions, vocab_size = 2, 32, 16
    compile_kind = "compile"

    def __init__(self):
        self.warmed: list[tuple[list[int], list[int]]] = []

    def warm_up(self, prefill_lengths, batch_sizes):
        self.warmed.append((list(prefill_lengths), list(batch_sizes)))

    def step(self, input_ids, positions, rows):
        logits = np.zeros((input_ids.shape[0], self.vocab_size), dtype=np.float32)
        logits[np.arange(input_ids.shape[0]), (input_ids[:, -1] + 1) % self.vocab_size] = 1
        return logits


def test_warm_up_asks_for_the_prefill_chunks_and_decode_batch():
    from linnet.runtimes.generation import Generator

    model = RecordingStepModel()
    Generator(model, None).warm_up(11)
    Generator(model, None, prefill_chunk=4).warm_up(11)
    Generator(model, None).warm_up(50, batch_size=5)  # clamped to the cache: 31 positions, 2 rows
    assert model.warmed == [([11], [1]), ([3, 4], [1]), ([31], [2])]


def test_warm_up_is_a_no_op_for_a_model_without_one():
    from linnet.runtimes.generation import Generator

    class Plain(RecordingStepModel):
        warm_up = None

    Generator(Plain(), None).warm_up(5)  # nothing to call, nothing raised
