"""StopStringMatcher: stop strings never emitted, found across chunk boundaries, the earliest
match wins, and only a possible start of a stop string is ever held back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_async.engine.stop_strings import StopCheck, StopStringMatcher


def expected_output(text: str, stops: list[str]) -> tuple[str, str | None]:
    """``text`` cut before the earliest-starting stop string (the shortest on ties)."""
    found = [(text.find(s), len(s), s) for s in stops if s and s in text]
    if not found:
        return text, None
    start, _, stop = min(found)
    return text[:start], stop


def longest_partial_suffix(text: str, stops: list[str]) -> str:
    """The longest suffix of ``text`` that is a proper prefix of some stop string."""
    for k in range(len(text), 0, -1):
        if any(len(s) > k and s.startswith(text[-k:]) for s in stops):
            return text[-k:]
    return ""


@st.composite
def chunked(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=len(text) + 1)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def stream(stops: list[str], chunks: list[str]) -> tuple[str, StopCheck]:
    matcher = StopStringMatcher(stops)
    out, seen = [], ""
    for chunk in chunks:
        check = matcher.feed(chunk)
        out.append(check.text)
        if check.stopped:
            return "".join(out), check
        seen += chunk
        # Held back: exactly the longest suffix that could still start a stop string.
        assert "".join(out) + matcher.held == seen
        assert matcher.held == longest_partial_suffix(seen, matcher.stops)
    final = matcher.flush()
    out.append(final.text)
    return "".join(out), final


ALPHABET = "ab.*\\\n🎉"  # regex metacharacters, newline, astral char


@settings(max_examples=400, deadline=None)
@given(text=st.text(ALPHABET, max_size=30),
       stops=st.lists(st.text(ALPHABET, max_size=4), max_size=4), data=st.data())
def test_output_is_text_before_earliest_stop_for_any_chunking(text: str, stops: list[str],
                                                              data: st.DataObject) -> None:
    chunks = data.draw(chunked(text))
    out, final = stream(stops, chunks)
    want, stop = expected_output(text, stops)
    assert out == want
    assert final.stopped == (stop is not None)
    assert final.stop == stop


def test_stop_split_across_chunks_is_never_emitted() -> None:
    m = StopStringMatcher(["</answer>"])
    assert m.feed("The result is 4</") == StopCheck("The result is 4", False)
    assert m.held == "</"
    assert m.feed("ans") == StopCheck("", False)
    assert m.feed("wer> trailing") == StopCheck("", True, "</answer>")
    assert m.feed("more") == StopCheck("", True, "</answer>")
    assert m.flush() == StopCheck("", True, "</answer>")


def test_false_alarm_is_released() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("a ST") == ("a ", False, None)
    assert m.feed("ART") == ("START", False, None)
    assert m.feed("ST") == ("", False, None)
    assert m.flush() == ("ST", False, None)


def test_earliest_match_wins_over_list_order() -> None:
    m = StopStringMatcher(["world", "lo"])
    assert m.feed("hello world") == ("hel", True, "lo")


def test_longer_stop_starting_earlier_wins_when_it_completes() -> None:
    m = StopStringMatcher(["abcd", "bc"])
    assert m.feed("xab") == ("x", False, None)
    assert m.feed("c") == ("", False, None)  # "bc" is complete, but "abcd" could start earlier
    assert m.feed("d") == ("", True, "abcd")  # output "x": text[:text.find("abcd")]
    m = StopStringMatcher(["abcd", "bc"])
    assert m.feed("xabc") == ("x", False, None)
    assert m.feed("e") == ("a", True, "bc")
    m = StopStringMatcher(["abcd", "bc"])
    m.feed("xabc")
    assert m.flush() == ("a", True, "bc")  # the text ended: "bc" it is


def test_no_stops_passes_through_and_empty_stops_ignored() -> None:
    m = StopStringMatcher([])
    assert m.feed("anything") == ("anything", False, None)
    m = StopStringMatcher(["", "x", "x"])
    assert m.stops == ("x",)
    assert m.feed("abc") == ("abc", False, None)
    with pytest.raises(TypeError):
        StopStringMatcher("stop")  # type: ignore[arg-type]


def test_unicode_and_newline_stops() -> None:
    m = StopStringMatcher(["\n\n", "🎉"])
    assert m.feed("line\n") == ("line", False, None)
    assert m.feed("x🎉") == ("\nx", True, "🎉")
