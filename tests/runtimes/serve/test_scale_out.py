"""Scale-out: two `linnet serve` replicas behind nginx, configured exactly as docs/serving-scale-out.md says.

The nginx configuration is read from that page (its ```nginx block), with only the ports rewritten to free ones,
so the documented file is the tested one. The real `nginx` binary runs it (Debian's `nginx-light`; skipped, saying
so, where it is not installed). Through the balancer, concurrent requests (streamed and not) each get exactly
their solo output (`Generator.generate`), both replicas serve some, streamed chunks arrive one by one rather than
in one buffered burst, and with one replica stopped every request is still answered by the other.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.runtimes.serve.tiny_server import ROOT, LiveServer, solo_runner, write_tiny_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.torch]

# Debian installs it in /usr/sbin, which a non-root PATH lacks
NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
DOC = ROOT / "docs" / "serving-scale-out.md"
MAX_POSITIONS = 128
NEW_TOKENS = 8
PROMPTS = [f"Replica test {i}: the {word} of the model is" for i, word in enumerate("abcdefgh")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def documented_config(listen: int, replicas: list[int]) -> str:
    """docs/serving-scale-out.md's nginx.conf with its listen port and upstream servers' ports replaced."""
    block = re.search(r"```nginx\n(.*?)```", DOC.read_text(), re.S)
    assert block, f"{DOC} has no ```nginx block"
    conf = block.group(1)
    documented = re.findall(r"server 127\.0\.0\.1:(\d+)", conf)
    assert len(documented) == len(replicas), documented
    for old, new in zip(documented, replicas, strict=True):
        conf = conf.replace(f"server 127.0.0.1:{old} ", f"server 127.0.0.1:{new} ")
    conf, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{listen};", conf)
    assert n == 1
    return conf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def replicas(checkpoint, tmp_path_factory):
    started = []
    args = ("--weights", str(checkpoint), "--max-batch", "2", "--max-positions", str(MAX_POSITIONS))
    try:
        for _ in range(2):
            started.append(LiveServer(tmp_path_factory.mktemp("replica"), *args))
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture(scope="module")
def balancer(replicas, tmp_path_factory):
    """nginx in front of the replicas; yields its base URL."""
    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light); docs/serving-scale-out.md's setup")
    prefix = tmp_path_factory.mktemp("lb")
    (prefix / "logs").mkdir()
    port = free_port()
    ports = [int(r.url.rsplit(":", 1)[1]) for r in replicas]
    (prefix / "nginx.conf").write_text(documented_config(port, ports))
    proc = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", "nginx.conf", "-g", "daemon off;"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                assert r.status == 200
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log = (prefix / "logs" / "error.log").read_text() if (prefix / "logs" / "error.log").exists() else ""
                pytest.fail(f"nginx did not start: {proc.stdout.read()}\n{log}")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def solo(checkpoint):
    from linnet.runtimes.sampling import SamplingParams

    generator, tokenizer = solo_runner(checkpoint, MAX_POSITIONS)
    return [generator.generate(tokenizer.encode(p), SamplingParams(max_new_tokens=NEW_TOKENS)).text for p in PROMPTS]


async def ask_all(url: str) -> tuple[list[str], list[int]]:
    """Every prompt at once through `url`, odd ones streamed; returns the texts and each stream's chunk count."""
    api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    model = (await api.models.list()).data[0].id

    async def one(i: int, prompt: str) -> tuple[str, int]:
        if i % 2 == 0:
            r = await api.completions.create(model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0)
            return r.choices[0].text, 0
        chunks = await api.completions.create(
            model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, stream=True
        )  # fmt: skip
        pieces = [c.choices[0].text async for c in chunks if c.choices]
        return "".join(pieces), len(pieces)

    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))
    await api.close()
    return [r[0] for r in results], [r[1] for r in results if r[1]]


def served(replica: LiveServer) -> float:
    return replica.metrics().get("linnet:request_success_total", 0.0)


def test_replicas_behind_nginx_serve_exact_outputs_and_share_the_load(replicas, balancer, solo):
    before = [served(r) for r in replicas]
    texts, chunk_counts = asyncio.run(ask_all(balancer))
    assert texts == solo
    assert all(n > 1 for n in chunk_counts), chunk_counts  # streamed through nginx, not buffered into one chunk
    after = [served(r) for r in replicas]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)  # least_conn used both
    for r in replicas:
        r.wait_idle()


def test_a_stopped_replica_is_skipped(replicas, balancer, solo):
    replicas[0].stop()
    texts, _ = asyncio.run(ask_all(balancer))
    assert texts == solo
