"""The checkpoint header checks' worker process: `python -m linnet.lsp.weight_worker`, started by the language
server (`WeightWorker`) on the first document whose presets name weights, and kept.

The check reads the checkpoint's headers and checks the source again under the checkpoint's config (0.3-1 s and
millions of short-lived objects for a 30-layer model). Run in a thread of the server, it took the GIL in turns with
the event loop and left its garbage to the server's full collections (1-9 s pauses that requests waited on, and RSS
growing with every edit); here it runs on another core, its garbage is collected in this process, and the server
only waits on a pipe, and at a lower scheduling priority (`NICENESS`), so a check never takes a core from the
server's own work. A check is cancelled by killing the process (the next check starts another).

Frames on stdin and stdout: an 8-byte big-endian length, then a pickle. In: `(path, text, targets, encoding)`
(`weights.Target`s, the position encoding in use); out: `("ok", diagnostics, files)` (lsprotocol Diagnostics in
`path`, the checkpoint files read) or `("error", message)`. Results are cached by text and target while the
checkpoint's files keep their size and modification time, so a document that comes back to a text already checked
is answered at once.
"""

from __future__ import annotations

import gc
import os
import pickle
import struct
import sys
from pathlib import Path
from typing import Any, BinaryIO

HEADER = struct.Struct(">Q")
CACHE_SIZE = 32
# The worker's scheduling priority, added to the server's (nice(2)): on a machine with few cores a check (1-1.5 s
# of CPU on a 3,000-line file) that runs on when typing resumes took a core from the server's keystroke checks;
# traced on 2 shared cores, it overlapped edits that waited 110-180 ms for diagnostics. At +10 it gets about a
# tenth of a contended core's time (CFS weight 110 against 1024) and all of an idle one.
NICENESS = 10


def read_frame(stream: BinaryIO) -> Any | None:
    """The next frame's object, or None at the end of the stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    return pickle.loads(stream.read(size))


def frame(obj: Any) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _stamp(files: list[Path]) -> tuple:
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((str(f), st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((str(f), None, None))
    return tuple(out)


_cache: dict[tuple, tuple[tuple, list, list[Path], list[Path]]] = {}


def check_target(path: str, text: str, target: tuple) -> tuple[list, list[Path]]:
    """One target's header check (`linnet.runtimes.headers.check_weights`) as LSP diagnostics in `path`, and the
    files it read; cached by (path, text, target) while those files and the checkpoint's own path are unchanged (a
    folder or file made where none was, or entries added to the folder: a check that could not open it read no
    file, and was otherwise cached for as long as the text stayed the same)."""
    from linnet.runtimes.headers import check_weights
    from linnet.runtimes.loading import resolve_preset_weights

    from .convert import lsp_diagnostic

    preset, spec, base, named_at = target
    where = (named_at.path, named_at.start.offset, named_at.end.offset) if named_at is not None else None
    key = (path, text, preset, spec, base, where)
    found = _cache.get(key)
    if found is not None and found[0] == _stamp(found[3]):
        return found[1], found[2]
    weights = resolve_preset_weights(str(Path(base) / "_"), spec)  # a relative path starts from `base`
    report = check_weights(path, text, weights, preset, weights_at=named_at)
    diagnostics = [lsp_diagnostic(d) for d in report.diagnostics if d.location.path == path]
    files = list(report.files)
    if len(_cache) >= CACHE_SIZE:
        _cache.pop(next(iter(_cache)))
    stamped = [Path(weights), *files]  # (an embedded id is no path here: its stamp stays "no such file")
    _cache[key] = (_stamp(stamped), diagnostics, files, stamped)
    return diagnostics, files


def check_all(path: str, text: str, targets) -> tuple[list, list[Path]]:
    diagnostics: list = []
    files: list[Path] = []
    for target in targets:
        found, read = check_target(path, text, tuple(target))
        diagnostics += found
        files += read
    return diagnostics, files


def main() -> int:
    from .convert import set_position_encoding

    try:
        os.nice(NICENESS)
    except OSError:  # not allowed here (a sandbox): checks run at the server's priority
        pass
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (request := read_frame(stdin)) is not None:
        path, text, targets, encoding = request
        try:
            set_position_encoding(encoding)
            diagnostics, files = check_all(path, text, targets)
            answer: tuple = ("ok", diagnostics, files)
        except Exception as err:  # noqa: BLE001 - reported to the server, which logs it
            answer = ("error", f"{type(err).__name__}: {err}")
        stdout.write(frame(answer))
        stdout.flush()
        gc.collect()  # this process's garbage, collected while the server waits on nothing
    return 0


if __name__ == "__main__":
    sys.exit(main())
