"""The Mistral format: ``[TOOL_CALLS]`` followed by a JSON array of calls
``[{"name": ..., "arguments": {...}, "id"?: ...}]`` (v3 templates), or by
``name[ARGS]{...}`` (newer tokenizers; ``name[CALL_ID]id[ARGS]{...}`` too), one marker per call.

Call ids are the model's own (an ``id`` before the arguments, or ``[CALL_ID]``), else 9 random
alphanumerics (what Mistral's templates require of ids sent back). An array whose closing
``]`` is missing at the very end of the output still gives its complete calls.
"""

from __future__ import annotations

import json
import re

from hermes_async.tools.scan import NEED, JsonValueScanner, match_literal, skip_ws
from hermes_async.tools.streaming import (
    DONE,
    FAIL,
    CallObject,
    StartedCall,
    StreamParser,
    ToolCallStream,
)
from hermes_async.tools.types import new_mistral_id

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9_\-]+")


class MistralStream(ToolCallStream):
    """Streaming parser of the Mistral format."""

    new_id = staticmethod(new_mistral_id)
    _TEXT, _MARK, _ITEM, _FIRST, _OBJ, _NEXT, _NAME, _ID, _ARGS = range(9)

    def __init__(self) -> None:
        super().__init__()
        self._state = self._TEXT
        self._obj: CallObject | None = None
        self._name = ""
        self._id: str | None = None
        self._call: StartedCall | None = None
        self._scanner = JsonValueScanner()
        self._value: list[str] = []

    def _step(self) -> bool:
        buf, pos, state = self._buf, self._pos, self._state
        if state == self._TEXT:
            if not self._seek_block(MARKER):
                return False
            self._state = self._MARK
            return True
        if state == self._OBJ:
            assert self._obj is not None
            status = self._obj.step(buf, pos)
            self._pos = self._obj.pos
            if status == DONE:
                self._state = self._NEXT
                return True
            return self._need_or_fail(status)
        if state == self._ARGS:
            return self._args_step(buf, pos)
        if state in (self._NAME, self._ID):
            return self._name_step(buf, pos)
        p = skip_ws(buf, pos)
        if p >= len(buf):
            if self._final and state == self._NEXT:
                return self._close()  # the output ended where the "]" would be
            return self._need_or_fail(NEED)
        c = buf[p]
        if state == self._MARK and c == "[":
            self._pos, self._state = p + 1, self._FIRST
        elif state == self._MARK and _NAME.match(c):
            self._pos, self._state = p, self._NAME
        elif state in (self._ITEM, self._FIRST) and c == "{":
            self._pos, self._state = p, self._OBJ
            self._obj = CallObject(self, model_ids=True)
        elif state == self._NEXT and c in ",]":
            self._pos = p + 1
            if c == "]":
                return self._close()
            self._state = self._ITEM
        else:
            return self._fail()
        return True

    def _name_step(self, buf: str, pos: int) -> bool:
        pattern = _NAME if self._state == self._NAME else _ID
        if pos >= len(buf):
            return self._need_or_fail(NEED)
        m = pattern.match(buf, pos)
        if m is None:
            return self._fail()
        if m.end() >= len(buf):
            return self._need_or_fail(NEED)
        for marker in (ARGS, CALL_ID) if self._state == self._NAME else (ARGS,):
            end = match_literal(buf, m.end(), marker)
            if end == NEED:
                return self._need_or_fail(NEED)
            if end >= 0:
                break
        else:
            return self._fail()
        if self._state == self._NAME:
            self._name = m.group()
        else:
            self._id = m.group()
        self._pos = end
        if marker == CALL_ID:
            self._state = self._ID
            return True
        self._state = self._ARGS
        self._scanner = JsonValueScanner()
        self._value = []
        self._call = self._start_call(self._name, self._id)
        return True

    def _args_step(self, buf: str, pos: int) -> bool:
        assert self._call is not None
        if pos < len(buf) and not self._value and buf[pos] != "{":
            return self._fail()
        end = self._scanner.scan(buf, pos)
        if self._scanner.failed:
            return self._fail()
        piece = buf[pos:end]
        self._pos = end
        if piece:
            self._value.append(piece)
            self._args(self._call, piece)
        if not self._scanner.done:
            return self._need_or_fail(NEED)
        try:
            ok = isinstance(json.loads("".join(self._value)), dict)
        except (ValueError, RecursionError):
            ok = False
        return self._close() if ok else self._fail()

    def _need_or_fail(self, status: int) -> bool:
        if status == FAIL or self._final:
            return self._fail()
        return False

    def _close(self) -> bool:
        self._close_block()
        self._state = self._TEXT
        self._id = None
        return True

    def _fail(self) -> bool:
        self._fail_block()
        self._state = self._TEXT
        self._id = None
        return True


def MistralParser() -> StreamParser:
    """Tool-call parser of the Mistral format (``[TOOL_CALLS]``)."""
    return StreamParser("mistral", MistralStream)
