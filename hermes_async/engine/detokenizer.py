"""Incremental detokenization: one sequence's token ids in, final text out, one token at a time.

The technique: keep a short *window* of the most recent token ids that starts at a clean point
(a token boundary where everything before it has been decoded into whole characters), decode
only that window after each new token, and emit the part of its text that lies beyond what was
already emitted. Decoding a window instead of the single new token gets right what a token does
not know about itself: a SentencePiece ``▁word`` is ``" word"`` after other text but ``"word"`` at
the start of a decode, and a byte-level or byte-fallback token may hold only part of a multi-byte
UTF-8 character. Text the decoder renders as a trailing U+FFFD (an incomplete character) is held
back until the character completes, and released by :meth:`IncrementalDetokenizer.flush` if it
never does. The window slides forward to a clean point whenever it grows past a few tokens, so
each step decodes a few tokens whatever the length of the output: the cost per token is O(1),
never a decode of the whole output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT_TOKENS = 4
"""How many trailing prompt tokens seed the window (leading-space context for the first token)."""
SLIDE_AT_TOKENS = 6
"""The window restarts (at its latest clean point) once it is this long: a longer window costs
a little more per decode, a shorter one more restarts (one extra decode each)."""
MAX_HELD_TOKENS = 64
"""Bound on held-back tokens: a UTF-8 character spans at most 4 tokens, so a text that still
ends in U+FFFD after this many is garbage (say, a stream of lone continuation bytes); it is then
emitted as rendered and the window restarts empty, so even such a stream costs O(1) per token."""
MAX_PROMPT_CONTEXT_TOKENS = 32
"""How far back into the prompt to look for a clean start of that context."""

Decode = Callable[[list[int]], str]


def make_decode(tokenizer: Any, skip_special_tokens: bool) -> tuple[Decode, frozenset[int]]:
    """``(decode, special_ids)`` for ``tokenizer``.

    ``tokenizer`` is a transformers tokenizer or a ``tokenizers.Tokenizer``. When a Rust
    ``tokenizers`` backend is present its ``decode`` is called directly (the transformers wrapper
    costs several times more per call and adds nothing once clean-up is off); otherwise the
    tokenizer's own ``decode``. ``clean_up_tokenization_spaces`` is never applied: it rewrites text
    across token boundaries, cannot be done incrementally, and transformers itself skips it for BPE.
    ``special_ids`` are the ids such a decode drops when ``skip_special_tokens`` is true.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "get_added_tokens_decoder"):
        backend = tokenizer  # a bare tokenizers.Tokenizer
    if backend is not None:
        specials = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )

        def decode(ids: list[int]) -> str:
            return backend.decode(ids, skip_special_tokens=skip_special_tokens)

        return decode, specials

    slow_specials = frozenset(getattr(tokenizer, "all_special_ids", ()))

    def slow_decode(ids: list[int]) -> str:
        return tokenizer.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    return slow_decode, slow_specials


class IncrementalDetokenizer:
    """Turns one sequence's generated token ids into text, token by token.

    **Contract** (for any token ids, including ones that split multi-byte characters):

    - ``"".join(add(t) for t in ids) + flush()`` equals ``tokenizer.decode(ids,
      skip_special_tokens=...)`` when the prompt gives no context (empty prompt, or a prompt whose
      tail does not decode to whole characters), and otherwise the text that ``ids`` add after the
      prompt's tail: ``decode(tail + ids)[len(decode(tail)):]``. With a prompt that text keeps the
      leading space a SentencePiece tokenizer gives the first generated word.
    - :meth:`add` never returns a string ending in an incomplete character: the U+FFFD a decoder
      renders for a partial UTF-8 sequence at the end is held back; a U+FFFD inside the text
      (bytes that can never form a character) is final and is emitted, as the full decode has it.
    - Special tokens are dropped when ``skip_special_tokens`` (the default), so ``<|im_end|>``
      and friends never show; with ``False`` they appear as their text.
    - Cost per token: one decode of a window of a few tokens (``SLIDE_AT_TOKENS``; one more
      decode when it slides, every few tokens).
      Tokenizers whose decoder turns a whole run of invalid byte-fallback tokens into U+FFFD
      (SentencePiece ``ByteFallback``) match the full decode exactly whenever the output is valid
      UTF-8; on invalid bytes they may differ in how many U+FFFD stand for the bad run.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._decode, specials = make_decode(tokenizer, skip_special_tokens)
        # Skipped specials decode to nothing: keeping them out of the window means a window
        # never starts with one (which would lose the context a leading space depends on).
        self._skipped: frozenset[int] = specials if skip_special_tokens else frozenset()
        self._finished = False
        # Window state: ``_ids`` is the window (its first id is at a clean point),
        # ``_done`` how many characters of ``decode(_ids)`` are already emitted (or are context),
        # ``_clean`` the index in ``_ids`` of the latest clean point (all text before it final).
        self._ids: list[int] = []
        self._done = 0
        self._clean = 0
        self.num_tokens = 0
        """Tokens added so far (skipped special tokens included)."""
        self._seed_context(prompt_token_ids)

    def _seed_context(self, prompt_token_ids: Sequence[int]) -> None:
        """Start the window with the prompt's last few tokens when they decode to non-empty
        text that ends in a whole character; step further back (a run of byte-fallback tokens
        cut mid-character decodes to U+FFFD throughout) up to a limit; else no context."""
        tail = [t for t in prompt_token_ids[-4 * MAX_PROMPT_CONTEXT_TOKENS :]
                if t not in self._skipped][-MAX_PROMPT_CONTEXT_TOKENS:]
        for n in range(min(PROMPT_CONTEXT_TOKENS, len(tail)), len(tail) + 1):
            context = tail[len(tail) - n :]
            text = self._decode(context)
            if text and not text.endswith(REPLACEMENT_CHAR):
                self._ids, self._done, self._clean = context, len(text), n
                return

    @property
    def finished(self) -> bool:
        """True after :meth:`flush`."""
        return self._finished

    def add(self, token_id: int) -> str:
        """Take one generated token; return the text that became final with it (often "").

        Raises ``RuntimeError`` after :meth:`flush`.
        """
        if self._finished:
            raise RuntimeError("IncrementalDetokenizer.add() after flush()")
        self.num_tokens += 1
        if token_id in self._skipped:
            return ""
        ids = self._ids
        ids.append(token_id)
        text = self._decode(ids)
        complete = not text.endswith(REPLACEMENT_CHAR)
        if not complete and len(ids) - self._clean > MAX_HELD_TOKENS:
            out = text[self._done :]
            self._ids, self._done, self._clean = [], 0, 0
            return out
        stable = text if complete else text.rstrip(REPLACEMENT_CHAR)
        out = ""
        if len(stable) > self._done:
            out = stable[self._done :]
            self._done = len(stable)
        if complete:
            if len(ids) >= SLIDE_AT_TOKENS:
                self._slide()
            self._clean = len(self._ids)
        return out

    def _slide(self) -> None:
        """Restart the window at its latest clean point before the newest token(s), the
        context for what comes next. The window is kept when that context decodes to nothing,
        since a decoder that strips a leading space (SentencePiece) would then strip it from
        the next token's text instead."""
        if self._clean > 0:
            context = self._ids[self._clean :]
            text = self._decode(context)
            if text:
                self._ids, self._done = context, len(text)

    def flush(self) -> str:
        """Finish the sequence; return the text still held back (a dangling incomplete
        character comes out as the decoder renders it, U+FFFD). Idempotent: later calls
        return ""."""
        if self._finished:
            return ""
        self._finished = True
        if not self._ids:
            return ""
        text = self._decode(self._ids)
        out = text[self._done :]
        self._done = len(text)
        return out
