"""Importing a library without the optional modules it would import for an option Linnet does not use."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

# lark imports them when they are installed, for grammars with `regex=True` (~30 ms of its import)
OPTIONAL_FOR_LARK = ("regex", "interegular")


@contextlib.contextmanager
def without_optional(names: tuple[str, ...]) -> Iterator[None]:
    """Importing any of `names` raises ImportError while the block runs (the modules a library imports only to
    offer an option we do not use); modules already imported are left alone."""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
