"""Stop strings over streamed text: never emitted, found even when split across chunks.

The matcher holds back only what could still be the start of a stop string (the longest suffix
of the text so far that is a proper prefix of one: nothing before it can be part of a future
match), and emits everything before it. A stop string that appears ends the text where it
starts; the stop string and everything after it are dropped.

Which match wins: the one that **starts earliest** in the text (for equal starts, the
shortest, which completes first). That makes the result a function of the text alone,
independent of how it was chunked: ``emitted == text[:min(text.find(s) for s in stops)]``
over the stops found. It only matters when one stop string contains another: with stops
``["abcd", "bc"]`` and text ``"abc"`` so far, ``"bc"`` is complete but ``"abcd"`` could still
start earlier, so the matcher asks for more text before it decides (at most
``len("abcd") - 1`` more characters); :meth:`StopStringMatcher.flush` decides with whatever has
come. Otherwise a stop string ends the text as soon as it completes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple


def _proper_prefixes(stop: str) -> str:
    """A pattern matching exactly the proper prefixes of ``stop``: ``"abcd"`` gives
    ``a(?:b(?:c)?)?``."""
    pattern = ""
    for ch in reversed(stop[1:-1]):
        pattern = f"(?:{re.escape(ch)}{pattern})?"
    return re.escape(stop[0]) + pattern


class StopCheck(NamedTuple):
    """Result of feeding text to a :class:`StopStringMatcher`."""

    text: str
    """Text safe to emit now (never part of a stop string)."""
    stopped: bool
    """True when a stop string matched: the sequence must finish; ``text`` ends before it."""
    stop: str | None = None
    """The stop string that matched (when ``stopped``)."""


class StopStringMatcher:
    """Stop-string detection for one stream of text (one sequence).

    ``stops``: the stop strings; empty strings and duplicates are ignored, so an empty list
    gives a matcher that passes text straight through. Cost per :meth:`feed`: two compiled
    regular-expression searches (one for complete stop strings over the held-back text plus
    the new text, one for a possible partial match over its last ``max(len(stop)) - 1``
    characters), whatever the number of stop strings.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            raise TypeError("stops must be a sequence of strings, not a string")
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        # Leftmost match; at one position the shortest alternative is tried first.
        self._match_re = re.compile(
            "|".join(re.escape(s) for s in sorted(self._stops, key=len))
        ) if self._stops else None
        # A proper prefix of a stop string running to the end of the text (leftmost = longest).
        partials = [_proper_prefixes(s) for s in self._stops if len(s) > 1]
        self._partial_re = re.compile("(?:" + "|".join(partials) + r")\Z") if partials else None
        self._max_partial = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._stopped: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings in use (deduplicated, non-empty, in the order given)."""
        return self._stops

    @property
    def held(self) -> str:
        """Text received but not yet emitted: "" or a proper prefix of some stop string."""
        return self._held

    @property
    def stopped(self) -> str | None:
        """The stop string that matched, or None."""
        return self._stopped

    def _earliest_match(self, buf: str) -> tuple[int, str] | None:
        m = self._match_re.search(buf) if self._match_re is not None else None
        return (m.start(), m.group()) if m is not None else None

    def _partial_start(self, buf: str) -> int:
        """Start of the longest suffix of ``buf`` that is a proper prefix of a stop string
        (``len(buf)`` when none): nothing before it can be part of a future match."""
        n = len(buf)
        if self._partial_re is None:
            return n
        m = self._partial_re.search(buf, max(0, n - self._max_partial))
        return m.start() if m is not None else n

    def feed(self, new_text: str) -> StopCheck:
        """Take the next piece of text; return what may be emitted now and whether a stop
        string ended the text. After a stop, further calls return ``("", True, stop)``."""
        if self._stopped is not None:
            return StopCheck("", True, self._stopped)
        if not self._stops:
            return StopCheck(new_text, False)
        buf = self._held + new_text
        hold = self._partial_start(buf)
        match = self._earliest_match(buf)
        if match is not None and match[0] <= hold:
            self._held = ""
            self._stopped = match[1]
            return StopCheck(buf[: match[0]], True, match[1])
        # No match, or a match with a possible earlier-starting one still open: wait.
        self._held = buf[hold:]
        return StopCheck(buf[:hold], False)

    def flush(self) -> StopCheck:
        """The text ends (for another reason than a stop string): release what is held back.
        A complete stop string inside the held text still ends it there (``stopped`` True)."""
        if self._stopped is not None:
            return StopCheck("", True, self._stopped)
        buf, self._held = self._held, ""
        match = self._earliest_match(buf) if buf else None
        if match is not None:
            self._stopped = match[1]
            return StopCheck(buf[: match[0]], True, match[1])
        return StopCheck(buf, False)
