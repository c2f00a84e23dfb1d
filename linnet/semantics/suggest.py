"""Did-you-mean suggestions by edit distance."""

from __future__ import annotations

from difflib import SequenceMatcher


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance (Levenshtein with adjacent transpositions)."""
    if a == b:
        return 0
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def suggestions(name: str, candidates, limit: int = 3) -> list[str]:
    """The closest candidates to `name`: within an edit distance of a third of its length
    (at least 1, at most 3), or sharing most characters; best first."""
    scored = []
    max_dist = max(1, min(3, len(name) // 3))
    lowered = name.lower()
    for c in set(candidates):
        if not c or c == name:
            continue
        short, long_ = sorted((lowered, c.lower()), key=len)
        if len(name) <= 2 and not (short == long_ or (long_.startswith(short) and len(long_) - len(short) == 1)):
            continue  # one- and two-letter names are too short to guess from by edit distance
        d = edit_distance(lowered, c.lower())
        if d <= max_dist or (len(name) > 3 and SequenceMatcher(None, lowered, c.lower()).ratio() >= 0.8):
            scored.append((d, c))
    scored.sort()
    return [c for _, c in scored[:limit]]


def closest(name: str, candidates) -> str | None:
    found = suggestions(name, candidates, 1)
    return found[0] if found else None
