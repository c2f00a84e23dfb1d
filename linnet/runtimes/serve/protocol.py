"""The request bodies of `linnet serve`'s OpenAI-compatible endpoints, as pydantic models.

Field names, types and defaults follow OpenAI's API reference for `POST /v1/completions` and
`POST /v1/chat/completions`; the fields OpenAI lacks that vLLM takes in `extra_body` (`top_k`, `stop_token_ids`,
`ignore_eos`) are accepted under vLLM's names. A field this server does not implement is refused (400, naming
it) unless its value is the one that changes nothing (`frequency_penalty: 0`, `logprobs: null`, ...), and an
unknown field is refused too (vLLM ignores it with a warning): a misspelt `top_k` must not pass unnoticed.
Fields that only label a request (`user`, `metadata`, `store`, `service_tier`) are accepted and ignored.

Types are strict, as OpenAI's schema has them and answers them (400): `"max_tokens": "5"`, `"max_tokens": 5.0`,
`"temperature": "0.5"` and `"n": true` are refused, not converted (pydantic's strict mode, on every model); a
number field takes an integer (`"temperature": 1`), and null where OpenAI's schema makes the field nullable
(`NULL_MEANS_DEFAULT`: `"temperature": null` is the default). A content part other than text (`image_url`,
`input_audio`, `file`) is refused naming its type: the served models read text only.

Every model raises pydantic's `ValidationError` (which the app answers with 400 in OpenAI's error shape).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, field_validator, model_validator

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "StreamOptions", "quoted"]

NonNegativeTokenId = Annotated[int, Field(ge=0)]
# every request model: unknown fields refused, JSON types as OpenAI's schema has them (no "5" for 5)
_STRICT = ConfigDict(extra="forbid", strict=True)
QUOTE_CHARS = 80  # the most characters of a client's value an error message quotes
MAX_STOP_STRINGS = 4  # OpenAI's API reference: "Up to 4 sequences where the API will stop generating"
MAX_STOP_LENGTH = 1024  # characters of one stop string (ours: OpenAI states none)
# fields OpenAI's schema makes nullable with a default (the openai client sends `temperature=None` as null), and
# vLLM's Optional extra_body fields: null is their default, not a 400
NULL_MEANS_DEFAULT = frozenset({"n", "stream", "temperature", "top_p", "max_tokens", "top_k", "stop_token_ids"})


def quoted(value: Any) -> str:
    """`repr(value)` for an error message, cut to QUOTE_CHARS characters (a client's 10 MB value is not sent back;
    `repr` escapes lone surrogates and control characters)."""
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... ({len(text)} characters)"


def _prompt_kind(prompt: Any) -> str | None:
    """Which form of `prompt` this is, from its first element: validating a million token ids against every
    form of the union in turn took a second on the event loop."""
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return "texts"
        if isinstance(first, list):
            return "id_lists"
        return "ids"
    return "ids" if isinstance(prompt, list) else "text"


Prompt = Annotated[
    Annotated[str, Tag("text")]
    | Annotated[list[str], Tag("texts")]
    | Annotated[list[NonNegativeTokenId], Tag("ids")]
    | Annotated[list[list[NonNegativeTokenId]], Tag("id_lists")],
    Discriminator(_prompt_kind),
]


def _neutral_only(*names: str, neutral: tuple):
    """A validator of the fields `names` that refuses any value but those in `neutral` (the values that change
    nothing), naming the field: these OpenAI fields are accepted so that clients sending their defaults work."""

    def refuse(value):
        if value not in neutral:
            raise ValueError(f"{quoted(value)} is not supported by linnet serve (leave the field out)")
        return value

    return field_validator(*names)(refuse)


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with `choices: []` and the request's usage."""

    model_config = _STRICT
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """The fields completions and chat completions share."""

    model_config = _STRICT

    model: str
    n: int = Field(1, ge=1, le=128)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    temperature: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # vLLM's extra_body fields
    top_k: int = Field(0, ge=-1)
    stop_token_ids: list[NonNegativeTokenId] = Field(default_factory=list)
    ignore_eos: StrictBool = False
    # accepted only at the value that changes nothing
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # labels, ignored
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(s == "" for s in stops):
            raise ValueError("stop strings must not be empty")
        # every generated token is checked against every stop string on the engine's thread: 180,000 of them slowed
        # every stream of the server tenfold
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings (as OpenAI's API), got {len(stops)}")
        if any(len(s) > MAX_STOP_LENGTH for s in stops):
            raise ValueError(f"a stop string may be at most {MAX_STOP_LENGTH} characters long")
        return stops

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, top_k: int) -> int:
        return 0 if top_k == -1 else top_k  # vLLM's -1 and 0 both turn top-k off

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        return {k: v for k, v in body.items() if v is not None or k not in NULL_MEANS_DEFAULT}

    _penalties = _neutral_only("frequency_penalty", "presence_penalty", neutral=(None, 0.0))
    _logit_bias = _neutral_only("logit_bias", neutral=(None, {}))

    def cross_field_error(self) -> tuple[str, str] | None:
        """(message, field) for a combination of fields that cannot be served, or None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options is only allowed with stream: true", "stream_options"
        return None


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`. `prompt`: a string, a list of strings, a list of token ids or a list of lists of
    token ids (each prompt gets `n` choices, indices `prompt_index * n + i`). `max_tokens` defaults to 16, as
    OpenAI's does."""

    prompt: Prompt
    max_tokens: int = Field(16, ge=1)
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, prompt):
        if isinstance(prompt, list) and (not prompt or any(isinstance(p, list | str) and not p for p in prompt)):
            raise ValueError("prompt must not be empty")
        return prompt

    _echo = _neutral_only("echo", neutral=(None, False))
    _logprobs = _neutral_only("logprobs", "suffix", neutral=(None,))

    def cross_field_error(self) -> tuple[str, str] | None:
        if self.best_of is not None and self.best_of != self.n:
            return f"best_of other than n is not supported by linnet serve (got best_of={self.best_of})", "best_of"
        return super().cross_field_error()

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class _TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message: `role` and `content` (a string, or a list of `{"type": "text", "text": ...}` parts, joined
    with no separator as transformers' templates see a string); `name` is passed to the template, and so is a
    `tool` message's `tool_call_id` (which OpenAI's schema requires of it). Other content parts (images, audio,
    files) are refused naming their type: the served model reads text only."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        for i, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":
                raise ValueError(
                    f"content part {i} is of type {quoted(kind)}, but this model takes text only: send the content "
                    'as a string or as parts {"type": "text", "text": ...}'
                )
        return content

    def for_template(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content if content is not None else "", "name": self.name}
        if self.tool_call_id is not None:  # as transformers' templates see a tool message (Qwen's, Llama 3's)
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(_SamplingFields):
    """`POST /v1/chat/completions`. `max_completion_tokens` (OpenAI's current name) or `max_tokens` (its older
    one); without either, the rest of the cache row (`max_positions` minus the prompt), as vLLM does."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    _logprobs = _neutral_only("logprobs", neutral=(None, False))
    _top_logprobs = _neutral_only("top_logprobs", neutral=(None, 0))
    _tools = _neutral_only("tools", neutral=(None, []))
    _tool_choice = _neutral_only("tool_choice", neutral=(None, "none"))
    _response_format = _neutral_only("response_format", neutral=(None, {"type": "text"}))

    def cross_field_error(self) -> tuple[str, str] | None:
        both = self.max_tokens is not None and self.max_completion_tokens is not None
        if both and self.max_tokens != self.max_completion_tokens:
            return "give max_completion_tokens or max_tokens, not both with different values", "max_tokens"
        return super().cross_field_error()

    @property
    def token_limit(self) -> int | None:
        """The most new tokens asked for, or None for the rest of the cache row."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
