"""The analyses of whole sources that loading makes, kept for the next load of the same text in this process.

A process loads the same source again and again (the server's models, `linnet verify`'s runs, LoRA's base and
adapted programs, a test file's models), and each load checks the file under every preset and then again under
the bound config (`build.check_source`, `build.bind_config`): most of a small model's load time. An analysis is
a function of the text, the standard library (read once per process) and the files the text imports, and its
readers (binding, lowering, the LSP's generated-code views) do not change it, so one analysis can serve every
load of the same text while the files it imported still hold what it read.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

from ..semantics.program import Analysis, Document

# The most recent analyses kept (keyed by thread, path, text and preset): a load makes two, LoRA four; a few models'
# worth, and the memory of a few checked files (not of their weights).
ANALYSES_KEPT = 8

_kept: OrderedDict[tuple[int, str, str, str | None], Analysis] = OrderedDict()
_lock = threading.Lock()


def analyze_source(path: str, text: str, preset: str | None) -> Analysis:
    """`Document(path, text).analyze(preset)`, or the same analysis made earlier in this process when every file
    it imported (transitively) still holds the text it read and none of the imports it could not read has appeared
    (`Analysis.files`, `Analysis.absent_files`). An analysis with errors is not kept (the error is the answer; a
    missing import may appear). The result is shared, by the thread that made it only (lowering fills an analysis's
    caches of checks made on demand, and two threads never lower one analysis at once: the language server's views
    run in worker threads); callers must not change it."""
    key = (threading.get_ident(), path, text, preset)
    with _lock:
        hit = _kept.get(key)
    if hit is not None and _still_current(hit):
        with _lock:
            if key in _kept:
                _kept.move_to_end(key)
        return hit
    analysis = Document(path, text).analyze(preset)
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


def _still_current(analysis: Analysis) -> bool:
    """Whether every file `analysis` imported holds the text it read (read as the workspace reads an import) and
    no path it could not read exists now."""
    own = analysis.document
    for doc in analysis.namespaces.files if analysis.namespaces is not None else ():
        if doc is own:
            continue
        try:
            with open(doc.source.path, encoding="utf-8-sig", newline="") as f:
                if f.read() != doc.text:
                    return False
        except (OSError, UnicodeDecodeError):
            return False
    return not any(os.path.exists(p) for p in analysis.absent_files)
