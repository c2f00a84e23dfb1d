"""`linnet serve --ray`: `linnet serve`'s app as N Ray Serve replicas behind Ray's HTTP proxy, and the builder
`serve run` takes (`linnet.cli.serve_ray:build`).

Each replica loads the model and serves it exactly as `linnet serve` does (`serve.build_app`: one `Engine`, the same
FastAPI app and routes); `linnet.runtimes.serve.ray_deployment` mounts it on Ray Serve. This process starts a Ray
instance of its own (or joins a cluster with `--ray-address`), deploys the replicas, announces the URL once every
replica is up, and on SIGINT or SIGTERM takes them down again (on a cluster of its own, every Ray process with
them). docs/serving-scale-out.md has the recipe for a real cluster.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import signal
import socket
import sys
import threading
import urllib.request
from pathlib import Path

from linnet.cli.common import EXIT_ERRORS, EXIT_OK, UsageError, check_paths, load_model, print_notes
from linnet.cli.serve import EXIT_INTERRUPTED, build_app, pick_model

APP_NAME = "linnet"  # the Serve application's name on the cluster (`serve status` lists it)


def serve_on_ray(args: argparse.Namespace) -> int:
    """Run `linnet serve --ray` until SIGINT (exit 130) or SIGTERM (exit 0); exit 1 when the replicas do not start.
    Raises UsageError when Ray Serve is not installed, before anything is loaded or started."""
    ray_deployment = _import_ray()
    pick_model(args)
    check_paths(args)  # what can be refused here is refused before Ray starts, not by every replica in turn
    Path(args.file).read_bytes()  # OSError: a FILE that cannot be read
    replicas = args.replicas or 1
    own_cluster = args.ray_address is None
    try:
        port = _proxy_port(args.host, args.port, check_free=own_cluster)
    except OSError as err:
        print(f"linnet serve: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return EXIT_ERRORS
    stopped = threading.Event()
    signals = {}

    def on_signal(signum, frame) -> None:
        signals.setdefault("first", signum)
        stopped.set()

    previous = {}
    try:
        try:
            num_cpus = math.ceil(replicas * args.cpus_per_replica)
            ray_deployment.start(args.ray_address, args.host, port, num_cpus=num_cpus)
            # after `ray.init`, whose own SIGTERM handler logs a stack and aborts the process
            previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            ray_deployment.serve.run(_application(ray_deployment, args), name=APP_NAME, route_prefix="/")
            url = f"http://{args.host}:{port}"
            name = _served_name(url, args.api_key)
        except Exception as err:  # Ray fails in many types (ConnectionError, RuntimeError, RayTaskError,
            # GetTimeoutError...): each is one line here, and Ray has logged the replicas' tracebacks
            why = ray_deployment.replica_error(APP_NAME) if ray_deployment.ray.is_initialized() else None
            print(f"linnet serve: Ray Serve did not start: {why or _first_line(err)}", file=sys.stderr)
            return EXIT_ERRORS
        print(
            f"linnet serve: serving {name} at {url}/v1 ({replicas} Ray Serve replica(s) of {args.backend}, "
            f"{args.max_batch} cache rows each; Ray's proxy routes)",
            file=sys.stderr,
            flush=True,
        )
        while not stopped.wait(1.0):
            pass
    finally:
        ray_deployment.stop(APP_NAME, own_cluster=own_cluster)
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("linnet serve: stopped" + (" (SIGINT)" if signals.get("first") == signal.SIGINT else ""), file=sys.stderr)
    return EXIT_INTERRUPTED if signals.get("first") == signal.SIGINT else EXIT_OK


def replica_app(args: argparse.Namespace):
    """The app one replica serves, built in the replica's process: the model of `args` loaded as `linnet serve`
    loads it (on an accelerator, its layers unrolled: `load_model(..., throughput=True)`), its engine
    started. Raises what `load_model` and `build_app` raise (Ray retries, then reports it)."""
    model = load_model(args, random_weights=False, throughput=True)
    print_notes(model)
    app, _, summary = build_app(args, model)
    print(f"linnet serve: replica ready ({summary})", file=sys.stderr, flush=True)
    return app


def build(options: dict):
    """The Ray Serve application for `serve run linnet.cli.serve_ray:build KEY=VALUE...` or a Serve config file's
    `import_path`/`args`: each key is a `linnet serve` option without its dashes (`file`, `weights`, `max_batch`,
    `replicas`, `cpus_per_replica`, `backend`...), each value its argument (true: a flag given alone). Raises
    UsageError for options `linnet serve` would refuse (Serve prints it), naming them."""
    ray_deployment = _import_ray()
    from linnet.cli import build_parser

    argv = ["serve"]
    for key, value in options.items():
        if key == "file":
            argv.append(str(value))
        elif value is True or value == "true":
            argv.append(f"--{key.replace('_', '-')}")
        else:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    argv.append("--ray")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # argparse has printed why
        raise UsageError(f"linnet serve refuses these options: {' '.join(argv[1:])}") from None
    from linnet.cli.serve import _check_args

    _check_args(args)
    pick_model(args)
    check_paths(args)
    return _application(ray_deployment, args)


def _application(ray_deployment, args: argparse.Namespace):
    """`args`' replicas as a Serve application: one GPU each on `--device cuda`, and Ray's proxy lets each hold
    what its engine admits (cache rows plus queue)."""
    return ray_deployment.application(
        functools.partial(replica_app, args),
        replicas=args.replicas,
        cpus_per_replica=args.cpus_per_replica,
        gpus_per_replica=1.0 if args.device.startswith("cuda") else 0.0,
        max_ongoing_requests=args.max_batch + args.max_queue,
    )


def _import_ray():
    try:
        from linnet.runtimes.serve import ray_deployment
    except ImportError as err:
        raise UsageError(f"--ray needs Ray Serve, which is not installed ({err}): pip install 'linnet[ray]'") from None
    return ray_deployment


def _proxy_port(host: str, port: int, check_free: bool) -> int:
    """The port Serve's proxy will listen on: `port`, or a free one for 0 (the proxy needs a fixed port: it binds it
    on every node). With `check_free`, raises OSError when something listens on it here already (Ray's proxy would
    fail to bind it and Serve would give up after a minute)."""
    if port and not check_free:
        return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        return s.getsockname()[1]


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _served_name(url: str, api_key: str | None) -> str:
    """The served model's id, asked through Ray's proxy (which also shows the route works end to end)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers=headers), timeout=30) as r:
        return json.load(r)["data"][0]["id"]
