"""`linnet serve` end to end: one real server process (the embedded SmolLM2-135M-Instruct on the torch backend, 2
cache rows of 256 positions, a queue of 4, an API key) on a free loopback port, driven by the official `openai`
client, as vLLM's `tests/entrypoints/openai` drive `RemoteOpenAIServer` (docs/serving.md; REFERENCES.md §1).

The references: `linnet generate`'s text for the same prompt (greedy), the same server's non-streamed answer, the
tokenizer's own count of the chat template's tokens, and solo requests for each seed of an `n = 2` request.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.runtimes.serve.live_server import start_server, stop_server

pytestmark = [pytest.mark.torch]

openai = pytest.importorskip("openai")
try:  # the openai client's HTTP library: httpx, or its fork httpx2 in the newest clients
    import httpx
except ImportError:
    httpx = pytest.importorskip("httpx2")
pytest.importorskip("fastapi")
pytest.importorskip("torch")

MODEL = "smollm2-135m-instruct"
API_KEY = "test-key"
MAX_POSITIONS = 256
MAX_BATCH = 2
MAX_QUEUE = 4
START_TIMEOUT_S = 180  # a hang, not a slow start: loading takes a few seconds
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    proc, url, log = start_server(
        tmp,
        "--max-positions",
        str(MAX_POSITIONS),
        "--max-batch",
        str(MAX_BATCH),
        "--max-queue",
        str(MAX_QUEUE),
        "--api-key",
        API_KEY,
    )
    yield url
    code, text = stop_server(proc, log)
    # SIGTERM is a clean shutdown: status 0, no traceback, uvicorn's and our last lines
    assert code == 0, text
    assert "Traceback" not in text, text
    assert "linnet serve: stopped" in text, text


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    from linnet.runtimes.formats.checkpoints import open_checkpoint

    return open_checkpoint(MODEL).tokenizer()


def generate_cli(capsys, *args: str) -> str:
    """`linnet generate`'s text (stdout less the newline it ends with), greedy, on the same cache size; run in
    this process through `linnet.cli.main` (a subprocess would import torch again), its torch thread count
    restored afterwards."""
    import torch

    from linnet.cli import main

    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        code = main(["generate", "--weights", MODEL, "--max-positions", str(MAX_POSITIONS), *args])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.removesuffix("\n")


def metrics(server: str) -> dict[str, float]:
    """/metrics parsed by prometheus_client's own parser: {sample name: value} for model_name=MODEL."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{server}/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.labels.get("model_name") == MODEL and "le" not in sample.labels:
                key = sample.name + "".join(f"{{{v}}}" for k, v in sorted(sample.labels.items()) if k != "model_name")
                out[key] = sample.value
    return out


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.get(f"{server}/health", headers=auth).status_code == 200
    assert httpx.head(f"{server}/health", headers=auth).status_code == 200  # was 405
    found = metrics(server)
    for name in (
        "linnet:num_requests_running",
        "linnet:num_requests_waiting",
        "linnet:cache_rows_in_use",
        "linnet:prompt_tokens_total",
        "linnet:generation_tokens_total",
        "linnet:time_to_first_token_seconds_count",
        "linnet:inter_token_latency_seconds_count",
        "linnet:e2e_request_latency_seconds_count",
    ):
        assert name in found, sorted(found)
    assert found["linnet:cache_rows_total"] == MAX_BATCH


def test_chat_streamed_equals_non_streamed(client, tokenizer):
    from linnet.runtimes.inputs.chat import encode_chat

    whole = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=24)
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion" and whole.model == MODEL
    (choice,) = whole.choices
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    expected_prompt = len(encode_chat(tokenizer, CHAT))  # the template's tokens, BOS as the template writes it
    assert whole.usage.prompt_tokens == expected_prompt
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert whole.usage.completion_tokens == len(tokenizer.encode(choice.message.content, add_special_tokens=False))

    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=24, stream=True))
    assert all(c.object == "chat.completion.chunk" and c.usage is None for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [choice.finish_reason]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == choice.message.content


@pytest.mark.slow  # loads the model again in this process
def test_chat_equals_linnet_generate_chat(client, capsys):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=24)
    expected = generate_cli(capsys, "--chat", "--prompt", CHAT[0]["content"], "--max-new-tokens", "24")
    assert whole.choices[0].message.content == expected


def test_completion_streamed_equals_non_streamed(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed == whole.choices[0].text


@pytest.mark.slow  # loads the model again in this process
def test_completion_equals_linnet_generate(client, capsys):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=12)
    assert whole.choices[0].text == generate_cli(capsys, "--prompt", PROMPT, "--max-new-tokens", "12")


def test_include_usage_adds_one_usage_chunk_with_exact_counts(client):
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=8)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=CHAT, temperature=0, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    *content, last = chunks
    assert last.choices == [] and last.usage == whole.usage
    assert all(c.usage is None for c in content)


def test_n2_has_indices_0_1_and_choice_i_is_seed_plus_i(client):
    kwargs = dict(model=MODEL, prompt=PROMPT, temperature=1.0, top_p=0.9, max_tokens=10)
    pair = client.completions.create(n=2, seed=7, **kwargs)
    assert sorted(c.index for c in pair.choices) == [0, 1]
    by_index = {c.index: c.text for c in pair.choices}
    # the seed rule (vLLM's parallel sampling): choice i samples with seed + i, exactly as a solo request does
    assert by_index[0] == client.completions.create(seed=7, **kwargs).choices[0].text
    assert by_index[1] == client.completions.create(seed=8, **kwargs).choices[0].text
    solo_tokens = pair.usage.completion_tokens
    assert pair.usage.prompt_tokens == 5 and solo_tokens >= 2  # the prompt counted once, completions summed

    chunks = list(client.completions.create(n=2, seed=7, stream=True, **kwargs))
    finishes = [(ch.index, ch.finish_reason) for c in chunks for ch in c.choices if ch.finish_reason]
    assert sorted(i for i, _ in finishes) == [0, 1]  # one finish_reason per choice
    for i in (0, 1):
        assert "".join(ch.text for c in chunks for ch in c.choices if ch.index == i) == by_index[i]

    chat = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, temperature=0, max_tokens=6)
    assert sorted(c.index for c in chat.choices) == [0, 1]


def test_stop_string_spanning_two_tokens_is_matched_and_never_emitted(client, tokenizer):
    free = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=16, extra_body={})
    text = free.choices[0].text
    ids = tokenizer.encode(PROMPT + text, add_special_tokens=False)[len(tokenizer.encode(PROMPT)) :]
    pieces = [tokenizer.decode(ids[: k + 1]) for k in range(len(ids))]
    # a stop string made of the end of one token and the start of the next
    k = next(k for k in range(1, len(ids) - 1) if len(pieces[k]) - len(pieces[k - 1]) >= 2)
    boundary = len(pieces[k])
    stop = text[boundary - 2 : boundary + 2]
    assert len(stop) == 4 and text.find(stop) == boundary - 2, (text, stop)
    got = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=16, stop=[stop])
    assert got.choices[0].text == text[: boundary - 2]
    assert got.choices[0].finish_reason == "stop"
    assert got.choices[0].model_extra["stop_reason"] == stop
    chunks = list(
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=16, stop=stop, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == text[: boundary - 2]


def test_stop_token_ids_and_top_k_reach_the_engine(client, tokenizer):
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8)
    text = greedy.choices[0].text
    ids = tokenizer.encode(PROMPT + text, add_special_tokens=False)[len(tokenizer.encode(PROMPT)) :]
    third = ids[2]
    cut = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, extra_body={"stop_token_ids": [third]}
    )
    assert cut.choices[0].text == tokenizer.decode(ids[:2]) and cut.usage.completion_tokens == 2
    assert (cut.choices[0].finish_reason, cut.choices[0].model_extra["stop_reason"]) == ("stop", third)
    # top_k = 1 keeps only the most likely token: sampling at temperature 1 is then greedy, whatever the seed
    top1 = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=1.0, seed=3, max_tokens=8, extra_body={"top_k": 1}
    )
    assert top1.choices[0].text == text


def test_several_prompts_get_n_choices_each(client):
    prompts = [PROMPT, "Water boils at"]
    many = client.completions.create(model=MODEL, prompt=prompts, temperature=0, max_tokens=4, n=2)
    assert [c.index for c in sorted(many.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    solos = [client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=4) for p in prompts]
    by_index = {c.index: c.text for c in many.choices}
    for p, solo in enumerate(solos):  # choice p * n + i belongs to prompt p
        assert by_index[2 * p] == by_index[2 * p + 1] == solo.choices[0].text
    assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in solos)  # each prompt once
    ids = client.completions.create(model=MODEL, prompt=[504, 3575, 282], temperature=0, max_tokens=2)
    assert ids.usage.prompt_tokens == 3


def test_max_tokens_ends_with_length_after_exactly_that_many_tokens(client):
    got = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert got.choices[0].finish_reason == "length" and got.usage.completion_tokens == 5
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_completion_tokens=3)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 3


def _raw(server: str, body, *, key: str | None = API_KEY, path: str = "/v1/completions") -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server + path, content=content, headers=headers, timeout=120)


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ('{"model": "x", "prompt": ', 400, None, "json_invalid"),
        ([1, 2], 400, None, "invalid_body"),
        (b"\xff", 400, None, "json_invalid"),
        ('{"seed": ' + "9" * 5000 + "}", 400, None, "json_invalid"),  # past Python's int-parsing limit: was a 500
        ({"model": MODEL, "prompt": "\ud800", "max_tokens": 1}, 400, "prompt", None),  # not Unicode: was a 500
        ({"model": "nope", "prompt": "hi"}, 404, "model", "model_not_found"),
        ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature", None),
        ({"model": MODEL, "prompt": "hi", "n": 0}, 400, "n", None),
        ({"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p", None),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", None),
        ({"model": MODEL, "prompt": "hi", "logprobs": 5}, 400, "logprobs", None),
        ({"model": MODEL, "prompt": "hi", "topk": 5}, 400, "topk", None),
        ({"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options", None),
        ({"model": MODEL, "prompt": "hi", "max_tokens": MAX_POSITIONS}, 400, "max_tokens", "context_length_exceeded"),
        ({"model": MODEL, "prompt": "hi " * 300, "max_tokens": 1}, 400, "prompt", "context_length_exceeded"),
        # more choices than the 2 rows and the queue of 4 can ever hold: 400, not a 429 clients would retry in vain
        ({"model": MODEL, "prompt": "hi", "n": 8, "max_tokens": 4}, 400, "n", None),
        ({"model": MODEL, "prompt": ["a", "b", "c"], "n": 3, "max_tokens": 4}, 400, "n", None),
    ],
)
def test_errors_are_openai_shaped_4xx_and_the_server_keeps_serving(server, client, body, status, param, code):
    r = _raw(server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).choices


def test_a_full_queue_is_429_with_retry_after(server, client):
    """A streaming n = 4 request holds both rows and keeps 2 choices waiting; another n = 4 finds no room for its
    4 in the queue of 4: 429 with Retry-After, and what it submitted is cancelled."""
    busy = {"model": MODEL, "prompt": "Once", "n": 4, "max_tokens": 200, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    _wait_idle(server)  # nothing left over from an earlier test shares the queue (CI once saw the busy request refused)
    with httpx.stream("POST", f"{server}/v1/completions", json=busy, headers=headers, timeout=120) as running:
        lines = running.iter_lines()  # kept: a dropped line iterator closes the response in httpx2
        first = next(lines)  # the first chunk: it is being served
        assert running.status_code == 200 and first.startswith("data: "), first
        held = metrics(server)
        assert (held["linnet:num_requests_running"], held["linnet:num_requests_waiting"]) == (2, 2), held
        r = _raw(server, {"model": MODEL, "prompt": "hi", "n": 4, "max_tokens": 4})
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    assert int(r.headers["Retry-After"]) >= 1
    _wait_idle(server)  # the dropped stream's choices leave at the engine's next step
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).choices


class _NeverStepped:
    """The StepModel of an engine whose only request is refused for its length before any step."""

    max_batch, max_positions, vocab_size = 1, 64, 49152

    def step(self, input_ids, positions, rows):
        raise AssertionError("this test's request must be refused before any step")


def test_a_huge_prompt_is_tokenized_off_the_event_loop(tokenizer):
    """Tokenizing a huge prompt takes seconds (a 2 MB prompt once stalled every stream and /health for 8 s): it runs
    in a thread. Deterministic, without timings: the real tokenizer's `encode` waits until /health has been
    answered, which can only happen if the event loop is free while `encode` runs (else the test fails after 10 s)."""
    import asyncio
    import threading

    from linnet.runtimes.serve import Engine
    from linnet.runtimes.serve.http import create_app

    entered, release = threading.Event(), threading.Event()

    class WaitingTokenizer:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, text, *args, **kwargs):
            entered.set()
            release.wait(10)
            return tokenizer.encode(text, *args, **kwargs)

    async def scenario():
        app = create_app(Engine(_NeverStepped(), tokenizer), WaitingTokenizer(), MODEL)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://linnet") as client:
            body = {"model": MODEL, "prompt": "a " * 1000, "max_tokens": 1}
            huge = asyncio.create_task(client.post("/v1/completions", json=body))
            assert await asyncio.to_thread(entered.wait, 10)
            health = await client.get("/health")
            still_tokenizing = not huge.done()
            release.set()
            return health, still_tokenizing, await huge

    health, still_tokenizing, huge = asyncio.run(scenario())
    assert health.status_code == 200 and still_tokenizing
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "context_length_exceeded"


def test_a_json_body_is_read_whatever_its_content_type(server):
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    auth = {"Authorization": f"Bearer {API_KEY}"}
    for content_type in ("application/x-www-form-urlencoded", "text/plain"):  # curl -d sends the first
        r = httpx.post(f"{server}/v1/completions", content=body, headers={**auth, "Content-Type": content_type})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


def test_chat_errors(server, client):
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    for body, param in (
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": image}, "messages.0.content.list[_TextPart].0.type"),
        ({"model": MODEL, "messages": CHAT, "max_tokens": 10_000}, "max_tokens"),
    ):
        r = _raw(server, body, path="/v1/chat/completions")
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"].startswith(param.split(".")[0]), r.json()


def test_api_key_is_required_on_every_request(server):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for key in (None, "wrong"):
        r = _raw(server, body, key=key)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{server}/v1/models").status_code == 401
    lowercase = {"Authorization": f"bearer {API_KEY}"}  # the scheme is case-insensitive (RFC 9110 §11.1)
    assert httpx.get(f"{server}/v1/models", headers=lowercase).status_code == 200
    wrong = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def _wait_idle(server: str, timeout_s: float = 60) -> dict[str, float]:
    """Poll /metrics until no request runs or waits; fails past `timeout_s` (a hang, not a timing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = metrics(server)
        if found["linnet:num_requests_running"] == 0 and found["linnet:num_requests_waiting"] == 0:
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


def test_dropped_clients_free_their_rows(server, client):
    """Two dropped clients fill both rows (a non-streaming n = 2 request, then a streaming one), each asking for
    200 tokens with EOS ignored; once they are gone, their requests are cancelled: nothing runs, the tokens
    generated stay far below the 600 asked for, and a third request is served."""
    before = _wait_idle(server)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up (and closes) while the rows generate
        httpx.post(f"{server}/v1/completions", json={**long, "n": 2}, headers=auth, timeout=httpx.Timeout(120, read=2))
    with httpx.stream("POST", f"{server}/v1/completions", json={**long, "stream": True}, headers=auth) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    after = _wait_idle(server)
    generated = after["linnet:generation_tokens_total"] - before["linnet:generation_tokens_total"]
    assert 0 < generated < 300, generated
    cancelled = after.get("linnet:request_success_total{cancelled}", 0)
    assert cancelled - before.get("linnet:request_success_total{cancelled}", 0) == 3
    assert after["linnet:cache_rows_in_use"] == 0
    got = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4)
    assert got.choices[0].finish_reason in ("stop", "length")


def test_an_idle_keep_alive_connection_outlives_the_clients_expiry(server):
    """The server keeps an idle connection open longer than httpx's pool (the `openai` client's) keeps one for
    reuse (5 s): with uvicorn's default, also 5 s, a client reusing a connection idle for just under 5 s raced the
    server closing it ("Server disconnected without sending a response"). Here the same connection, idle for 5.5 s,
    serves a second request (with the default the server had closed it at 5 s)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(server)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        conn.request("GET", "/health", headers=headers)
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and not first.will_close
        time.sleep(5.5)
        conn.request("GET", "/health", headers=headers)  # on the same socket: http.client does not reconnect
        second = conn.getresponse()
        second.read()
        assert second.status == 200
    finally:
        conn.close()
