"""`linnet generate`: text (or token ids) from a decoder through the one generation runner
(`linnet.runtimes.generation`), on any backend of the registry; without a FILE, the zoo's source for `--weights`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from linnet.cli.common import (
    BACKEND_HELP,
    BACKEND_NAMES,
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    UsageError,
    add_common,
    cache_positions,
    check_utf8,
    fail,
    load_model,
    parse_ids,
    print_notes,
    timing_line,
    watch_compile,
)


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
            check_utf8("--prompt", args.prompt)
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
            pick_example(args)
        model = load_model(args, random_weights=False)
    except FAILURES as err:
        return fail("generate", err)
    print_notes(model)
    tok = model.tokenizer()
    if tok is None and prompt_ids is None:
        return fail(
            "generate",
            UsageError(
                f"{model.weights} has no tokenizer (no tokenizer.json): give the prompt as token ids, "
                "--prompt-ids 1,2,3 (the output is then token ids too)"
            ),
        )
    if "step" not in model.program.entries:
        return fail("generate", ValueError(f"{args.file}: generation needs a decoder with `entry fn step`"))
    refusal = _encoder_decoder_refusal(args.file, model.program)
    if refusal is not None:
        return fail("generate", UsageError(refusal))
    if tok is None:  # the EOS ids of config.json and generation_config.json still stop, as in transformers
        params = replace(params, stop_token_ids=_checkpoint_eos_ids(model.weights))
    try:
        ids = prompt_ids if prompt_ids is not None else _prompt_ids(args, tok)
    except FAILURES as err:
        return fail("generate", err)
    setup = f"; {args.setup}" if args.setup else ""
    print(
        f"loaded {args.file} with {model.weights} in {model.load_s:.2f} s "
        f"({args.backend}, {args.dtype}, cache for {cache_positions(model, args)} positions{setup})",
        file=sys.stderr,
    )
    if tok is None and not args.print_ids:
        print(f"note: {model.weights} has no tokenizer: printing token ids", file=sys.stderr)
    try:
        step_model = model.step_model()
        gen = Generator(step_model, tok)
        with watch_compile(args, getattr(step_model, "compile_kind", "")) as compiled:
            gen.warm_up(len(ids))
        print(compiled.describe(), file=sys.stderr)
        if args.print_ids or tok is None:
            _stream_ids(gen, ids, params)
        else:
            for piece in gen.stream_text(ids, params):
                sys.stdout.write(piece)
                sys.stdout.flush()
    except FAILURES as err:
        return fail("generate", err)
    sys.stdout.write("\n")
    sys.stdout.flush()
    positions = cache_positions(model, args)
    line = timing_line(gen.last_result, args.max_new_tokens, positions, capped=positions < args.max_positions)
    print(line, file=sys.stderr)
    return EXIT_OK


def _encoder_decoder_refusal(file: str, program) -> str | None:
    """Why `generate` cannot run `program`, or None: generation feeds `step` token ids alone, so a `step` that reads
    state it never writes (an encoder-decoder's cross-attention cache, which another entry fills from the encoder's
    input) or a `forward` that takes inputs beside the token ids would decode from an empty (zero) encoder output,
    printing tokens that mean nothing."""
    from linnet.ir.reads import state_needed_first

    needed = state_needed_first(program, "step")
    forward = program.entries.get("forward")
    others = [v.name for v in forward.inputs if v.name not in ("input_ids", "decoder_input_ids")] if forward else []
    if not needed and not others:
        return None
    writers = [e for e in program.entries if e != "step" and set(needed) & set(program.state_written(e))]
    why = (
        f"`step` reads {', '.join(needed[:2])}{' and more' if len(needed) > 2 else ''}, which "
        + (f"`{writers[0]}` writes" if writers else "no entry of `step`'s writes")
        if needed
        else f"`forward` takes {', '.join(f'`{n}`' for n in others)} beside the token ids"
    )
    return (
        f"{file} is an encoder-decoder ({why}): `linnet generate` feeds the decoder token ids only and cannot feed "
        "its encoder; transcribe speech with `linnet transcribe`"
    )


def pick_example(args: argparse.Namespace) -> None:
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


def register(sub) -> None:
    """Add the subcommands of this module to the `linnet` parser."""
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
