"""`linnet serve` under concurrent load, through the official `openai` client against a real server process.

- 32 concurrent clients with different prompts (8 of them sharing a long prefix), more clients than cache rows
  (`--max-batch 8`), so the batch's composition changes every few steps: greedy, each client gets exactly the text,
  finish reason and token count that `Generator.generate` (what `linnet generate` runs) gives its prompt alone;
  the same with seeded sampling (temperature, top-p, top-k, a seed per client).
- A soak (slow, about 90 seconds) of mixed traffic (completions and chat, streamed and not, `n` 1 or 2) with
  random disconnects: afterwards no request runs or waits, no cache row is in use, and the server process has
  no more threads nor open files than when idle and its RSS within RSS_TOLERANCE_MIB of it.

The server serves a seeded 2-layer Llama with SmolLM2's tokenizer (`tiny_server.write_tiny_llama`), so tokenizing,
EOS, chat templates and detokenizing are the real model's while each step takes milliseconds.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.runtimes.serve.tiny_server import LiveServer, solo_runner, write_tiny_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")
pytest.importorskip("psutil")

pytestmark = [pytest.mark.torch]

MAX_BATCH = 8
MAX_POSITIONS = 384  # the longest prompt (about 250 tokens) in the chat template, plus 48 new tokens
CLIENTS = 32
NEW_TOKENS = 8
SHARED_PREFIX_CLIENTS = 8
# RSS after the soak may exceed its idle value by this much: allocator arenas and Python's free lists keep some
# freed memory (measured: +1.2 MiB over 1464 requests, 396 to 397 MiB); a leak of one request's state per request
# (32+ KiB each, thousands of requests) or of a cache row's tensors is far above it.
RSS_TOLERANCE_MIB = 48
SOAK_S = 75


def prompts() -> list[str]:
    """CLIENTS different prompts from this repository's README; the first SHARED_PREFIX_CLIENTS share a prefix of
    about 100 tokens and differ only in their last sentence; the others are 30 to 250 tokens long."""
    from tests.runtimes.serve.tiny_server import ROOT

    words = (ROOT / "README.md").read_text().split()
    shared = " ".join(words[:60])
    out = [f"{shared} Question {i}: what comes after {words[200 + i]}?" for i in range(SHARED_PREFIX_CLIENTS)]
    out += [" ".join(words[40 * i : 40 * i + 20 + 3 * i]) for i in range(CLIENTS - SHARED_PREFIX_CLIENTS)]
    assert len(set(out)) == CLIENTS
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    args = ("--weights", str(checkpoint), "--max-batch", str(MAX_BATCH), "--max-positions", str(MAX_POSITIONS))
    live = LiveServer(tmp_path_factory.mktemp("serve"), *args)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def solo(checkpoint):
    return solo_runner(checkpoint, MAX_POSITIONS)


def client(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)


async def complete(api: openai.AsyncOpenAI, model: str, prompt: str, stream: bool, **sampling) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of one `/v1/completions` request, streamed or not."""
    if not stream:
        r = await api.completions.create(model=model, prompt=prompt, max_tokens=NEW_TOKENS, **sampling)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens
    pieces, finish, usage = [], None, None
    chunks = await api.completions.create(
        model=model, prompt=prompt, max_tokens=NEW_TOKENS, stream=True, stream_options={"include_usage": True},
        **sampling,
    )  # fmt: skip
    async for chunk in chunks:
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return "".join(pieces), finish, usage


def concurrent(server: LiveServer, texts: list[str], sampling: list[dict]) -> list[tuple[str, str, int]]:
    """Every prompt at once (half streamed, half not), each with its sampling fields."""

    async def run():
        api = client(server)
        model = (await api.models.list()).data[0].id
        jobs = [complete(api, model, t, i % 2 == 1, **s) for i, (t, s) in enumerate(zip(texts, sampling, strict=True))]
        results = await asyncio.gather(*jobs)
        await api.close()
        return results

    return asyncio.run(run())


def expected(solo, texts: list[str], params: list) -> list[tuple[str, str, int]]:
    generator, tokenizer = solo
    out = []
    for text, p in zip(texts, params, strict=True):
        r = generator.generate(tokenizer.encode(text), p)
        out.append((r.text, r.finish_reason, len(r.token_ids)))
    return out


def test_32_concurrent_greedy_clients_each_get_their_solo_output(server, solo):
    from linnet.runtimes.sampling import SamplingParams

    texts = prompts()
    got = concurrent(server, texts, [{"temperature": 0.0}] * CLIENTS)
    want = expected(solo, texts, [SamplingParams(max_new_tokens=NEW_TOKENS)] * CLIENTS)
    wrong = [i for i in range(CLIENTS) if got[i] != want[i]]
    assert not wrong, f"clients {wrong} differ from their solo run, first: {got[wrong[0]]!r} != {want[wrong[0]]!r}"
    assert len({w[0] for w in want}) > CLIENTS // 2  # the outputs differ, so cross-talk would show
    server.wait_idle()


def test_32_concurrent_seeded_sampling_clients_each_get_their_solo_output(server, solo):
    from linnet.runtimes.sampling import SamplingParams

    texts = prompts()
    fields = [
        {"temperature": 0.9, "top_p": 0.95, "seed": 1000 + i, "extra_body": {"top_k": 50}} for i in range(CLIENTS)
    ]
    got = concurrent(server, texts, fields)
    params = [SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1000 + i, max_new_tokens=NEW_TOKENS)
              for i in range(CLIENTS)]  # fmt: skip
    want = expected(solo, texts, params)
    wrong = [i for i in range(CLIENTS) if got[i] != want[i]]
    assert not wrong, f"clients {wrong} differ from their solo run, first: {got[wrong[0]]!r} != {want[wrong[0]]!r}"
    greedy = expected(solo, texts[:4], [SamplingParams(max_new_tokens=NEW_TOKENS)] * 4)
    assert [g[0] for g in got[:4]] != [g[0] for g in greedy]  # it did sample
    server.wait_idle()


async def mixed_client(api: openai.AsyncOpenAI, model: str, texts: list[str], rng: random.Random, until: float) -> int:
    """Requests of every kind until `until` (time.monotonic()); about one in three is dropped mid-way: a stream
    closed after a few chunks, or a non-streamed request cancelled (its connection closed) before the answer.
    Returns the number of requests sent."""
    sent = 0
    while time.monotonic() < until:
        sent += 1
        stream, chat, n = rng.random() < 0.5, rng.random() < 0.3, rng.choice((1, 1, 2))
        drop = rng.random() < 0.35
        text = rng.choice(texts)
        common = {"model": model, "max_tokens": rng.randint(2, 48), "n": n, "temperature": rng.choice((0.0, 0.8))}
        if chat:
            call = api.chat.completions.create(messages=[{"role": "user", "content": text}], stream=stream, **common)
        else:
            call = api.completions.create(prompt=text, stream=stream, **common)
        if not stream:
            try:
                await asyncio.wait_for(call, timeout=rng.uniform(0.01, 0.3) if drop else 300)
            except TimeoutError:
                pass
            continue
        chunks = await call
        keep = rng.randint(1, 4) if drop else None
        async for _ in chunks:
            if keep is not None:
                keep -= 1
                if keep == 0:
                    break
        await chunks.close()
    return sent


def soak(server: LiveServer, seconds: float, clients: int = 12, seed: int = 0) -> int:
    async def run():
        api = client(server)
        model = (await api.models.list()).data[0].id
        until = time.monotonic() + seconds
        texts = prompts()
        counts = await asyncio.gather(
            *(mixed_client(api, model, texts, random.Random(seed * 100 + i), until) for i in range(clients))
        )
        await api.close()
        return sum(counts)

    return asyncio.run(run())


@pytest.mark.slow
def test_soak_with_random_disconnects_leaks_no_row_thread_file_or_memory(server, solo):
    from linnet.runtimes.sampling import SamplingParams

    soak(server, 15, seed=1)  # warm: every request shape once, so lazy allocations are part of "idle"
    idle_metrics = server.wait_idle()
    idle = server.process_state()
    sent = soak(server, SOAK_S, seed=2)
    after_metrics = server.wait_idle()
    after = server.process_state()
    print(f"soak: {sent} requests in {SOAK_S} s; server idle {idle}, after {after}")  # the figures, with -s
    assert sent > 100, sent
    finished = after_metrics["linnet:request_success_total"] - idle_metrics["linnet:request_success_total"]
    assert finished > 0, "no request finished during the soak"
    assert after["threads"] <= idle["threads"], (idle, after)  # fewer is fine: an idle worker thread may retire
    assert after["fds"] <= idle["fds"], (idle, after)
    assert after["rss_mib"] <= idle["rss_mib"] + RSS_TOLERANCE_MIB, (idle, after)
    texts = prompts()[:4]  # and it still answers exactly
    want = expected(solo, texts, [SamplingParams(max_new_tokens=NEW_TOKENS)] * 4)
    assert concurrent(server, texts, [{"temperature": 0.0}] * 4) == want
