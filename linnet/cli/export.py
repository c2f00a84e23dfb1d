"""`linnet export hf|gguf|triton`: a loaded model written in a format other engines load
(`linnet.runtimes.export`).
"""

from __future__ import annotations

import argparse
import sys
import time

from linnet.cli.common import (
    BACKEND_HELP,
    BACKEND_NAMES,
    EXIT_OK,
    FAILURES,
    UsageError,
    add_common,
    at_least_one,
    check_paths,
    check_utf8,
    fail,
    load_model,
    print_notes,
)
from linnet.cli.generate import pick_example


def cmd_export_hf(args: argparse.Namespace) -> int:
    """`linnet export hf [FILE] [--weights W] -o DIR`: the model as a Hugging Face folder (`runtimes.export_hf`);
    without FILE, the zoo's example for the checkpoint's model_type (as `generate` picks it). The family and DIR are
    checked before the weights are read, so a refusal costs nothing and leaves nothing."""
    try:
        if args.file is None and args.weights is None:
            raise UsageError("give a source FILE, or --weights alone to pick the example for its model_type")
        from linnet.runtimes.export.hf import check_family, check_target

        check_target(args.output)
        if args.file is None:
            pick_example(args)
        check_paths(args)
        from linnet.ir.build import check_source, read_source

        check_family(check_source(*read_source(args.file), args.preset).analysis.model.ast.name.id)
        model = load_model(args, random_weights=False)
        print_notes(model)
        from linnet.export import hf

        written = hf(model, args.output, dtype=args.dtype, max_shard_size=args.max_shard_size)
    except FAILURES as err:
        return fail("export hf", err)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


# `linnet export gguf --type`: the keys of `runtimes.export_gguf.FILE_TYPES` (not imported here: building the
# parser imports no runtime; tests/runtimes/test_export_gguf.py checks they agree)
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1")


def cmd_export_gguf(args: argparse.Namespace) -> int:
    """`linnet export gguf`: load the model (FILE, or the example for --weights' model_type) on PyTorch and write
    it as a GGUF file (`linnet.runtimes.export.gguf`). Exit 1 for a model GGUF cannot express, 2 for a path that
    cannot be read or written."""
    from linnet.runtimes.export.gguf import check_family, check_target, export_gguf

    try:
        if args.file is None and args.weights is None:
            raise UsageError("give a source FILE, or --weights alone to pick the example for its model_type")
        check_utf8("-o", args.output)
        check_target(args.output, replace=args.force)
        if args.file is None:
            pick_example(args)
        check_paths(args)
        from linnet.ir.build import check_source, read_source

        check_family(check_source(*read_source(args.file), args.preset).analysis.model.ast.name.id)
        args.backend, args.provider = "torch", None
        model = load_model(args, random_weights=False)
        started = time.perf_counter()
        written = export_gguf(model, args.output, file_type=args.type)
    except FAILURES as err:
        return fail("export gguf", err)
    print_notes(model)
    print(f"wrote {written} ({args.type}) in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    return EXIT_OK


def _add_export_gguf(formats) -> None:
    """`linnet export gguf` under the `linnet export` group's subparsers `formats`."""
    gg = formats.add_parser("gguf", help="write the model as a GGUF file for llama.cpp, Ollama, LM Studio")
    add_common(
        gg,
        file_help="a .linnet source with a root model; without it, the shipped example for --weights' "
        "model_type under its closest preset",
    )
    gg.add_argument("-o", "--output", metavar="OUT.gguf", required=True, help="the GGUF file to write")
    gg.add_argument("--force", action="store_true", help="replace OUT.gguf if it exists (atomically, at the end)")
    gg.add_argument(
        "--type",
        choices=GGUF_TYPES,
        default="f32",
        help="type of the 2-D weights (norms and 1-D tensors stay f32; default f32)",
    )
    gg.set_defaults(func=cmd_export_gguf)


def cmd_export_triton(args: argparse.Namespace) -> int:
    """`linnet export triton [FILE] [--weights W] -o REPO`: a Triton Inference Server model repository that serves
    the model through Linnet's engine (`runtimes.export_triton`); without FILE, the zoo's example for the
    checkpoint's model_type (as `generate` picks it). No weights are read: the server loads them. Exit 1 for a
    source or option the repository cannot hold, 2 for a path that cannot be read or written."""
    try:
        if args.file is None and args.weights is None:
            raise UsageError("give a source FILE, or --weights alone to pick the example for its model_type")
        check_utf8("-o", args.output)
        from linnet.runtimes.export.hf import check_target

        check_target(args.output)
        if args.file is None:
            pick_example(args)
        check_paths(args)
        from linnet.export import triton

        written = triton(
            args.file,
            args.output,
            weights=args.weights,
            preset=args.preset,
            backend=args.backend,
            dtype=args.dtype,
            max_batch=args.max_batch,
            max_positions=args.max_positions,
            instances=args.instances,
            name=args.name,
            python_path=None if args.python_path is None else [p for p in args.python_path.split(":") if p],
        )
    except FAILURES as err:
        return fail("export triton", err)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"serve it: tritonserver --model-repository={args.output} (docs/triton.md)", file=sys.stderr)
    return EXIT_OK


def _add_export_triton(formats) -> None:
    """`linnet export triton` under the `linnet export` group's subparsers `formats`."""
    tr = formats.add_parser(
        "triton", help="a Triton Inference Server model repository (Python backend, streaming) serving the model"
    )
    tr.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="a .linnet source with a root model and a step entry; without it, the shipped example for --weights' "
        "model_type under its closest preset",
    )
    tr.add_argument("--weights", metavar="W", help="HF directory, .gguf file or embedded id (the server loads it)")
    tr.add_argument("--preset", metavar="NAME", help="the preset to build (default: the first with default weights)")
    tr.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32", help="working dtype (default f32)")
    tr.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    tr.add_argument("--max-batch", type=at_least_one, default=8, metavar="N", help="cache rows per model instance (8)")
    tr.add_argument(
        "--max-positions", type=at_least_one, default=768, metavar="N", help="cache positions per row (768)"
    )
    tr.add_argument("--instances", type=int, default=1, metavar="N", help="model instances, one process each (1)")
    tr.add_argument("--name", help="the model's name in the repository (default: the weights' or FILE's stem)")
    tr.add_argument(
        "--python-path",
        metavar="DIRS",
        help="folders (':'-separated) first on the Python backend stub's sys.path (default: tools/tritonserver.sh's "
        "numpy < 2 folder, which Triton <= 2.51's stubs need; '' for none)",
    )
    tr.add_argument("-o", "--output", metavar="REPO", required=True, help="the folder to create (missing or empty)")
    tr.set_defaults(func=cmd_export_triton)


def register(sub) -> None:
    """Add the subcommands of this module to the `linnet` parser."""
    ex = sub.add_parser("export", help="write a model in a format other engines load (hf, gguf, triton)")
    formats = ex.add_subparsers(dest="format", required=True, metavar="FORMAT")
    hf = formats.add_parser(
        "hf", help="a Hugging Face folder (config.json, safetensors, tokenizer) for transformers, vLLM, TGI"
    )
    add_common(hf, file_help="a .linnet source with a root model; without it, the shipped example for --weights' "
               "model_type, as `linnet generate` picks it")  # fmt: skip
    hf.add_argument("-o", "--output", metavar="DIR", required=True, help="the folder to create (missing or empty)")
    hf.add_argument("--max-shard-size", default="5GB", metavar="SIZE", help="bytes per safetensors file (5GB)")
    hf.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    hf.set_defaults(func=cmd_export_hf, provider=None)
    _add_export_gguf(formats)
    _add_export_triton(formats)
