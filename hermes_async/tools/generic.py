"""The generic format, for templates without tool support (the engine then adds
:func:`~hermes_async.tools.prompting.generic_tools_prompt`): the output is one JSON object
``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}``; ``{"tool_call": {...}}`` and a
bare ``{"name": ..., "arguments": {...}}`` are read too.

The object must start the output (after whitespace); anything else is plain text, and so is
any text after the object. An object whose closing ``]``/``}`` is missing at the very end of
the output still gives its complete calls.
"""

from __future__ import annotations

from hermes_async.tools.scan import NEED, read_string, skip_ws
from hermes_async.tools.streaming import DONE, FAIL, CallObject, StreamParser, ToolCallStream

_BARE_KEYS = ("name", "arguments", "id", "type")


class GenericStream(ToolCallStream):
    """Streaming parser of the generic JSON format."""

    _START, _OUTER, _ITEM, _FIRST, _OBJ, _NEXT, _CLOSE, _REST = range(8)

    def __init__(self) -> None:
        super().__init__()
        self._state = self._START
        self._obj: CallObject | None = None
        self._after_obj = self._NEXT  # where a call object leads: list, outer "}" or the end

    def _step(self) -> bool:
        buf, pos, state = self._buf, self._pos, self._state
        if state == self._REST:
            self._content(len(buf))
            return False
        if state == self._START:
            p = skip_ws(buf, pos)
            self._content(p)
            if p >= len(buf):
                return False
            if buf[p] == "{":
                self._open_block(p, p)
                self._state = self._OUTER
            else:
                self._state = self._REST
            return True
        if state == self._OUTER:
            return self._outer(buf, pos)
        if state == self._OBJ:
            assert self._obj is not None
            status = self._obj.step(buf, pos)
            self._pos = self._obj.pos
            if status == DONE:
                if self._after_obj == self._REST:
                    return self._close()
                self._state = self._after_obj
                return True
            return self._need_or_fail(status)
        p = skip_ws(buf, pos)
        if p >= len(buf):
            if self._final and state in (self._NEXT, self._CLOSE):
                self._pos = p
                return self._close()  # the output ended where the closers would be
            return self._need_or_fail(NEED)
        c = buf[p]
        if state in (self._ITEM, self._FIRST) and c == "{":
            self._object(p, bare=False, after=self._NEXT)
        elif state == self._NEXT and c in ",]":
            self._pos = p + 1
            self._state = self._ITEM if c == "," else self._CLOSE
        elif state == self._CLOSE and c == "}":
            self._pos = p + 1
            return self._close()
        else:
            return self._fail()
        return True

    def _outer(self, buf: str, pos: int) -> bool:
        """At the object's "{": its first key says which form it is."""
        p = skip_ws(buf, pos + 1)
        end, key = read_string(buf, p)
        if end < 0:
            return self._need_or_fail(end)
        if key in _BARE_KEYS:
            self._object(pos, bare=True, after=self._REST)
            return True
        if key not in ("tool_calls", "tool_call"):
            return self._fail()
        p = skip_ws(buf, end)
        if p >= len(buf):
            return self._need_or_fail(NEED)
        if buf[p] != ":":
            return self._fail()
        p = skip_ws(buf, p + 1)
        if p >= len(buf):
            return self._need_or_fail(NEED)
        if key == "tool_call":
            if buf[p] != "{":
                return self._fail()
            self._object(p, bare=False, after=self._CLOSE)
        elif buf[p] == "[":
            self._pos, self._state = p + 1, self._FIRST
        else:
            return self._fail()
        return True

    def _object(self, p: int, bare: bool, after: int) -> None:
        self._obj = CallObject(self, bare=bare)
        self._pos, self._state, self._after_obj = p, self._OBJ, after

    def _need_or_fail(self, status: int) -> bool:
        if status == FAIL or self._final:
            return self._fail()
        return False

    def _close(self) -> bool:
        self._close_block()
        self._state = self._REST
        return True

    def _fail(self) -> bool:
        self._fail_block()
        self._state = self._REST
        return True


def GenericParser() -> StreamParser:
    """Tool-call parser of the generic JSON format (``{"tool_calls": [...]}``)."""
    return StreamParser("generic", GenericStream)
