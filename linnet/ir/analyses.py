"""The analyses of whole sources that loading makes, kept for the next load of the same text in this process.

A process loads the same source again and again (the server's models, `linnet verify`'s runs, LoRA's base and
adapted programs, a test file's models), and each load checks the file under every preset and then again under
the bound config (`build.check_source`, `build.bind_config`): most of a small model's load time. An analysis is
a function of the text, the standard library (read once per process) and the files the text imports, and its
readers (binding, lowering, the LSP's generated-code views) do not change it, so one analysis can serve every
load of the same text while the files it imported still hold what it read.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from typing import Iterator

from ..semantics.program import Analysis, Document
from ..semantics.workspace import Workspace

# The most recent analyses kept (keyed by thread, path, text and preset): a load makes two, LoRA four; a few models'
# worth, and the memory of a few checked files (not of their weights).
ANALYSES_KEPT = 8

_kept: OrderedDict[tuple[int, str, str, str | None], Analysis] = OrderedDict()
_lock = threading.Lock()
_local = threading.local()  # `texts`: the files this thread's analyses read as given (`buffers`)


@contextlib.contextmanager
def buffers(texts: dict[str, str]) -> Iterator[None]:
    """Within the block, this thread's analyses read the files in `texts` (path -> text) as given there, not from
    disk: an editor's buffers, unsaved edits included, for what the language server lowers (its code views) and
    what its workers run (`linnet --buffers FILE`), as its diagnostics and hovers see them."""
    previous = getattr(_local, "texts", None)
    _local.texts = {Workspace.key(path): text for path, text in texts.items()}
    try:
        yield
    finally:
        _local.texts = previous


def analyze_source(path: str, text: str, preset: str | None) -> Analysis:
    """`Document(path, text).analyze(preset)`, or the same analysis made earlier in this process when every file
    it imported (transitively) still holds the text it read and none of the imports it could not read has appeared
    (`Analysis.files`, `Analysis.absent_files`). An analysis with errors is not kept (the error is the answer; a
    missing import may appear). The result is shared, by the thread that made it only (lowering fills an analysis's
    caches of checks made on demand, and two threads never lower one analysis at once: the language server's views
    run in worker threads); callers must not change it."""
    key = (threading.get_ident(), path, text, preset)
    texts = getattr(_local, "texts", None) or {}
    with _lock:
        hit = _kept.get(key)
    if hit is not None and _still_current(hit, texts):
        with _lock:
            if key in _kept:
                _kept.move_to_end(key)
        return hit
    document = Document(path, text, workspace=Workspace(texts)) if texts else Document(path, text)
    analysis = document.analyze(preset)
    if not any(d.severity == "error" for d in analysis.diagnostics):
        with _lock:
            _kept[key] = analysis
            _kept.move_to_end(key)
            while len(_kept) > ANALYSES_KEPT:
                _kept.popitem(last=False)
    return analysis


def forget_analyses() -> None:
    """Drop every kept analysis (their memory, or a test's need of a fresh check)."""
    with _lock:
        _kept.clear()


def _still_current(analysis: Analysis, texts: dict[str, str]) -> bool:
    """Whether every file `analysis` imported holds the text it read (read as the workspace reads an import: from
    `texts`, the given texts by `Workspace.key`, else from disk) and no path it could not read exists now."""
    own = analysis.document
    for doc in analysis.namespaces.files if analysis.namespaces is not None else ():
        if doc is own:
            continue
        given = texts.get(Workspace.key(doc.source.path))
        if given is not None:
            if given != doc.text:
                return False
            continue
        try:
            with open(doc.source.path, encoding="utf-8-sig", newline="") as f:
                if f.read() != doc.text:
                    return False
        except (OSError, UnicodeDecodeError):
            return False
    return not any(Workspace.key(p) in texts or os.path.exists(p) for p in analysis.absent_files)
