"""Training data: JSONL rows in the shapes TRL reads, turned into token rows and padded batches.

A row is one JSON object per line. The shapes (TRL's dataset formats, trl/data_utils.py):
- prompt-completion (SFT): `{"prompt": str, "completion": str}`; conversational when both are lists of
  messages (`[{"role": "user", "content": "..."}]`), rendered with the checkpoint's chat template;
- preference (DPO): `{"prompt", "chosen", "rejected"}`;
- prompt-only (GRPO): `{"prompt"}` plus any columns the reward function reads;
and, for models without a tokenizer, the same rows as token ids: `prompt_ids`, `completion_ids`, `chosen_ids`,
`rejected_ids` (lists of ints, used as given: no BOS or EOS is added).

Every problem names the file, the line and the field (`data.jsonl:3: field "completion" is missing`).

Batches are right-padded: `forward(input_ids: i64[B, S])` takes no attention mask, and under causal
attention a real token never attends to a later position, so the logits of the real tokens of a right-padded
row equal those of the row alone; the padding positions are left out of every loss (`loss_mask`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linnet.errors import TrainError

__all__ = [
    "Row",
    "TokenRow",
    "Batch",
    "read_jsonl",
    "field_choice",
    "encode_prompt_completion",
    "pad_batch",
    "batches",
]


@dataclass
class Row:
    """One JSONL line as read: `fields` the object, `where` "file:line" for messages."""

    fields: dict[str, Any]
    where: str

    def error(self, message: str) -> TrainError:
        return TrainError(f"{self.where}: {message}")


@dataclass
class TokenRow:
    """A row as tokens: `input_ids` the whole sequence (prompt then completion), `completion_mask` 1 on the
    tokens that count in the loss (the completion under completion-only loss), `where` its "file:line".
    Objectives with several sequences per row (DPO's chosen and rejected) keep them in `extra`."""

    input_ids: list[int]
    completion_mask: list[int]
    where: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """Right-padded micro-batch: `input_ids` i64[B, S]; `loss_mask` f32[B, S - 1], 1 where the token at
    position s + 1 is a loss target predicted from position s (the labels shifted as TRL and transformers
    shift them); `lengths` the real length of each row; `rows` the token rows it holds."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    lengths: list[int]
    rows: list[TokenRow]

    @property
    def num_loss_tokens(self) -> int:
        """The tokens that count in the loss (TRL's `num_items_in_batch` for this micro-batch)."""
        return int(self.loss_mask.sum())

    @property
    def num_tokens(self) -> int:
        """The real (unpadded) tokens, for tokens/s."""
        return int(sum(self.lengths))


def read_jsonl(path: str | Path) -> list[Row]:
    """The rows of a JSONL file, each with its "file:line". Blank lines are skipped.

    Raises TrainError for a missing or unreadable file, a line that is not JSON, a key twice in one object
    (file:line:column; json keeps the last silently, `datasets` refuses the file), or a value that is not an
    object (file:line), and for a file without rows."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainError(f"{p}: no such data file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TrainError(f"{p}: cannot read the data file ({err})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            value = json.loads(line, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as err:
            raise TrainError(f"{where}: not JSON ({err.msg} at column {err.colno})") from None
        except _DuplicateKey as dup:
            raise TrainError(
                f"{where}:{_second_column(line, dup.key)}: key {json.dumps(dup.key)} appears twice in one object "
                "(JSON would keep the last silently; `datasets` refuses such a file): keep one"
            ) from None
        if not isinstance(value, dict):
            raise TrainError(f"{where}: a row must be a JSON object, got {type(value).__name__}")
        rows.append(Row(value, where))
    if not rows:
        raise TrainError(f"{p}: the data file has no rows")
    return rows


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' object hook: the object, or _DuplicateKey for a key it holds twice (at any depth)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _second_column(line: str, key: str) -> int:
    """The 1-based column of the second `"key":` on `line` (where the duplicate starts), or of the first, or 1."""
    found = [m.start() + 1 for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", line)]
    return found[1] if len(found) > 1 else (found[0] if found else 1)


def field_choice(row: Row, shapes: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The first of `shapes` (tuples of field names, e.g. `("prompt", "completion")` then
    `("prompt_ids", "completion_ids")`) whose fields the row all has. Raises TrainError naming the first
    missing field of the shape the row comes closest to (file:line, field)."""
    for shape in shapes:
        if all(name in row.fields for name in shape):
            return tuple(shape)
    best = max(shapes, key=lambda s: sum(name in row.fields for name in s))
    missing = [name for name in best if name not in row.fields]
    have = ", ".join(sorted(row.fields)) or "none"
    wanted = " or ".join("{" + ", ".join(s) + "}" for s in shapes)
    raise row.error(f'field "{missing[0]}" is missing (rows need {wanted}; this one has {have})')


def token_ids(row: Row, name: str, vocab_size: int | None) -> list[int]:
    """Field `name` of `row` as a list of token ids. Raises TrainError (file:line, field) for a value that is not
    a non-empty list of ints in [0, vocab_size)."""
    value = row.fields[name]
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise row.error(f'field "{name}" must be a list of token ids (ints), got {json.dumps(value)[:60]}')
    if not value:
        raise row.error(f'field "{name}" is empty')
    if vocab_size is not None:
        bad = [t for t in value if not 0 <= t < vocab_size]
        if bad:
            raise row.error(f'field "{name}" holds token id {bad[0]}, outside the vocabulary [0, {vocab_size})')
    return value


def _text(row: Row, name: str) -> str | list[dict]:
    value = row.fields[name]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return value
    raise row.error(f'field "{name}" must be a string or a list of messages ({{"role", "content"}}), got '
                    f"{json.dumps(value)[:60]}")  # fmt: skip


def encode_prompt_completion(
    row: Row, prompt: str, completion: str, tokenizer: Any, vocab_size: int | None
) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of `row`'s fields `prompt` and `completion`.

    `*_ids` fields are taken as given. Text is tokenized as TRL's SFTTrainer does
    (trl/trainer/sft_trainer.py, `SFTTrainer._prepare_dataset.tokenize_fn`): standard text appends the EOS
    token to the completion when it does not end with it (`add_eos`) and tokenizes `prompt` and
    `prompt + completion` (special tokens added, e.g. BOS); conversational rows render `prompt` with the
    generation prompt and `prompt + completion` without, through the chat template. The completion starts
    where the two token lists first differ (`common_prefix_length`).

    Raises TrainError (file:line, field) for a text row without a tokenizer, mixed text and messages, a
    tokenizer without a chat template for messages, and bad ids."""
    if prompt.endswith("_ids"):
        return token_ids(row, prompt, vocab_size), token_ids(row, completion, vocab_size)
    if tokenizer is None:
        raise row.error(
            f'field "{prompt}" is text, and the checkpoint has no tokenizer: give the row as token ids '
            f'("{prompt}_ids", "{completion}_ids")'
        )
    p, c = _text(row, prompt), _text(row, completion)
    if isinstance(p, str) != isinstance(c, str):
        raise row.error(f'fields "{prompt}" and "{completion}" must both be text or both lists of messages')
    if isinstance(p, str):
        eos = tokenizer.eos_token
        if eos is not None and not c.endswith(eos):
            c = c + eos
        prompt_ids = tokenizer.encode(p)
        full = tokenizer.encode(p + c)
    else:
        from linnet.runtimes.inputs.chat import encode_chat

        try:
            prompt_ids = encode_chat(tokenizer, p, add_generation_prompt=True)
            full = encode_chat(tokenizer, p + c, add_generation_prompt=False)
        except ValueError as err:
            raise row.error(f"cannot render the messages: {err}") from None
    n = _common_prefix(prompt_ids, full)
    return full[:n], full[n:]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pad_batch(rows: Sequence[TokenRow], pad_token_id: int = 0) -> Batch:
    """Right-pad `rows` into a `Batch` (`input_ids` i64[B, S] with S the longest row; `loss_mask` f32[B, S - 1]:
    `completion_mask` shifted by one, so entry s says whether position s's prediction of token s + 1 counts)."""
    width = max(len(r.input_ids) for r in rows)
    ids = np.full((len(rows), width), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r.input_ids)] = r.input_ids
        mask[i, : len(r.completion_mask)] = r.completion_mask
    return Batch(ids, mask[:, 1:].copy(), [len(r.input_ids) for r in rows], list(rows))


def batches(rows: Sequence[TokenRow], batch_size: int, *, shuffle: bool, seed: int) -> Iterator[list[TokenRow]]:
    """Micro-batches of `batch_size` rows, forever: each epoch visits every row once, in the file's order or,
    with `shuffle`, in an order drawn from `seed` and the epoch (the same run gives the same order). The last
    micro-batch of an epoch may be smaller (as PyTorch's DataLoader with `drop_last=False`)."""
    epoch = 0
    while True:
        order = list(range(len(rows)))
        if shuffle:
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
        for start in range(0, len(order), batch_size):
            yield [rows[i] for i in order[start : start + batch_size]]
        epoch += 1
