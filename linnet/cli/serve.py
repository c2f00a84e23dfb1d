"""`linnet serve`: an OpenAI-compatible HTTP server (`linnet.runtimes.serve.http`) around the serving engine.

Loads the model as `linnet generate` does (the registry's `--backend`, `--weights` alone picks the zoo's source),
with the embedded SmolLM2 when neither FILE nor `--weights` is given, starts one `Engine` over its `max_batch`
cache rows and serves it with uvicorn until SIGINT or SIGTERM. Imports nothing heavy until it runs, so
`linnet check` never loads the runtimes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from linnet.cli.common import (
    BACKEND_HELP,
    BACKEND_NAMES,
    EXIT_ERRORS,
    EXIT_OK,
    EXIT_USAGE,
    FAILURES,
    UsageError,
    add_common,
    fail,
    load_model,
    print_notes,
)
from linnet.cli.generate import pick_example

# served when neither FILE nor --weights is given, as the README's first example answers from it
DEFAULT_WEIGHTS = "smollm2-135m-instruct"
API_KEY_ENV = "LINNET_API_KEY"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as `linnet.cli.main` answers KeyboardInterrupt
# --max-queue-delay-ms's default: the engine's (`engine.MAX_QUEUE_DELAY_S`), written here so that parsing the command
# line imports no runtime
MAX_QUEUE_DELAY_MS = 0.0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
        if args.ray:  # N replicas on Ray Serve, each what follows (linnet/cli/serve_ray.py)
            from linnet.cli.serve_ray import serve_on_ray

            return serve_on_ray(args)
        pick_model(args)
        model = load_model(args, random_weights=False, throughput=True)
    except UsageError as err:
        print(f"linnet serve: {err}", file=sys.stderr)
        return EXIT_USAGE
    except FAILURES as err:
        return fail("serve", err)
    print_notes(model)
    try:
        app, engine, summary = build_app(args, model)
    except ValueError as err:
        return fail("serve", err)
    return serve_http(args, app, engine, summary)


def build_app(args: argparse.Namespace, model):
    """(app, engine, summary): the started `Engine` over `model`'s cache rows (every compiled shape warmed up
    first) and the FastAPI app serving it as `--served-model-name` (default: the weights), whose lifespan's end
    shuts the engine down; `summary` is the line `linnet serve` prints about it. Raises ValueError for a model
    without a tokenizer or without `entry fn step`."""
    tokenizer = model.tokenizer()
    if tokenizer is None:
        raise ValueError(f"{model.weights} has no tokenizer (tokenizer.json); linnet serve needs one")
    if "step" not in model.program.entries:
        raise ValueError(f"{args.file}: serving needs a decoder with `entry fn step`")
    from linnet.runtimes.backends import get_backend
    from linnet.runtimes.serve.engine import Engine
    from linnet.runtimes.serve.http import create_app, default_max_request_bytes

    step_model = model.step_model()
    name = args.served_model_name or str(model.weights)
    # the backend's process set-up again whenever the server falls idle (`Backend.setup_process`: on torch eager, the
    # thread count of the cores idle now; a server started while the machine was busy kept 1 thread for its whole
    # life). Not where compiled kernels are specialised to the thread count (`thread_specific`).
    backend = get_backend(args.backend)
    on_idle = None if backend.thread_specific else (lambda: backend.setup_process(args.device))
    engine = Engine(
        step_model,
        tokenizer,
        max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk,
        step_token_budget=args.max_num_batched_tokens,
        max_queue_delay_s=args.max_queue_delay_ms / 1000,
        on_idle=on_idle,
    )
    compile_kind = getattr(step_model, "compile_kind", "")
    if compile_kind:
        # compile (or build the session for) every decode batch size and prefill bucket before the first client
        # comes, so no request's time to first token includes it
        started = time.perf_counter()
        engine.warm_up()
        print(f"linnet serve: {compile_kind} took {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    engine.start()
    app = create_app(
        engine,
        tokenizer,
        name,
        api_key=args.api_key,
        shutdown_engine=True,
        max_request_bytes=args.max_request_bytes,
    )
    body_limit = args.max_request_bytes or default_max_request_bytes(step_model.max_positions)
    setup = f"; {args.setup}" if args.setup else ""
    summary = (
        f"{args.backend}, {args.dtype}, {step_model.max_batch} cache rows of {step_model.max_positions} positions, "
        f"queue of {args.max_queue}, bodies up to {body_limit} bytes{', API key required' if args.api_key else ''}"
        f"{setup}"
    )
    return app, engine, summary


def serve_http(args: argparse.Namespace, app, engine, summary: str) -> int:
    """Serve `app` with uvicorn on `--host`:`--port` until SIGINT (exit 130) or SIGTERM (exit 0); exit 1 when the
    address cannot be bound."""
    from linnet.runtimes.serve.http import run_server

    name = app.state.linnet.model_name

    def announce(url: str) -> None:
        print(f"linnet serve: serving {name} at {url}/v1 ({summary})", file=sys.stderr, flush=True)

    # uvicorn re-raises the signal that stopped it once it has shut down; SIGTERM then ends here with status 0
    # (SIGINT raises KeyboardInterrupt, which `linnet.cli.main` turns into 130)
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        run_server(app, args.host, args.port, on_started=announce)
    except SystemExit as exit_:  # uvicorn exits 1 when it cannot bind; it has logged why
        engine.shutdown()
        return EXIT_ERRORS if exit_.code else EXIT_OK
    except OSError as err:
        engine.shutdown()
        return fail("serve", err)
    except KeyboardInterrupt:  # SIGINT, re-raised by uvicorn after its clean shutdown
        print("linnet serve: stopped (SIGINT)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print("linnet serve: stopped", file=sys.stderr)
    return EXIT_OK


def pick_model(args: argparse.Namespace) -> None:
    """Without FILE, the shipped example for `--weights` (the embedded DEFAULT_WEIGHTS without either), said on
    stderr. Raises LoadError for a checkpoint whose model_type no example implements."""
    if args.file is None:
        if args.weights is None:
            args.weights = DEFAULT_WEIGHTS
            print(f"no FILE nor --weights: serving the embedded {DEFAULT_WEIGHTS}", file=sys.stderr)
        pick_example(args)


def _check_args(args: argparse.Namespace) -> None:
    for flag, value, least in (
        ("--port", args.port, 0),
        ("--max-batch", args.max_batch, 1),
        ("--max-queue", args.max_queue, 1),
        ("--prefill-chunk", args.prefill_chunk, 1),
        ("--max-num-batched-tokens", args.max_num_batched_tokens, 1),
        ("--max-request-bytes", 1 if args.max_request_bytes is None else args.max_request_bytes, 1),
    ):
        if value < least:
            raise UsageError(f"{flag} must be >= {least}, got {value}")
    if not (0 <= args.max_queue_delay_ms < float("inf")):  # NaN fails it too
        raise UsageError(f"--max-queue-delay-ms must be a number of milliseconds >= 0, got {args.max_queue_delay_ms}")
    if args.port > 65535:
        raise UsageError(f"--port must be <= 65535, got {args.port}")
    if args.replicas is not None and args.replicas < 1:
        raise UsageError(f"--replicas must be >= 1, got {args.replicas}")
    if args.cpus_per_replica <= 0:
        raise UsageError(f"--cpus-per-replica must be > 0, got {args.cpus_per_replica}")
    if not args.ray:
        given = [flag for flag, value in (("--replicas", args.replicas), ("--ray-address", args.ray_address)) if value]
        if given:
            raise UsageError(f"{given[0]} is an option of Ray Serve: add --ray")
    if args.api_key is not None and not args.api_key:
        raise UsageError(f"--api-key (or {API_KEY_ENV}) must not be empty")
    if args.served_model_name is not None and not args.served_model_name:
        raise UsageError("--served-model-name must not be empty (without it, the model is named by its weights)")


def register(sub) -> None:
    serve = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions)"
    )
    add_common(
        serve,
        file_help="a .linnet source with a root model; without it, the shipped example for --weights' model_type, "
        f"and without either, the embedded {DEFAULT_WEIGHTS}",
        max_batch=8,
        stored=True,
    )
    serve.add_argument("--backend", choices=BACKEND_NAMES, default="torch", metavar="BACKEND", help=BACKEND_HELP)
    serve.add_argument("--provider", action="append", choices=("cpu", "cuda", "tensorrt"), help="onnxruntime providers")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="the port (8000; 0 picks a free one)")
    serve.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="requests waiting for a row, when none is free, at most (256); then 429",
    )
    serve.add_argument(
        "--prefill-chunk",
        type=int,
        default=256,
        metavar="N",
        help="prompt tokens one step prefills for one request at most (256)",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        metavar="N",
        help="tokens one step aims at: decode tokens plus prefill chunks (512); on an accelerator, full chunks of "
        "several prompts that fit prefill in one step (e.g. 4160 with --prefill-chunk 512 for 8 at once)",
    )
    serve.add_argument(
        "--max-queue-delay-ms",
        type=float,
        default=MAX_QUEUE_DELAY_MS,
        metavar="MS",
        help="how long an idle server holds the first request of a burst for the others, so they prefill in one "
        f"step ({MAX_QUEUE_DELAY_MS:g}: no wait)",
    )
    serve.add_argument(
        "--max-request-bytes",
        type=int,
        metavar="N",
        help="the largest request body; larger ones get 413 (default: 2 MiB, or 32 bytes per cache position where "
        "that is more)",
    )
    serve.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        metavar="KEY",
        help=f"require `Authorization: Bearer KEY` on every request (default: ${API_KEY_ENV}, else none)",
    )
    serve.add_argument(
        "--served-model-name", metavar="NAME", help="the model id clients send and /v1/models lists (default: W)"
    )
    ray = serve.add_argument_group("scale-out on Ray Serve (needs linnet[ray]; docs/serving-scale-out.md)")
    ray.add_argument(
        "--ray",
        action="store_true",
        help="serve as Ray Serve replicas behind Ray's HTTP proxy (at --host:--port), with the same routes",
    )
    ray.add_argument("--replicas", type=int, metavar="N", help="engine replicas, each its own process (1)")
    ray.add_argument(
        "--cpus-per-replica",
        type=float,
        default=1.0,
        metavar="N",
        help="CPUs Ray reserves for each replica (1); PyTorch runs that many threads",
    )
    ray.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to join: `auto` (the one `ray start` runs here) or HEAD:PORT; default: a Ray "
        "instance of this process's own, sized for the replicas, ended with it",
    )
    serve.set_defaults(func=cmd_serve)
