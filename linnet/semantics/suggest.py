"""Did-you-mean suggestions by edit distance."""

from __future__ import annotations

import functools
from difflib import SequenceMatcher


def edit_distance(a: str, b: str, limit: int | None = None) -> int:
    """Optimal string alignment distance (Levenshtein with adjacent transpositions). With `limit`, any distance
    above it may be answered as `limit + 1` (the rows stop once every entry exceeds it)."""
    if a == b:
        return 0
    if limit is not None and abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if limit is not None and min(cur) > limit and (i == 1 or min(prev) > limit):
            return limit + 1  # every later row is at least this row's (or, by a transposition, the last's) minimum
        prev2, prev = prev, cur
    return prev[-1]


@functools.lru_cache(maxsize=65536)
def _mask(text: str) -> int:
    """The set of `text`'s characters as bits (a candidate's is computed once, however many names it is offered to)."""
    mask = 0
    for ch in set(text):
        mask |= 1 << (ord(ch) & 1023)
    return mask


def _mask64(text: str) -> int:
    """The set of `text`'s characters folded into 64 bits (two characters may share a bit)."""
    mask = 0
    for ch in set(text):
        mask |= 1 << (ord(ch) & 63)
    return mask


class NameIndex:
    """Many names (a file's top-level names) grouped by the characters they hold, so that a suggestion for an
    unknown name looks at the few that can pass `suggestions`' tests, not at every one: a file with thousands of
    unknown names among thousands of items made the search quadratic (issue 45: minutes for a 5 MB file).

    Why the filter loses nothing: each distinct character one name has and the other lacks leaves at least one of
    its characters unmatched, and the unmatched characters of the two number at most twice the edit distance (a
    substitution leaves one on each side, an insertion or deletion one, a transposition none) and at most a fifth
    of the two lengths when difflib's quick ratio is 0.8 or more (`similar`). Folding characters into 64 bits only
    lowers the count of differing bits, so a name that passes either test is never filtered out."""

    def __init__(self, names) -> None:
        self.groups: dict[int, tuple[int, list[str]]] = {}  # mask -> (the longest name's length, the names)
        for name in names:
            if not name:
                continue
            mask = _mask64(name.lower())
            longest, group = self.groups.get(mask, (0, []))
            group.append(name)
            self.groups[mask] = (max(longest, len(name)), group)
        self._best: dict[tuple[str, int], list[str]] = {}

    def best(self, name: str, also: frozenset[str] = frozenset(), limit: int = 3) -> list[str]:
        """`suggestions(name, near(name) | also, limit)`, remembered per name: a file repeats its unknown names
        (one per preset it is checked under, and the same typo in many items), and each search scans every group.
        `also` is the same set on every call (the built-in names)."""
        key = (name, limit)
        found = self._best.get(key)
        if found is None:
            found = self._best[key] = suggestions(name, also.union(self.near(name)), limit)
        return found

    def near(self, name: str) -> list[str]:
        """The names that may be suggested for `name` (a superset of what `suggestions` keeps of them)."""
        max_dist = max(1, min(3, len(name) // 3))
        query = _mask64(name.lower())
        out: list[str] = []
        for mask, (longest, group) in self.groups.items():
            bound = max(2 * max_dist, 0.2 * (len(name) + longest) if len(name) > 3 else 0)
            if (mask ^ query).bit_count() <= bound:
                out.extend(group)
        return out


def suggestions(name: str, candidates, limit: int = 3) -> list[str]:
    """The closest candidates to `name`: within an edit distance of a third of its length
    (at least 1, at most 3), or sharing most characters; best first (by distance, then name: the order of
    `candidates` does not matter).

    Linear in the candidates with a small constant: a candidate whose length alone rules out both tests is
    skipped, and the character-sharing ratio is bounded by difflib's quick ratios (`name` is the matcher's
    cached second sequence) before it is computed; the distance stops once it exceeds what can be kept.
    Remembered per name and set of candidates: a module is checked once per config, and an unknown name in it
    asked the same question under each (five times per typo in llama.linnet)."""
    return list(_suggestions(name, frozenset(candidates), limit))


@functools.lru_cache(maxsize=4096)
def _suggestions(name: str, candidates: frozenset[str], limit: int) -> tuple[str, ...]:
    scored = []
    max_dist = max(1, min(3, len(name) // 3))
    lowered = name.lower()
    matcher = SequenceMatcher(None, "", lowered)
    name_mask = _mask(lowered)
    for c in candidates:
        if not c or c == name:
            continue
        other = c.lower()
        short, long_ = sorted((lowered, other), key=len)
        if len(name) <= 2 and not (short == long_ or (long_.startswith(short) and len(long_) - len(short) == 1)):
            continue  # one- and two-letter names are too short to guess from by edit distance
        if len(long_) - len(short) > max_dist and (len(name) <= 3 or 2 * len(short) < 0.8 * (len(short) + len(long_))):
            continue  # too far apart in length for either test
        # each distinct character one has and the other lacks leaves at least one of its characters unmatched
        other_mask = _mask(other)
        shared_most = min(
            len(other) - (other_mask & ~name_mask).bit_count(), len(lowered) - (name_mask & ~other_mask).bit_count()
        )
        if shared_most < len(long_) - max_dist and (len(name) <= 3 or shared_most < 0.4 * (len(short) + len(long_))):
            continue
        matcher.set_seq1(other)
        quick = matcher.quick_ratio()  # 2 * (characters the two share, as multisets) / (their lengths' sum)
        shared = round(quick * (len(short) + len(long_)) / 2)
        similar = len(name) > 3 and quick >= 0.8 and matcher.ratio() >= 0.8
        if not similar and len(long_) - shared > max_dist:
            continue  # an alignment within max_dist edits keeps all but max_dist of the longer one's characters
        d = edit_distance(lowered, other, None if similar else max_dist)
        if d <= max_dist or similar:
            scored.append((d, c))
    scored.sort()
    return tuple(c for _, c in scored[:limit])


@functools.lru_cache(maxsize=4096)
def close_to(name: str, candidates: tuple[str, ...]) -> tuple[str, ...]:
    """The `candidates` equal to `name` or each `closest` to it alone, in their order (a config's fields, asked
    about for every unknown name in every item that takes the config)."""
    return tuple(c for c in candidates if c == name or closest(name, [c]))


def closest(name: str, candidates) -> str | None:
    found = suggestions(name, candidates, 1)
    return found[0] if found else None
