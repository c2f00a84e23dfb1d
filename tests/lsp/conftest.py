"""A real client (pytest-lsp) talking to `python -m linnet lsp` over stdio, with VS Code's
capabilities, on the fixture workspace `tests/lsp/workspace` and the examples."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp")

from lsprotocol import types as T  # noqa: E402
from pygls.protocol import default_converter  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities  # noqa: E402
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = Path(__file__).resolve().parent / "workspace"
EXAMPLES = ROOT / "examples"
SERVER = [sys.executable, "-m", "linnet", "lsp"]
TIMEOUT_S = 20.0


def _publish(client: LanguageClient, params: T.PublishDiagnosticsParams):
    client.diagnostics[params.uri] = params.diagnostics
    client.published.append(params)


def _pick_last(client: LanguageClient, params: T.ShowMessageRequestParams):
    client.message_requests.append(params)
    return params.actions[-1] if params.actions else None


def _refresh(client: LanguageClient, params: None):
    client.refreshes.append(True)


def _register(client: LanguageClient, params: T.RegistrationParams):
    client.registrations.extend(params.registrations)


def _factory() -> LanguageClient:
    """pytest-lsp's client, keeping every publishDiagnostics with its version, answering
    showMessageRequest with the last action and accepting (and keeping) registrations."""
    client = LanguageClient(converter_factory=default_converter)
    client.published = []
    client.message_requests = []
    client.refreshes = []
    client.registrations = []
    features = dict(DEFAULT_CLIENT_FEATURES)
    features[T.CLIENT_REGISTER_CAPABILITY] = _register
    features[T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = _publish
    features[T.WINDOW_SHOW_MESSAGE_REQUEST] = _pick_last
    for method in (T.WORKSPACE_CODE_LENS_REFRESH, T.WORKSPACE_INLAY_HINT_REFRESH, T.WORKSPACE_SEMANTIC_TOKENS_REFRESH):
        features[method] = _refresh
    register_lsp_features(client, features)
    return client


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER, client_factory=_factory), scope="module")
async def client(lsp_client: LanguageClient):
    lsp_client.set_configuration({"linnet": {"preset": "", "inlayHints": {"shapes": True, "maxLength": 40}}})
    await lsp_client.initialize_session(
        T.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            workspace_folders=[T.WorkspaceFolder(WORKSPACE.as_uri(), "workspace")],
            initialization_options={"inlayHints": {"shapes": True, "maxLength": 40}},
        )
    )
    yield
    await lsp_client.shutdown_session()


@dataclass
class Doc:
    """An open document: its URI, its current text and version, and position helpers."""

    client: LanguageClient
    uri: str
    text: str
    version: int = 1
    first_publish: int = 0  # publishes before this index belong to an earlier open of the URI

    @property
    def id(self) -> T.TextDocumentIdentifier:
        return T.TextDocumentIdentifier(self.uri)

    def pos(self, needle: str, delta: int = 0, nth: int = 0) -> T.Position:
        """The LSP position of the `nth` occurrence of `needle`, plus `delta` characters."""
        offset = -1
        for _ in range(nth + 1):
            offset = self.text.index(needle, offset + 1)
        return self.at(offset + delta)

    def at(self, offset: int) -> T.Position:
        line = self.text.count("\n", 0, offset)
        start = self.text.rfind("\n", 0, offset) + 1
        return T.Position(line, len(self.text[start:offset].encode("utf-16-le")) // 2)

    def offset(self, position: T.Position) -> int:
        lines = self.text.split("\n")
        return sum(len(x) + 1 for x in lines[: position.line]) + position.character

    def slice(self, rng: T.Range) -> str:
        return self.text[self.offset(rng.start) : self.offset(rng.end)]

    async def change(self, start: T.Position, end: T.Position, new_text: str) -> None:
        """One ranged edit, as editors send them."""
        a, b = self.offset(start), self.offset(end)
        self.text = self.text[:a] + new_text + self.text[b:]
        self.version += 1
        self.client.text_document_did_change(
            T.DidChangeTextDocumentParams(
                T.VersionedTextDocumentIdentifier(version=self.version, uri=self.uri),
                [T.TextDocumentContentChangePartial(range=T.Range(start, end), text=new_text)],
            )
        )

    async def diagnostics(self, version: int | None = None) -> list[T.Diagnostic]:
        """The diagnostics published for `version` (default: the current one)."""
        version = self.version if version is None else version
        for _ in range(int(TIMEOUT_S / 0.02)):
            for p in reversed(self.client.published[self.first_publish :]):
                if p.uri == self.uri and p.version == version:
                    return list(p.diagnostics)
            await asyncio.sleep(0.02)
        raise AssertionError(f"no diagnostics for {self.uri} version {version}")

    def close(self) -> None:
        self.client.text_document_did_close(T.DidCloseTextDocumentParams(self.id))


async def open_doc(client: LanguageClient, path: Path, text: str | None = None) -> Doc:
    text = path.read_text(encoding="utf-8") if text is None else text
    doc = Doc(client, path.as_uri(), text, first_publish=len(client.published))
    client.text_document_did_open(T.DidOpenTextDocumentParams(T.TextDocumentItem(doc.uri, "linnet", 1, text)))
    await doc.diagnostics(1)
    return doc
