"""Marking user-supplied strings so rendered text tells user text from template control tokens.

Before rendering, :meth:`Marker.mark` wraps, in every user-supplied string, each control-token
string, each stray marker character, and a fragment at the string's start or end that could
join the template's neighbouring text into a control token (a proper suffix / prefix of one),
between ``OPEN`` and ``CLOSE`` (two private-use characters). After rendering,
:meth:`Marker.parse` splits the text at the control tokens outside markers, which only the
template can have written, and :meth:`Marker.restore` gives the real text.

A template that splits user text (like Qwen3's ``content.split('</think>')``) can leave a lone
marker; it is dropped, as transformers' ``sanitize_control_tokens`` does. A template that
JSON-escapes user text with ``ensure_ascii`` would turn the markers into ``\\udb80\\udc01``
while leaving the control-token string raw: that is refused (HTTP 400) rather than encoded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hermes_async.prompt.errors import TemplateRenderError

#: Private-use markers (plane 15) around user text that must not become control tokens.
OPEN = "\U000f0001"
CLOSE = "\U000f0002"
_ESCAPED = "\\udb80\\udc0"  # OPEN / CLOSE after json.dumps(..., ensure_ascii=True)


class Marker:
    """Marks, parses and restores text for one set of control-token strings.

    With ``enabled=False`` (``allow_special_tokens_in_content``) nothing is marked and every
    control-token string in the rendered text counts as a control token.
    """

    def __init__(self, controls: Sequence[str], *, enabled: bool = True) -> None:
        self.enabled = enabled
        strings = sorted(set(controls), key=len, reverse=True)
        alt = "|".join(map(re.escape, strings)) or "(?!)"
        wrapped = f"{OPEN}([^{OPEN}{CLOSE}]+|[{OPEN}{CLOSE}]){CLOSE}"
        self._mark_re = re.compile(f"{alt}|[{OPEN}{CLOSE}]")
        # group 1: wrapped user text; group 2: a template control token; else a lone marker
        self._parse_re = re.compile(f"{wrapped}|({alt})|[{OPEN}{CLOSE}]")
        self._plain_re = re.compile(f"(?!)()|({alt})")  # same groups; group 1 never matches
        self._restore_re = re.compile(f"{wrapped}|[{OPEN}{CLOSE}]")
        self._triggers = frozenset(s[0] for s in strings) | {OPEN, CLOSE}
        self._last_chars = frozenset(s[-1] for s in strings)
        self._prefixes = {s[:i] for s in strings for i in range(1, len(s))}
        self._suffixes = {s[i:] for s in strings for i in range(1, len(s))}
        self._max_partial = max((len(s) - 1 for s in strings), default=0)

    def _edges(self, s: str) -> tuple[int, int]:
        """Lengths of the longest start fragment (a proper suffix of a control token) and of the
        end fragment (a proper prefix of one) of ``s``; 0 when none."""
        if not self._max_partial:
            return 0, 0
        head = s[: self._max_partial]
        start = 0
        for i, ch in enumerate(head):
            if ch in self._last_chars and head[: i + 1] in self._suffixes:
                start = i + 1
        tail = s[-self._max_partial:]
        end = 0
        for i, ch in enumerate(tail):
            if ch in self._triggers and tail[i:] in self._prefixes:
                end = len(tail) - i
                break
        return start, end

    def mark(self, s: str) -> str:
        """``s`` with its risky parts wrapped; ``s`` itself (the same object) when it has none,
        which is the common case and keeps the rendered text identical to the model's."""
        if not self.enabled or not s:
            return s
        has_trigger = any(ch in s for ch in self._triggers)
        start, end = self._edges(s)
        if not has_trigger and not start and not end:
            return s
        if start + end > len(s):
            end = 0
        body = s[start:len(s) - end]
        if has_trigger:
            body = self._mark_re.sub(lambda m: OPEN + m.group(0) + CLOSE, body)
        head = OPEN + s[:start] + CLOSE if start else ""
        tail = OPEN + s[len(s) - end:] + CLOSE if end else ""
        return head + body + tail

    def mark_tree(self, obj: Any) -> Any:
        """:meth:`mark` applied to every string value in nested dicts/lists (keys untouched)."""
        if isinstance(obj, str):
            return self.mark(obj)
        if isinstance(obj, Mapping):
            return {k: self.mark_tree(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.mark_tree(v) for v in obj]
        return obj

    def check_escapes(self, marked: str) -> None:
        """Refuse rendered text in which the template JSON-escaped the markers (call it when
        some user string was marked): the control-token strings there are raw now."""
        if self.enabled and _ESCAPED in marked:
            raise TemplateRenderError(
                "the chat template JSON-escaped user text that contains control-token strings; "
                "it cannot be protected", param="messages")

    @staticmethod
    def has_marks(text: str) -> bool:
        """Whether rendered text holds any marker (else it is exactly the real text)."""
        return OPEN in text or CLOSE in text

    def restore(self, marked: str) -> str:
        """The real text: markers removed, wrapped user text kept."""
        if not self.enabled or not self.has_marks(marked):
            return marked
        return self._restore_re.sub(lambda m: m.group(1) or "", marked)

    def parse(self, marked: str) -> tuple[list[str], list[tuple[str, int]]]:
        """Split rendered text at the template's control tokens.

        Returns ``(runs, controls)``: ``runs[i]`` is the real text before ``controls[i]``
        (``len(runs) == len(controls) + 1``), each control as ``(content, offset in marked)``.
        """
        runs: list[str] = []
        controls: list[tuple[str, int]] = []
        buf: list[str] = []
        pos = 0
        for m in (self._parse_re if self.enabled else self._plain_re).finditer(marked):
            buf.append(marked[pos:m.start()])
            if m.group(1) is not None:
                buf.append(m.group(1))
            elif m.group(2) is not None:
                runs.append("".join(buf))
                buf = []
                controls.append((m.group(2), m.start()))
            pos = m.end()  # a lone marker is dropped
        buf.append(marked[pos:])
        runs.append("".join(buf))
        return runs, controls
