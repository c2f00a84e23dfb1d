"""`linnet ir`, `linnet torch`, `linnet jax`, `linnet stablehlo`, `linnet onnx`, `linnet run`,
`linnet generate`, `linnet export hf`, `linnet cache` and `linnet backends`.

Like the rest of the CLI these import lazily: `ir`, `torch` and `jax` need the front end and
the code generator (no framework); `stablehlo` needs jax; `onnx` needs onnx and onnx-ir; `run`
and `generate` load a backend of the registry (`linnet.runtimes.backends`, read only when
`--backend` is parsed or help is printed, so `linnet check` never imports it), and handle
every backend alike: numpy in, numpy out (`LoadedModel.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from copy import copy
from dataclasses import replace
from pathlib import Path

from linnet.errors import AudioError, BackendError, LinnetError

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


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
        _check_utf8("--config", item)
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
    else:
        p.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32", help="working dtype (default f32)")
    p.add_argument("--max-positions", type=int, default=768, metavar="N", help="cache positions per row (768)")
    p.add_argument("--max-batch", type=int, default=max_batch, metavar="N", help=f"cache rows ({max_batch})")
    if weights:
        p.add_argument("--weights", metavar="W", help="HF directory, .gguf file or embedded id")
        p.add_argument("--numerics", choices=("equivalent", "fast"), default="equivalent")
        p.add_argument("--device", default="cpu", help="cpu or cuda")


def _fail(cmd: str, err: Exception) -> int:
    """Print `err` for `cmd`; the exit status: 2 for a file that cannot be read or written, or an
    option value the command cannot take (usage or I/O), 1 for anything else."""
    print(f"linnet {cmd}: {err}", file=sys.stderr)
    return EXIT_USAGE if isinstance(err, (OSError, UsageError)) else EXIT_ERRORS


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse a FILE or --weights path with bytes that are not UTF-8: the generated code, ONNX's
    metadata and JAX's locations quote the paths as text, and died with a bare "'utf-8' codec
    can't encode character '\\udcff'". Raises UsageError naming the argument; rename the file."""
    _check_utf8("FILE", args.file)
    if getattr(args, "weights", None):
        _check_utf8("--weights", args.weights)


def _build(args: argparse.Namespace, entries=None):
    from linnet.ir import build

    _check_paths(args)
    return build(
        args.file,
        preset=args.preset,
        config=parse_config(args.config),
        dtype="f32" if args.dtype == "stored" else args.dtype,  # the front end's working dtype (gguf_quants)
        max_batch=args.max_batch,
        max_positions=args.max_positions,
        entries=entries,
    )


def _write(text: str, out: str | None, cmd: str) -> int:
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


def cmd_ir(args: argparse.Namespace) -> int:
    from linnet.ir import format_program

    try:
        program = _build(args, [args.entry] if args.entry else None)
    except FAILURES as err:
        return _fail("ir", err)
    return _write(format_program(program), args.output, "ir")


def cmd_torch(args: argparse.Namespace) -> int:
    from linnet.compiler.torch import codegen

    return _emit_source(args, "torch", codegen)


def cmd_jax(args: argparse.Namespace) -> int:
    from linnet.compiler.jax import codegen

    return _emit_source(args, "jax", codegen)


def _emit_source(args: argparse.Namespace, cmd: str, codegen) -> int:
    """`linnet torch` / `linnet jax`: the model as source from a code generator module, standalone (it carries the
    prelude's helpers and imports only the framework), under the preset `linnet run` picks (`_default_preset`)."""
    try:
        _check_paths(args)
        _default_preset(args)
        text = codegen.generate(_build(args), args.numerics, standalone=True)
    except FAILURES as err:
        return _fail(cmd, err)
    return _write(text, args.output, cmd)


def _default_preset(args: argparse.Namespace) -> None:
    """Without `--preset` and `--weights`, set `args.preset` to the first preset with default weights (None where
    there is none): a real checkpoint's config, not the config's defaults (Llama's are 7B parameters), as generation
    uses. Raises what checking the source raises."""
    if args.preset is not None or getattr(args, "weights", None) is not None:
        return
    from linnet.ir.build import check_source, read_source
    from linnet.runtimes.loading import default_preset

    args.preset = default_preset(check_source(*read_source(args.file)))


def cmd_stablehlo(args: argparse.Namespace) -> int:
    """The entry as StableHLO text (`-o` or stdout) and, with `--serialized`, the serialized
    `jax.export` artifact plus a JSON sidecar (entry, max_batch, max_positions, dtype, and the
    fused weights' members with their shapes)."""
    try:
        from linnet.compiler.jax.module import compile_program, export_entry
    except ImportError as err:
        return _fail("stablehlo", ImportError(f"needs jax ({err}); pip install linnet[jax]"))
    try:
        program = _build(args)
        entry = args.entry or next(iter(program.entries))
        if entry not in program.entries:
            raise ValueError(f"no entry `{entry}` (entries: {', '.join(program.entries)})")
        compiled = compile_program(program, args.numerics)
        exported = export_entry(compiled, entry, platforms=args.platform)
    except FAILURES as err:
        return _fail("stablehlo", err)
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
        }
        try:
            written = save_exported(exported, args.serialized, meta)
        except OSError as err:
            print(f"linnet stablehlo: cannot write {args.serialized}: {err.strerror or err}", file=sys.stderr)
            return EXIT_USAGE
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    if args.output or not args.serialized:
        return _write(exported.mlir_module(), args.output, "stablehlo")
    return EXIT_OK


def cmd_onnx(args: argparse.Namespace) -> int:
    """One entry as an .onnx file (checked and shape-inferred): parameters as initializers from
    `--weights` (or the preset's default weights), else as graph inputs."""
    try:
        from linnet.runtimes.backends.onnx_backend import export
    except ImportError as err:
        return _fail("onnx", ImportError(f"needs onnx and onnx-ir ({err}); pip install linnet[onnx]"))
    if args.output is None and not args.text:
        return _fail("onnx", UsageError("give -o OUT (the .onnx file) or --text"))
    try:
        _check_paths(args)
    except UsageError as err:
        return _fail("onnx", err)
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
            return _fail("onnx", err)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        if args.text:
            import onnx

            sys.stdout.write(onnx.printer.to_text(onnx.load(str(output))) + "\n")
            return EXIT_OK
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def _load(args: argparse.Namespace, random_weights: bool):
    """The model of `args.file` on `--backend`, through the registry, with the backend's
    persistent compile cache on (`linnet.runtimes.backends.caches`) and, on PyTorch, one thread per idle
    core of the process's CPU affinity (per core of it where the compiled kernels are specialised to
    the thread count, `Backend.thread_specific`; `linnet.runtimes.backends.threads`); `args.setup` says what
    was chosen.
    Raises LinnetError (a backend option it lacks included), ValueError (a bad `--config`) or
    OSError."""
    from linnet.runtimes.backends import BACKENDS, caches, get_backend

    _check_paths(args)
    backend = get_backend(args.backend)
    args.setup = ""
    if backend.unavailable(args.device, probe=False) is None:  # else `load` says why
        caches.enable(backend.family)
        if backend.family == "torch":
            from linnet.runtimes.backends.threads import set_torch_threads

            args.setup = set_torch_threads(follow_load=not backend.thread_specific)
    options = {}
    if args.provider:
        if "providers" not in backend.options:
            takes = ", ".join(b.name for b in BACKENDS.values() if "providers" in b.options)
            raise BackendError(f"--provider is an option of {takes}, not of {backend.name}")
        options["providers"] = args.provider
    if getattr(args, "tensor_parallel", False) and backend.family == "jax":
        options["fuse_linear_weights"] = False  # split by checkpoint name
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


def cmd_generate(args: argparse.Namespace) -> int:
    from linnet.runtimes.generation import Generator
    from linnet.runtimes.sampling import SamplingParams

    try:
        prompt_ids = parse_ids(args.prompt_ids)
        if (args.prompt is None) == (prompt_ids is None):
            raise UsageError("give the prompt as text (--prompt) or as token ids (--prompt-ids), one of them")
        if prompt_ids is not None and args.chat:
            raise UsageError("--chat renders a text prompt; with --prompt-ids the ids are the whole prompt")
        if args.prompt is not None:
            _check_utf8("--prompt", args.prompt)
        if args.file is None and args.weights is None:
            raise UsageError("give a source FILE, or --weights alone to pick the example for its model_type")
        params = SamplingParams(
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            max_new_tokens=args.max_new_tokens,
        )
    except ValueError as err:
        print(f"linnet generate: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.file is None:
            _pick_example(args)
        model = _load(args, random_weights=False)
    except FAILURES as err:
        return _fail("generate", err)
    _print_notes(model)
    tok = model.tokenizer()
    if tok is None and prompt_ids is None:
        return _fail(
            "generate",
            UsageError(
                f"{model.weights} has no tokenizer (no tokenizer.json): give the prompt as token ids, "
                "--prompt-ids 1,2,3 (the output is then token ids too)"
            ),
        )
    if "step" not in model.program.entries:
        return _fail("generate", ValueError(f"{args.file}: generation needs a decoder with `entry fn step`"))
    if tok is None:  # the EOS ids of config.json and generation_config.json still stop, as in transformers
        params = replace(params, stop_token_ids=_checkpoint_eos_ids(model.weights))
    try:
        ids = prompt_ids if prompt_ids is not None else _prompt_ids(args, tok)
    except FAILURES as err:
        return _fail("generate", err)
    setup = f"; {args.setup}" if args.setup else ""
    print(
        f"loaded {args.file} with {model.weights} in {model.load_s:.2f} s "
        f"({args.backend}, {args.dtype}, cache for {_cache_positions(model, args)} positions{setup})",
        file=sys.stderr,
    )
    if tok is None and not args.print_ids:
        print(f"note: {model.weights} has no tokenizer: printing token ids", file=sys.stderr)
    try:
        step_model = model.step_model()
        gen = Generator(step_model, tok)
        with _watch(args, getattr(step_model, "compile_kind", "")) as compiled:
            gen.warm_up(len(ids))
        print(compiled.describe(), file=sys.stderr)
        if args.print_ids or tok is None:
            _stream_ids(gen, ids, params)
        else:
            for piece in gen.stream_text(ids, params):
                sys.stdout.write(piece)
                sys.stdout.flush()
    except FAILURES as err:
        return _fail("generate", err)
    sys.stdout.write("\n")
    sys.stdout.flush()
    positions = _cache_positions(model, args)
    line = _timing_line(gen.last_result, args.max_new_tokens, positions, capped=positions < args.max_positions)
    print(line, file=sys.stderr)
    return EXIT_OK


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


def _pick_example(args: argparse.Namespace) -> None:
    """Set `args.file` (and `args.preset`, unless given) from the zoo index for `--weights`, and
    say which on stderr. Raises LoadError for an unknown model_type, naming the known ones."""
    from linnet.runtimes import zoo

    choice = zoo.choose(args.weights)
    args.file = str(choice.source)
    shown = f"{choice.source.parent.name}/{choice.source.name}"  # examples/llama.linnet, wherever installed
    if args.preset is None:
        args.preset = choice.preset
        print(choice.describe(shown), file=sys.stderr)
    else:
        print(f"using {shown}, preset {args.preset} (--preset)", file=sys.stderr)


def _checkpoint_eos_ids(weights: str | None) -> frozenset[int]:
    """The `eos_token_id`s of a Hugging Face folder's config.json and generation_config.json
    (where transformers' `generate` stops); empty for anything else."""
    from linnet.runtimes.formats.tokenizer import hf_eos_token_ids

    if weights is None or not Path(weights).is_dir():
        return frozenset()
    return frozenset(hf_eos_token_ids(weights))


def _stream_ids(gen, ids: list[int], params) -> None:
    """Generate, writing each new token id to stdout as it comes, comma-separated (what
    `--prompt-ids` reads back)."""
    written = 0

    def write(token: int) -> None:
        nonlocal written
        sys.stdout.write(("," if written else "") + str(token))
        sys.stdout.flush()
        written += 1

    gen.generate(ids, params, on_token=write)


def _prompt_ids(args: argparse.Namespace, tok) -> list[int]:
    """`--prompt` as token ids, through the checkpoint's chat template with `--chat`. Raises
    ValueError when it has none or it does not parse (naming the weights and the template line)."""
    from linnet.runtimes.inputs.chat import encode_chat

    if not args.chat:
        return tok.encode(args.prompt)
    if not tok.chat_template:
        raise ValueError(f"{args.weights} has no chat template; drop --chat")
    try:
        return encode_chat(tok, [{"role": "user", "content": args.prompt}])
    except ValueError as err:  # the checkpoint's template is broken: say whose, exit 1
        raise ValueError(f"{args.weights}: {err}") from None


def _watch(args: argparse.Namespace, what: str):
    """`caches.watch` for `--backend`'s framework: times the block, counts its cache hits."""
    from linnet.runtimes.backends import caches, get_backend

    return caches.watch(get_backend(args.backend).family, what)


def _cache_positions(model, args) -> int:
    """The positions the loaded model's cache holds: `--max-positions`, or fewer where loading capped it (a
    learned position table, `runtimes.loading.learned_position_rows`)."""
    program = model.program
    return program.max_positions if program is not None else args.max_positions


def _timing_line(r, max_new_tokens: int, max_positions: int, capped: bool = False) -> str:
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


def _check_utf8(flag: str, value: str) -> None:
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


def _print_notes(model) -> None:
    for note in model.notes:
        print(f"note: {note}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from linnet.runtimes.model import concrete_dim, random_inputs

    try:
        parse_dims(args.dim)  # a usage error before anything loads
        _check_paths(args)
        if args.tolerance is not None and args.compare is None:
            raise UsageError("--tolerance is the agreement --compare asks of the backends; add --compare")
        for flag in ("image", "audio"):
            if getattr(args, flag) is not None and args.compare is not None:
                raise UsageError(
                    f"--{flag} runs the {flag} on one backend; drop --compare (or compare on random inputs)"
                )
    except UsageError as err:
        return _fail("run", err)
    try:
        _default_preset(args)  # random weights under a real checkpoint's config
    except FAILURES as err:
        return _fail("run", err)
    if args.compare is not None:
        return compare_backends(args)
    if args.backend is None:
        args.backend = "torch"
    try:
        model = _load(args, random_weights=args.weights is None)
    except FAILURES as err:
        return _fail("run", err)
    program = model.program
    try:
        image, audio = _file_inputs(args, model)
        entry, graph, sizes = entry_and_sizes(args, program)
    except AudioError as err:  # a WAV that cannot be read: a usage error, as for `linnet transcribe --audio`
        print(f"linnet run: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FAILURES as err:
        return _fail("run", err)
    if args.format != "json":
        _print_notes(model)
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
        return _fail("run", err)
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
                "mean": float(f.mean()),
                "std": float(f.std(ddof=1)) if f.size > 1 else 0.0,
                "min": float(f.min()),
                "max": float(f.max()),
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
        program = _build(args)  # the front end only: the checker's signature and the sizes, before any backend
        entry, graph, sizes = entry_and_sizes(args, program)
    except FAILURES as err:
        return _fail("run", err)
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
        try:
            model = _load(mine, random_weights=args.weights is None)
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

    itemsize = {"i64": 8, "f64": 8, "i32": 4, "bool": 1}
    total = 0
    for v in graph.inputs:
        n = 1
        for d in v.dims:
            n *= concrete_dim(d, sizes)
        size = n * itemsize.get(v.dtype.name, 4)
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

    with _watch(args, getattr(model, "compile_kind", "")) as compiled:
        model.run(entry, *inputs)
    t0 = time.perf_counter()
    outs = model.run(entry, *inputs)
    elapsed = time.perf_counter() - t0
    return [(list(o.shape), o.dtype.name, np.asarray(o, dtype=np.float64)) for o in outs], elapsed, compiled


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
            _pick_example(args)
        _check_paths(args)
        from linnet.ir.build import check_source, read_source

        check_family(check_source(*read_source(args.file), args.preset).analysis.model.ast.name.id)
        model = _load(args, random_weights=False)
        _print_notes(model)
        from linnet.export import hf

        written = hf(model, args.output, dtype=args.dtype, max_shard_size=args.max_shard_size)
    except FAILURES as err:
        return _fail("export hf", err)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    return EXIT_OK


def cmd_backends(args: argparse.Namespace) -> int:
    """`linnet backends`: the registry, one backend per line, and whether each can run here on
    `--device` (asking the framework, so this imports the installed ones)."""
    from linnet.runtimes.backends import BACKENDS

    rows = [b.describe(args.device, probe=True) for b in BACKENDS.values()]
    if args.format == "json":
        print(json.dumps(rows))
        return EXIT_OK
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        view = r["codeView"] or "-"
        where = "ok" if r["available"] else f"unavailable: {r['reason']}"
        print(
            f"{r['name']:<{width}}  {r['label']:<24} code {view:<9} dtypes {','.join(r['dtypes']):<12} "
            f"devices {','.join(r['devices']):<14} {where}"
        )
    return EXIT_OK


def cmd_cache(args: argparse.Namespace) -> int:
    """`linnet cache [info|clear]`: the persistent compile caches' folders and sizes, or remove them."""
    from linnet.runtimes.backends import caches

    reason = caches.unusable()
    if args.action == "clear":
        if reason:
            print(f"nothing to remove: cache off: {reason} (set {caches.ENV_DIR} to another folder)", file=sys.stderr)
            return EXIT_OK
        try:
            removed = caches.clear()
        except OSError as err:
            return _fail("cache", err)
        for folder in removed:
            print(f"removed {folder}", file=sys.stderr)
        if not removed:
            print("nothing to remove", file=sys.stderr)
        return EXIT_OK
    root = caches.cache_root()
    if root is None:
        print(f"persistent caches are off ({caches.ENV_OFF} is set)")
        return EXIT_OK
    if reason:
        print(f"persistent caches are off: {reason} (set {caches.ENV_DIR} to another folder)")
        return EXIT_OK
    print(f"{root} (set {caches.ENV_DIR} to move it, {caches.ENV_OFF}=1 to turn caching off)")
    for framework, folder, size in caches.info():
        print(f"  {framework:<12} {size / 2**20:9.1f} MiB  {folder}")
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
        _check_utf8("-o", args.output)
        check_target(args.output, replace=args.force)
        if args.file is None:
            _pick_example(args)
        _check_paths(args)
        from linnet.ir.build import check_source, read_source

        check_family(check_source(*read_source(args.file), args.preset).analysis.model.ast.name.id)
        args.backend, args.provider = "torch", None
        model = _load(args, random_weights=False)
        started = time.perf_counter()
        written = export_gguf(model, args.output, file_type=args.type)
    except FAILURES as err:
        return _fail("export gguf", err)
    _print_notes(model)
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
        _check_utf8("-o", args.output)
        from linnet.runtimes.export.hf import check_target

        check_target(args.output)
        if args.file is None:
            _pick_example(args)
        _check_paths(args)
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
        return _fail("export triton", err)
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
    tr.add_argument("--max-batch", type=int, default=8, metavar="N", help="cache rows per model instance (8)")
    tr.add_argument("--max-positions", type=int, default=768, metavar="N", help="cache positions per row (768)")
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
    """Add the backend subcommands to the `linnet` parser."""
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

    gen = sub.add_parser("generate", help="generate text (only the text goes to stdout)")
    add_common(
        gen,
        stored=True,
        file_help="a .linnet source with a root model; without it, the shipped example for --weights' "
        "model_type (config.json's, or a GGUF's general.architecture) under its closest preset",
    )
    gen.add_argument("--prompt", help="the prompt as text")
    gen.add_argument(
        "--prompt-ids", metavar="IDS", help="the prompt as token ids, comma-separated (1,2,3): no tokenizer needed"
    )
    gen.add_argument(
        "--print-ids", action="store_true", help="print the generated token ids (comma-separated), not text"
    )
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    gen.add_argument("--provider", action="append", choices=("cpu", "cuda", "tensorrt"), help="onnxruntime providers")
    gen.add_argument(
        "--tensor-parallel",
        action="store_true",
        help="split the weights over the torchrun processes (torch backends: torchrun --nproc-per-node N -m linnet "
        "generate ...) or over every JAX device (jax); docs/distributed.md",
    )
    gen.set_defaults(func=cmd_generate)

    ca = sub.add_parser("cache", help="show (info) or remove (clear) the persistent compile caches")
    ca.add_argument("action", nargs="?", choices=("info", "clear"), default="info")
    ca.set_defaults(func=cmd_cache)

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

    be = sub.add_parser("backends", help="list the backends and whether each can run here")
    be.add_argument("--device", default="cpu", help="the device to ask about (cpu, cuda)")
    be.add_argument("--format", choices=("text", "json"), default="text")
    be.set_defaults(func=cmd_backends)


# The steps of `generate` that `linnet serve` (cli_serve.py) shares: load a model from the options, pick the zoo's
# source for --weights alone, print its notes, report a failure. Public names for the other CLI module.
fail = _fail
load_model = _load
pick_example = _pick_example
print_notes = _print_notes
