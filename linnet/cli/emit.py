"""`linnet ir`, `linnet torch`, `linnet jax`, `linnet stablehlo` and `linnet onnx`: a model's Core IR, generated
code or exported graph. `ir`, `torch` and `jax` need the front end and the code generator (no framework);
`stablehlo` needs jax; `onnx` needs onnx and onnx-ir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from linnet.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    UsageError,
    add_common,
    build_program,
    check_paths,
    fail,
    parse_config,
    use_default_preset,
    write_output,
)


def cmd_ir(args: argparse.Namespace) -> int:
    from linnet.ir import format_program

    try:
        program = build_program(args, [args.entry] if args.entry else None)
    except FAILURES as err:
        return fail("ir", err)
    return write_output(format_program(program), args.output, "ir")


def cmd_torch(args: argparse.Namespace) -> int:
    from linnet.compiler.torch import codegen

    return _emit_source(args, "torch", codegen)


def cmd_jax(args: argparse.Namespace) -> int:
    from linnet.compiler.jax import codegen

    return _emit_source(args, "jax", codegen)


def _emit_source(args: argparse.Namespace, cmd: str, codegen) -> int:
    """`linnet torch` / `linnet jax`: the model as source from a code generator module, standalone (it carries the
    prelude's helpers and imports only the framework), under the preset `linnet run` picks (`use_default_preset`)."""
    try:
        check_paths(args)
        use_default_preset(args)
        text = codegen.generate(build_program(args), args.numerics, standalone=True)
    except FAILURES as err:
        return fail(cmd, err)
    return write_output(text, args.output, cmd)


def cmd_stablehlo(args: argparse.Namespace) -> int:
    """The entry as StableHLO text (`-o` or stdout) and, with `--serialized`, the serialized
    `jax.export` artifact plus a JSON sidecar (entry, max_batch, max_positions, dtype, and the
    fused weights' members with their shapes)."""
    try:
        from linnet.compiler.jax.module import compile_program, export_entry
    except ImportError as err:
        return fail("stablehlo", ImportError(f"needs jax ({err}); pip install linnet[jax]"))
    try:
        program = build_program(args)
        entry = args.entry or next(iter(program.entries))
        if entry not in program.entries:
            raise ValueError(f"no entry `{entry}` (entries: {', '.join(program.entries)})")
        compiled = compile_program(program, args.numerics)
        exported = export_entry(compiled, entry, platforms=args.platform)
    except FAILURES as err:
        return fail("stablehlo", err)
    if args.serialized:
        from linnet.compiler.jax.module import exported_signature, fused_member_shapes
        from linnet.runtimes.backends.jax_backend import save_exported

        takes = exported_signature(exported)[0]
        meta = {
            "entry": entry,
            "source": args.file,
            "model": program.model,
            "preset": program.preset,
            "dtype": program.dtype.name,
            "numerics": args.numerics,
            "max_batch": program.max_batch,
            "max_positions": program.max_positions,
            "inputs": [v.name for v in program.entries[entry].inputs],
            "platforms": list(exported.platforms),
            "fused_weights": {k: v for k, v in fused_member_shapes(program, compiled.fused).items() if k in takes},
            # the XLA options its numerics need (`JaxProgram.compiler_options`): `load_exported` compiles with them
            "compiler_options": compiled.compiler_options or {},
            # its block writes drop a padded batch's rows past the cache (`JaxModel.drops_padded_rows`)
            "drops_padded_rows": True,
        }
        try:
            written = save_exported(exported, args.serialized, meta)
        except OSError as err:
            print(f"linnet stablehlo: cannot write {args.serialized}: {err.strerror or err}", file=sys.stderr)
            return EXIT_USAGE
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    if args.output or not args.serialized:
        return write_output(exported.mlir_module(), args.output, "stablehlo")
    return EXIT_OK


def cmd_onnx(args: argparse.Namespace) -> int:
    """One entry as an .onnx file (checked and shape-inferred): parameters as initializers from
    `--weights` (or the preset's default weights), else as graph inputs."""
    try:
        from linnet.runtimes.backends.onnx_backend import export
    except ImportError as err:
        return fail("onnx", ImportError(f"needs onnx and onnx-ir ({err}); pip install linnet[onnx]"))
    if args.output is None and not args.text:
        return fail("onnx", UsageError("give -o OUT (the .onnx file) or --text"))
    try:
        check_paths(args)
    except UsageError as err:
        return fail("onnx", err)
    with tempfile.TemporaryDirectory() as tmp:
        # --text: the graph without weights in ONNX's textual syntax (what the language server shows)
        output = Path(tmp) / "model.onnx" if args.text else args.output
        try:
            written, notes = export(
                args.file,
                args.entry,
                output,
                None if args.text else args.weights,
                preset=args.preset,
                config=parse_config(args.config),
                dtype=args.dtype,
                numerics=args.numerics,
                max_batch=args.max_batch,
                max_positions=args.max_positions,
                progress=sys.stderr.isatty() and not args.text,
                with_weights=not (args.no_weights or args.text),
            )
        except FAILURES as err:
            return fail("onnx", err)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        if args.text:
            import onnx

            sys.stdout.write(onnx.printer.to_text(onnx.load(str(output))) + "\n")
            return EXIT_OK
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def register(sub) -> None:
    """Add the subcommands of this module to the `linnet` parser."""
    ir = sub.add_parser("ir", help="print the Core IR of a model")
    add_common(ir, weights=False)
    ir.add_argument("--entry", metavar="NAME", help="only this entry")
    ir.add_argument("-o", "--output", metavar="OUT")
    ir.set_defaults(func=cmd_ir)

    tor = sub.add_parser("torch", help="emit the model as PyTorch source")
    add_common(tor, weights=False)
    tor.add_argument("--numerics", choices=("equivalent", "fast"), default="equivalent")
    tor.add_argument("-o", "--output", metavar="OUT")
    tor.set_defaults(func=cmd_torch)

    jx = sub.add_parser("jax", help="emit the model as JAX source")
    add_common(jx, weights=False)
    jx.add_argument("--numerics", choices=("equivalent", "fast"), default="equivalent")
    jx.add_argument("-o", "--output", metavar="OUT")
    jx.set_defaults(func=cmd_jax)

    hlo = sub.add_parser("stablehlo", help="export an entry as StableHLO through jax.export (needs jax)")
    add_common(hlo, weights=False)
    hlo.add_argument("--numerics", choices=("equivalent", "fast"), default="equivalent")
    hlo.add_argument("--entry", metavar="NAME", help="the entry to export (default: the first)")
    hlo.add_argument("-o", "--output", metavar="OUT", help="the StableHLO text (.mlir); stdout without --serialized")
    hlo.add_argument("--serialized", metavar="OUT", help="the serialized artifact (plus OUT.json) for load_exported")
    hlo.add_argument(
        "--platform",
        action="append",
        choices=("cpu", "cuda", "rocm", "tpu"),
        help="target platform(s) (default: this machine's)",
    )
    hlo.set_defaults(func=cmd_stablehlo)

    ox = sub.add_parser("onnx", help="write an entry as an .onnx model (needs onnx and onnx-ir)")
    add_common(ox)
    ox.add_argument("--entry", metavar="NAME", help="the entry to write (default: the first)")
    ox.add_argument("-o", "--output", metavar="OUT", help="the .onnx file")
    ox.add_argument("--text", action="store_true", help="print the graph (no weights) as ONNX text instead")
    ox.add_argument("--no-weights", action="store_true", help="parameters as graph inputs, even with default weights")
    ox.set_defaults(func=cmd_onnx)
