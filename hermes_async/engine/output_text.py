"""One sequence's output text: incremental detokenization followed by stop strings.

The engine makes one :class:`OutputText` per generated sequence, calls :meth:`OutputText.append`
once per sampled token and :meth:`OutputText.finish` when the sequence ends for any other reason
than a stop string (EOS, a stop token id, ``max_tokens``, abort). Each call returns a
:class:`Delta`: the new text to stream, and whether a stop string ended the sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from hermes_async.engine.detokenizer import IncrementalDetokenizer
from hermes_async.engine.stop_strings import StopStringMatcher


class Delta(NamedTuple):
    """What one step adds to a sequence's output text."""

    text: str
    """New text to stream (may be ""): final, valid text that is no part of a stop string."""
    stopped: bool = False
    """True when a stop string matched: the sequence is finished (finish reason "stop")."""
    stop_reason: str | None = None
    """The stop string that matched, when ``stopped`` (vLLM reports it as ``stop_reason``)."""


_NOTHING = Delta("")  # immutable: the common "no new text yet" answer


class OutputText:
    """Text of one generated sequence, built token by token.

    **Contract:** the concatenation of every :attr:`Delta.text` returned (by :meth:`append`
    and :meth:`finish`) is :attr:`text`, and equals the incremental detokenizer's full text
    (see :class:`IncrementalDetokenizer`) cut before the earliest-starting stop string (see
    :class:`StopStringMatcher`); without a match, all of it. Once a delta has ``stopped`` set
    or :meth:`finish` has been called, :attr:`finished` is True and :meth:`append` raises.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens)
        self._stops = StopStringMatcher(stop)
        self._pieces: list[str] = []
        self._finished = False
        self._stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text emitted so far. Joined when read and cached: appending stays O(1) per
        token, and reading it only at the end costs one join."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def finished(self) -> bool:
        """True once a stop string matched or :meth:`finish` was called."""
        return self._finished

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the text, or None."""
        return self._stop_reason

    @property
    def num_tokens(self) -> int:
        """Tokens appended so far."""
        return self._detok.num_tokens

    def _emit(self, text: str, stopped: bool, stop: str | None) -> Delta:
        if text:
            self._pieces.append(text)
        if stopped:
            self._finished = True
            self._stop_reason = stop
            return Delta(text, True, stop)
        return Delta(text)

    def append(self, token_id: int) -> Delta:
        """Add one generated token. When the delta says ``stopped``, the sequence must end:
        the stop string (and anything after it) is not part of the output."""
        if self._finished:
            raise RuntimeError("OutputText.append() after the sequence finished")
        new = self._detok.add(token_id)
        if not new:
            return _NOTHING
        text, stopped, stop = self._stops.feed(new)
        return self._emit(text, stopped, stop)

    def finish(self) -> Delta:
        """The sequence ends (EOS, stop token, length, abort): release all held-back text.
        A stop string can still match in it (then ``stopped`` is True). Idempotent."""
        if self._finished:
            return Delta("", self._stop_reason is not None, self._stop_reason)
        tail = self._detok.flush()
        check = self._stops.feed(tail) if tail else None
        if check is None or not check.stopped:
            rest = self._stops.flush()
            text = (check.text if check else "") + rest.text
            check = rest._replace(text=text)
        delta = self._emit(check.text, check.stopped, check.stop)
        self._finished = True
        return delta


def output_text_factory(tokenizer: Any) -> Callable[[list[int], tuple[str, ...]], OutputText]:
    """Per-sequence :class:`OutputText` over ``tokenizer`` (the engine's default)."""

    def make(prompt_ids: list[int], stops: tuple[str, ...]) -> OutputText:
        return OutputText(tokenizer, prompt_ids, stops)

    return make
