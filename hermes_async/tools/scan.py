"""Incremental scanning shared by the parsers: one JSON value fed in pieces, and the small
markup matches (a literal, a JSON string, whitespace) that say "yes", "no" or "need more text".

Every answer depends only on the text seen so far, never on how it was split, which is what
keeps a stream's events the same whatever the chunking.
"""

from __future__ import annotations

import json
import re

NEED = -1  # the text ends before the answer is known
FAIL = -2  # the text cannot match

_WS = " \t\n\r"
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = ("true", "false", "null")

# scanner states
_VALUE, _OBJ_FIRST, _OBJ_KEY, _COLON, _AFTER, _ARR_FIRST = range(6)
_STRING, _ESC, _HEXS, _NUM, _LIT = range(6, 11)


class JsonValueScanner:
    """Recognises one JSON value fed in pieces (strict RFC 8259 syntax, any nesting).

    :meth:`scan` consumes ``text[i:]`` up to the value's end and returns the index just after
    it (``done`` set), or ``len(text)`` when the value goes on; on a syntax error it sets
    ``failed`` and returns the index of the offending character. A number at the top level
    ends only at a character that cannot continue it (not consumed) or at :meth:`end`.
    """

    __slots__ = ("_stack", "_state", "_key", "_lit", "_hex", "_num", "done", "failed")

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._state = _VALUE
        self._key = False  # the string being read is an object key
        self._lit = ""  # the rest of a literal still expected
        self._hex = 0  # hex digits still expected in a \u escape
        self._num = ""  # the number read so far
        self.done = False
        self.failed = False

    def end(self) -> bool:
        """The input ended: completes a top-level number; True when the value is complete."""
        if not self.done and not self.failed and self._state == _NUM and not self._stack:
            self.done = _NUMBER.fullmatch(self._num) is not None
            self.failed = not self.done
        return self.done

    def _after_value(self) -> None:
        if self._stack:
            self._state = _AFTER
        else:
            self.done = True

    def scan(self, text: str, i: int) -> int:
        """Consume ``text[i:]`` as far as the value goes (see the class docstring)."""
        n = len(text)
        stack = self._stack
        while i < n and not self.done:
            state = self._state
            c = text[i]
            if state == _STRING:
                m = _STRING_RUN.match(text, i)
                i = m.end()
                if i >= n:
                    break
                c = text[i]
                if c == '"':
                    i += 1
                    if self._key:
                        self._key = False
                        self._state = _COLON
                    else:
                        self._after_value()
                elif c == "\\":
                    i += 1
                    self._state = _ESC
                else:  # a raw control character
                    self.failed = True
                    return i
                continue
            if state == _ESC:
                if c == "u":
                    self._hex = 4
                    self._state = _HEXS
                elif c in _ESCAPES:
                    self._state = _STRING
                else:
                    self.failed = True
                    return i
                i += 1
                continue
            if state == _HEXS:
                if c not in _HEX:
                    self.failed = True
                    return i
                self._hex -= 1
                if not self._hex:
                    self._state = _STRING
                i += 1
                continue
            if state == _NUM:
                if c in _NUMBER_CHARS:
                    self._num += c
                    i += 1
                    continue
                if _NUMBER.fullmatch(self._num) is None:
                    self.failed = True
                    return i
                self._after_value()  # the terminating character is read again below
                continue
            if state == _LIT:
                if c != self._lit[0]:
                    self.failed = True
                    return i
                self._lit = self._lit[1:]
                i += 1
                if not self._lit:
                    self._after_value()
                continue
            if c in _WS and state != _VALUE or (state == _VALUE and stack and c in _WS):
                i += 1
                continue
            if state == _ARR_FIRST:
                if c == "]":
                    stack.pop()
                    i += 1
                    self._after_value()
                    continue
                state = self._state = _VALUE
            if state == _VALUE:
                i += 1
                if c == "{":
                    stack.append("{")
                    self._state = _OBJ_FIRST
                elif c == "[":
                    stack.append("[")
                    self._state = _ARR_FIRST
                elif c == '"':
                    self._state = _STRING
                elif c == "-" or "0" <= c <= "9":
                    self._num = c
                    self._state = _NUM
                elif c in "tfn":
                    self._lit = next(w for w in _LITERALS if w[0] == c)[1:]
                    self._state = _LIT
                else:
                    self.failed = True
                    return i - 1
            elif state in (_OBJ_FIRST, _OBJ_KEY):
                if c == '"':
                    self._key = True
                    self._state = _STRING
                elif c == "}" and state == _OBJ_FIRST:
                    stack.pop()
                    self._after_value()
                else:
                    self.failed = True
                    return i
                i += 1
            elif state == _COLON:
                if c != ":":
                    self.failed = True
                    return i
                self._state = _VALUE
                i += 1
            else:  # _AFTER: a value inside a container ended
                top = stack[-1]
                if c == ",":
                    self._state = _OBJ_KEY if top == "{" else _VALUE
                elif c == ("}" if top == "{" else "]"):
                    stack.pop()
                    self._after_value()
                else:
                    self.failed = True
                    return i
                i += 1
        return i


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character at or after ``i`` (or ``len(text)``)."""
    n = len(text)
    while i < n and text[i] in _WS:
        i += 1
    return i


def match_literal(text: str, i: int, literal: str) -> int:
    """``text[i:]`` starts with ``literal``: the index after it; else NEED when the text ends
    inside a prefix of it, FAIL otherwise."""
    if text.startswith(literal, i):
        return i + len(literal)
    return NEED if literal.startswith(text[i:]) else FAIL


def read_string(text: str, i: int) -> tuple[int, str]:
    """A JSON string at ``i``: (index after it, its value), or (NEED | FAIL, "")."""
    if i >= len(text):
        return NEED, ""
    if text[i] != '"':
        return FAIL, ""
    scanner = JsonValueScanner()
    end = scanner.scan(text, i)
    if scanner.failed:
        return FAIL, ""
    if not scanner.done:
        return NEED, ""
    return end, json.loads(text[i:end])


def held_suffix(text: str, start: int, marker: str) -> int:
    """Length of the longest suffix of ``text[start:]`` that is a proper prefix of ``marker``
    (what must wait for more text before it can be called plain text)."""
    for k in range(min(len(marker) - 1, len(text) - start), 0, -1):
        if marker.startswith(text[len(text) - k:]):
            return k
    return 0
