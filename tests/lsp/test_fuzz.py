"""Random edits against one server, interleaved with every kind of request at random (also
out-of-range) positions: the server answers every request, keeps its text in step with the
client's, never logs a caught exception, and ends on the diagnostics a fresh analysis of the
final text gives. Seeded, so a failure reproduces."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest
from lsprotocol import types as T
from pygls.exceptions import JsonRpcException

from linnet.lsp.convert import lsp_diagnostic
from linnet.lsp.tokens import TOKEN_TYPES
from linnet.semantics.program import Document

from .conftest import EXAMPLES, WORKSPACE, open_doc

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEED = 20260517
EDITS = 2000
REQUEST_EVERY = 5  # on average, one awaited (and checked) request per this many edits
FIRE_EVERY = 25  # on average, one request left in flight while the edits go on
MAX_CHARS = 12_000  # a text longer than this is replaced by an example
REQUEST_TIMEOUT_S = 30.0  # generous: a missing answer, not a slow one, fails

NAME = re.compile(r"[^\W\d]\w*")
EXAMPLE_TEXTS = [p.read_text(encoding="utf-8") for p in sorted(EXAMPLES.glob("*.linnet"))]

SNIPPETS = [
    # keywords and punctuation
    *"config preset module model fn entry let for in if else state and or not true false none self".split(),
    *"( ) [ ] { } < > -> : , . = == != + - * / ** @ ... ? | ; # ## \" '".split(),
    "\n",
    "\n    ",
    "\n\n",
    "    ",
    " ",
    "\t",
    # pieces of real programs
    "let x = ",
    "let (a, b) = ",
    "c.",
    "c.hidden_size",
    "[B, S, c.hidden_size]",
    "bool[B, S, S]",
    "f32[B, 4]",
    'rearrange(x, "b s (h d) -> b h s d", h=c.num_heads)',
    "Linear(c.hidden_size, c.hidden_size, use_bias=false)",
    "fn f(x: [B, S, D]) -> [B, S, D] {\n    x\n}\n",
    "module M(c: C) {\n}\n",
    "config C {\n    d: int = 4\n}\n",
    "preset p = C { d = 8 }\n",
    "for layer in layers {\n    h = layer(h)\n}",
    '@name("w")',
    "## doc\n",
    "x @ transpose(w)",
    "silu(",
    "attention(q, k, v, mask, ",
    "1e-6",
    "0",
    "-1",
    "3.5",
    "2 ** -0.5",
    '"str',
    # unicode: accents, Greek, arrows, an astral character (two UTF-16 units), zero-width, NBSP, combining, CJK
    "é",
    "λ",
    "→",
    "😀",
    "𝔁",
    "\u200b",
    "\u00a0",
    "e\u0301",
    "名前",
    "\x00",
    "\ufeff",
]


class Fuzz:
    """The client's side: its text, version and random choices."""

    def __init__(self, client, doc, rng: random.Random, tmp_path: Path):
        self.client, self.doc, self.rng, self.tmp_path = client, doc, rng, tmp_path
        self.problems: list[str] = []
        self.in_flight: list[tuple[str, asyncio.Future]] = []
        self.requests = 0
        self.logs_seen = len(client.log_messages)

    # ------------------------------------------------------------------ edits
    def offset(self) -> int:
        return self.rng.randint(0, len(self.doc.text))

    def snippet(self) -> str:
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(SNIPPETS)
        if r < 0.8:  # a word already in the text (names that resolve)
            words = self.doc.text.split()
            return self.rng.choice(words) if words else "x"
        alphabet = "abcxyzBS_0123456789()[]{}<>,.:;=+-*/@\"'#\n \t éλ😀\u200b"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(1, 12)))

    def send(self, changes: list[tuple[int, int, str] | str]) -> None:
        """One didChange: ranged changes (start, end, text), applied in order as LSP says, or a
        whole-text replacement (str)."""
        events = []
        for change in changes:
            if isinstance(change, str):
                self.doc.text = change
                events.append(T.TextDocumentContentChangeWholeDocument(text=change))
                continue
            a, b, new = change
            rng = T.Range(self.doc.at(a), self.doc.at(b))
            self.doc.text = self.doc.text[:a] + new + self.doc.text[b:]
            events.append(T.TextDocumentContentChangePartial(range=rng, text=new))
        self.doc.version += 1
        self.client.text_document_did_change(
            T.DidChangeTextDocumentParams(T.VersionedTextDocumentIdentifier(self.doc.version, self.doc.uri), events)
        )

    async def replace_all(self, text: str) -> None:
        """A whole-text change, after a checkpoint: it would wipe out a divergence unseen."""
        await self.checkpoint()
        self.send([text])

    async def edit(self) -> None:
        text, rng = self.doc.text, self.rng
        if len(text) > MAX_CHARS:
            return await self.replace_all(rng.choice(EXAMPLE_TEXTS))
        r = rng.random()
        if r < 0.5:  # insert
            at = self.offset()
            self.send([(at, at, self.snippet())])
        elif r < 0.72:  # delete a short range, sometimes a long one
            a = self.offset()
            b = min(len(text), a + (rng.randint(1, 8) if rng.random() < 0.8 else rng.randint(1, 400)))
            self.send([(a, b, "")])
        elif r < 0.82:  # replace a range
            a = self.offset()
            b = min(len(text), a + rng.randint(1, 20))
            self.send([(a, b, self.snippet())])
        elif r < 0.92:  # several changes in one notification, each against the text the previous left
            changes = []
            for _ in range(rng.randint(2, 4)):
                n = len(text)
                a = rng.randint(0, n)
                b = min(n, a + rng.randint(0, 5))
                new = self.snippet() if rng.random() < 0.7 else ""
                changes.append((a, b, new))
                text = text[:a] + new + text[b:]
            self.send(changes)
        elif r < 0.945:  # truncate
            a = self.offset()
            self.send([(a, len(text), "")])
        elif r < 0.95:  # close and reopen at once, with a request in flight, as an editor's "revert" does
            self.fire()
            self.client.text_document_did_close(T.DidCloseTextDocumentParams(self.doc.id))
            self.doc.version += 1
            item = T.TextDocumentItem(self.doc.uri, "linnet", self.doc.version, self.doc.text)
            self.client.text_document_did_open(T.DidOpenTextDocumentParams(item))
        elif r < 0.97:  # a random prefix of an example, as a whole-text change
            example = rng.choice(EXAMPLE_TEXTS)
            await self.replace_all(example[: rng.randint(0, len(example))])
        else:  # a whole example, so the text keeps coming back to real programs
            await self.replace_all(rng.choice(EXAMPLE_TEXTS))

    # ------------------------------------------------------------------ requests
    def position(self) -> T.Position:
        """Mostly real positions; some past the end of a line, of the file, or far out."""
        r = self.rng.random()
        if r < 0.4:  # on a name, where hover, definition and rename have something to say
            names = [m.start() for m in re.finditer(r"\w+", self.doc.text)]
            if names:
                return self.doc.at(self.rng.choice(names) + self.rng.randint(0, 1))
        if r < 0.65:
            return self.doc.at(self.offset())
        lines = self.doc.text.split("\n")
        if r < 0.8:
            line = self.rng.randint(0, len(lines) - 1)
            return T.Position(line, len(lines[line].encode("utf-16-le")) // 2 + self.rng.randint(1, 50))
        if r < 0.9:
            return T.Position(len(lines) + self.rng.randint(0, 5), self.rng.randint(0, 80))
        return T.Position(self.rng.choice([0, len(lines) - 1, 2**31 - 1]), 2**31 - 1)

    def range(self) -> T.Range:
        a, b = self.position(), self.position()
        if (b.line, b.character) < (a.line, a.character):
            a, b = b, a
        return T.Range(a, b)

    def params(self, kind: str):
        doc, rng, pos = self.doc, self.rng, self.position()
        at = dict(text_document=doc.id, position=pos)
        if kind == "hover":
            return T.HoverParams(**at)
        if kind == "completion":
            trigger = T.CompletionContext(T.CompletionTriggerKind.TriggerCharacter, trigger_character=".")
            return T.CompletionParams(**at, context=trigger if rng.random() < 0.3 else None)
        if kind == "inlay_hint":
            return T.InlayHintParams(text_document=doc.id, range=self.range())
        if kind == "references":
            return T.ReferenceParams(**at, context=T.ReferenceContext(include_declaration=rng.random() < 0.5))
        if kind == "code_action":
            context = T.CodeActionContext(diagnostics=[])
            return T.CodeActionParams(text_document=doc.id, range=self.range(), context=context)
        if kind == "formatting":
            options = T.FormattingOptions(tab_size=4, insert_spaces=True)
            return T.DocumentFormattingParams(text_document=doc.id, options=options)
        if kind == "rename":
            return T.RenameParams(**at, new_name=rng.choice(["y", "renamed", "h2", "1bad", "", "λ", "let"]))
        return REQUESTS[kind](**(at if kind in AT_POSITION else dict(text_document=doc.id)))

    def request(self, kind: str | None = None) -> tuple[str, asyncio.Future]:
        """A request (default: a random one), sent now (pygls' non-async methods write before
        returning)."""
        kind = kind or self.rng.choice(list(REQUESTS))
        send = getattr(self.client, f"text_document_{kind}")
        return kind, asyncio.wrap_future(send(self.params(kind)))

    async def answer(self, kind: str, future: asyncio.Future):
        """The response, or the error a request may be refused with (rename's)."""
        try:
            return await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.problem(kind, f"no response within {REQUEST_TIMEOUT_S} s")
        except JsonRpcException as err:
            if kind not in ("rename", "prepare_rename"):
                self.problem(kind, f"error response: {err}")
        return None

    async def checked_request(self, kind: str | None = None) -> None:
        """A request answered for the text the client holds now, so its ranges can be checked."""
        kind, future = self.request(kind)
        self.requests += 1
        result = await self.answer(kind, future)
        check = CHECKS.get(kind)
        if result is not None and check is not None:
            for message in check(self, result):
                self.problem(kind, message)
        self.new_errors(kind)

    def fire(self) -> None:
        self.in_flight.append(self.request())
        self.requests += 1

    async def drain(self) -> None:
        for kind, future in self.in_flight:
            await self.answer(kind, future)
        self.in_flight.clear()

    # ------------------------------------------------------------------ checks
    def new_errors(self, what: str) -> None:
        """Caught exceptions the server logged since the last look, with the text they came from."""
        logs = self.client.log_messages
        for m in logs[self.logs_seen :]:
            if m.type == T.MessageType.Error and "failed:" in m.message:
                self.problem(what, "server logged " + m.message.splitlines()[0])
        self.logs_seen = len(logs)

    def problem(self, kind: str, message: str) -> None:
        if len(self.problems) < 20:
            path = self.tmp_path / f"problem-{len(self.problems)}.linnet"
            path.write_text(self.doc.text, encoding="utf-8")
            self.problems.append(f"{kind} at version {self.doc.version}: {message} (text: {path})")

    def text_of(self, rng: T.Range) -> str:
        """The client's text in `rng` (a range `bad_range` accepts), UTF-16 columns."""
        lines = self.doc.text.split("\n")

        def offset(p: T.Position) -> int:
            prefix = lines[p.line].encode("utf-16-le")[: 2 * p.character].decode("utf-16-le", errors="ignore")
            return sum(len(x) + 1 for x in lines[: p.line]) + len(prefix)

        return self.doc.text[offset(rng.start) : offset(rng.end)]

    def bad_range(self, rng: T.Range) -> str | None:
        """Why `rng` is not a range in the client's text, or None."""
        lines = self.doc.text.split("\n")
        for p in (rng.start, rng.end):
            if not 0 <= p.line < len(lines):
                return f"line {p.line} outside 0..{len(lines) - 1}"
            width = len(lines[p.line].encode("utf-16-le")) // 2
            if not 0 <= p.character <= width:
                return f"character {p.character} outside line {p.line} (width {width})"
        if (rng.end.line, rng.end.character) < (rng.start.line, rng.start.character):
            return f"end before start: {rng}"
        return None

    def ranges(self, ranges) -> list[str]:
        return [f"{why}: {r}" for r in ranges if (why := self.bad_range(r))]

    async def checkpoint(self) -> None:
        """The diagnostics for the current version equal a fresh analysis of the client's text:
        the server's incremental sync and incremental analysis agree with starting over."""
        await self.drain()
        path = str(WORKSPACE / "fuzz.linnet")
        fresh = asyncio.create_task(asyncio.to_thread(fresh_diagnostics, path, self.doc.text))  # meanwhile
        got = await self.doc.diagnostics()
        fresh = await fresh
        key = lambda d: (d.range.start.line, d.range.start.character, d.code, d.message)  # noqa: E731
        want = sorted((key(d), d.range.end.line, d.range.end.character) for d in fresh)
        have = sorted((key(d), d.range.end.line, d.range.end.character) for d in got)
        for message in self.ranges(d.range for d in got):
            self.problem("diagnostics", message)
        if have != want:
            self.problem("diagnostics", f"differ from a fresh analysis:\n  server {have}\n  fresh  {want}")


def fresh_diagnostics(path: str, text: str) -> list[T.Diagnostic]:
    """What the server should publish for `text`: a new Document, analysed once."""
    analysis = Document(path, text).analyze(None)
    return [lsp_diagnostic(d) for d in analysis.diagnostics if d.location.path == path]


# client method suffix -> params type
REQUESTS = {
    "hover": T.HoverParams,
    "completion": T.CompletionParams,
    "inlay_hint": T.InlayHintParams,
    "definition": T.DefinitionParams,
    "references": T.ReferenceParams,
    "semantic_tokens_full": T.SemanticTokensParams,
    "document_symbol": T.DocumentSymbolParams,
    "folding_range": T.FoldingRangeParams,
    "signature_help": T.SignatureHelpParams,
    "code_action": T.CodeActionParams,
    "formatting": T.DocumentFormattingParams,
    "document_highlight": T.DocumentHighlightParams,
    "prepare_rename": T.PrepareRenameParams,
    "rename": T.RenameParams,
    "code_lens": T.CodeLensParams,
}
AT_POSITION = {"definition", "signature_help", "document_highlight", "prepare_rename"}


def _locations(fuzz: Fuzz, result) -> list[str]:
    items = result if isinstance(result, (list, tuple)) else [result]
    here = [x for x in items if (getattr(x, "uri", None) or x.target_uri) == fuzz.doc.uri]
    return fuzz.ranges(x.range if isinstance(x, T.Location) else x.target_range for x in here)


def _symbols(fuzz: Fuzz, symbols) -> list[str]:
    out = []
    for s in symbols:
        sel = s.selection_range
        if bad := fuzz.ranges([s.range, sel]):
            out += bad
        elif not _within(sel, s.range):  # VS Code rejects the whole answer
            out.append(f"selectionRange {sel} not inside range {s.range} of {s.name!r}")
        elif fuzz.text_of(sel) != s.name:  # the server's text is the client's
            out.append(f"selectionRange {sel} holds {fuzz.text_of(sel)!r}, not {s.name!r}")
        out += _symbols(fuzz, s.children or [])
    return out


def _within(inner: T.Range, outer: T.Range) -> bool:
    start, end = (inner.start.line, inner.start.character), (inner.end.line, inner.end.character)
    return (outer.start.line, outer.start.character) <= start and end <= (outer.end.line, outer.end.character)


def _tokens(fuzz: Fuzz, result: T.SemanticTokens) -> list[str]:
    data = result.data
    if len(data) % 5:
        return [f"{len(data)} integers, not a multiple of 5"]
    lines = fuzz.doc.text.split("\n")
    out, line, char, prev_end = [], 0, 0, (0, 0)
    for i in range(0, len(data), 5):
        dl, dc, length, kind, _mods = data[i : i + 5]
        line, char = line + dl, (char + dc if dl == 0 else dc)
        if not 0 <= kind < len(TOKEN_TYPES) or length <= 0:
            out.append(f"token {i // 5}: type {kind}, length {length}")
        elif line >= len(lines) or char + length > len(lines[line].encode("utf-16-le")) // 2:
            out.append(f"token {i // 5} at {line}:{char}+{length} outside the text")
        elif (line, char) < prev_end:
            out.append(f"token {i // 5} at {line}:{char} overlaps the previous one")
        else:  # every token is a name in the client's text: the server's text is the client's
            name = fuzz.text_of(T.Range(T.Position(line, char), T.Position(line, char + length)))
            if not NAME.fullmatch(name):
                out.append(f"token {i // 5} at {line}:{char}+{length} covers {name!r}, not a name")
        prev_end = (line, char + length)
    return out


def _workspace_edit(fuzz: Fuzz, edit: T.WorkspaceEdit) -> list[str]:
    out = []
    for uri, edits in (edit.changes or {}).items():
        if uri == fuzz.doc.uri:
            out += fuzz.ranges(e.range for e in edits)
    return out


def _folding(fuzz: Fuzz, result) -> list[str]:
    last = fuzz.doc.text.count("\n")
    return [
        f"{f.start_line}..{f.end_line} outside 0..{last}" for f in result if not 0 <= f.start_line <= f.end_line <= last
    ]


def _completion(fuzz: Fuzz, result) -> list[str]:
    items = result.items if isinstance(result, T.CompletionList) else result
    out = [f"item without a label: {i}" for i in items if not i.label]
    return out + fuzz.ranges(i.text_edit.range for i in items if isinstance(i.text_edit, T.TextEdit))


def _code_actions(fuzz: Fuzz, result) -> list[str]:
    return [m for a in result if isinstance(a, T.CodeAction) and a.edit for m in _workspace_edit(fuzz, a.edit)]


CHECKS = {
    "hover": lambda f, r: f.ranges([r.range] if r.range else []),
    "completion": _completion,
    "inlay_hint": lambda f, r: f.ranges(T.Range(h.position, h.position) for h in r),
    "definition": _locations,
    "references": _locations,
    "semantic_tokens_full": _tokens,
    "document_symbol": _symbols,
    "folding_range": _folding,
    "code_action": _code_actions,
    "formatting": lambda f, r: f.ranges(e.range for e in r),
    "document_highlight": lambda f, r: f.ranges(h.range for h in r),
    "prepare_rename": lambda f, r: f.ranges(
        [r] if isinstance(r, T.Range) else [r.range] if hasattr(r, "range") else []
    ),
    "rename": _workspace_edit,
    "code_lens": lambda f, r: f.ranges(lens.range for lens in r),
}


@pytest.mark.slow
async def test_random_edits_and_requests(client, tmp_path):
    """About 40 s on two cores: 2,000 edits, some 500 requests, a checkpoint per whole-text change."""
    rng = random.Random(SEED)
    logs_before = len(client.log_messages)
    doc = await open_doc(client, WORKSPACE / "fuzz.linnet", (EXAMPLES / "llama.linnet").read_text(encoding="utf-8"))
    fuzz = Fuzz(client, doc, rng, tmp_path)
    for _ in range(EDITS):
        await fuzz.edit()
        if rng.random() < 1 / REQUEST_EVERY:
            await fuzz.checked_request()
        if rng.random() < 1 / FIRE_EVERY:
            fuzz.fire()
    await fuzz.checkpoint()  # the final version's diagnostics, as a fresh analysis gives them

    assert client._server is not None and client._server.returncode is None, "the server exited"
    failed = [
        m.message for m in client.log_messages[logs_before:] if m.type == T.MessageType.Error and "failed:" in m.message
    ]
    assert not fuzz.problems, f"seed {SEED}, {fuzz.requests} requests:\n" + "\n".join(fuzz.problems)
    assert not failed, f"seed {SEED}: the server logged {len(failed)} caught exceptions; first:\n{failed[0]}"
    assert fuzz.requests > EDITS / REQUEST_EVERY / 2  # the loop really asked
    doc.close()
