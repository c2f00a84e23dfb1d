"""`linnet serve`'s OpenAI-compatible HTTP server: a FastAPI app around one serving `Engine`, run by uvicorn.

Endpoints (docs/serving.md says every field and what differs from OpenAI): `POST /v1/completions`,
`POST /v1/chat/completions` (streamed as server-sent events when `stream` is true), `GET /v1/models`,
`GET /v1/models/{model}`, `GET /health`, `GET /metrics` (metrics.py).

How a request runs: the body is read (at most `--max-request-bytes`, else 413) and validated (protocol.py), its
prompt tokenized in a pool of threads that never stalls the event loop nor the engine, a prompt that provably
cannot fit refused from its length before tokenizing (prompts.py; a chat's prompt through the model's chat
template, `linnet/runtimes/inputs/chat.py`), and `n` engine requests are submitted per prompt, choice i seeded `seed +
i` as vLLM's parallel sampling seeds its children (`vllm/v1/engine/parallel_sampling.py`). Their events are merged into
one response, or one SSE stream of `data: {json}` chunks ending `data: [DONE]`. A client that goes away cancels every
engine request of its response (their rows are free at the engine's next step): Starlette cancels a streaming response
when the client disconnects, and a non-streaming handler waits on the client's `http.disconnect` message beside the
engine's events, since Starlette does not cancel those (ATOM PR #1562).

Errors are answered in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for malformed JSON and
bad values (pydantic's validation errors too, which FastAPI would answer with 422), 400 `context_length_exceeded`,
401 for a missing or wrong API key (checked on every request when one is set), 404 for an unknown model or path,
413 `request_too_large` for a body over `--max-request-bytes`, 429 with `Retry-After` when the engine's queue is
full, 500 when the engine fails. An error after a stream has started comes as one `data: {"error": ...}` chunk
before `[DONE]`, as vLLM sends it. Any string a client sent may come back in a message, lone surrogates included:
bodies write those as JSON escapes (as `ensure_ascii` does), never failing to encode (which was a 500).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..sampling import SamplingParams
from .engine import ContextLengthExceeded, Delta, Finished, QueueFull
from .engine import Request as EngineRequest
from .metrics import ServerMetrics
from .prompts import PromptEncoder, PromptTooLong
from .protocol import ChatCompletionRequest, CompletionRequest, quoted

__all__ = ["OpenAIError", "create_app", "default_max_request_bytes", "run_server"]

log = logging.getLogger("linnet.serve")

# seconds a client is asked to wait before retrying when the queue is full
RETRY_AFTER_S = 1
# `--max-request-bytes`' default: MIN_REQUEST_BYTES, or BYTES_PER_POSITION per cache position where that is more.
# A prompt that fills a row takes at most about 7 bytes a token as JSON token ids, and as text about 6 bytes a
# character escaped (`\u4e2d`) at a few characters a token, so a request that can fit stays far below it. On the
# event loop, 2 MiB of JSON text parses in 8 ms here, 2 MiB of token ids in 44 ms (under load), and ids past what a
# row holds are refused before pydantic validates them one by one (`check_token_ids`).
MIN_REQUEST_BYTES = 2 * 2**20
BYTES_PER_POSITION = 32


def default_max_request_bytes(max_positions: int) -> int:
    """`--max-request-bytes`' default for a cache of `max_positions` positions per row (bytes)."""
    return max(MIN_REQUEST_BYTES, BYTES_PER_POSITION * int(max_positions))


class _JSONResponse(JSONResponse):
    """JSON whose lone surrogates (a client's `"\\ud800"` echoed in a message) are written as JSON escapes, as
    `json.dumps(ensure_ascii=True)` writes them, instead of failing to encode as UTF-8 (a 500 and tracebacks)."""

    def render(self, content: Any) -> bytes:
        return _json_bytes(content, separators=(",", ":"))  # compact, as Starlette's JSONResponse


def _json_bytes(content: Any, separators: tuple[str, str] | None = None) -> bytes:
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=separators)
    return text.encode("utf-8", "backslashreplace")  # only lone surrogates fail: `\udXXX` is their JSON escape


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: HTTP `status`, `message`, `type` (OpenAI's: "invalid_request_error",
    "authentication_error", "rate_limit_error", "server_error"), the request field it is about (`param`) and a
    machine-readable `code` (e.g. "context_length_exceeded", "model_not_found")."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return _JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def create_app(
    engine,
    tokenizer,
    model_name: str,
    *,
    api_key: str | None = None,
    shutdown_engine: bool = False,
    max_request_bytes: int | None = None,
) -> FastAPI:
    """The FastAPI app serving `engine` (a started `linnet.runtimes.serve.engine.Engine`) as `model_name`.

    `tokenizer` (`linnet.runtimes.formats.tokenizer.Tokenizer`) encodes prompts and renders chats with its chat template
    (a chat without `max_tokens` may generate up to the rest of its cache row, `engine.max_positions`).
    `api_key`: when set, every request must carry `Authorization: Bearer <api_key>` (else 401).
    `shutdown_engine`: shut the engine down when the app's lifespan ends (`linnet serve` does; tests that share an
    engine do not). `max_request_bytes`: the largest request body (else 413; default
    `default_max_request_bytes(engine.max_positions)`).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.prompts.shutdown()
        if shutdown_engine:
            await asyncio.to_thread(engine.shutdown)

    app = FastAPI(title="linnet serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    server = _Server(engine, tokenizer, model_name, engine.max_positions)
    limit = max_request_bytes if max_request_bytes is not None else default_max_request_bytes(engine.max_positions)
    app.state.linnet = server
    _add_error_handlers(app)
    if api_key:
        app.add_middleware(_APIKeyMiddleware, api_key=api_key)
    app.add_middleware(_TrimAfterLargeBodies)

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: the health check of some load balancers
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [server.model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        server.check_model(model)
        return server.model_card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest, limit, server.check_token_ids)
        return await server.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.chat_completions(await _parse(request, ChatCompletionRequest, limit), request)

    return app


class _Server:
    """The handlers' state and logic: the engine, tokenizer, served name and metrics."""

    def __init__(self, engine, tokenizer, model_name: str, max_positions: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_positions = int(max_positions)
        self.created = int(time.time())
        self.metrics = ServerMetrics(engine, model_name)
        self.prompts = PromptEncoder(tokenizer, self.max_positions)
        self._draining: set[asyncio.Task] = set()  # tasks recording the end of requests whose client went away

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "linnet",
            "max_model_len": self.max_positions,
        }

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise OpenAIError(
                404,
                f"The model {quoted(model)} does not exist; this server serves `{self.model_name}` (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    # ---- the two generation endpoints ------------------------------------------------------------------------

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        self._check(body)
        prompts = [await self._encode_prompt(p) for p in body.prompts()]
        handles = self._submit(body, prompts, body.max_tokens, param="prompt")
        response = _Response("cmpl", "text_completion", self.model_name, body, [len(p) for p in prompts])
        return await self._respond(request, body.stream, handles, response, chat=False)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        self._check(body)
        if not getattr(self.tokenizer, "chat_template", None):
            raise OpenAIError(
                400,
                f"{self.model_name} has no chat template; use /v1/completions with the prompt as text",
                param="messages",
            )
        try:
            prompt = await self.prompts.encode_chat([m.for_template() for m in body.messages])
        except PromptTooLong as err:
            raise self._too_long(err, "messages") from None
        except ValueError as err:  # the template refused the conversation (raise_exception) or failed, bad Unicode
            raise OpenAIError(400, str(err), param="messages") from None
        limit = body.token_limit if body.token_limit is not None else max(1, self.max_positions - len(prompt))
        handles = self._submit(body, [prompt], limit, param="messages")
        response = _Response("chatcmpl", "chat.completion", self.model_name, body, [len(prompt)])
        return await self._respond(request, body.stream, handles, response, chat=True)

    # ---- helpers -----------------------------------------------------------------------------------------------

    async def _respond(self, request: Request, stream: bool, handles: list, response: _Response, chat: bool):
        """The SSE stream when `stream`, else the whole response as JSON once every handle has finished (nothing,
        with status 499, when the client went away first)."""
        if stream:
            return self._stream(handles, response, response.chat_chunk if chat else response.completion_chunk)
        choices = await self._collect(request, handles)
        if choices is None:
            return Response(status_code=499)
        return _JSONResponse(response.chat(choices) if chat else response.completion(choices))

    def _check(self, body) -> None:
        """Refuse, before any tokenizing, a request for the wrong model, with fields that do not go together, or
        with more choices than the rows and the queue can ever hold (400 param `n`: a 429 would have clients retry
        a request that cannot succeed; 100,000 prompts in one body are refused before the first is tokenized)."""
        self.check_model(body.model)
        if (problem := body.cross_field_error()) is not None:
            message, param = problem
            raise OpenAIError(400, message, param=param)
        prompts = len(body.prompts()) if isinstance(body, CompletionRequest) else 1
        choices = body.n * prompts
        room = self.engine.max_batch + self.engine.max_queue
        if choices > room:
            raise OpenAIError(
                400,
                f"{choices} choices ({prompts} prompt(s) x n = {body.n}) can never fit this server's "
                f"{self.engine.max_batch} rows and queue of {self.engine.max_queue} requests (--max-batch, "
                "--max-queue); send fewer at a time",
                param="n",
            )

    def check_token_ids(self, data: dict) -> None:
        """Before validating a completion's body: a `prompt` of token ids (or a list of such lists) with more ids
        than a row can hold is refused at once (400 `context_length_exceeded`), so a 2 MB list of ids is not
        validated id by id on the event loop (that took 90 ms)."""
        prompt = data.get("prompt")
        if not isinstance(prompt, list) or not prompt or isinstance(prompt[0], str):
            return
        lists = prompt if isinstance(prompt[0], list) else [prompt]
        longest = max((len(ids) for ids in lists if isinstance(ids, list)), default=0)
        if longest >= self.max_positions:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_positions} tokens. However, your prompt has "
                f"{longest} token ids. Please reduce the length of the prompt.",
                param="prompt",
                code="context_length_exceeded",
            )

    async def _encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            try:
                ids = await self.prompts.encode(prompt)
            except PromptTooLong as err:
                raise self._too_long(err, "prompt") from None
            except ValueError as err:  # RunError: not valid Unicode (a lone surrogate such as "\ud800")
                raise OpenAIError(400, str(err), param="prompt") from None
            if not ids:
                raise OpenAIError(400, "the prompt encodes to no tokens", param="prompt")
            return ids
        return prompt

    def _too_long(self, err: PromptTooLong, param: str) -> OpenAIError:
        return OpenAIError(
            400,
            f"This model's maximum context length is {self.max_positions} tokens. However, your {param} has "
            f"{err.chars} characters, which is at least {err.min_tokens} tokens (no token of this model spans more "
            f"than {err.chars_per_token} characters). Please reduce the length of the {param}.",
            param=param,
            code="context_length_exceeded",
        )

    def _submit(self, body, prompts: list[list[int]], max_tokens: int, param: str) -> list:
        """Submit `body.n` engine requests per prompt (choice `p * n + i` seeded `seed + i`); on any refusal,
        cancel what was submitted and raise the matching OpenAIError."""
        handles = []
        try:
            for prompt in prompts:
                for i in range(body.n):
                    seed = None if body.seed is None else body.seed + i
                    params = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=seed)
                    handles.append(
                        self.engine.submit(
                            EngineRequest(
                                prompt_ids=list(prompt),
                                params=params,
                                max_tokens=max_tokens,
                                stop=tuple(body.stop),
                                stop_token_ids=tuple(body.stop_token_ids),
                                ignore_eos=body.ignore_eos,
                            )
                        )
                    )
        except QueueFull:
            self._abandon(handles, set())
            raise OpenAIError(
                429,
                "the server's queue is full; retry later",
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except ContextLengthExceeded as err:
            self._abandon(handles, set())
            too_long = err.prompt_tokens >= self.max_positions
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_positions} tokens. However, you requested "
                f"{err.prompt_tokens + err.max_tokens} tokens ({err.prompt_tokens} in the {param}, {err.max_tokens} "
                "for the completion). Please reduce the length of the prompt or max_tokens.",
                param=param if too_long else "max_tokens",
                code="context_length_exceeded",
            ) from None
        except ValueError as err:
            self._abandon(handles, set())
            raise OpenAIError(400, str(err), param=param) from None
        except RuntimeError:  # submitted after shutdown
            self._abandon(handles, set())
            raise OpenAIError(503, "the server is shutting down", type="server_error") from None
        return handles

    async def _collect(self, request: Request, handles: list) -> list[_Choice] | None:
        """Every handle's text and `Finished`, or None when the client went away first (then every handle still
        running is abandoned)."""
        ended: set[int] = set()
        collect = asyncio.ensure_future(self._gather(handles, ended))
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not collect.done():
                collect.cancel()
                self._abandon(handles, ended)  # also when `collect` is cancelled before it started
            gone.cancel()
        if not collect.done() or collect.cancelled():
            return None
        choices = collect.result()
        for choice in choices:
            if choice.finished.finish_reason in ("error", "cancelled"):
                raise _engine_error(choice.finished)
        return choices

    async def _gather(self, handles: list, ended: set[int]) -> list[_Choice]:
        choices = [_Choice() for _ in handles]
        async with aclosing(self._merge(handles, ended)) as events:
            async for index, event in events:
                choices[index].add(event)
        return choices

    async def _merge(self, handles: list, ended: set[int]) -> AsyncIterator[tuple[int, Delta | Finished]]:
        """The events of every handle as (handle index, event), in arrival order, until each has sent `Finished`
        (which `/metrics` records; its index goes into `ended`). Closing the iterator early (the client went
        away, an error) abandons the handles still running."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, handle) -> None:
            async for event in handle.aevents():
                queue.put_nowait((index, event))

        tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(handles)]
        try:
            while len(ended) < len(handles):
                index, event = await queue.get()
                if isinstance(event, Finished):
                    ended.add(index)
                    self.metrics.observe(event)
                yield index, event
        finally:
            for task in tasks:
                task.cancel()
            self._abandon(handles, ended)

    def _abandon(self, handles: list, ended: set[int]) -> None:
        """Cancel the handles not in `ended` (their rows are free at the engine's next step) and record their
        `Finished("cancelled")` in `/metrics` when it comes, from a task of its own; mark them ended."""
        for index, handle in enumerate(handles):
            if index in ended:
                continue
            ended.add(index)
            handle.cancel()
            drain = asyncio.ensure_future(self._observe_end(handle))
            self._draining.add(drain)
            drain.add_done_callback(self._draining.discard)

    async def _observe_end(self, handle) -> None:
        async for event in handle.aevents():
            if isinstance(event, Finished):
                self.metrics.observe(event)

    def _stream(self, handles: list, response: _Response, chunk: Callable) -> StreamingResponse:
        """The SSE response. Its background task, which Starlette runs after the response ends however it ends
        (the client gone before the first chunk included, when the stream never started), abandons whatever
        still runs."""
        ended: set[int] = set()
        return StreamingResponse(
            self._events(handles, ended, response, chunk),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(self._abandon, handles, ended),
        )

    async def _events(
        self, handles: list, ended: set[int], response: _Response, chunk: Callable
    ) -> AsyncIterator[bytes]:
        """The SSE stream: per choice, a first chunk (the chat's role), its text deltas and one chunk with its
        finish_reason; then the usage chunk when asked; then `[DONE]`. Closing it (the client went away)
        abandons every handle still running."""
        choices = [_Choice() for _ in handles]
        try:
            for index in range(len(handles)):
                if (first := chunk(index, first=True)) is not None:
                    yield _sse(first)
            async with aclosing(self._merge(handles, ended)) as events:
                async for index, event in events:
                    choice = choices[index]
                    choice.add(event)
                    if isinstance(event, Delta):
                        if event.text:
                            yield _sse(chunk(index, text=event.text))
                        continue
                    if event.finish_reason in ("error", "cancelled"):  # the response ends here, the rest abandoned
                        yield _sse(_engine_error(event).body())
                        yield _DONE
                        return
                    yield _sse(chunk(index, finish=choice))
            if response.include_usage:
                yield _sse(response.usage_chunk(choices))
            yield _DONE
        finally:
            self._abandon(handles, ended)


class _Choice:
    """One engine request's text so far and its `Finished`."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.finished: Finished | None = None

    def add(self, event: Delta | Finished) -> None:
        if isinstance(event, Delta):
            self.pieces.append(event.text)
        else:
            self.finished = event

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str:
        return self.finished.finish_reason

    @property
    def stop_reason(self) -> str | int | None:
        return self.finished.stop_reason


class _Response:
    """Builds the JSON bodies and chunks of one completion or chat completion response (one id, one `created`)."""

    def __init__(self, prefix: str, object_: str, model_name: str, body, prompt_tokens: list[int]) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.object = object_
        self.created = int(time.time())
        self.model = model_name
        self.n = body.n
        self.prompt_tokens = sum(prompt_tokens)  # each prompt counted once, whatever n (as vLLM and OpenAI)
        options = body.stream_options
        self.include_usage = bool(options and options.include_usage)

    def _head(self, object_: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def usage(self, choices: list[_Choice]) -> dict[str, int]:
        completion = sum(c.finished.completion_tokens for c in choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def completion(self, choices: list[_Choice]) -> dict[str, Any]:
        return {
            **self._head("text_completion"),
            "choices": [
                {
                    "index": i,
                    "text": c.text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
                for i, c in enumerate(choices)
            ],
            "usage": self.usage(choices),
        }

    def chat(self, choices: list[_Choice]) -> dict[str, Any]:
        return {
            **self._head("chat.completion"),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
                for i, c in enumerate(choices)
            ],
            "usage": self.usage(choices),
        }

    def _chunk(self, object_: str, choice: dict[str, Any]) -> dict[str, Any]:
        chunk = {**self._head(object_), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: every chunk but the last has usage null
        return chunk

    def completion_chunk(
        self, index: int, *, first: bool = False, text: str = "", finish: _Choice | None = None
    ) -> dict[str, Any] | None:
        if first:
            return None  # a completion has no role to announce
        return self._chunk(
            "text_completion",
            {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish.finish_reason if finish else None,
                "stop_reason": finish.stop_reason if finish else None,
            },
        )

    def chat_chunk(
        self, index: int, *, first: bool = False, text: str = "", finish: _Choice | None = None
    ) -> dict[str, Any]:
        if first:
            delta = {"role": "assistant", "content": ""}
        elif finish is not None:
            delta = {}
        else:
            delta = {"content": text}
        return self._chunk(
            "chat.completion.chunk",
            {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish.finish_reason if finish else None,
                "stop_reason": finish.stop_reason if finish else None,
            },
        )

    def usage_chunk(self, choices: list[_Choice]) -> dict[str, Any]:
        object_ = "chat.completion.chunk" if self.object == "chat.completion" else "text_completion"
        return {**self._head(object_), "choices": [], "usage": self.usage(choices)}


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects. The body has been read, so the next ASGI message is
    `http.disconnect` (uvicorn sends it when the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _engine_error(finished: Finished) -> OpenAIError:
    if finished.finish_reason == "cancelled":
        return OpenAIError(503, "the request was cancelled: the server is shutting down", type="server_error")
    return OpenAIError(500, f"the engine failed: {finished.error}", type="server_error")


_DONE = b"data: [DONE]\n\n"


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + _json_bytes(payload) + b"\n\n"


# ---- errors ------------------------------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, err: OpenAIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _validation_error(err.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        message = f"{request.method} {quoted(request.url.path)}: {err.detail}"
        return OpenAIError(err.status_code, message, code=code).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return OpenAIError(500, f"internal error: {type(err).__name__}: {err}", type="server_error").response()


async def _parse(
    request: Request, model: type[BaseModel], limit: int, precheck: Callable[[dict], None] | None = None
) -> BaseModel:
    """The request's body as JSON (whatever its Content-Type: `curl -d` sends form-encoded, and OpenAI reads such
    bodies as JSON too), validated by `model` after `precheck(data)` (which may raise OpenAIError). Raises
    OpenAIError 413 for a body over `limit` bytes (before reading it when its Content-Length says so), 400 for a
    body that is not UTF-8 JSON or not valid for `model`."""
    raw = await _read_body(request, limit)
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as err:
        raise OpenAIError(400, f"malformed JSON: the body is not UTF-8 ({err.reason})", code="json_invalid") from None
    except json.JSONDecodeError as err:
        raise OpenAIError(
            400, f"malformed JSON: {err.msg} at line {err.lineno} column {err.colno}", code="json_invalid"
        ) from None
    except RecursionError:
        raise OpenAIError(400, "malformed JSON: nested too deeply", code="json_invalid") from None
    except ValueError as err:  # an integer literal past Python's 4300-digit limit (sys.set_int_max_str_digits)
        raise OpenAIError(400, f"malformed JSON: {err}", code="json_invalid") from None
    if not isinstance(data, dict):
        raise OpenAIError(
            400, f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_body"
        )
    if precheck is not None:
        precheck(data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise _validation_error(err.errors(include_url=False)) from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(f"{int(declared)} bytes", limit)
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body (no Content-Length) is counted as it comes
        size += len(chunk)
        if size > limit:
            raise _too_large(f"over {limit} bytes", limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: str, limit: int) -> OpenAIError:
    # what was not read is left unread: uvicorn closes the connection after this response
    return OpenAIError(
        413,
        f"the request body is {size}, more than this server takes ({limit} bytes, --max-request-bytes)",
        code="request_too_large",
    )


def _validation_error(errors) -> OpenAIError:
    """The first of pydantic's validation errors as a 400: malformed JSON says where, a bad field names it (as
    `param`, dotted: `messages.0.role`) and quotes pydantic's message."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        where = f" at byte {loc[0]}" if loc else ""
        reason = (first.get("ctx") or {}).get("error", "")
        return OpenAIError(400, f"malformed JSON{where}: {reason}".rstrip(": "), code="json_invalid")
    if first.get("type") == "missing" and not loc:
        return OpenAIError(400, "the request body must be a JSON object", code="invalid_body")
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return OpenAIError(400, f"{param}: {message}{more}" if param else message + more, param=param)


# a request whose body is larger than this gives its freed memory back to the system once it is answered
TRIM_AFTER_BYTES = 2**20


class _TrimAfterLargeBodies:
    """Pure ASGI middleware: after answering a request whose `Content-Length` is over TRIM_AFTER_BYTES, return
    glibc's freed heap pages to the system (`malloc_trim`, in a thread). A 10 MB body is read, joined and
    decoded into several 10 MB blocks; once freed, glibc keeps them in its arenas, so RSS grew with each
    refused 10 MB request (1.3 to 5.9 GB in issue 42's run; +9 % over 50 with the length check alone)."""

    def __init__(self, app) -> None:
        self.app = app
        self.trim = _malloc_trim()

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)
        if self.trim is not None and scope["type"] == "http":
            declared = dict(scope["headers"]).get(b"content-length", b"")
            if declared.isdigit() and int(declared) > TRIM_AFTER_BYTES:
                await asyncio.to_thread(self.trim, 0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class _APIKeyMiddleware:
    """Pure ASGI middleware: every HTTP request must carry `Authorization: Bearer <api_key>` (compared in constant
    time), else 401 `invalid_api_key`. Pure ASGI, not `BaseHTTPMiddleware`, so streaming and disconnects pass
    through untouched."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, key = given.partition(b" ")
            # the scheme is case-insensitive (RFC 9110 §11.1): `bearer K` is as good as `Bearer K`
            if scheme.lower() != b"bearer" or not secrets.compare_digest(key.strip(), self.expected):
                what = "a wrong API key" if given else "no API key"
                error = OpenAIError(
                    401,
                    f"the request has {what}: send the server's --api-key as `Authorization: Bearer <key>`",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


# ---- running -----------------------------------------------------------------------------------------------------


SHUTDOWN_GRACE_S = 5  # after SIGINT/SIGTERM, running requests may finish for this long
# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals the idle expiry of httpx's pool,
# which the `openai` client uses: a client reusing a connection idle for just under 5 s raced the server closing it
# and got "Server disconnected without sending a response" (seen in CI). Longer than the clients' expiry, the client
# always drops an idle connection first (nginx's default keepalive_timeout is 75 s too).
KEEP_ALIVE_S = 75
_SHUTDOWN_WRITE_S = 5  # then the cancelled ones have this long to send their 503 or last stream events


def run_server(
    app: FastAPI, host: str, port: int, *, on_started: Callable[[str], None] | None = None, log_level: str = "info"
) -> None:
    """Serve `app` with uvicorn on `host`:`port` until SIGINT or SIGTERM: uvicorn stops accepting and lets running
    requests finish for up to `SHUTDOWN_GRACE_S`; then the engine cancels what is left, so each such request ends
    as a 503 (a stream: its error event and `[DONE]`) instead of a connection cut mid-chunk and a logged
    CancelledError; the app's lifespan then shuts the engine down (idempotent).
    `on_started(url)` is called once the socket listens. Raises OSError when the address cannot be bound."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_S,
        # uvicorn's own limit, past which it cancels the handlers, leaves them time to write their last events
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S + _SHUTDOWN_WRITE_S,
    )
    server = uvicorn.Server(config)
    shutdown = server.shutdown

    async def shutdown_cancelling_late_requests(sockets=None) -> None:
        engine = app.state.linnet.engine
        cancelling: list[asyncio.Future] = []  # a reference keeps the task alive
        cancel_late = asyncio.get_running_loop().call_later(
            SHUTDOWN_GRACE_S, lambda: cancelling.append(asyncio.ensure_future(asyncio.to_thread(engine.shutdown)))
        )
        try:
            await shutdown(sockets=sockets)
        finally:
            cancel_late.cancel()

    server.shutdown = shutdown_cancelling_late_requests
    if on_started is not None:
        startup = server.startup

        async def startup_then_announce(sockets=None) -> None:
            await startup(sockets=sockets)
            if server.started:
                bound = server.servers[0].sockets[0].getsockname()
                on_started(f"http://{_host_for_url(bound[0])}:{bound[1]}")

        server.startup = startup_then_announce
    server.run()
    if not server.started:
        raise OSError(f"cannot listen on {host}:{port} (see the message above)")


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host
