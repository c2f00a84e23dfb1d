"""Scale-out on Ray Serve: `linnet serve --ray --replicas 2` on loopback, driven by the official `openai` client.

One real `linnet serve --ray` process per module (it starts a Ray instance of its own, 2 logical CPUs, a 100 MiB
object store, in a temporary folder of its own) serves a tiny Llama from two replicas behind Ray's HTTP proxy. Each
response names its replica (`X-Linnet-Replica`), so the tests see that both replicas serve (exactly what
`linnet generate` gives each prompt alone); that a replica killed mid-stream (SIGKILL) fails its clients with an
error (the stream is cut before `[DONE]`, so the client raises; a request not streamed gets a 500), never a hang nor
a truncated stream that ends as a complete one would, while the other replica's stream goes on; that Ray replaces
the dead replica; and that stopping the server leaves no Ray process behind. Skipped, saying why, where Ray Serve
is not installed (`linnet[ray]`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.runtimes.serve.live_server import start_server, stop_server
from tests.runtimes.serve.tiny_server import solo_runner, write_tiny_llama

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve is not installed (pip install 'linnet[ray]')", allow_module_level=True)
pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.torch, pytest.mark.ray]

MAX_POSITIONS = 1024  # room for a stream long enough to be killed in the middle
PROMPTS = [f"Ray replica test {i}: the {word} of the model is" for i, word in enumerate("abcd")]
NEW_TOKENS = 12
LONG_TOKENS = 900  # a few seconds of decoding on 2 busy cores: the kill lands mid-stream
REPLICA_HEADER = "x-linnet-replica"
RESTART_TIMEOUT_S = 120


class RayServer:
    """`linnet serve --ray --replicas 2` in its own process, with its Ray processes (every descendant) recorded."""

    def __init__(self, folder, checkpoint) -> None:
        # Ray's sockets live under RAY_TMPDIR, and a Unix socket's path is limited to 107 bytes: a short folder
        self.ray_tmp = tempfile.mkdtemp(prefix="lnray", dir="/tmp")
        args = ("--weights", str(checkpoint), "--ray", "--replicas", "2", "--max-batch", "2")
        with pytest.MonkeyPatch.context() as env:
            env.setenv("RAY_TMPDIR", self.ray_tmp)
            env.setenv("RAY_DEDUP_LOGS", "0")  # every replica's lines in the log, not "[repeated 2x]"
            started = time.monotonic()
            try:
                self.proc, self.url, self.log = start_server(folder, *args, "--max-positions", str(MAX_POSITIONS))
            except BaseException:  # pytest.fail: the server did not start (start_server has SIGKILLed it)
                self.descendants = self.started_here()  # Ray's own processes (raylet, gcs_server) name the folder
                self.kill_leftovers()
                raise
            self.start_s = time.monotonic() - started
        self.descendants: list = []

    def ray_processes(self) -> list:
        """The server's live descendants (gcs_server, raylet, the Serve controller, proxy and replicas...)."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> tuple[int, str, float]:
        """SIGTERM, once; returns (exit status, log, seconds it took)."""
        self.descendants = self.ray_processes()
        started = time.monotonic()
        code, log = stop_server(self.proc, self.log)
        return code, log, time.monotonic() - started

    def leftovers(self, timeout_s: float = 15.0) -> list[str]:
        """The recorded descendants, and any process started from our Ray folder, still alive after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [p for p in self.descendants if _alive(p)] + self.started_here()
            if not alive or time.monotonic() > deadline:
                return [f"{p.pid} {_name(p)}" for p in alive]
            time.sleep(0.5)

    def started_here(self) -> list:
        """The processes whose command line names our Ray folder (gcs_server, raylet and Ray's agents do)."""
        return [p for p in psutil.process_iter(["cmdline"]) if self.ray_tmp in " ".join(p.info["cmdline"] or ())]

    def kill_leftovers(self) -> None:
        for p in self.descendants + self.started_here():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    s = RayServer(tmp_path_factory.mktemp("ray-serve"), checkpoint)
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            s.stop()
        s.kill_leftovers()


@pytest.fixture(scope="module")
def api(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def model(api) -> str:
    return api.models.list().data[0].id


def replica_of(headers) -> tuple[str, int]:
    """(Ray's replica id, its process id) from a response's X-Linnet-Replica header."""
    value = headers[REPLICA_HEADER]
    replica, _, pid = value.partition("; pid=")
    return replica, int(pid)


def health_replicas(url: str, tries: int = 20) -> set[tuple[str, int]]:
    """The replicas that answer /health over `tries` requests (Ray's router picks one of two at random)."""
    seen = set()
    for _ in range(tries):
        with urllib.request.urlopen(f"{url}/health", timeout=30) as r:
            assert r.status == 200
            seen.add(replica_of(r.headers))
    return seen


def test_both_replicas_serve_the_openai_routes_with_solo_outputs(server, api, model, checkpoint):
    from linnet.runtimes.sampling import SamplingParams

    assert model == str(checkpoint)
    generator, tokenizer = solo_runner(checkpoint, MAX_POSITIONS)
    solo = [
        generator.generate(tokenizer.encode(p), SamplingParams(max_new_tokens=NEW_TOKENS)).text for p in PROMPTS
    ]  # fmt: skip
    served_by: dict[tuple[str, int], int] = {}
    texts = []
    for i, prompt in enumerate(PROMPTS):
        if i % 2:
            with api.completions.with_streaming_response.create(
                model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, stream=True
            ) as raw:
                replica = replica_of(raw.headers)
                chunks = [c for c in raw.parse() if c.choices]
                texts.append("".join(c.choices[0].text for c in chunks))
                assert [c.choices[0].finish_reason is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
        else:
            raw = api.completions.with_raw_response.create(
                model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0
            )  # fmt: skip
            replica = replica_of(raw.headers)
            texts.append(raw.parse().choices[0].text)
        served_by[replica] = served_by.get(replica, 0) + 1
    assert texts == solo
    # the chat route and the rest of the API, through Ray's proxy
    chat = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )  # fmt: skip
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 4
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as r:
        assert "linnet:request_success_total" in r.read().decode()
    # both replicas answer: /health until each has (Ray routes each request to the less busy of two at random)
    served_by.update(dict.fromkeys(health_replicas(server.url) - set(served_by), 0))
    assert len(served_by) == 2, served_by
    assert len({pid for _, pid in served_by}) == 2


def _stream_on(api, model: str, prompt: str, **options):
    """A started stream (its response open, first chunk read): (raw response, chunk iterator, replica, first)."""
    raw = api.completions.with_streaming_response.create(
        model=model, prompt=prompt, temperature=0, stream=True, **options
    ).__enter__()
    chunks = iter(raw.parse())
    first = next(chunks)
    return raw, chunks, replica_of(raw.headers), first


def test_a_replica_killed_mid_stream_fails_its_client_the_other_goes_on_and_ray_replaces_it(server, api, model):
    # stream A, then stream B until Ray's router puts it on the other replica (it prefers the less busy one)
    a_raw, a_chunks, a_replica, _ = _stream_on(
        api, model, PROMPTS[0], max_tokens=LONG_TOKENS, extra_body={"ignore_eos": True}
    )  # fmt: skip
    for _ in range(10):
        b_raw, b_chunks, b_replica, b_first = _stream_on(api, model, PROMPTS[1], max_tokens=200)
        if b_replica != a_replica:
            break
        b_raw.close()
    assert b_replica != a_replica, "Ray's router put every stream on one replica"
    # and a request not streamed, on whichever replica the router picks
    unstreamed = ThreadPoolExecutor(1).submit(
        api.completions.with_raw_response.create,
        model=model, prompt=PROMPTS[2], max_tokens=LONG_TOKENS, temperature=0, extra_body={"ignore_eos": True},
    )  # fmt: skip
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(a_replica[1], signal.SIGKILL)

    # A's client gets an error, soon: Ray's proxy cuts the chunked body before its end (and before [DONE]), which
    # the openai client raises as a connection error
    a_pieces = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in a_chunks:
            a_pieces.append(chunk)
    a_raw.close()
    assert time.monotonic() - killed_at < 30
    assert all(c.choices[0].finish_reason is None for c in a_pieces if c.choices), "A looked complete"

    # B's stream, on the other replica, goes on to its end, the same text as the request unstreamed
    b_rest = [c for c in b_chunks if c.choices]
    b_raw.close()
    b_text = b_first.choices[0].text + "".join(c.choices[0].text for c in b_rest)
    assert b_rest[-1].choices[0].finish_reason in ("stop", "length")
    alone = api.completions.create(model=model, prompt=PROMPTS[1], max_tokens=200, temperature=0)
    assert b_text == alone.choices[0].text

    # the request not streamed: a 500 from Ray's proxy when it was on the killed replica, else its whole answer
    try:
        raw = unstreamed.result(timeout=120)
    except openai.InternalServerError:
        print("the request not streamed was on the killed replica: 500")
    else:
        print("the request not streamed was on the other replica: answered")
        assert replica_of(raw.headers) == b_replica
        assert raw.parse().usage.completion_tokens == LONG_TOKENS

    # Ray replaces the dead replica: two replicas answer again, neither of them the killed one
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
        replicas = health_replicas(server.url, tries=6)
        if a_replica not in replicas and len(replicas) == 2:
            break
        assert time.monotonic() < deadline, f"Ray did not replace {a_replica} in {RESTART_TIMEOUT_S} s: {replicas}"
        time.sleep(1)
    print(f"replica replaced {time.monotonic() - killed_at:.1f} s after the kill")
    assert not psutil.pid_exists(a_replica[1]) or not _alive(psutil.Process(a_replica[1]))
    again = api.completions.create(model=model, prompt=PROMPTS[0], max_tokens=NEW_TOKENS, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length")


def test_stopping_the_server_ends_every_ray_process(server):
    assert len(server.ray_processes()) >= 5  # gcs_server, raylet, the Serve controller, proxy, replicas
    assert server.started_here()  # what `leftovers` also looks for: Ray's processes that name our folder
    code, log, took_s = server.stop()
    print(f"started in {server.start_s:.1f} s, stopped in {took_s:.1f} s")
    assert code == 0, log
    assert "linnet serve: stopped" in log
    assert server.leftovers() == []
