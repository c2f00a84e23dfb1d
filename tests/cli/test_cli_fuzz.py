"""The CLI on hypothesis-generated argument lists: every subcommand, its flags (read from the real parser),
values of the right and wrong kinds, and paths that do and don't exist (sources that check, fail, or are not
UTF-8; a tiny checkpoint, a corrupt one; folders and files where the other is expected). Nothing may end in a
traceback or a hang: `main` returns 0, 1 or 2, and stderr holds no "Traceback".

Most lists run in this process through `linnet.cli.main` (fast; an escaping exception fails the example); a
smaller sweep runs `python -m linnet` in a subprocess with a timeout, with bytes that are not UTF-8 in the
arguments and a real stdout (where printing such text could fail). Left out: `lsp` (serves stdin until closed),
`serve` (serves HTTP until a signal; tests/runtimes/serve/test_http_*.py run it) and `--backend torch-compile`
(each compile takes tens of seconds; its loading is the `torch` backend's).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linnet.cli import build_parser, main
from tests.conftest import EXAMPLES, ROOT, installed

SKIPPED_COMMANDS = {"lsp", "serve"}
SKIPPED_VALUES = {"torch-compile"}
EXAMPLE_TIMEOUT_S = 120  # a hang, not a slow load: the slowest list here loads in a few seconds


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Paths the argument lists draw from, all in a temporary folder (fmt rewrites files in place)."""
    from tests.runtimes.test_corrupt_files import write_hf_folder

    root = tmp_path_factory.mktemp("cli-fuzz")
    out = {
        "mlp": root / "mlp.linnet",
        "dims": root / "vector_dims.linnet",
        "llama": root / "llama.linnet",
        "broken": root / "broken.linnet",
        "latin1": root / "latin1.linnet",
        "empty": root / "empty.linnet",
        "folder": root / "sources",
        "missing": root / "no" / "such.linnet",
        "weights": root / "tiny",
        "corrupt_weights": root / "corrupt",
        "gguf_garbage": root / "garbage.gguf",
        "out_file": root / "out" / "model.out",
        "out_missing_dir": root / "nowhere" / "model.out",
    }
    shutil.copy(EXAMPLES / "mlp.linnet", out["mlp"])
    shutil.copy(ROOT / "tests/fixtures/dims/vector_dims.linnet", out["dims"])
    shutil.copy(EXAMPLES / "llama.linnet", out["llama"])
    out["broken"].write_text("model M {\n    entry fn forward(x: [B, 4]) -> [B, 5] { x + }\n}\n")
    out["latin1"].write_bytes("# caf\u00e9\nconfig C { n: int = 1 }\n".encode("latin-1"))
    out["empty"].write_text("")
    out["folder"].mkdir()
    shutil.copy(EXAMPLES / "mlp.linnet", out["folder"] / "mlp.linnet")
    write_hf_folder(out["weights"])
    shutil.copytree(out["weights"], out["corrupt_weights"])
    weights = out["corrupt_weights"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    out["gguf_garbage"].write_bytes(b"GGUF" + bytes(range(256)) * 4)
    out["out_file"].parent.mkdir()
    return out


def option_values(action: argparse.Action, files: dict[str, Path], wrong: bool) -> st.SearchStrategy[str]:
    """Values for one option: its choices, numbers for int and float options, else names, paths and
    key=value pairs; with `wrong`, values of the wrong kind mixed in."""
    paths = st.sampled_from([str(p) for p in files.values()])
    junk = st.sampled_from(["", "-1", "0", "nan", "1e400", "x=y", "--", "\u00e9t\u00e9", "\U0001f600", "a" * 300])
    if action.choices is not None:
        right = st.sampled_from([str(c) for c in action.choices if str(c) not in SKIPPED_VALUES])
    elif action.type is int:
        right = st.integers(-3, 40).map(str) | st.sampled_from(["1000000000000", "2"])
    elif action.type is float:
        right = st.floats(-2, 5, allow_nan=False).map(str)
    elif action.dest in ("output", "serialized"):
        right = st.sampled_from([str(files["out_file"]), str(files["out_missing_dir"]), str(files["folder"])])
    elif action.dest == "weights":
        right = st.sampled_from([str(files["weights"]), str(files["corrupt_weights"]), str(files["gguf_garbage"])])
        right |= st.sampled_from(["smollm2-135m-instruct", str(files["missing"]), str(files["mlp"])])
    elif action.dest == "config":
        keys = st.sampled_from(["hidden_size", "in_features", "num_hidden_layers", "rope_scaling", "nope", ""])
        vals = st.sampled_from(["8", "0", "-4", "1.5", "true", "null", '{"rope_type": "llama3"}', "x", ""])
        right = st.builds(lambda k, v: f"{k}={v}", keys, vals) | st.just("no_equals_sign")
    elif action.dest == "dim":
        right = st.sampled_from(["N=4", "K=2", "N=0", "N=x", "B=2", "Q=1", "N"])
    elif action.dest == "prompt":
        right = st.sampled_from(["hello world", "", "the quick brown fox " * 20, "<|endoftext|>", "\u00e9"])
    elif action.dest == "preset":
        right = st.sampled_from(["tiny", "smollm2_135m", "nope"])
    elif action.dest == "entry":
        right = st.sampled_from(["forward", "step", "nope"])
    elif action.dest == "device":
        right = st.sampled_from(["cpu", "cpu", "cuda", "cpu:0", "tpu"])
    else:
        right = st.sampled_from(["tiny", "forward", "nope", "cpu"]) | paths
    return st.one_of(right, right, junk) if wrong else right


@st.composite
def argument_lists(draw, files: dict[str, Path]) -> list[str]:
    """A subcommand, some of its positionals (paths), some of its options (flags and values), shuffled a little,
    and sometimes an unknown flag or a stray word."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    name = draw(st.sampled_from(sorted(set(sub.choices) - SKIPPED_COMMANDS)))
    command = sub.choices[name]
    paths = st.sampled_from([str(p) for p in files.values()])
    sources = st.sampled_from([str(files[k]) for k in ("mlp", "mlp", "dims", "llama", "llama", "broken", "latin1")])
    args = [name]
    options = []
    wrong = not draw(st.integers(0, 3))  # a quarter of the lists mix in values of the wrong kind
    for action in command._actions:
        optional = action.option_strings and not action.required
        if isinstance(action, argparse._HelpAction) or (optional and draw(st.integers(0, 2))):
            continue
        if not action.option_strings:  # a positional: FILE or PATH...
            if draw(st.integers(0, 9)):  # usually present, usually a source
                one = st.one_of(sources, sources, sources, paths)
                args += draw(st.lists(one, min_size=1, max_size=2 if action.nargs == "+" else 1))
            continue
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            options.append([flag])
        else:
            options.append([flag, draw(option_values(action, files, wrong))])
    for option in draw(st.permutations(options)):
        args += option
    if name == "generate" and draw(st.integers(0, 4)):
        args += ["--max-new-tokens", "2"]  # keep most generations short; the rest keep the default
    if not draw(st.integers(0, 19)):
        args.insert(draw(st.integers(1, len(args))), draw(st.sampled_from(["--bogus", "extra", "-x", "--entry"])))
    return args


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_in_process(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(EXAMPLE_TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(args)
    except _Hang:
        pytest.fail(f"linnet {' '.join(args)} did not finish in {EXAMPLE_TIMEOUT_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.skipif(not installed("torch"), reason="the default backend is torch")
def test_cli_never_ends_in_a_traceback(files):
    @settings(
        max_examples=int(os.environ.get("LINNET_FUZZ_EXAMPLES", "150")),
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(argument_lists(files))
    def sweep(args):
        status, _, err = run_in_process(args)
        assert status in (0, 1, 2), (args, status, err)
        assert "Traceback" not in err, (args, err)

    sweep()


@pytest.mark.slow
@pytest.mark.skipif(not installed("torch"), reason="the default backend is torch")
def test_cli_processes_with_bytes_that_are_not_utf8(files):
    """In a real process, arguments with bytes that are not UTF-8 (Python hands them over as lone surrogates)
    and a real stdout: exit 0, 1 or 2, no traceback, no hang."""
    bad = b"caf\xe9"

    @settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(argument_lists(files), st.integers(0, 30), st.sampled_from([bad, b"\xff\xfe", b"ok"]))
    def sweep(args, where, payload):
        argv = [a.encode("utf-8", "surrogateescape") for a in args]
        argv.insert(1 + where % len(argv), payload)
        try:
            r = subprocess.run(
                [sys.executable.encode(), b"-m", b"linnet", *argv],
                cwd=ROOT,
                capture_output=True,
                timeout=EXAMPLE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{argv} did not finish in {EXAMPLE_TIMEOUT_S} s")
        stderr = r.stderr.decode("utf-8", "replace")
        assert r.returncode in (0, 1, 2), (argv, r.returncode, stderr)
        assert "Traceback" not in stderr, (argv, stderr)

    sweep()
