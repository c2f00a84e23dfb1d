"""`linnet serve` under abuse (issue 42), against real server processes on loopback serving a seeded 2-layer Llama
with SmolLM2's tokenizer (`tiny_server.write_tiny_llama`), `--max-batch 2 --max-queue 2 --max-positions 128`:

- a burst that fits the rows plus the queue is never refused (it once got [200, 200, 429]);
- a body over `--max-request-bytes` is 413 in OpenAI's error shape, announced or chunked;
- a prompt that cannot fit is refused from its length, before tokenizing (a 10 MB one held the GIL for 8 s),
  while a running stream goes on to its last token; a long prompt the tokenizer drops to a few tokens is served;
- malformed requests (wrong JSON types, image and audio parts, lone surrogates) are 4xx in OpenAI's shape, never a
  500 nor a logged traceback; a hypothesis fuzz over both request schemas holds that and the server keeps serving.

Timings are bench/serve_abuse.py's (never asserted here).
"""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.runtimes.serve.tiny_server import LiveServer, write_tiny_llama

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")
try:  # the openai client's HTTP library: httpx, or its fork httpx2 in the newest clients
    import httpx
except ImportError:
    httpx = pytest.importorskip("httpx2")

pytestmark = [pytest.mark.torch]

MAX_BATCH, MAX_QUEUE, MAX_POSITIONS = 2, 2, 128
BODY_LIMIT = 4_000_000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    live = LiveServer(
        tmp_path_factory.mktemp("serve"),
        *("--weights", str(checkpoint), "--max-batch", str(MAX_BATCH), "--max-queue", str(MAX_QUEUE)),
        *("--max-positions", str(MAX_POSITIONS), "--max-request-bytes", str(BODY_LIMIT)),
    )
    live.model = str(checkpoint)
    yield live
    live.stop()
    assert "Traceback" not in live.log.read_text(), live.log.read_text()


def post(server: LiveServer, body, path: str = "/v1/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()  # ensure_ascii: "\ud800" escaped
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=120)


def assert_openai_error(r: httpx.Response, status: int | None = None) -> dict:
    assert 400 <= r.status_code < 500 if status is None else r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    return error


def still_serving(server: LiveServer) -> None:
    r = post(server, {"model": server.model, "prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text


def burst(server: LiveServer, body: dict, clients: int) -> list[int]:
    """The statuses of `clients` identical requests sent at once (threads released together)."""
    start = threading.Barrier(clients)
    statuses: list[int] = []

    def one() -> None:
        start.wait()
        statuses.append(post(server, body).status_code)

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_a_burst_of_rows_plus_queue_is_never_refused(server):
    """4 requests at once on 2 rows and a queue of 2: every one is served (was [200, 200, 429] for 3)."""
    body = {"model": server.model, "prompt": "Once upon a time", "max_tokens": 24, "ignore_eos": True}
    for _ in range(3):
        server.wait_idle()
        assert burst(server, body, MAX_BATCH + MAX_QUEUE) == [200] * (MAX_BATCH + MAX_QUEUE)


def test_a_body_over_the_limit_is_413(server):
    big = json.dumps({"model": server.model, "prompt": "a" * BODY_LIMIT}).encode()
    error = assert_openai_error(post(server, big), 413)
    assert error["code"] == "request_too_large" and str(BODY_LIMIT) in error["message"]

    def chunked():  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 2**16):
            yield big[i : i + 2**16]

    r = httpx.post(server.url + "/v1/completions", content=chunked(), timeout=120)
    assert_openai_error(r, 413)
    still_serving(server)


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing_while_a_stream_goes_on(server):
    """A 3.9 MB prompt: 400 context_length_exceeded from its length, while a stream started before it runs on to
    its last token (the refusal did not end nor stall it, and the server answered in between)."""
    body = {"model": server.model, "prompt": "Once", "max_tokens": 100, "ignore_eos": True, "stream": True}
    huge = {"model": server.model, "prompt": "All work and no play. " * 170_000, "max_tokens": 1}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        assert next(lines).startswith("data: ")
        error = assert_openai_error(post(server, huge), 400)
        assert error["code"] == "context_length_exceeded" and "3740000 characters" in error["message"], error
        chat = {"model": server.model, "messages": [{"role": "user", "content": huge["prompt"]}]}
        assert assert_openai_error(post(server, chat, "/v1/chat/completions"))["code"] == "context_length_exceeded"
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len(chunks) >= 99 // 2  # held-back pieces may join, but the stream ran on


def test_long_id_lists_and_many_prompts_are_refused_before_any_work(server):
    """300,000 token ids: refused from the list's length (pydantic validated them one by one on the event loop);
    100,000 prompts in one body: refused for the choices (they were each tokenized first)."""
    ids = {"model": server.model, "prompt": list(range(300_000)), "max_tokens": 1}
    error = assert_openai_error(post(server, ids), 400)
    assert error["code"] == "context_length_exceeded" and "300000 token ids" in error["message"], error
    many = {"model": server.model, "prompt": ["Hi"] * 100_000, "max_tokens": 1}
    assert assert_openai_error(post(server, many), 400)["param"] == "n"
    still_serving(server)


def test_a_long_prompt_that_tokenizes_to_little_is_served(server):
    """SmolLM2's tokenizer drops U+0004 (no byte-level token for it): 100,000 of them and "Hello" are one token.
    The length check must not count them (it would refuse a prompt that fits)."""
    from linnet.runtimes.formats.tokenizer import Tokenizer

    prompt = "\x04" * 100_000 + "Hello"
    assert len(Tokenizer.from_hf_dir(server.model).encode(prompt)) == 1
    r = post(server, {"model": server.model, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 1, r.text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_tokens": 5.0}, "max_tokens"),
        ({"temperature": "0.5"}, "temperature"),
        ({"n": True}, "n"),
        ({"seed": 1.5}, "seed"),
        ({"stream": "true"}, "stream"),
        ({"model": "\ud800"}, "model"),  # a lone surrogate: was a 500 and two logged tracebacks
        ({"stop": ["\udfff"], "max_tokens": 2}, None),  # served: no stop string is met
        ({"stop": [f"{i:07d}q" for i in range(5)]}, "stop"),  # OpenAI's at most 4 (180,000 slowed every stream)
        ({"stop": ["x" * 1025]}, "stop"),
    ],
)
def test_wrong_types_and_lone_surrogates_are_4xx(server, fields, param):
    r = post(server, {"model": server.model, "prompt": "Hi", **fields})
    if param is None:
        assert r.status_code == 200, r.text
    else:
        assert assert_openai_error(r)["param"] == param
    still_serving(server)


def test_a_subnormal_temperature_is_served_and_fails_nobody_else(server):
    """temperature 1e-310 overflowed the division of the logits: the sampler raised, and the engine failed every
    request of the step with it (a 500 for each). It samples (as greedy, in effect) now."""
    import threading

    greedy = {"model": server.model, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
    results = {}
    other = threading.Thread(target=lambda: results.update(greedy=post(server, greedy)))
    other.start()
    r = post(server, {"model": server.model, "prompt": "x", "max_tokens": 5, "temperature": 1e-310})
    other.join()
    assert r.status_code == 200, r.text
    assert results["greedy"].status_code == 200, results["greedy"].text


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_content_parts_other_than_text_are_named(server, part):
    chat = {"model": server.model, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}]}
    error = assert_openai_error(post(server, chat, "/v1/chat/completions"), 400)
    assert part["type"] in error["message"] and "text only" in error["message"], error
    assert error["param"] == "messages.0.content"


NULLABLE = ["temperature", "top_p", "n", "stream", "max_tokens"]


@pytest.mark.parametrize("field", NULLABLE)
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_null_is_the_default_of_the_fields_openai_makes_nullable(server, field, chat):
    """OpenAI's schema types these fields `Optional` (the openai client's `CompletionCreateParams` and chat's), and
    the client sends `temperature=None` as `"temperature": null`: that is the default, not a 400 (each was one)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    asked = {"seed": 7} | ({} if field == "max_tokens" else {"max_tokens": 4})
    if chat:
        messages = [{"role": "user", "content": "Hi"}]
        default = client.chat.completions.create(model=server.model, messages=messages, **asked)
        given = client.chat.completions.create(model=server.model, messages=messages, **asked, **{field: None})
        texts = [[c.message.content for c in r.choices] for r in (default, given)]
    else:
        default = client.completions.create(model=server.model, prompt="Hi", **asked)
        given = client.completions.create(model=server.model, prompt="Hi", **asked, **{field: None})
        texts = [[c.text for c in r.choices] for r in (default, given)]
    assert texts[1] == texts[0] and given.usage.completion_tokens == default.usage.completion_tokens


def test_a_tool_message_with_its_tool_call_id_is_templated_as_transformers_does(server, checkpoint):
    """OpenAI's schema requires `tool_call_id` on a `tool` message (the openai client's
    `ChatCompletionToolMessageParam`); the server refused it as an unknown field, so the documented `tool` role
    could not be sent by any client that follows the schema. The prompt is transformers' `apply_chat_template` of
    the same conversation."""
    openai = pytest.importorskip("openai")
    from transformers import AutoTokenizer

    messages = [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": "Let me compute it."},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    ]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=server.model, messages=messages, max_tokens=2, temperature=0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert reply.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ---- the fuzz ------------------------------------------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)), max_size=12
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "robot"]) | JSON},
    optional={
        "content": TEXT
        | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio"]) | JSON,
                                          "text": TEXT | JSON}), max_size=2)
        | JSON,
        "name": TEXT | JSON,
    },
)  # fmt: skip
SMALL = st.integers(-2, 6)
FIELDS = {  # each field: a value of its own type (often valid) or any JSON value
    "n": SMALL,
    "max_tokens": SMALL,
    "max_completion_tokens": SMALL,
    "temperature": st.floats(-1, 3) | SMALL,
    "top_p": st.floats(-0.5, 1.5),
    "top_k": SMALL,
    "seed": st.integers(-5, 2**64),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JSON}),
    "stop": TEXT | st.lists(TEXT, max_size=3),
    "stop_token_ids": st.lists(st.integers(-2, 60_000), max_size=3),
    "ignore_eos": st.booleans(),
    "logprobs": st.booleans() | SMALL,
    "echo": st.booleans(),
    "frequency_penalty": st.floats(-1, 1),
    "logit_bias": st.dictionaries(TEXT, st.floats(-5, 5), max_size=2),
    "user": TEXT,
    "metadata": st.dictionaries(TEXT, TEXT, max_size=2),
    "response_format": st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
    "tools": st.lists(JSON, max_size=1),
    "suffix": TEXT,
    "best_of": SMALL,
    TEXT: JSON,  # unknown fields
}


@st.composite
def requests(draw):
    chat = draw(st.booleans())
    body = {"model": draw(st.just("MODEL") | TEXT)}  # the served name, or any text (lone surrogates too)
    if chat:
        body["messages"] = draw(st.lists(MESSAGE, max_size=3) | JSON)
    else:
        ids = st.lists(st.integers(-1, 60_000), max_size=4)
        body["prompt"] = draw(
            st.just("Hi") | TEXT | st.lists(TEXT, max_size=3) | ids | st.lists(ids, max_size=2) | JSON
        )
    for name in draw(st.lists(st.sampled_from(list(FIELDS)), max_size=3, unique_by=str)):
        strategy = FIELDS[name]
        key = draw(TEXT) if name is TEXT else name
        body[key] = draw(strategy | JSON)
    if draw(st.booleans()):
        body.pop("model")
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests())
def test_fuzzed_requests_are_never_a_500(server, request):
    path, body = request
    if body.get("model") == "MODEL":
        body["model"] = server.model
    if body.get("stream") is True:  # read the whole stream: an error after the start comes as its last event
        with httpx.stream("POST", server.url + path, content=json.dumps(body).encode(), timeout=120) as r:
            text = "".join(r.iter_text())
            assert r.status_code < 500, text
            if r.status_code == 200:
                assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, text
                return
        r = httpx.Response(r.status_code, content=text.encode())
    else:
        r = post(server, json.dumps(body).encode(), path)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert_openai_error(r)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
