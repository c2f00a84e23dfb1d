"""32 concurrent clients against one `linnet serve` (8 cache rows): each gets exactly the text it gets alone, greedy
(half of them) and with seeded sampling (the other half), whatever else shares the batch (no cross-talk between
rows or streams). The prompts differ, several share a long prefix, and half the clients stream."""

from __future__ import annotations

import asyncio

import pytest

from tests.runtimes.serve.live_server import start_server, stop_server

pytestmark = [pytest.mark.torch, pytest.mark.slow]
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

MODEL = "smollm2-135m-instruct"
CLIENTS = 32
MAX_TOKENS = 6
PREFIX = "You are a helpful assistant who answers in one short sentence. Question number "
PROMPTS = [
    *(f"{PREFIX}{i}: name a colour." for i in range(12)),
    *(f"Count from {i} to {i + 5}:" for i in range(10)),
    *(f"The {word} is" for word in ("sky", "sea", "sun", "moon", "grass", "snow", "night", "fire", "rain", "wind")),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url, log = start_server(
        tmp_path_factory.mktemp("serve"), "--max-positions", "128", "--max-batch", "8", "--max-queue", "64"
    )
    yield url
    code, text = stop_server(proc, log)
    assert code == 0 and "Traceback" not in text, text


async def _complete(client, prompt: str, stream: bool, **sampling) -> str:
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, **sampling)
    if not stream:
        return (await client.completions.create(**kwargs)).choices[0].text
    return "".join([c.choices[0].text async for c in await client.completions.create(stream=True, **kwargs)])


def _sampling(i: int) -> dict:
    """Client i's options: even clients greedy, odd ones sampling with their own seed."""
    return {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.95, "seed": 100 + i}


def test_concurrent_clients_get_their_solo_text(server):
    assert len(PROMPTS) == CLIENTS

    async def run() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=600) as c:
            alone = [await _complete(c, p, False, **_sampling(i)) for i, p in enumerate(PROMPTS)]
            together = await asyncio.gather(
                *(_complete(c, p, i % 4 >= 2, **_sampling(i)) for i, p in enumerate(PROMPTS))
            )
        return alone, list(together)

    alone, together = asyncio.run(run())
    assert together == alone
    assert len(set(alone)) > CLIENTS // 2  # different prompts, different texts: a mix-up would show
