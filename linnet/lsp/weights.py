"""Checkpoint headers checked in the editor: the diagnostics `linnet check --weights` gives, on the open documents.

A preset's weights are the `linnet.weights` setting's entry for it (preset name -> folder, .gguf file or embedded
id), else its `@weights("...")` (an embedded id, or a path relative to the `.linnet` file). For each such preset
of an open document, `linnet.runtimes.headers.check_weights` reads the checkpoint's headers (never tensor data)
and reports what loading would: missing, extra, wrong shape, integer dtype, config.json keys and values the
source refuses, on the member or config field each concerns, config.json's key as related information.

The check runs in a worker process (`weight_worker.py`: about 0.3-1 s for a 30-layer model, mostly checking the
source again under the checkpoint's config), never in the server's process: it takes neither the server's GIL nor
its memory, and leaves no garbage for the server's collections. `WeightChecks.diagnostics` answers at once with
the result for the document's current text and settings when there is one, and otherwise starts the check and
answers nothing; when the check ends, the document's diagnostics are published again. One check runs at a time,
once the text has been still for `SETTLE_S`; edits made meanwhile are checked next, and a check whose document
closed is cancelled (the worker is killed; the next check starts another). Results are dropped when a watched
checkpoint file changes (`workspace/didChangeWatchedFiles`; `watch` registers a watcher for each folder in use)
or the settings change. The server imports neither the header reader nor numpy; never torch, jax nor onnxruntime.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from lsprotocol import types as T

from linnet.semantics.preset_weights import preset_model_mismatch, preset_weights_at
from linnet.semantics.program import Analysis
from linnet.syntax.items import Location

from .convert import uri_of

if TYPE_CHECKING:
    from .documents import OpenDocument
    from .server import LinnetServer

log = logging.getLogger("linnet.lsp")

SETTLE_S = 0.3  # a check starts once the text has not changed for this long: typing never waits on one

# (preset, checkpoint spec as written, the folder a relative path starts from, where `@weights` names it or None)
Target = tuple[str, str, str, Location | None]


class WeightWorker:
    """The worker process that runs the header checks (`weight_worker.py`), started on the first check; one check
    at a time. `kill()` cancels the check running (its `check` raises CancelledError) and ends the process."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def _started(self) -> asyncio.subprocess.Process:
        if self.process is None or self.process.returncode is not None:
            import linnet

            env = dict(os.environ)  # the worker imports the same linnet as this process
            root = str(Path(linnet.__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "linnet.lsp.weight_worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
        return self.process

    async def check(self, path: str, text: str, targets: tuple[Target, ...]) -> tuple[list[T.Diagnostic], list[Path]]:
        """`path`'s weight diagnostics and the checkpoint files read. Raises RuntimeError when the check failed,
        CancelledError when it was cancelled."""
        from .convert import position_encoding
        from .weight_worker import HEADER, frame

        async with self._lock:
            process = await self._started()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(frame((path, text, targets, position_encoding())))
                await process.stdin.drain()
                (size,) = HEADER.unpack(await process.stdout.readexactly(HEADER.size))
                body = await process.stdout.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError) as err:
                if process.returncode is None and self.process is process:
                    raise RuntimeError(f"the weight check worker failed: {err}") from err
                raise asyncio.CancelledError from err  # killed: cancelled
            except asyncio.CancelledError:
                self.kill()  # its answer would be read as the next check's
                raise
            import pickle

            answer = pickle.loads(body)
            if answer[0] != "ok":
                raise RuntimeError(answer[1])
            return answer[1], answer[2]

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
        self.process = None


class WeightChecks:
    """The header checks of the open documents: results by document URI, the checks running, the watchers."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[tuple, list[T.Diagnostic]]] = {}
        self.running: dict[str, asyncio.Task] = {}
        self.watched: set[Path] = set()
        self.worker = WeightWorker()
        self.checking: str | None = None  # the URI whose check the worker runs now

    def cancel(self, uri: str) -> None:
        """A document closed: its check, if the worker runs it now, is cancelled."""
        task = self.running.pop(uri, None)
        if task is not None and not task.done():
            task.cancel()
        if self.checking == uri:
            self.worker.kill()
        self.results.pop(uri, None)

    def targets(self, ls: LinnetServer, doc: OpenDocument, analysis: Analysis) -> list[Target]:
        """The presets of `doc` that name weights, with the checkpoint each names; a preset of another config
        than the root model takes is not checked against that model."""
        out: list[Target] = []
        for preset in analysis.declared_presets:
            if preset_model_mismatch(analysis, preset) is not None:
                continue
            named = preset_weights_at(analysis, preset)
            if preset in ls.settings.weights:
                spec = ls.settings.weights[preset]
                base = ls.roots[0] if ls.roots else str(Path(doc.path).parent)
                out.append((preset, spec, base, None))
            elif named is not None:
                out.append((preset, named[0], str(Path(doc.path).parent), named[1]))
        return out

    def diagnostics(self, ls: LinnetServer, doc: OpenDocument, analysis: Analysis) -> list[T.Diagnostic]:
        """The weight diagnostics of `doc`'s current text, or [] while they are being checked (a check is
        started, and publishes when it ends)."""
        for uri in [u for u in self.results if ls.documents.get(u) is None]:  # closed since
            del self.results[uri]
        targets = self.targets(ls, doc, analysis)
        if not targets:
            self.results.pop(doc.uri, None)
            return []
        key = (doc.text, tuple(targets))
        found = self.results.get(doc.uri)
        if found is not None and found[0] == key:
            return found[1]
        task = self.running.get(doc.uri)
        if task is None or task.done():
            self.running[doc.uri] = asyncio.ensure_future(self._check(ls, doc, key))
        return []

    async def _check(self, ls: LinnetServer, doc: OpenDocument, key: tuple) -> None:
        text, targets = key
        await asyncio.sleep(SETTLE_S)
        if doc.text != text:  # still typing: check the text it settles on (the next publish starts it)
            if ls.documents.get(doc.uri) is doc:
                ls.schedule_diagnostics(doc)
            return
        try:
            self.checking = doc.uri
            diagnostics, files = await self.worker.check(doc.path, text, targets)
        except asyncio.CancelledError:
            return
        except Exception as err:  # noqa: BLE001 - a failed check must not take the diagnostics down
            ls.log_error("checkpoint header check", err)
            diagnostics, files = [], []
        finally:
            self.checking = None
        self.results[doc.uri] = (key, diagnostics)
        await self.watch(ls, files)
        if ls.documents.get(doc.uri) is doc:
            ls.schedule_diagnostics(doc)

    def forget(self, changed: list[str]) -> bool:
        """Drop every result when one of `changed` (paths) is a watched checkpoint file or inside a watched
        folder; whether any was."""
        hit = any(Path(p) in self.watched or Path(p).parent in self.watched for p in changed)
        if hit:
            self.results.clear()
        return hit

    async def watch(self, ls: LinnetServer, files: list[Path]) -> None:
        """Ask the client to report changes of the checkpoint files in use (their folders), when it can."""
        folders = {f.parent for f in files} - self.watched
        if not folders:
            return
        self.watched |= folders
        if not ls.client_supports("workspace", "did_change_watched_files", "dynamic_registration"):
            return
        relative = ls.client_supports("workspace", "did_change_watched_files", "relative_pattern_support")
        watchers = [
            T.FileSystemWatcher(
                glob_pattern=T.RelativePattern(base_uri=uri_of(str(folder)), pattern="*")
                if relative
                else f"{folder.as_posix()}/*"
            )
            for folder in sorted(folders)
        ]
        options = T.DidChangeWatchedFilesRegistrationOptions(watchers=watchers)
        registration = T.Registration(str(uuid.uuid4()), T.WORKSPACE_DID_CHANGE_WATCHED_FILES, options)
        try:
            await ls.client_register_capability_async(T.RegistrationParams([registration]))
        except Exception as err:  # noqa: BLE001 - a client may refuse; settings changes still re-check
            log.warning("registering a watcher for checkpoint files failed: %s", err)
