"""Stop conditions of one served request: stop token ids, EOS, and stop strings matched across token boundaries.

`TextStream` turns the request's tokens into the text a client may see. Tokens go through `IncrementalDetokenizer`
(so a multi-byte UTF-8 character split across tokens is released only once complete: a stop string whose
character is split between two tokens is matched on the whole character), then the released text is held back
for as long as its end could still be the beginning of a stop string. The stop string itself and anything after it
are never released. This is the scheme of vLLM's `StopChecker` and text-generation-inference's `StopSequenceCriteria`
(vLLM `v1/engine/detokenizer.py`: "hold back the last len(longest stop) - 1 characters"); here the hold is exact
(the longest suffix of the pending text that is a prefix of a stop string), so text that can no longer match is
released at once.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ..generation import IncrementalDetokenizer, Tokenizer

__all__ = ["StopResult", "TextStream", "held_back_length", "stop_token_ids"]


def stop_token_ids(tokenizer: Tokenizer | None, extra: Collection[int], *, ignore_eos: bool) -> frozenset[int]:
    """The token ids that end a request: the tokenizer's `eos_token_ids` (unless `ignore_eos`) and `extra`."""
    eos = () if ignore_eos else (getattr(tokenizer, "eos_token_ids", None) or ())
    return frozenset(int(t) for t in eos) | frozenset(int(t) for t in extra)


def held_back_length(text: str, stops: Sequence[str]) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of one of `stops` (0 when none): the
    characters that must stay hidden because the next token could complete a stop string with them."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold


@dataclass
class StopResult:
    """What one token released: `text` safe to show (possibly ""), and `stop`, the matched stop string (None while
    none has matched). Once `stop` is set the request is over; `text` is what came before the stop string."""

    text: str
    stop: str | None = None


@dataclass
class TextStream:
    """The visible text of one request, token by token.

    `tokenizer`: decodes the tokens (`IncrementalDetokenizer`); None when the engine runs on token ids only (then
    `stops` must be empty and every `push` returns ""). `stops`: the stop strings (non-empty strings).

    `push(token_id)` returns the newly releasable text and whether a stop string has just matched; `finish()`
    releases what was held back (at EOS, a stop token or `max_tokens`: nothing can complete a stop string any
    more). The released pieces concatenate to the decoded text of the tokens up to the stop string (or all of it).
    """

    tokenizer: Tokenizer | None
    stops: tuple[str, ...] = ()
    pending: str = field(default="", init=False)  # released by the detokenizer, not yet by us
    _detok: IncrementalDetokenizer | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if any(not isinstance(s, str) or not s for s in self.stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(self.stops)!r}")
        if self.stops and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (the model was loaded without one)")
        self._detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer is not None else None

    def push(self, token_id: int) -> StopResult:
        """Add one generated token (not a stop token); returns the text it makes safe to show."""
        if self._detok is None:
            return StopResult("")
        return self._release(self._detok.push(token_id))

    def finish(self) -> StopResult:
        """Everything not yet released (the detokenizer's tail and the held-back text); call once, at the end.
        `stop` is set when the detokenizer's tail completes a stop string (the text is then what precedes it)."""
        if self._detok is None:
            return StopResult("")
        result = self._release(self._detok.flush())
        if result.stop is None:
            result.text, self.pending = result.text + self.pending, ""
        return result

    def _release(self, piece: str) -> StopResult:
        if not piece:
            return StopResult("")
        # A stop string can only newly appear in a window that starts inside the held-back text.
        searched_from = len(self.pending)
        self.pending += piece
        if self.stops:
            found = self._first_stop(max(0, searched_from - max(len(s) for s in self.stops) + 1))
            if found is not None:
                at, stop = found
                text, self.pending = self.pending[:at], ""
                return StopResult(text, stop)
        hold = held_back_length(self.pending, self.stops)
        cut = len(self.pending) - hold
        text, self.pending = self.pending[:cut], self.pending[cut:]
        return StopResult(text)

    def _first_stop(self, start: int) -> tuple[int, str] | None:
        """The earliest (position, stop string) in `pending[start:]`; the longer stop string on a tie."""
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = self.pending.find(stop, start)
            if at >= 0 and (best is None or at < best[0] or (at == best[0] and len(stop) > len(best[1]))):
                best = (at, stop)
        return best
