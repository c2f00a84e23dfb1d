"""`linnet run`: one entry on random inputs (and random weights unless `--weights`), or on an image or audio file
(`linnet.cli.image`, `linnet.cli.audio`); `--compare` runs it on several backends
(`linnet.runtimes.backends.compare`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from copy import copy
from pathlib import Path

from linnet.cli.common import (
    BACKEND_NAMES,
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    UsageError,
    add_common,
    build_program,
    check_paths,
    fail,
    load_model,
    parse_config,
    parse_dims,
    print_notes,
    use_default_preset,
    watch_compile,
)
from linnet.errors import AudioError


def cmd_run(args: argparse.Namespace) -> int:
    from linnet.runtimes.model import concrete_dim, random_inputs

    try:
        parse_dims(args.dim)  # a usage error before anything loads
        check_paths(args)
        if args.tolerance is not None and args.compare is None:
            raise UsageError("--tolerance is the agreement --compare asks of the backends; add --compare")
        for flag in ("image", "audio"):
            if getattr(args, flag) is not None and args.compare is not None:
                raise UsageError(
                    f"--{flag} runs the {flag} on one backend; drop --compare (or compare on random inputs)"
                )
    except UsageError as err:
        return fail("run", err)
    try:
        use_default_preset(args)  # random weights under a real checkpoint's config
    except FAILURES as err:
        return fail("run", err)
    if args.compare is not None:
        return compare_backends(args)
    if args.backend is None:
        args.backend = "torch"
    try:
        model = load_model(args, random_weights=args.weights is None)
    except FAILURES as err:
        return fail("run", err)
    program = model.program
    try:
        image, audio = _file_inputs(args, model)
        entry, graph, sizes = entry_and_sizes(args, program)
    except AudioError as err:  # a WAV that cannot be read: a usage error, as for `linnet transcribe --audio`
        print(f"linnet run: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FAILURES as err:
        return fail("run", err)
    if args.format != "json":
        print_notes(model)
        for path, read in ((args.image, image), (args.audio, audio)):
            if read is not None:
                print(f"note: {path}: {read.described}", file=sys.stderr)
    inputs = random_inputs(graph, sizes, args.seed, program.config.get("vocab_size", 100))
    files = {}
    if image is not None:
        files["pixel_values"] = image.pixel_values
    if audio is not None:
        files["input_features"] = audio.input_features
    inputs = [files.get(v.name, a) for v, a in zip(graph.inputs, inputs)]  # the files' arrays for their arguments
    try:
        outs, elapsed, compiled = _run_entry(args, model, entry, inputs)
    except FAILURES as err:
        return fail("run", err)
    weights = model.weights or "random weights"
    report = {
        "file": args.file,
        "entry": entry,
        "backend": args.backend,
        "preset": program.preset,
        "weights": str(weights),
        "inputs": [
            {"name": v.name, "shape": list(a.shape), "dtype": str(a.dtype)} for v, a in zip(graph.inputs, inputs)
        ],
        "outputs": [],
        "time_ms": elapsed * 1000,
        "load_s": model.load_s,
        "first_call": {
            "what": compiled.what,
            "seconds": compiled.seconds,
            "cache": compiled.cache,
            "cache_hits": compiled.hits,
            "cache_misses": compiled.misses,
        },
        "disagreements": [],
        "notes": list(model.notes),
    }
    for v, (shape, dtype, f) in zip(graph.outputs, outs):
        expected = [concrete_dim(d, sizes) for d in v.dims]
        report["outputs"].append(
            {
                "shape": list(shape),
                "dtype": str(dtype),
                "checker_shape": expected,
                # an output with a zero-sized dim (a size the checker allows) has no summary values
                "mean": float(f.mean()) if f.size else None,
                "std": float(f.std(ddof=1)) if f.size > 1 else (0.0 if f.size else None),
                "min": float(f.min()) if f.size else None,
                "max": float(f.max()) if f.size else None,
            }
        )
        if list(shape) != expected:
            report["disagreements"].append(f"the checker says {expected}, the runtime gave {list(shape)}")
    if image is not None:
        from linnet.cli import image as cli_image

        report["image"] = {"path": args.image, "preprocessing": image.described}
        report["top_labels"] = cli_image.top_labels(outs[0][2], image) if outs else []
    if audio is not None:
        report["audio"] = {"path": args.audio, "preprocessing": audio.described}
    if args.format == "json":
        print(json.dumps(report))
        return EXIT_ERRORS if report["disagreements"] else EXIT_OK
    print(
        f"{args.file}: entry {entry} ({args.backend}, {weights}), inputs "
        + ", ".join(f"{i['name']}{i['shape']}" for i in report["inputs"])
    )
    for out in report["outputs"]:
        if out["mean"] is None:
            print(f"  output {out['shape']} {out['dtype']}: empty")
            continue
        print(
            f"  output {out['shape']} {out['dtype']}: mean {out['mean']:.6g}, "
            f"std {out['std']:.6g}, min {out['min']:.6g}, max {out['max']:.6g}"
        )
    if image is not None:
        print("\n".join(cli_image.format_labels(report["top_labels"])))
    for d in report["disagreements"]:
        print(f"  disagreement: {d}")
    setup = f"; {args.setup}" if args.setup else ""
    print(f"  load {model.load_s:.2f} s{setup}; first call: {compiled.describe()}")
    print(f"  time {elapsed * 1000:.2f} ms (a second call)")
    return EXIT_ERRORS if report["disagreements"] else EXIT_OK


def _file_inputs(args: argparse.Namespace, model):
    """`linnet run`'s `--image` and `--audio`: each file read and preprocessed for the argument of the entry it
    fills (`linnet.cli.inputs`), (ImageInput or None, AudioInput or None), the entry's dim variables sized from
    them. Raises ValueError (an entry without the argument, naming its inputs), LoadError (an unreadable image)
    or AudioError (an unreadable WAV)."""
    from linnet.cli import inputs as cli_inputs

    if not cli_inputs.requested(args):
        return None, None
    graph = cli_inputs.entry_graph(args, model.program)
    cli_inputs.check_arguments(args, graph)
    image = audio = None
    if args.image is not None:
        from linnet.cli import image as cli_image

        image = cli_image.prepare(args, graph)
    if args.audio is not None:
        from linnet.cli import audio as cli_audio

        audio = cli_audio.prepare(args, graph, model)
    return image, audio


def _compared_program(args: argparse.Namespace):
    """The program every compared backend runs, before any backend: the front end's alone for random weights; with
    `--weights`, bound to the checkpoint's config as loading binds it (headers only, no tensor read), so the random
    ids are drawn from the checkpoint's vocabulary (256) and not the source's default (32000), and the checker's
    shapes are the checkpoint's."""
    if args.weights is None:
        return build_program(args)
    from linnet.runtimes.loading import LoadOptions, prepare

    options = LoadOptions(
        preset=args.preset,
        config=parse_config(args.config),
        dtype=args.dtype,
        max_batch=args.max_batch,
        max_positions=args.max_positions,
    )
    prepared = prepare(args.file, args.weights, options)
    if prepared.checkpoint is not None:
        prepared.checkpoint.close()
    return prepared.program


def compare_backends(args: argparse.Namespace) -> int:
    """`linnet run --compare`: the entry on the reference and each backend listed, with the same
    inputs and weights; the report of `linnet.runtimes.backends.compare`, printed as text or JSON. Returns the
    exit status: 1 on a disagreement or a backend that failed, 2 for a usage error."""
    from linnet.runtimes.backends import compare, get_backend
    from linnet.runtimes.model import random_inputs

    try:
        if args.backend is not None:
            raise UsageError("--compare runs the backends it lists; drop --backend")
        try:
            names = compare.parse_backends(args.compare)
            compare.tolerance_for(args)
        except ValueError as err:
            raise UsageError(str(err)) from None
        program = _compared_program(args)
        entry, graph, sizes = entry_and_sizes(args, program)
    except FAILURES as err:
        return fail("run", err)
    inputs = random_inputs(graph, sizes, args.seed, program.config.get("vocab_size", 100))
    expected = compare.checker_outputs(graph, sizes)
    rows, values = [], {}
    for name in names:
        backend = get_backend(name)
        why = compare.unavailable(backend, args.device, args.dtype)
        if why is not None:
            rows.append(compare.row(backend, "unavailable", why))
            continue
        mine = copy(args)
        mine.backend = name
        mine.provider = args.provider if "providers" in backend.options else None
        mine.cpu_offload_gb = args.cpu_offload_gb if "cpu_offload_gb" in backend.options else None
        try:
            model = load_model(mine, random_weights=args.weights is None)
            outs, elapsed, _ = _run_entry(mine, model, entry, inputs)
        except FAILURES as err:
            rows.append(compare.row(backend, "failed", str(err)))
            continue
        except Exception as err:  # noqa: BLE001 - a backend's own crash is its row, not the end of the comparison
            rows.append(compare.row(backend, "failed", f"{type(err).__name__}: {err}"))
            continue
        rows.append(compare.row(backend))
        values[name] = compare.ran(rows[-1], model, outs, elapsed, expected)
        del model  # one backend's model at a time
    report = compare.build_report(args, program, graph, inputs, rows, values)
    print(json.dumps(report) if args.format == "json" else compare.format_text(report))
    failed = any(r["status"] == "failed" for r in rows)
    return EXIT_ERRORS if report["disagreements"] or failed else EXIT_OK


def entry_and_sizes(args: argparse.Namespace, program) -> tuple[str, object, dict[str, int]]:
    """The entry `linnet run` runs (`--entry`, else the program's first), its IR graph, and the size
    of each dim variable of its inputs (`_entry_sizes`). Raises ValueError for an entry the program
    lacks (naming its entries) or a batch or sequence the KV cache cannot hold, UsageError for bad
    sizes."""
    entry = args.entry or next(iter(program.entries))
    if entry not in program.entries:
        raise ValueError(f"no entry `{entry}` (entries: {', '.join(program.entries)})")
    graph = program.entries[entry]
    sizes = _entry_sizes(graph, args)
    if graph.uses_state:
        if sizes.get("B", 1) > program.max_batch:
            raise ValueError(
                f"--batch {sizes['B']} is more than the cache's {program.max_batch} rows; raise --max-batch"
            )
        if sizes.get("S", 1) > program.max_positions:
            raise ValueError(
                f"--seq {sizes['S']} is more than the cache's {program.max_positions} positions; raise --max-positions"
            )
    return entry, graph, sizes


def _entry_sizes(graph, args: argparse.Namespace) -> dict[str, int]:
    """The size of every dim variable of `graph`'s inputs: `B` from `--batch`, `S` from `--seq`,
    any other (and B or S too) from `--dim NAME=SIZE`. Raises UsageError for a
    bad `--dim`, a size below 1, a dim variable no option sizes, naming it, or sizes whose random
    inputs numpy cannot make or memory cannot hold (`_check_input_sizes`)."""
    from linnet.types.dims import dim_variables

    if args.batch < 1 or args.seq < 1:
        raise UsageError(f"--batch and --seq must be at least 1, got {args.batch} and {args.seq}")
    sizes = {"B": args.batch, "S": args.seq} | parse_dims(args.dim)
    needed = sorted({name for v in graph.inputs for d in v.dims for name in dim_variables(d)})
    missing = [name for name in needed if name not in sizes]
    if missing:
        flags = " ".join(f"--dim {name}=SIZE" for name in missing)
        raise UsageError(f"entry `{graph.name}` has input dim(s) {', '.join(missing)} with no size: give {flags}")
    unused = sorted(set(parse_dims(args.dim)) - set(needed))
    if unused:
        takes = ", ".join(needed) or "none"
        raise UsageError(f"--dim {', '.join(unused)}: entry `{graph.name}` has no such dim (its dims: {takes})")
    _check_input_sizes(graph, sizes, needed)
    return sizes


INPUTS_SHARE = 0.5  # of the memory available now, the most the random inputs of `linnet run` may take


def _check_input_sizes(graph, sizes: dict[str, int], needed: list[str]) -> None:
    """Refuse sizes whose random inputs numpy cannot make (an array of more elements or bytes than
    numpy's index type holds) or that would take more than half the memory available
    (MemAvailable, Linux only), before anything is allocated: numpy died with a ValueError or an
    `_ArrayMemoryError` traceback. Raises UsageError naming the sizes given."""
    import numpy as np

    from linnet.runtimes.model import concrete_dim
    from linnet.types.core import F32

    total = 0
    for v in graph.inputs:
        n = 1
        for d in v.dims:
            n *= concrete_dim(d, sizes)
        itemsize = v.dtype.itemsize or F32.itemsize
        # random_inputs makes every float input an f32 array (an f64 one is counted at its own 8 bytes)
        size = n * (max(itemsize, F32.itemsize) if v.dtype.is_float else itemsize)
        if size > np.iinfo(np.intp).max:
            raise UsageError(
                f"{_sizes_text(sizes, needed)}: input `{v.name}` would have {n} elements, more than numpy can hold"
            )
        total += size
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return
    available = next(
        (int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None
    )
    if available is not None and total > INPUTS_SHARE * available:
        raise UsageError(
            f"{_sizes_text(sizes, needed)}: the random inputs of entry `{graph.name}` need {total / 2**30:.1f} GiB, "
            f"more than half the {available / 2**30:.1f} GiB available: give smaller sizes"
        )


def _sizes_text(sizes: dict[str, int], needed: list[str]) -> str:
    """The sizes as the options that set them: `--batch 1 --dim N=100000`."""
    flags = {"B": "--batch {}", "S": "--seq {}"}
    return " ".join(flags.get(name, f"--dim {name}={{}}").format(sizes[name]) for name in needed)


def _run_entry(args: argparse.Namespace, model, entry: str, inputs: list):
    """Run `entry` once to warm up (compile, make sessions; watched with `caches.watch`), then
    time one call, numpy in and out on every backend (the time includes copying the inputs in and
    the outputs out). Returns ([(shape, dtype name, f64 values)] per output, seconds, the first
    call's `CompileReport`)."""
    import numpy as np

    with watch_compile(args, getattr(model, "compile_kind", "")) as compiled:
        model.run(entry, *inputs)
    t0 = time.perf_counter()
    outs = model.run(entry, *inputs)
    elapsed = time.perf_counter() - t0
    return [(list(o.shape), o.dtype.name, np.asarray(o, dtype=np.float64)) for o in outs], elapsed, compiled


def register(sub) -> None:
    """Add the subcommands of this module to the `linnet` parser."""
    run = sub.add_parser("run", help="run an entry on random inputs (and random weights unless --weights)")
    add_common(run, stored=True)
    run.add_argument("--entry", metavar="NAME")
    run.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        metavar="BACKEND",
        help="one of %(choices)s (default torch; `linnet backends` lists them)",
    )
    run.add_argument(
        "--compare",
        nargs="?",
        const="torch,xla,onnxruntime",
        metavar="B1,B2,...",
        help="run on each of these backends (default torch,xla,onnxruntime) and on torch-interpret, the "
        "reference, with the same inputs and weights; report max |Δ| between every pair and any output "
        "the checker's shapes or dtypes disagree with",
    )
    run.add_argument(
        "--tolerance",
        type=float,
        metavar="ATOL",
        help="with --compare, the max |Δ| two backends may differ by (default 1e-4 in f32, 1e-2 in f16, 5e-2 in bf16)",
    )
    run.add_argument("--batch", type=int, default=1, help="B of the random inputs (1)")
    run.add_argument("--seq", type=int, default=8, help="S of the random inputs (8)")
    run.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="the size of an input dim other than B and S, e.g. --dim N=8 (repeatable)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument(
        "--image",
        metavar="PATH",
        help="an image file as `pixel_values`, preprocessed as the model's image processor does (the weights' "
        "preprocessor_config.json, else the model type's defaults); prints a classifier's top labels",
    )
    run.add_argument(
        "--audio",
        metavar="PATH",
        help="a WAV file (integer PCM) as `input_features`: Whisper's log-mel features, as transformers' "
        "WhisperFeatureExtractor makes them (the weights' preprocessor_config.json, else its defaults with the "
        "config's num_mel_bins)",
    )
    run.add_argument("--provider", action="append", choices=("cpu", "cuda", "tensorrt"), help="onnxruntime providers")
    run.add_argument(
        "--format", choices=("text", "json"), default="text", help="json: one object (the language server)"
    )
    run.set_defaults(func=cmd_run)
