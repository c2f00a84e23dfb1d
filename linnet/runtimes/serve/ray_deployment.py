"""Linnet's OpenAI server as a Ray Serve deployment: N replicas, one engine each, behind Ray's HTTP proxy.

Each replica is a Ray actor serving the very app `linnet serve` serves (`http.create_app` around one `Engine`),
mounted through Ray Serve's FastAPI ingress (`@serve.ingress`, late-bound: `__serve_build_asgi_app__` builds the app
in the replica's own process once Ray has placed it, so the weights are loaded there and never pickled). Ray's proxy
routes each request to one replica (power of two choices on the replicas' ongoing requests), passes the SSE chunks
through as they come, and Ray's controller replaces a replica whose process dies.

`linnet serve --ray` and the `serve run` builder (linnet/cli/serve_ray.py) drive this module;
docs/serving-scale-out.md says how to run it on a cluster. Imports Ray: import it only when Ray Serve is wanted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import ray
from ray import serve

__all__ = ["REPLICA_HEADER", "LinnetReplica", "application", "replica_error", "start", "stop"]

# every response says which replica answered: "<Ray's replica id>; pid=<its process id>"
REPLICA_HEADER = "x-linnet-replica"
# the object store holds nothing of ours (requests and chunks pass as small messages); Ray's floor is 75 MiB
OBJECT_STORE_BYTES = 100 * 2**20
HEALTH_CHECK_PERIOD_S = 2.0


class _ReplicaHeader:
    """Pure ASGI middleware adding `REPLICA_HEADER: value` to every HTTP response (streams untouched)."""

    def __init__(self, app, value: str) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), value.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


@serve.deployment(name="LinnetReplica")
@serve.ingress()
class LinnetReplica:
    """One replica. `build_app`: a picklable callable, run once in the replica's process, returning the FastAPI app
    it serves (its lifespan's end shuts the engine down when Ray stops the replica)."""

    def __init__(self, build_app: Callable[[], Any]) -> None:
        self._build_app = build_app

    def __serve_build_asgi_app__(self):
        app = self._build_app()
        replica_id = serve.get_replica_context().replica_id.unique_id
        app.add_middleware(_ReplicaHeader, value=f"{replica_id}; pid={os.getpid()}")
        return app


def application(
    build_app: Callable[[], Any],
    *,
    replicas: int | None,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    max_ongoing_requests: int = 5,
) -> serve.Application:
    """The Ray Serve application: `replicas` copies of `LinnetReplica(build_app)` (None: as a Serve config's
    `num_replicas` or `autoscaling_config` says, else 1), each reserving
    `cpus_per_replica` CPUs (Ray sets the replica's OMP_NUM_THREADS to it, which PyTorch's thread count follows)
    and `gpus_per_replica` GPUs. `max_ongoing_requests`: what Ray's proxy lets one replica hold at once (its cache
    rows plus its queue, so each replica admits, queues and refuses with 429 as `linnet serve` alone does); the
    rest wait in the proxy. A replica that fails to start is retried once per replica, then `serve.run` raises."""
    count = {} if replicas is None else {"num_replicas": replicas}  # a count set here would clash with autoscaling
    return LinnetReplica.options(
        **count,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=max_ongoing_requests,
        max_constructor_retry_count=replicas or 1,
        # Ray finds a replica's process gone at its next health check (default every 10 s); a check is one small
        # message to the actor, so look every 2 s and replace a dead replica sooner
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
    ).bind(build_app)


def start(address: str | None, host: str, port: int, num_cpus: int | None = None) -> None:
    """Connect to the Ray cluster at `address` (`auto`: the one `ray start` runs on this machine; `HOST:PORT`: its
    head), or, with None, start a Ray instance for this process alone (`num_cpus` logical CPUs, a 100 MiB object
    store, no dashboard; `stop` ends it); then start Serve with its HTTP proxy on `host`:`port` (on a cluster, on
    every node). Raises ConnectionError when there is no cluster at `address`."""
    if address is None:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=OBJECT_STORE_BYTES,
            include_dashboard=False,
            configure_logging=False,
        )
    else:
        _check_reachable(address)
        ray.init(address=address, configure_logging=False)
    serve.start(http_options={"host": host, "port": port})


def replica_error(app_name: str) -> str | None:
    """Why the replicas of `app_name` failed to start, as the last line of the error Serve recorded (e.g.
    `linnet.errors.CheckpointError: ... no config.json in this folder ...`), or None when it recorded none."""
    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # Serve is down too: there is nothing more to say than serve.run did
        return None
    for deployment in (app.deployments if app else {}).values():
        lines = [line.strip() for line in (deployment.message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return None


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise ConnectionError when a `HOST:PORT` address does not accept a TCP connection: `ray.init` would retry
    it for minutes, logging each try. Other forms (`auto`, `ray://...`) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in address:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at {address} ({err.strerror or err})") from None


def stop(app_name: str, *, own_cluster: bool) -> None:
    """Undo `start`: on a Ray instance of our own, shut Serve and Ray down (every replica and Ray process ends);
    on a shared cluster, delete our application alone and disconnect. Nothing when Ray was not started."""
    if not ray.is_initialized():
        return
    try:
        if own_cluster:
            serve.shutdown()
        else:
            serve.delete(app_name)
    finally:
        ray.shutdown()
