"""The Hermes format (Hermes 2 Pro, Qwen 2.5, Qwen 3): plain text, then one or more
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks.

A block whose closing tag is missing at the very end of the output (the model stopped right
after the call object) is still a call; any other malformed block is plain text.
"""

from __future__ import annotations

from hermes_async.tools.scan import NEED, match_literal, skip_ws
from hermes_async.tools.streaming import DONE, FAIL, CallObject, StreamParser, ToolCallStream

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesStream(ToolCallStream):
    """Streaming parser of the Hermes format."""

    _TEXT, _CALL, _CLOSE = range(3)

    def __init__(self) -> None:
        super().__init__()
        self._state = self._TEXT
        self._obj: CallObject | None = None

    def _step(self) -> bool:
        buf, pos = self._buf, self._pos
        if self._state == self._TEXT:
            if not self._seek_block(OPEN):
                return False
            self._obj = CallObject(self)
            self._state = self._CALL
            return True
        if self._state == self._CALL:
            assert self._obj is not None
            status = self._obj.step(buf, pos)
            self._pos = self._obj.pos
            if status == DONE:
                self._state = self._CLOSE
                return True
            if status == FAIL or self._final:
                return self._fail()
            return False
        end = match_literal(buf, skip_ws(buf, pos), CLOSE)
        if end == NEED and self._final:
            end = len(buf)  # the output ended where the closing tag would be
        if end == NEED:
            return False
        if end == FAIL:
            return self._fail()
        self._pos = end
        self._close_block()
        self._state = self._TEXT
        return True

    def _fail(self) -> bool:
        self._fail_block()
        self._state = self._TEXT
        return True


def HermesParser() -> StreamParser:
    """Tool-call parser of the Hermes format (``<tool_call>`` blocks)."""
    return StreamParser("hermes", HermesStream)
