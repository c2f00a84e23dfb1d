"""Room for deep nesting. Parsing and checking recurse once per nesting level (a sum of 400
terms, 200 nested calls, a chain of 400 modules). Python 3.11 runs Python-to-Python calls
without growing the C stack, so a higher recursion limit is safe for this code; beyond it a
RecursionError becomes a diagnostic (see `program._check_item` and `parser.parse_item`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

RECURSION_LIMIT = 20000


@contextmanager
def deep_recursion():
    previous = sys.getrecursionlimit()
    if previous < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
    try:
        yield
    finally:
        if previous < RECURSION_LIMIT:
            sys.setrecursionlimit(previous)
