"""`linnet check --jobs N` (issue 45): a big file's items checked in forked workers print exactly what one process
prints, in the same order; the workers really ran, also where a share uses what an earlier share's checks made
(an item's check prints the same whatever was checked before it: a file for each way it once did not); a worker
that dies leaves the parent to check every share itself, with the same output; a big file is forked by default."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linnet.cli import main
from linnet.semantics import parallel
from linnet.semantics.program import Document
from linnet.semantics.render import render_text
from tests.conftest import EXAMPLES, ROOT

sys.path.insert(0, str(ROOT / "bench"))
import bigdoc_source  # noqa: E402  (bench/ is not a package; stdlib-only)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="worker processes are forked (POSIX)")

CASES = ROOT / "tests" / "semantics" / "cases"
COPIES = 12  # 60 modules: three shares of at least 16 (too few items for a head checked before the fork)


def rendered(path: str, text: str, jobs: int) -> tuple[str, int]:
    """The diagnostics of `text` checked with `jobs` processes, as `linnet check` prints them, and how many of
    its items the workers checked."""
    analysis = Document(path, text).analyze(jobs=jobs)

    def read(p: str) -> str:
        return text if p == path else Path(p).read_text(encoding="utf-8")

    return "\n\n".join(render_text(d, read) for d in analysis.diagnostics), len(analysis.remote)


def test_workers_print_what_one_process_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    path = tmp_path / "big.linnet"
    path.write_text(bigdoc_source.big_source(COPIES), encoding="utf-8")
    outputs = []
    for jobs in ("1", "3"):
        rc = main(["check", "--jobs", jobs, str(path)])
        out, err = capsys.readouterr()
        outputs.append((rc, out, err))
    assert outputs[0][0] == 1 and outputs[0][1].count("error[") == 10 * COPIES
    assert outputs[1] == outputs[0]


def test_the_workers_check_most_items_and_the_labels_stay_those_of_one_process():
    text = bigdoc_source.big_source(COPIES)
    alone, remote_alone = rendered("/tmp/big.linnet", text, 1)
    shared, remote = rendered("/tmp/big.linnet", text, 3)
    assert remote_alone == 0 and remote >= 30  # two of three shares of 55 modules were the workers'
    # every copy's `Embedding(c.vocab_size, c.hidden_size)` is its own cache entry (the sizes as written, not their
    # values), so each copy's L202 labels its own preset's `vocab_size = 49152`: the first copy's (line 35) once
    assert shared == alone
    assert len(re.findall(r"vocab_size = 49152, hidden_size = 576.*\n.*`vocab_size` = 49152", alone)) == COPIES
    assert len(re.findall(r"\n +35 \|     vocab_size = 49152", alone)) == 1


def test_shares_that_use_an_earlier_shares_entries_print_what_one_process_prints(monkeypatch):
    # every place a share may start: a copy's modules then fall in two shares, and the second uses the instances
    # and config atoms the first one made; its own make the same entries, so the workers' checks count (before,
    # every share was checked again in the parent)
    monkeypatch.setattr(parallel, "independent_cuts", lambda items, by_name: [True] * len(items))
    text = bigdoc_source.big_source(COPIES)
    shared, remote = rendered("/tmp/big.linnet", text, 3)
    assert remote >= 30
    assert shared == rendered("/tmp/big.linnet", text, 1)[0]


# Files whose second module's check printed something else when the first one had been checked before it in the
# process (one process) than when it had not (a worker's share): each effect's own. The padding makes the first
# module's text half the file's, so that two shares split them.
PADDING = "".join(f"        # padding line {n}, so that this module's text is half the file's\n" for n in range(8))
FIRST_USE_DISPLAY = f"""config Inner {{
    n: int = 4
}}

module A(c: Inner) {{
    fn forward(x: [B, c.n]) -> [B, 3] {{
{PADDING}        x
    }}
}}

module B2(k: Inner) {{
    fn forward(x: [B, k.n]) -> [B, 3] {{
        x
    }}
}}
"""
UNKNOWN_FIELD = f"""config C {{
    d: int
    e: int = 4
}}

module A(c: C) {{
    fn forward(x: [B, c.d]) -> [B, c.e] {{
{PADDING}        x
    }}
}}

module B2(cfg: C) {{
    fn forward(x: [B, cfg.d]) -> [B, cfg.e] {{
        x
    }}
}}
"""
DIVISION_ORDER = f"""config C {{
    d: int
}}

module A(c: C) {{
    fn forward(x: [c.d / 2]) -> [c.d / 2] {{
{PADDING}        x
    }}
}}

module B2(c: C) {{
    fn forward(x: [S, S * (c.d / 2)]) -> [S, 3] {{
        x
    }}
}}
"""


def _split_in_two(monkeypatch) -> None:
    """Shares of one item each, none checked before the fork, a share starting at every item."""
    monkeypatch.setattr(parallel, "MIN_ITEMS_PER_JOB", 1)
    monkeypatch.setattr(parallel, "WARM_SHARE", 0.0)
    monkeypatch.setattr(parallel, "independent_cuts", lambda items, by_name: [True] * len(items))


@pytest.mark.parametrize(
    "text, second",
    [
        # a config value's field atom was made by its first use, with that use's way of writing it: B2's messages
        # said `c.n` where it wrote `k.n` (siglip.linnet's model printed its `c.vision_config.hidden_size` as the
        # vision tower's `c.hidden_size`); a worker checking B2 alone printed `k.n`
        (FIRST_USE_DISPLAY, "returns [B, k.n], declared [B, 3] ([B, 4] vs [B, 3])"),
        # the same for a field of unknown value (no default), which compares by atom: `cfg.d` and `c.d` alias one
        (UNKNOWN_FIELD, "returns [B, cfg.d], declared [B, cfg.e] ([B, cfg.d] vs [B, 4])"),
        # a written division's atom ordered a product by when it was first made: after B2's `S` in a worker,
        # before it where A had made it
        (DIVISION_ORDER, "returns [S, (c.d / 2) * S], declared [S, 3]"),
    ],
    ids=["first-use-display", "unknown-field", "division-order"],
)
def test_a_check_prints_the_same_whatever_was_checked_before_it(text, second, monkeypatch):
    _split_in_two(monkeypatch)
    alone, remote_alone = rendered("/tmp/order.linnet", text, 1)
    shared, remote = rendered("/tmp/order.linnet", text, 2)
    assert remote_alone == 0 and remote == 1  # B2 was the worker's
    assert shared == alone
    assert second in alone.split("\n\n")[-1]


def test_two_ways_of_writing_an_unknown_field_are_one_value():
    text = """config C {
    d: int
}

module Inner(cfg: C) {
    fn forward(x: [B, cfg.d]) -> [B, cfg.d] {
        x
    }
}

module Outer(c: C) {
    inner: Inner(c)

    fn forward(x: [B, c.d]) -> [B, c.d] {
        inner(x)
    }
}
"""
    assert rendered("/tmp/alias.linnet", text, 1)[0] == ""


def test_an_exact_quotient_of_an_unknown_field_written_two_ways_is_one_value():
    # `k.d / 2` in Outer and `c.d / 2` in Inner, of one config value: each way of writing `d` is its own atom
    # (aliased), and the quotient atoms were keyed by those atoms, so the call said `argument `x` of `inner` is
    # [B, k.d / 2], expected [B, c.d / 2]` (0400f9a: no error; `//` and `%` compare by their canonical values)
    text = """config C {
    d: int
}

module Inner(c: C) {
    fn forward(x: [B, c.d / 2, S]) -> [B, S * (c.d / 2)] {
        reshape(x, [B, S * (c.d / 2)])
    }
}

module Outer(k: C) {
    inner: Inner(k)

    fn forward(x: [B, k.d / 2, S]) -> [B, (k.d / 2) * S] {
        inner(x)
    }

    fn halves(x: [B, k.d / 2]) -> [B, 2 * (k.d / 2)] {
        concat([x, x], dim=-1)
    }
}
"""
    assert rendered("/tmp/alias.linnet", text, 1)[0] == ""


def test_an_exact_quotient_is_one_value_however_its_known_operands_are_written():
    # `k.d / k.e` and `k.d / 4` against `c.d / c.e` (e = 4) of one config value: a quotient of unknown value was keyed
    # by its operands as written, so main said L203 `k.d / k.e vs c.d / c.e` (0400f9a: `c.d / 4 vs c.d / c.e`)
    text = """config C {
    d: int
    e: int = 4
}

module Inner(c: C) {
    fn forward(x: [B, c.d], y: [B, c.d / c.e]) -> [B, c.d + c.d / c.e] {
        concat([x, y], dim=-1)
    }
}

module Outer(k: C) {
    inner: Inner(k)

    fn forward(x: [B, k.d], y: [B, k.d / k.e]) -> [B, k.d + k.d / k.e] {
        inner(x, y)
    }

    fn literal(x: [B, k.d], y: [B, k.d / 4]) -> [B, k.d + k.d / 4] {
        inner(x, y)
    }
}
"""
    assert rendered("/tmp/alias.linnet", text, 1)[0] == ""


def test_a_message_prints_an_unknown_field_as_written():
    # messages that print a dim's value (`.val`) printed the atom the ways of writing a field stand for, `C.d`, a
    # name the source never writes (0400f9a: `k.d * B`)
    text = """config C {
    d: int
}

module Outer(k: C) {
    fn f(x: [B, k.d]) -> [B, 1] {
        reshape(x, [B, 1])
    }

    fn g(x: [B, k.d], w: [k.d + 1, 2]) -> [B, 2] {
        x @ w
    }
}
"""
    out = rendered("/tmp/alias.linnet", text, 1)[0]
    assert "element count: k.d * B vs B" in out and "k.d vs k.d + 1" in out
    assert "C.d" not in out


def test_imported_configs_are_evaluated_before_any_check(tmp_path):
    # a config only an imported item names was evaluated at its defaults by the first check that reached it: its
    # atoms' ids (the order of a product's factors) were then the checks' order, a worker's share its own
    (tmp_path / "lib.linnet").write_text(
        "config Hidden {\n    n: int = 4\n}\n\nmodule Mlp(c: Hidden) {\n    w: [c.n, c.n]\n}\n", encoding="utf-8"
    )
    main_path = tmp_path / "main.linnet"
    text = 'from "lib.linnet" import Mlp\n\nfn f(x: [N]) -> [N] {\n    x\n}\n'
    analysis = Document(str(main_path), text).analyze(only=lambda item: False)
    assert "Hidden" in [i.name for i in analysis.context.evaluator._defaults]


def test_a_worker_that_dies_leaves_its_share_to_the_parent(monkeypatch):
    def dies(self, value):
        os._exit(3)

    monkeypatch.setattr(parallel._Pickler, "dump", dies)
    text = bigdoc_source.big_source(COPIES)
    shared, remote = rendered("/tmp/big.linnet", text, 3)
    assert remote == 0
    assert shared == rendered("/tmp/big.linnet", text, 1)[0]


@pytest.mark.parametrize(
    "path", sorted(CASES.glob("*.linnet")) + sorted(EXAMPLES.glob("*.linnet")), ids=lambda p: p.name
)
def test_every_case_and_example_checks_the_same_in_shares(path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_ITEMS_PER_JOB", 1)  # shares of a few items: every file is split
    monkeypatch.setattr(parallel, "WARM_SHARE", 0.0)
    text = path.read_text(encoding="utf-8")
    assert rendered(str(path), text, 3)[0] == rendered(str(path), text, 1)[0]


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_jobs_must_be_a_positive_whole_number(value, capsys):
    assert main(["check", "--jobs", value, str(EXAMPLES / "llama.linnet")]) == 2
    assert "argument --jobs: expected" in capsys.readouterr().err


def test_a_big_file_is_checked_in_every_usable_cpu_by_default(tmp_path, monkeypatch):
    from linnet.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["check", "x.linnet"]).jobs is None
    assert parser.parse_args(["check", "--jobs", "auto", "x.linnet"]).jobs == len(parallel.usable_cpus())
    asked = []
    real_analyze = Document.analyze

    def analyze(self, preset=None, only=None, jobs=1):
        asked.append((Path(self.source.path).name, jobs))
        return real_analyze(self, preset, only, jobs=1)  # what was asked is the point, not the fork

    monkeypatch.setattr(Document, "analyze", analyze)
    big = tmp_path / "big.linnet"
    big.write_text(bigdoc_source.big_source(7), encoding="utf-8")  # 67,000 characters
    main(["check", str(big), str(EXAMPLES / "llama.linnet")])
    cpus = len(parallel.usable_cpus()) if parallel.can_fork() else 1
    assert asked == [("big.linnet", cpus), ("llama.linnet", 1)]
    assert parallel.default_jobs("x" * (parallel.DEFAULT_JOBS_MIN_CHARS - 1)) == 1


def test_shares_start_only_where_no_item_names_one_before():
    document = Document("/tmp/big.linnet", bigdoc_source.big_source(COPIES))
    items = [i for i in document.items if i.kind in ("module", "fn")]
    own = {i.name: i for i in document.items}
    cuts = parallel.independent_cuts(items, own)
    # each copy's five modules name each other and the copy's config; the copies name nothing of each other
    # (the comment above copy 1 naming `LlamaForCausalLM_1` ends copy 0's last item's text)
    assert [p for p, cut in enumerate(cuts) if cut] == list(range(0, 5 * COPIES, 5))
    runs = parallel.shares(items, 3, cuts)
    assert len(runs) == 3 and [i for run in runs for i in run] == items
    assert all(run[0].name.startswith("LlamaMLP_") for run in runs)


def test_a_fork_that_fails_leaves_every_share_to_the_parent(monkeypatch):
    # os.fork raises OSError (EAGAIN: the process limit; ENOMEM) after the first worker started: that worker is
    # ended and the parent checks every share itself, as one process does, without a traceback
    real_fork, forks = os.fork, []

    def fork_once():
        if forks:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        forks.append(real_fork())
        return forks[-1]

    monkeypatch.setattr(os, "fork", fork_once)
    text = bigdoc_source.big_source(COPIES)
    shared, remote = rendered("/tmp/big.linnet", text, 3)
    assert remote == 0 and forks and forks[0] != 0
    with pytest.raises(ChildProcessError):  # the worker that started was ended and reaped
        os.waitpid(forks[0], os.WNOHANG)
    assert shared == rendered("/tmp/big.linnet", text, 1)[0]


def test_an_interrupted_parent_ends_its_workers(monkeypatch):
    # Ctrl-C (KeyboardInterrupt) while the parent waits for its workers: they are ended and reaped, not left to
    # run their shares to the end as orphans
    real_worker, started = parallel._worker, []

    def slow_worker(*args):
        time.sleep(60)  # a share that takes long
        real_worker(*args)

    def interrupted(self):
        started.extend(pid for pid, _ in self.workers)
        raise KeyboardInterrupt

    monkeypatch.setattr(parallel, "_worker", slow_worker)
    monkeypatch.setattr(parallel.Forked, "collect", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            Document("/tmp/big.linnet", bigdoc_source.big_source(COPIES)).analyze(jobs=3)
        assert len(started) == 2
        for pid in started:
            with pytest.raises(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    finally:
        for pid in started:  # before the fix: end them here so that no test leaves processes behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def test_sizes_that_recur_across_the_file_still_let_the_workers_checks_count():
    # each copy's smollm2_135m vocabulary is one of three sizes: copies in different shares once made the same
    # cache entry (`Embedding(1001, 576)`, keyed by the sizes' values), which sent every share back to the parent
    # (then every share was checked again in the parent); keyed by the sizes as written (each copy's
    # `c.vocab_size`), they make entries of their own
    copies = re.split(r"(?=^config Llama_\d+ )", bigdoc_source.big_source(COPIES), flags=re.M)
    text = "".join(part.replace("vocab_size = 49152", f"vocab_size = {1000 + k % 3}") for k, part in enumerate(copies))
    shared, remote = rendered("/tmp/big.linnet", text, 3)
    assert shared == rendered("/tmp/big.linnet", text, 1)[0]
    assert remote >= 30


_KILLED_PARENT = """
import sys, time
sys.path.insert(0, {bench!r})
import bigdoc_source
from linnet.semantics import parallel
from linnet.semantics.program import Document

real_worker, real_collect = parallel._worker, parallel.Forked.collect

def slow_worker(*args):
    time.sleep(60)
    real_worker(*args)

def collect(self):
    print(*[pid for pid, _ in self.workers], flush=True)
    return real_collect(self)

parallel._worker, parallel.Forked.collect = slow_worker, collect
Document("/tmp/big.linnet", bigdoc_source.big_source({copies})).analyze(jobs=3)
"""


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (one that exited, waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers' parent-death signal is Linux's")
def test_workers_end_when_their_parent_is_killed():
    # SIGTERM or SIGKILL of `linnet check` (a CI timeout, an editor's task stopped) gives it no chance to end its
    # workers: they must not run their shares on as orphans
    code = _KILLED_PARENT.format(bench=str(ROOT / "bench"), copies=COPIES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    try:
        assert len(workers) == 2
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_running, workers))
    finally:
        for pid in workers:  # before the fix: end them here so that no test leaves processes behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# mistral.linnet with a preset of 0 attention heads (its `head_dim` given, so the config itself evaluates), and a
# second module building llama.linnet's layer that nothing names, so a share of its own can start at it
BAD_HEADS = (
    "    num_attention_heads = 32, num_key_value_heads = 8, head_dim = 128,",
    "    num_attention_heads = 0, num_key_value_heads = 8, head_dim = 128,",
)
LAYER_PAIR = """
## Two decoder layers side by side.
module MistralLayerPair(c: Mistral) {
    first: LlamaDecoderLayer(c)
    second: LlamaDecoderLayer(c)
}
"""


def test_what_imported_modules_find_under_the_importers_presets_is_the_same_in_shares(tmp_path, capsys, monkeypatch):
    # imported.py reads the call information of the importer's checks, which a worker's share keeps to itself: the
    # layers MistralLayerPair builds (checked by a worker) went unchecked, and `--jobs 3` printed 1 error of 3
    _split_in_two(monkeypatch)
    monkeypatch.setenv("NO_COLOR", "1")
    (tmp_path / "llama.linnet").write_text((EXAMPLES / "llama.linnet").read_text(encoding="utf-8"), encoding="utf-8")
    text = (EXAMPLES / "mistral.linnet").read_text(encoding="utf-8")
    assert text.count(BAD_HEADS[0]) == 1
    path = tmp_path / "mistral.linnet"
    path.write_text(text.replace(*BAD_HEADS) + LAYER_PAIR, encoding="utf-8")
    assert "MistralLayerPair" in [i.name for i in Document(str(path), path.read_text()).analyze(jobs=3).remote]
    outputs = []
    for jobs in ("1", "3"):
        rc = main(["check", "--jobs", jobs, str(path)])
        outputs.append((rc, *capsys.readouterr()))
    assert outputs[1] == outputs[0]
    out = outputs[0][1]
    # the stack's layers and the pair's two, each at the member that builds it, the imported line labelled
    assert (
        out.count("error[L213]: `LlamaDecoderLayer` under this config: axis `h` has size c.num_attention_heads = 0")
        == 3
    )
    assert "first: LlamaDecoderLayer(c)" in out and "second: LlamaDecoderLayer(c)" in out
    assert out.count("= note: under preset `mistral_7b_instruct_v0_3`") == 3
