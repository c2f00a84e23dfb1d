"""Chat templates: render a conversation into the prompt text a chat model was trained on.

This mirrors transformers' `utils/chat_template_utils.py` (`_cached_compile_jinja_template` and
`render_jinja_template`, as called by `PreTrainedTokenizerBase.apply_chat_template`), so that
`render_chat(template, messages, bos_token=..., eos_token=...)` equals
`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for the same template and
special tokens. Templates come from checkpoints, so they are untrusted code: they run in jinja2's
`ImmutableSandboxedEnvironment`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["chat_prompt_text", "encode_chat", "render_chat"]

# Names a message's reasoning is passed under (transformers `_REASONING_FIELDS`); the first is the standard one.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_chat(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **extra: Any,
) -> str:
    """Render `messages` (dicts with at least "role" and "content") through the jinja2 chat `template`.

    The template sees `messages`, `tools`, `documents`, `add_generation_prompt`, the special tokens given
    (`bos_token`, `eos_token`, and any others passed in `extra`, e.g. `unk_token`, `pad_token`; a token that is
    None is left undefined, as transformers leaves out unset special tokens) and the remaining `extra` keyword
    arguments; plus the globals `raise_exception(message)`, `strftime_now(format)`, `dict`, `namespace` and the
    `tojson` filter (no HTML escaping, `ensure_ascii=False`), with `trim_blocks` and `lstrip_blocks` on and the
    `loopcontrols` extension, as in transformers. Message keys whose value is None are dropped and reasoning is
    aliased under `reasoning_content` and `thinking`, as transformers does before rendering.

    Unlike `apply_chat_template`, `add_generation_prompt` defaults to True: the runner renders prompts to
    generate from. Returns the rendered text (str).

    Raises `ValueError` for an empty conversation, a message that is not a dict, and for any template error
    (syntax errors, `raise_exception(...)` calls, sandbox violations, undefined attributes), with the template's
    message (and, for a syntax error, its line in the template: "chat template error at line 3: ...").
    """
    import jinja2

    if not isinstance(template, str) or not template:
        raise ValueError("chat template must be a non-empty string")
    if not messages:
        raise ValueError("cannot apply a chat template to an empty conversation; give at least one message")
    chat = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise ValueError(f"chat messages must be dicts, got {message!r}")
        chat.append({key: value for key, value in message.items() if value is not None})
    chat = _alias_reasoning_fields(_plain_template_data(chat))
    kwargs = {"bos_token": bos_token, "eos_token": eos_token, **extra}
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    try:
        compiled = _compile(template)
        return compiled.render(
            messages=chat,
            tools=_plain_template_data(tools),
            documents=_plain_template_data(documents),
            add_generation_prompt=add_generation_prompt,
            **_plain_template_data(kwargs),
        )
    except jinja2.TemplateSyntaxError as error:
        # jinja2 knows the template line of a syntax error; the CLI names the file around this
        raise ValueError(f"chat template error at line {error.lineno}: {error.message or error}") from error
    except jinja2.TemplateError as error:
        raise ValueError(f"chat template error: {error.message or error}") from error


def encode_chat(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
    """The token ids of `messages` rendered through `tokenizer.chat_template` (`chat_prompt_text`), encoded without
    adding special tokens: the template writes them itself, so the prompt holds exactly the BOS the template
    writes, as transformers' `apply_chat_template(tokenize=True)` does. `linnet generate --chat` and `linnet
    serve`'s chat completions both build their prompts this way.

    Raises `ValueError` when the tokenizer has no chat template, and as `render_chat` does.
    """
    text = chat_prompt_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)
    return tokenizer.encode(text, add_special_tokens=False)


def chat_prompt_text(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """`messages` rendered through `tokenizer.chat_template` (`render_chat`, with the tokenizer's BOS and EOS texts
    as `bos_token` and `eos_token`): the prompt text `encode_chat` tokenizes. Raises `ValueError` when the
    tokenizer has no chat template, and as `render_chat` does."""
    if not tokenizer.chat_template:
        raise ValueError("the checkpoint has no chat template")
    return render_chat(
        tokenizer.chat_template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=_special_token_text(tokenizer, tokenizer.bos_token_id),
        eos_token=_special_token_text(tokenizer, tokenizer.eos_token_id),
    )


def _special_token_text(tokenizer: Any, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.decode([token_id], skip_special_tokens=False)


@lru_cache(maxsize=16)
def _compile(template: str):
    """The jinja2 environment of transformers' `_cached_compile_jinja_template`, less its `{% generation %}`
    tracker (which only records assistant spans for training masks), compiled once per template text."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; transformers overrides it with plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        # A limited `dict` so templates cannot break out through attribute access on the builtin type.
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # Namespaces reject underscore-prefixed attributes, so templates cannot reach CPython internals.
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
                )

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)


def _alias_reasoning_fields(chat: list[dict]) -> list[dict]:
    """Fill `reasoning_content` (and `thinking`, read by gpt-oss templates) from whichever reasoning field a
    message has (transformers `_alias_reasoning_fields`)."""
    aliased = []
    for message in chat:
        reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def _plain_template_data(value: Any) -> Any:
    """Rebuild what a template sees from plain JSON-like types (transformers `_plain_template_data`): subclasses of
    str/int/float are cast to the base type, numpy scalars to Python ones, dataclasses to dicts, anything else
    becomes an inert placeholder such as "<ndarray>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain_template_data(key): _plain_template_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_template_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain_template_data(item) for item in value)
    if isinstance(value, np.generic):
        return _plain_template_data(value.item())  # np.bool_(False) would otherwise be a truthy placeholder
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain_template_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain_template_data(value.model_dump())
    return f"<{type(value).__name__}>"
