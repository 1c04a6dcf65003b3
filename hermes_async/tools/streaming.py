"""The streaming machinery every format shares: :class:`ToolCallStream` (buffer, plain text,
calls and their events) and :class:`CallObject`, the incremental reader of one
``{"name": ..., "arguments": {...}}`` call object.

A format's stream is a state machine over the text seen so far: its ``_step`` makes one move
(or says it needs more text). Text is held back only while it could still be call markup; a
call's ``ToolCallStart`` goes out as soon as its name is known and its arguments begin, and
its arguments text follows as it arrives. Calls belong to a *block* (one ``<tool_call>`` tag,
one ``[TOOL_CALLS]`` array, the generic JSON object, ...): when a block turns out malformed,
its text is plain text after all (its first character is emitted and scanning resumes right
after it), and its calls are dropped from :meth:`ToolCallStream.result` (their events, already
sent, stay sent). ``parse`` is this same machine run over the whole text, so a stream and
``parse`` always agree on the plain text, however the output was split.

Whitespace: plain text that is whitespace only so far is held until non-whitespace plain text
follows; at the end it is dropped when there were calls (``content`` is then None) and emitted
otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Protocol

from hermes_async.tools.scan import (
    FAIL,
    NEED,
    JsonValueScanner,
    held_suffix,
    read_string,
    skip_ws,
)
from hermes_async.tools.types import (
    ArgumentsDelta,
    ContentDelta,
    ParsedOutput,
    StreamEvent,
    ToolCall,
    ToolCallStart,
    new_call_id,
)

DONE = -3  # a CallObject is complete


class StartedCall:
    """A call whose ToolCallStart went out: its index, id, name and arguments text so far."""

    __slots__ = ("index", "id", "name", "args")

    def __init__(self, index: int, call_id: str, name: str) -> None:
        self.index = index
        self.id = call_id
        self.name = name
        self.args: list[str] = []


class ToolCallStream:
    """Incremental tool-call parser of one choice's output (one instance per choice).

    :meth:`feed` takes each new piece of text and returns the events it decides
    (:class:`ContentDelta`, :class:`ToolCallStart`, :class:`ArgumentsDelta`); :meth:`finish`
    marks the end of the output and flushes what was held back. :meth:`result` is then what
    ``parse`` returns for the whole text.
    """

    new_id: Callable[[], str] = staticmethod(new_call_id)

    def __init__(self) -> None:
        self._buf = ""
        self._pos = 0  # next unread index of _buf
        self._block_start = 0  # where the open block began in _buf
        self._final = False
        self._finished = False
        self._out: list[StreamEvent] = []
        self._text: list[str] = []  # plain text emitted
        self._ws = ""  # leading whitespace-only plain text held back
        self._calls: list[ToolCall] = []  # calls of completed blocks
        self._block: list[StartedCall] = []  # calls of the open block
        self._count = 0  # calls started (their indices)

    # -- public -------------------------------------------------------------------------------

    def feed(self, delta: str) -> list[StreamEvent]:
        """Take the next piece of output text; return the events now decided."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if delta:
            self._buf += delta
            self._run()
        return self._take()

    def finish(self) -> list[StreamEvent]:
        """The output ended: decide and return everything still held back."""
        if not self._finished:
            self._final = True
            self._run()
            self._finished = True
            if self._ws and not self._calls:
                self._put_text(self._ws)
            self._ws = ""
        return self._take()

    def result(self) -> ParsedOutput:
        """The whole output as ``parse`` reads it (meaningful after :meth:`finish`)."""
        text = "".join(self._text)
        if self._calls and not text.strip():
            return ParsedOutput(None, tuple(self._calls))
        return ParsedOutput(text, tuple(self._calls))

    # -- for the formats ---------------------------------------------------------------------

    def _step(self) -> bool:
        """One move of the format's state machine; False when it needs more text (never False
        with text left once ``_final`` is set, except after consuming everything)."""
        raise NotImplementedError

    def _run(self) -> None:
        while self._step():
            pass
        keep = min(self._pos, self._block_start)
        if keep > 4096:  # drop what is decided, so the buffer holds about one block
            self._buf = self._buf[keep:]
            self._pos -= keep
            self._block_start -= keep

    def _content(self, end: int) -> None:
        """``_buf[_pos:end]`` is plain text."""
        if end > self._pos:
            text = self._buf[self._pos:end]
            self._pos = end
            if not self._text and not text.strip():  # still whitespace only
                self._ws += text
                return
            if self._ws:
                text = self._ws + text
                self._ws = ""
            self._put_text(text)
        self._block_start = self._pos

    def _put_text(self, text: str) -> None:
        self._text.append(text)
        if self._out and isinstance(self._out[-1], ContentDelta):
            self._out[-1] = ContentDelta(self._out[-1].text + text)
        else:
            self._out.append(ContentDelta(text))

    def _seek_block(self, marker: str) -> bool:
        """In plain text: open a block at the next ``marker`` (True), or emit the plain text
        up to what could still be the start of one and wait for more (False)."""
        k = self._buf.find(marker, self._pos)
        if k < 0:
            held = 0 if self._final else held_suffix(self._buf, self._pos, marker)
            self._content(len(self._buf) - held)
            return False
        self._open_block(k, k + len(marker))
        return True

    def _open_block(self, start: int, after: int) -> None:
        """A block begins at ``start`` (plain text before it is emitted); read on at ``after``."""
        self._content(start)
        self._block_start = start
        self._pos = after

    def _start_call(self, name: str, call_id: str | None = None) -> StartedCall:
        call = StartedCall(self._count, call_id or self.new_id(), name)
        self._count += 1
        self._block.append(call)
        self._out.append(ToolCallStart(call.index, call.id, name))
        return call

    def _args(self, call: StartedCall, text: str) -> None:
        if not text:
            return
        call.args.append(text)
        last = self._out[-1] if self._out else None
        if isinstance(last, ArgumentsDelta) and last.index == call.index:
            self._out[-1] = ArgumentsDelta(call.index, last.text + text)
        else:
            self._out.append(ArgumentsDelta(call.index, text))

    def _close_block(self) -> None:
        """The open block is well formed: its calls are final."""
        self._calls.extend(ToolCall(c.id, c.name, "".join(c.args)) for c in self._block)
        self._block = []
        self._block_start = self._pos

    def _fail_block(self) -> None:
        """The open block is malformed: its first character is plain text; resume after it."""
        self._block = []
        self._pos = self._block_start
        self._content(self._pos + 1)

    def _take(self) -> list[StreamEvent]:
        out, self._out = self._out, []
        return out


def parse_whole(stream: ToolCallStream, text: str) -> ParsedOutput:
    """Run ``stream`` over the whole of ``text`` (what every parser's ``parse`` does)."""
    stream.feed(text)
    stream.finish()
    return stream.result()


class StreamParser:
    """A :class:`ToolCallParser` over a format's stream class: ``parse`` is that stream run
    over the whole text, ``stream`` a fresh one per choice."""

    def __init__(self, name: str, stream_type: Callable[[], ToolCallStream]) -> None:
        self.name = name
        self._stream_type = stream_type

    def parse(self, text: str) -> ParsedOutput:
        """Split a whole output into plain text and calls."""
        return parse_whole(self.stream(), text)

    def stream(self) -> ToolCallStream:
        """A fresh streaming parser (one per choice)."""
        return self._stream_type()


class CallObject:
    """Reads one call object ``{"name": ..., "arguments": {...}}`` incrementally.

    Keys may come in any order. ``args_keys`` name the arguments (``arguments``, or
    ``parameters`` for Llama); their value is an object, or a string holding an object's JSON
    (then that inner text is the arguments). ``id`` is taken when ``model_ids`` (Mistral) and it
    comes before the arguments. ``bare``: the object stands alone (generic, Llama), so it must
    have its arguments and no keys but name, arguments, ``id`` and ``type``: anything else
    means it is not a call. The call starts (its event is sent) once the name is known and the
    arguments begin; without arguments (allowed unless ``bare``) they are ``{}``.

    :meth:`step` reads on from a position and returns NEED (more text is needed; ``pos`` says
    where to read on), FAIL (not a call) or DONE (``pos`` is the index after the ``}``).
    """

    __slots__ = ("_stream", "_args_keys", "_bare", "_model_ids", "_state", "_key", "_scanner",
                 "_value", "_string_args", "_args", "_name", "_id", "_call", "pos")

    _OPEN, _KEY, _COLON, _VALUE, _ARGS, _SKIP, _AFTER = range(7)

    def __init__(self, stream: ToolCallStream, args_keys: tuple[str, ...] = ("arguments",),
                 bare: bool = False, model_ids: bool = False) -> None:
        self._stream = stream
        self._args_keys = args_keys
        self._bare = bare
        self._model_ids = model_ids
        self._state = self._OPEN
        self._key = ""
        self._scanner = JsonValueScanner()
        self._value: list[str] = []  # the arguments value's text read so far
        self._string_args = False
        self._args: str | None = None  # the arguments text, once read and valid
        self._name: str | None = None
        self._id: str | None = None
        self._call: StartedCall | None = None
        self.pos = 0

    def _commit(self) -> None:
        if self._call is None and self._name is not None:
            self._call = self._stream._start_call(self._name, self._id)
            if self._args is not None:
                self._stream._args(self._call, self._args)

    def step(self, buf: str, pos: int) -> int:
        """Read on from ``pos``; NEED, FAIL or DONE (see the class docstring)."""
        while True:
            state = self._state
            if state == self._ARGS or state == self._SKIP:
                start, pos = pos, self._scanner.scan(buf, pos)
                self.pos = pos
                if self._scanner.failed:
                    return FAIL
                if state == self._ARGS:
                    piece = buf[start:pos]
                    self._value.append(piece)
                    if self._call is not None and not self._string_args:
                        self._stream._args(self._call, piece)
                if not self._scanner.done:
                    return NEED
                if state == self._ARGS and not self._end_args():
                    return FAIL
                self._state = self._AFTER
                continue
            pos = skip_ws(buf, pos)
            self.pos = pos
            if pos >= len(buf):
                return NEED
            c = buf[pos]
            if state == self._OPEN:
                if c != "{":
                    return FAIL
                pos += 1
                self._state = self._KEY
            elif state == self._KEY:
                end, key = read_string(buf, pos)
                if end < 0:
                    return end
                if self._bare and key not in ("name", "id", "type") + self._args_keys:
                    return FAIL
                self._key = key
                pos = end
                self._state = self._COLON
            elif state == self._COLON:
                if c != ":":
                    return FAIL
                pos += 1
                self._state = self._VALUE
            elif state == self._VALUE:
                pos = self._value_start(buf, pos, c)
                if pos < 0:
                    return pos
            else:  # _AFTER a value
                if c == "}":
                    self.pos = pos + 1
                    return self._close()
                if c != ",":
                    return FAIL
                pos += 1
                self._state = self._KEY

    def _value_start(self, buf: str, pos: int, c: str) -> int:
        key = self._key
        if key in self._args_keys and self._args is None and not self._value:
            if c not in '{"':
                return FAIL
            self._string_args = c == '"'
            self._scanner = JsonValueScanner()
            self._commit()
            self._state = self._ARGS
            return pos
        if key == "name" and self._name is None or (
                key == "id" and self._model_ids and c == '"' and self._call is None):
            end, value = read_string(buf, pos)
            if end < 0:
                return end
            if key == "id":
                self._id = value or None
            elif not value:
                return FAIL
            else:
                self._name = value
                if self._args is not None:
                    self._commit()
            self._state = self._AFTER
            return end
        self._scanner = JsonValueScanner()
        self._state = self._SKIP
        return pos

    def _end_args(self) -> bool:
        text = "".join(self._value)
        try:
            value = json.loads(text)
            if self._string_args:
                if not isinstance(value, str) or not isinstance(json.loads(value), dict):
                    return False
                text = value
            elif not isinstance(value, dict):
                return False
        except (ValueError, RecursionError):
            return False
        self._args = text
        if self._call is not None and self._string_args:
            self._stream._args(self._call, text)
        return True

    def _close(self) -> int:
        if self._name is None or (self._args is None and self._bare):
            return FAIL
        if self._args is None:
            self._args = "{}"  # no arguments given (so the call has not started yet)
        self._commit()
        return DONE


class ToolCallParser(Protocol):
    """A tool-call output format: ``name`` (a key of ``PARSERS``), whole-output :meth:`parse`
    and a fresh :meth:`stream` per choice."""

    name: str

    def parse(self, text: str) -> ParsedOutput:
        """Split a whole output into plain text and calls."""
        ...

    def stream(self) -> ToolCallStream:
        """A fresh streaming parser (one per choice)."""
        ...
