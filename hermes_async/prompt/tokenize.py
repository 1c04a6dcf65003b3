"""Protected tokenization: control tokens come only from the template.

Why the result equals ``apply_chat_template(..., tokenize=True)`` when no user string contains
a control-token string: user strings are marked before rendering (``marking``); a string that
needs no mark passes through unchanged, so when nothing was marked the rendered text *is* the
text ``apply_chat_template`` renders, and it is encoded in one call with normal special-token
parsing: identical to the oracle by construction. Otherwise the text is split at the
template's control tokens only; each run of text between two of them (template text and user
text together) is encoded with special-token parsing off and the control tokens are placed as
ids. For text without control-token strings both paths give the same ids (the tests check it).

Boundary merges: added tokens are hard boundaries (the text between two of them is
normalized, pre-tokenized and merged independently), but nothing else is. Cutting at the edge
of user content instead ("\n" + content starting with spaces or newlines, a word split across a
template literal) changes pre-tokenizer splits and BPE merges, so runs are never cut there.
Two context effects of a cut at a control token are reproduced: an added token's
``lstrip``/``rstrip`` eats neighbouring whitespace, and a ``Metaspace`` pre-tokenizer with
``prepend_scheme="first"`` adds its prefix only to the run at offset 0 of the whole text.

All encoding uses private clones of the backend tokenizer (transformers toggles the shared one's
``encode_special_tokens`` flag per call), so this object is safe to use from several threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from tokenizers import Tokenizer

from hermes_async.prompt.errors import ProtectedTokenizationError, TemplateConfigError
from hermes_async.prompt.marking import CLOSE, OPEN, Marker

logger = logging.getLogger(__name__)

#: How many cut points (latest template control tokens) an encoding remembers.
MAX_CUTS = 4
# Whitespace as the tokenizers crate sees it (Rust char::is_whitespace), for lstrip/rstrip tokens.
_WS = " \t\n\x0b\x0c\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008" \
      "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True, slots=True)
class ControlToken:
    """An added token that only the template may emit."""

    content: str
    id: int
    lstrip: bool = False
    rstrip: bool = False


class Encoded(NamedTuple):
    """Result of :meth:`ProtectedTokenizer.encode`.

    ``cuts`` holds ``(char offset in the marked text, token index)`` of the last
    :data:`MAX_CUTS` control tokens the template emitted, latest first: incremental assembly may
    reuse the ids before one of them.
    """

    ids: list[int]
    text: str
    cuts: tuple[tuple[int, int], ...]


def discover_control_tokens(tokenizer: Any, template_literal_text: str) -> tuple[ControlToken, ...]:
    """The control tokens of a tokenizer + template pair.

    Every special added token, plus the non-special added tokens that the template's literal text
    contains (like Qwen's ``<tool_call>``), except whitespace-only ones; when the tokenizer lists
    ``chat_control_tokens`` those are used instead of the template scan.
    """
    listed = getattr(tokenizer, "chat_control_tokens", None)
    out = []
    for tid, tok in sorted(tokenizer.added_tokens_decoder.items()):
        content = str(tok.content)
        if tok.special:
            pass
        elif listed is not None:
            if content not in listed:
                continue
        elif content.isspace() or content not in template_literal_text:
            continue
        out.append(ControlToken(content, int(tid), bool(tok.lstrip), bool(tok.rstrip)))
    for c in out:
        if OPEN in c.content or CLOSE in c.content:
            raise TemplateConfigError(f"control token {c.content!r} contains a reserved marker")
    return tuple(out)


def _walk_metaspace(node: Any, scheme: str) -> bool:
    """Set prepend_scheme on every Metaspace with scheme 'first'; True if one was found."""
    found = False
    if isinstance(node, dict):
        if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first":
            node["prepend_scheme"] = scheme
            found = True
        for value in node.values():
            found |= _walk_metaspace(value, scheme)
    elif isinstance(node, list):
        for value in node:
            found |= _walk_metaspace(value, scheme)
    return found


def _clone(spec: dict[str, Any], *, encode_special_tokens: bool) -> Tokenizer:
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = encode_special_tokens
    return tok


class ProtectedTokenizer:
    """Marks user strings, encodes rendered text with control tokens only from the template.

    ``allow_special_tokens_in_content=True`` restores plain behaviour: nothing is marked and a
    control-token string typed by a user becomes that control token (as ``apply_chat_template``).
    """

    def __init__(self, tokenizer: Any, controls: Iterable[ControlToken], *,
                 allow_special_tokens_in_content: bool = False) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TemplateConfigError("protected tokenization needs a fast (tokenizers) tokenizer")
        self.controls = tuple(controls)
        self.allow_special = allow_special_tokens_in_content
        self._spec_str = backend.to_str()
        self.fingerprint = hashlib.blake2b(self._spec_str.encode(), digest_size=8).hexdigest()
        self._plain = _clone(json.loads(self._spec_str), encode_special_tokens=False)
        self._by_content = {c.content: c for c in self.controls}
        self._by_id = {c.id: c for c in self.controls}
        self.control_ids = frozenset(self._by_id)
        self._protected: tuple[Tokenizer, Tokenizer] | None = None
        self._lock = threading.Lock()
        self.marker = Marker([c.content for c in self.controls], enabled=not self.allow_special)
        self.mark = self.marker.mark
        self.mark_tree = self.marker.mark_tree
        self.restore = self.marker.restore
        # A control token matched after normalization could be produced by a normalizer from
        # other text (e.g. NFKC of fullwidth forms): then never take the plain path.
        spec = json.loads(self._spec_str)
        self._plain_path_ok = spec.get("normalizer") is None or not any(
            e.get("normalized") for e in spec.get("added_tokens", [])
            if e.get("content") in self._by_content)
        unk = (spec.get("model") or {}).get("unk_token")
        self._may_emit = frozenset(c.id for c in self.controls if c.content == unk)

    # ---- encoding --------------------------------------------------------------------------
    def segments(self, marked: str) -> list[tuple[str, bool]]:
        """Real-text pieces of rendered ``marked`` text; ``True`` marks a template control token."""
        runs, controls = self.marker.parse(marked)
        out = [(runs[0], False)]
        for (content, _), run in zip(controls, runs[1:], strict=True):
            out += [(content, True), (run, False)]
        return [seg for seg in out if seg[0]]

    def encode(self, marked: str, *, at_text_start: bool = True, marked_inputs: bool = True,
               force_protected: bool = False) -> Encoded:
        """Token ids of rendered ``marked`` text (see the module docstring).

        ``at_text_start=False`` encodes a tail of a longer text; such a tail must start with a
        template control token. ``marked_inputs=False`` tells that no user string needed a
        mark. ``force_protected`` takes the run-by-run path even for text without markers
        (tests check that path against the oracle).
        """
        plain = self.allow_special or (
            self._plain_path_ok and not force_protected and not Marker.has_marks(marked))
        if plain:
            if marked_inputs:
                self.marker.check_escapes(marked)
            ids = self._plain.encode(marked, add_special_tokens=False).ids
            return Encoded(ids, marked, self._cuts(marked, ids))
        return self._encode_protected(marked, at_text_start)

    def _cuts(self, text: str, ids: list[int]) -> tuple[tuple[int, int], ...]:
        """Cut points of a plain-path encoding: every control token there is the template's."""
        control_ids, by_id = self.control_ids - self._may_emit, self._by_id
        cuts: list[tuple[int, int]] = []
        end = len(text)
        for idx in range(len(ids) - 1, -1, -1):
            if ids[idx] in control_ids:
                end = text.rfind(by_id[ids[idx]].content, 0, end)
                if end < 0:
                    break
                cuts.append((end, idx))
                if len(cuts) == MAX_CUTS:
                    break
        return tuple(cuts)

    def _protected_clones(self) -> tuple[Tokenizer, Tokenizer]:
        """(clone for the run at text offset 0, clone for every later run), special parsing off."""
        with self._lock:
            if self._protected is None:
                spec = json.loads(self._spec_str)
                for entry in spec.get("added_tokens", []):
                    if entry.get("content") in self._by_content:
                        entry["special"] = True
                first = _clone(spec, encode_special_tokens=True)
                later = first
                if _walk_metaspace(spec.get("pre_tokenizer"), "never"):
                    later = _clone(spec, encode_special_tokens=True)
                self._protected = (first, later)
            return self._protected

    def _encode_protected(self, marked: str, at_text_start: bool) -> Encoded:
        runs, found = self.marker.parse(marked)
        controls = [(self._by_content[content], pos) for content, pos in found]
        text_parts = [runs[0]]
        for (ctrl, _), run in zip(controls, runs[1:], strict=True):
            text_parts.append(ctrl.content)
            text_parts.append(run)
        to_encode = list(runs)
        for i, (ctrl, _) in enumerate(controls):
            if ctrl.lstrip:
                to_encode[i] = to_encode[i].rstrip(_WS)
            if ctrl.rstrip:
                to_encode[i + 1] = to_encode[i + 1].lstrip(_WS)
        first, later = self._protected_clones()
        run_ids: list[list[int]] = [[] for _ in to_encode]
        if to_encode[0]:
            run_ids[0] = (first if at_text_start else later).encode(
                to_encode[0], add_special_tokens=False).ids
        rest = [(i, s) for i, s in enumerate(to_encode) if i and s]
        if rest:
            for (i, _), enc in zip(rest, later.encode_batch([s for _, s in rest],
                                                            add_special_tokens=False), strict=True):
                run_ids[i] = enc.ids
        ids: list[int] = list(run_ids[0])
        cuts: list[tuple[int, int]] = []
        for (ctrl, char_pos), more in zip(controls, run_ids[1:], strict=True):
            cuts.append((char_pos, len(ids)))
            ids.append(ctrl.id)
            ids.extend(more)
        forbidden = self.control_ids - self._may_emit
        for chunk in run_ids:
            if not forbidden.isdisjoint(chunk):
                raise ProtectedTokenizationError(
                    "plain text was encoded into a control token; this tokenizer's vocabulary "
                    "can build a control token from ordinary text")
        return Encoded(ids, "".join(text_parts), tuple(reversed(cuts[-MAX_CUTS:])))
