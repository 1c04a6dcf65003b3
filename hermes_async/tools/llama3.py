"""The Llama 3.x JSON format (Llama 3.1 / 3.2 / 3.3 with custom tools): an optional
``<|python_tag|>``, then ``{"name": ..., "parameters": {...}}`` (``"arguments"`` also read),
several separated by ``;`` or newlines.

Without the tag, a call must start the output (after whitespace), and an object that is not
a call (any key but name, parameters/arguments, id, type) is plain text; after the tag the
object is read as a call, and anything else after it (e.g. Python for a built-in tool) is plain
text.
"""

from __future__ import annotations

from hermes_async.tools.scan import skip_ws
from hermes_async.tools.streaming import DONE, FAIL, CallObject, StreamParser, ToolCallStream

TAG = "<|python_tag|>"
_ARGS_KEYS = ("parameters", "arguments")


class Llama3Stream(ToolCallStream):
    """Streaming parser of the Llama 3 JSON format."""

    _START, _TEXT, _TAGGED, _OBJ, _AFTER, _SEP = range(6)

    def __init__(self) -> None:
        super().__init__()
        self._state = self._START
        self._obj: CallObject | None = None

    def _step(self) -> bool:
        buf, pos, state = self._buf, self._pos, self._state
        if state == self._TEXT:
            if not self._seek_block(TAG):
                return False
            self._state = self._TAGGED
            return True
        if state == self._OBJ:
            assert self._obj is not None
            status = self._obj.step(buf, pos)
            self._pos = self._obj.pos
            if status == DONE:
                self._close_block()  # each call is a block of its own
                self._state = self._AFTER
                return True
            if status == FAIL or self._final:
                return self._fail()
            return False
        p = skip_ws(buf, pos)
        if p >= len(buf):
            if not self._final:
                return False
            if state == self._TAGGED:
                return self._fail()
            if state == self._START:
                self._content(len(buf))
            else:  # trailing whitespace (and a last ";") end the calls
                self._pos = len(buf)
            self._state = self._TEXT
            return False
        c = buf[p]
        if state == self._START:
            self._content(p)
            if c != "{":
                self._state = self._TEXT
                return True
            self._open_block(p, p)
            return self._object(p, bare=True)
        if state == self._TAGGED:
            return self._object(p, bare=False) if c == "{" else self._fail()
        if state == self._SEP:
            return self._object(p, bare=True) if c == "{" else self._fail()
        # _AFTER a call: a separator, another call, or plain text from here on
        if c == ";":
            self._pos, self._state = p + 1, self._SEP
            return True
        if c == "{":
            return self._object(p, bare=True)
        self._state = self._TEXT
        return True

    def _object(self, p: int, bare: bool) -> bool:
        self._obj = CallObject(self, _ARGS_KEYS, bare=bare)
        self._pos = p
        self._state = self._OBJ
        return True

    def _fail(self) -> bool:
        self._fail_block()
        self._state = self._TEXT
        return True


def Llama3JsonParser() -> StreamParser:
    """Tool-call parser of the Llama 3 JSON format."""
    return StreamParser("llama3_json", Llama3Stream)

