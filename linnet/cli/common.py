"""What the `linnet` commands that load a backend share: exit codes, the common options (`add_common`), option
parsing (`--config`, `--dim`, `--prompt-ids`), loading a model from the options through the registry
(`load_model`), and the lines they print about it (notes, compile and timing lines).

Like the rest of the CLI these import lazily: building the parser imports no runtime (`BACKEND_NAMES` reads the
registry only when `--backend` is parsed or help is printed, so `linnet check` never imports it), and every backend is
handled alike: numpy in, numpy out (`LoadedModel.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from linnet.errors import BackendError, LinnetError, UnknownPreset

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2
# Set by `linnet.cli.entry` when the process ends at once after this command (FAST_EXIT_COMMANDS, `os._exit`): a
# command then leaves the collector as it set it (`linnet check` turns it off)
EXITS_AT_ONCE = False


class UsageError(ValueError):
    """An option value the command cannot take (`--config` without `=`, a bad `--dim`): exit 2."""


# what a command reports as a one-line error (exit 1): Linnet's errors, bad values, unreadable files
FAILURES = (LinnetError, ValueError, OSError)


class _BackendNames:
    """The registry's backend names as argparse `choices`, read on first use (parsing `--backend`,
    or printing help or a usage error), so that building the parser imports no runtime."""

    def _names(self) -> list[str]:
        from linnet.runtimes.backends import BACKENDS

        return list(BACKENDS)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


BACKEND_NAMES = _BackendNames()


BACKEND_HELP = "one of %(choices)s (default %(default)s; `linnet backends` lists them)"


def parse_config(items: list[str] | None) -> dict:
    """`--config key=value` pairs as a dict; values read as JSON (`8`, `1e-5`, `true`,
    `null`, `{"rope_type": "llama3"}`), else as strings. Raises UsageError for a pair
    without `=`, or one with bytes that are not UTF-8 (naming --config)."""
    out: dict = {}
    for item in items or []:
        check_utf8("--config", item)
        if "=" not in item:
            raise UsageError(f"--config takes key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = {"none": None, "True": True, "False": False}.get(raw, raw)
        except RecursionError:
            raise UsageError(f"--config {key.strip()}=...: the value nests arrays or objects too deeply") from None
        out[key.strip()] = value
    return out


def add_common(
    p: argparse.ArgumentParser,
    weights: bool = True,
    file_help: str | None = None,
    max_batch: int = 1,
    stored: bool = False,
) -> None:
    """The options every model command takes; with `file_help`, FILE is optional and described by it;
    `max_batch` is the default of `--max-batch`; `stored`: `--dtype stored` is offered (the commands that run
    a loaded model: run, generate, serve)."""
    if file_help is None:
        p.add_argument("file", metavar="FILE", help="a .linnet source with a root model")
    else:
        p.add_argument("file", metavar="FILE", nargs="?", help=file_help)
    p.add_argument("--preset", metavar="NAME", help="the preset to build (default: the first with default weights)")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    if stored:
        p.add_argument(
            "--dtype",
            choices=("f32", "bf16", "f16", "stored"),
            default="f32",
            help="working dtype (default f32); stored: a GGUF file's quantized matrices stay quantized (weight-only "
            "quantized matmuls), the rest runs in f32",
        )
        p.add_argument(
            "--cpu-offload-gb",
            type=gib,
            default=None,
            metavar="GiB",
            help="hold that many GiB of the layers' weights in host memory and stream them to the device each step, "
            "for a model larger than the device (vLLM's option; the jax and xla backends)",
        )
    else:
        p.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32", help="working dtype (default f32)")
    p.add_argument("--max-positions", type=at_least_one, default=768, metavar="N", help="cache positions per row (768)")
    p.add_argument("--max-batch", type=at_least_one, default=max_batch, metavar="N", help=f"cache rows ({max_batch})")
    if weights:
        p.add_argument("--weights", metavar="W", help="HF directory, .gguf file or embedded id")
        p.add_argument("--numerics", choices=("equivalent", "fast"), default="equivalent")
        p.add_argument("--device", default="cpu", help=DEVICE_HELP)


def at_least_one(text: str) -> int:
    """A count of cache rows or positions: an integer >= 1. Raises argparse.ArgumentTypeError (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes an integer >= 1, got {text!r}")
    return value


def gib(text: str) -> float:
    """`--cpu-offload-gb`'s value: a finite number of GiB >= 0. Raises argparse.ArgumentTypeError (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"takes a number of GiB >= 0 (8, 7.5), got {text!r}")
    return value


DEVICE_HELP = "cpu (the default), cuda[:N] or tpu[:N]; `linnet backends` lists which backend runs on which"


def fail(cmd: str, err: Exception) -> int:
    """Print `err` for `cmd`; the exit status: 2 for a file that cannot be read or written, or an
    option value the command cannot take (usage or I/O: a `--preset` the source does not declare), 1 for
    anything else."""
    print(f"linnet {cmd}: {err}", file=sys.stderr)
    return EXIT_USAGE if isinstance(err, (OSError, UsageError, UnknownPreset)) else EXIT_ERRORS


def check_paths(args: argparse.Namespace) -> None:
    """Refuse a FILE or --weights path with bytes that are not UTF-8: the generated code, ONNX's
    metadata and JAX's locations quote the paths as text, and died with a bare "'utf-8' codec
    can't encode character '\\udcff'". Raises UsageError naming the argument; rename the file."""
    check_utf8("FILE", args.file)
    if getattr(args, "weights", None):
        check_utf8("--weights", args.weights)


def build_program(args: argparse.Namespace, entries=None):
    from linnet.ir import build

    check_paths(args)
    return build(
        args.file,
        preset=args.preset,
        config=parse_config(args.config),
        dtype="f32" if args.dtype == "stored" else args.dtype,  # the front end's working dtype (gguf_quants)
        max_batch=args.max_batch,
        max_positions=args.max_positions,
        entries=entries,
    )


def write_output(text: str, out: str | None, cmd: str) -> int:
    """Write `text` to `out` (stdout without it). Returns the exit status: a path that cannot be
    written is a usage error naming it, not a traceback."""
    if not out:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as err:
        print(f"linnet {cmd}: cannot write {out}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out}", file=sys.stderr)
    return EXIT_OK


def load_model(args: argparse.Namespace, random_weights: bool, throughput: bool = False):
    """The model of `args.file` on `--backend`, through the registry, with the backend's
    persistent compile cache on (`linnet.runtimes.backends.caches`) and, on PyTorch, one thread per idle
    core of the process's CPU affinity (per core of it where the compiled kernels are specialised to
    the thread count, `Backend.thread_specific`; `linnet.runtimes.backends.threads`); `args.setup` says what
    was chosen.
    `throughput` (`linnet serve`): on an accelerator the JAX backends' layers unrolled, unless `LINNET_SCAN_LAYERS`
    says otherwise (the scanned decode step costs ~8 % more a 32-row batch on a TPU:
    `jax_backend.SCAN_ON_ACCELERATORS`).
    Raises LinnetError (a backend option it lacks included), ValueError (a bad `--config`) or
    OSError."""
    from linnet.runtimes.backends import BACKENDS, get_backend
    from linnet.runtimes.parallel import load_options as tensor_parallel_options

    check_paths(args)
    backend = get_backend(args.backend)
    args.setup = backend.setup_process(args.device)
    options = {}
    if args.provider:
        if "providers" not in backend.options:
            takes = ", ".join(b.name for b in BACKENDS.values() if "providers" in b.options)
            raise BackendError(f"--provider is an option of {takes}, not of {backend.name}")
        options["providers"] = args.provider
    if getattr(args, "cpu_offload_gb", None) is not None:
        if "cpu_offload_gb" not in backend.options:
            takes = ", ".join(b.name for b in BACKENDS.values() if "cpu_offload_gb" in b.options)
            raise UsageError(f"--cpu-offload-gb is an option of {takes}, not of {backend.name}")
        options["cpu_offload_gb"] = args.cpu_offload_gb
    if throughput and "scan_layers" in backend.options and args.device != "cpu":
        from linnet.runtimes.backends.jax_backend import scan_layers_env

        if scan_layers_env() is None:  # unset or empty, as auto reads it
            options["scan_layers"] = False
    if getattr(args, "tensor_parallel", False):
        options.update(tensor_parallel_options(backend))  # JAX: every weight under its checkpoint name, split by it
    model = backend.load(
        args.file,
        args.weights,
        preset=args.preset,
        config=parse_config(args.config),
        dtype=args.dtype,
        numerics=args.numerics,
        device=args.device,
        max_batch=args.max_batch,
        max_positions=args.max_positions,
        random_weights=random_weights,
        progress=sys.stderr.isatty(),
        **options,
    )
    if getattr(args, "tensor_parallel", False):
        from linnet.runtimes.parallel import tensor_parallel

        model, reports = tensor_parallel(model)
        if not reports:  # every rank computes the same tokens: rank 0 alone prints them
            sys.stdout = sys.stderr = open(os.devnull, "w")
    return model


def parse_ids(text: str | None) -> list[int] | None:
    """`--prompt-ids 1,2,3` as [1, 2, 3] (None without the option). Raises UsageError for an
    item that is not an integer >= 0, naming it (the range of the vocabulary is checked later)."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    bad = next((t for t in items if not (t.isascii() and t.isdigit())), None)
    if bad is not None:
        raise UsageError(f"--prompt-ids takes token ids >= 0 separated by commas (1,2,3), got {bad!r} in {text!r}")
    return [int(t) for t in items]


def watch_compile(args: argparse.Namespace, what: str):
    """`caches.watch` for `--backend`'s framework: times the block, counts its cache hits."""
    from linnet.runtimes.backends import caches, get_backend

    return caches.watch(get_backend(args.backend).family, what)


def cache_positions(model, args) -> int:
    """The positions the loaded model's cache holds: `--max-positions`, or fewer where loading capped it (a
    learned position table, `runtimes.loading.learned_position_rows`)."""
    program = model.program
    return program.max_positions if program is not None else args.max_positions


def timing_line(r, max_new_tokens: int, max_positions: int, capped: bool = False) -> str:
    """The last stderr line of `generate`: why it stopped, the time to first token (prefill and the
    first sampled token) and the decode rate (decode steps over their own time); neither includes
    loading or compiling, which have their lines. A "length" stop before `max_new_tokens` tokens
    is the cache's row filling up, and says so: "(length: the cache's 16 positions are full; raise
    --max-positions)"; or, where the model's learned position table capped the cache (`capped`), that
    the model has no more positions."""
    reason = r.finish_reason
    if reason == "length" and len(r.token_ids) < max_new_tokens:
        if capped:
            reason = f"length: the model's {max_positions} positions (n_positions) are full"
        else:
            reason = f"length: the cache's {max_positions} positions are full; raise --max-positions"
    if r.decode_steps:
        decode = f"decode {r.decode_tokens_per_s:.1f} tokens/s ({r.decode_steps} steps in {r.decode_s:.2f} s)"
    else:
        decode = "no decode step"
    return (
        f"prompt {r.prompt_tokens} tokens, {len(r.token_ids)} generated ({reason}); "
        f"time to first token {r.prefill_s * 1000:.0f} ms, {decode}"
    )


def check_utf8(flag: str, value: str) -> None:
    """Refuse a command-line value with bytes that are not UTF-8 (Python passes them on as lone
    surrogates, `os.fsdecode`'s surrogateescape). Raises UsageError (a ValueError) naming the flag,
    the byte and its position in the argument's bytes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(value)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(
                f"{flag} is not valid UTF-8: byte 0x{raw[err.start]:02x} at byte {err.start} of {raw!r}"
            ) from None
        raise UsageError(f"{flag} is not valid Unicode (a lone surrogate)") from None


def print_notes(model) -> None:
    for note in model.notes:
        print(f"note: {note}", file=sys.stderr)


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """`--dim NAME=SIZE` pairs as a dict (`["N=8"]` -> `{"N": 8}`). Raises UsageError for a pair
    without `=`, a name that is not an identifier, a size that is not a positive integer, or a
    name given twice (the last one silently won)."""
    out: dict[str, int] = {}
    for item in items or []:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise UsageError(f"--dim takes NAME=SIZE (for example N=8), got {item!r}")
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if size < 1:
            raise UsageError(f"--dim {name} must be a positive integer, got {raw!r}")
        if name in out:
            raise UsageError(f"--dim {name} is given twice ({name}={out[name]} and {name}={size}): give it once")
        out[name] = size
    return out


def use_default_preset(args: argparse.Namespace) -> None:
    """Without `--preset` and `--weights`, set `args.preset` to the first preset with default weights (None where
    there is none): a real checkpoint's config, not the config's defaults (Llama's are 7B parameters), as generation
    uses. Raises what checking the source raises."""
    if args.preset is not None or getattr(args, "weights", None) is not None:
        return
    from linnet.ir.build import check_source, read_source
    from linnet.runtimes.loading import default_preset

    args.preset = default_preset(check_source(*read_source(args.file)))
