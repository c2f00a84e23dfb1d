"""Where the cursor is, for completion: at a field name of a config value (`MlpConfig { in_features = 8, | }`)
or at a type (`fn f(y: |`, `-> |`, `let x: |`, a config field's `name: |`), read from the text before it.

Completion offers names in scope elsewhere; at these places only a field or a type can go. The text is read,
not the tree, because the statement being typed usually does not parse; only the item's text up to the cursor
is scanned (and a config value's own text after it), so this stays cheap on large files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from linnet.syntax.parser import code_mask

_NAME = r"[A-Za-z_]\w*"
# what comes before the `{` of a config value (`= MlpConfig {`) or of a config's body (`config MlpConfig {`)
_BRACE_HEAD = re.compile(rf"((?<![=!<>])=|\bconfig)\s*({_NAME})\s*$")  # not `if a == b {`
# what comes before the `(` of a signature's parameters (`fn f<T>(`, `module Mlp(`, `model M(`)
_PARAMS_HEAD = re.compile(rf"\b(fn|module|model)\s+{_NAME}\s*(<[^<>()]*>)?\s*$")
_TYPED_NAME = re.compile(rf"\s*{_NAME}\s*:\s*")  # `y: ` with the type to come
_LET_TYPED = re.compile(rf"\s*let\s+{_NAME}\s*:\s*")
_FIELD_INIT = re.compile(rf"({_NAME})\s*=(?!=)")
BEFORE_ITEM_CHARS = 4096  # text scanned before the cursor when it is in no item (the item being typed)


@dataclass
class Place:
    """A completion place: `kind` "field" (a field name of a value of config `config`, `written` the fields the
    value already sets) or "type" (`in_config`: a config field's type, where `list[...]` may go too; `generics`:
    in a parameter list, the dtype variables its function declares)."""

    kind: str
    config: str = ""
    written: set[str] = field(default_factory=set)
    in_config: bool = False
    generics: list[str] = field(default_factory=list)  # a signature's dtype variables, read from its `<T, U>`


# what bracket depth is read from: brackets, commas and newlines, with strings and comments skipped whole (a
# regex, so that the characters between are skipped in C: this runs on each completion request)
_STRUCTURE = re.compile(r'[()\[\]{},\n]|"(?:\\.|[^"\\\n])*"?|#[^\n]*')


def _innermost_open(text: str) -> tuple[int, int, int]:
    """The offset of the innermost bracket of `text` left open at its end (-1 if none), and the offsets of the
    last comma and the last newline after it at that depth (-1 if none)."""
    depth, comma, newline = 0, -1, -1
    for match in reversed(list(_STRUCTURE.finditer(text))):
        ch, i = match.group(), match.start()
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                return i, comma, newline
            depth -= 1
        elif depth == 0 and ch == "," and comma < 0:
            comma = i
        elif depth == 0 and ch == "\n" and newline < 0:
            newline = i
    return -1, comma, newline


def _written_fields(text: str, brace: int, limit: int) -> set[str]:
    """The field names a config value whose `{` is at `brace` sets (`name =` at its top level, before the cursor
    and after it, up to its `}` or `limit`)."""
    body = text[brace + 1 : limit]
    mask = code_mask(body)
    written, depth, at_start = set(), 0, True
    i = 0
    while i < len(body):
        ch = body[i]
        if not mask[i] or ch.isspace() and ch != "\n":
            i += 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and ch in ",\n":
            at_start = True
            i += 1
            continue
        elif depth == 0 and at_start and (match := _FIELD_INIT.match(body, i)):
            written.add(match.group(1))
            i, at_start = match.end(), False
            continue
        at_start = False
        i += 1
    return written


def completion_place(text: str, floor: int, start: int, limit: int) -> Place | None:
    """The place a name typed at `start` (the start of the word at the cursor) goes, or None where completion
    offers names in scope. `floor`: where the item the cursor is in starts; `limit`: where it ends."""
    before = text[floor:start]
    line = before[before.rfind("\n") + 1 :]
    last = line.rstrip()[-1:]
    if last not in ("", ":", ">", "{", ","):
        return None  # after an operator, a call's `(`, a value: an expression goes here (most requests end here)
    if line.rstrip().endswith("->") or _LET_TYPED.fullmatch(line):
        return Place("type")
    brace, comma, newline = _innermost_open(before)
    if brace < 0:
        return None
    opener = before[brace]
    if opener == "(":
        segment = before[max(brace, comma) + 1 :]
        if (head := _PARAMS_HEAD.search(before, 0, brace)) and _TYPED_NAME.fullmatch(segment):
            generics = re.findall(rf"({_NAME})\s*(?::\s*{_NAME}\s*)?[,>]", head.group(2) or "")
            return Place("type", generics=generics)
        return None
    if opener != "{" or (head := _BRACE_HEAD.search(before, 0, brace)) is None:
        return None
    segment = before[max(brace, comma, newline) + 1 :]
    if head.group(1) == "config":
        return Place("type", in_config=True) if _TYPED_NAME.fullmatch(segment) else None
    if segment.strip():
        return None
    return Place("field", head.group(2), _written_fields(text, floor + brace, limit))
