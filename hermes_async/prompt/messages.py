"""The message model: OpenAI chat messages -> validated, role-normalized :class:`Message` objects.

Accepted shapes (OpenAI Chat Completions):

- ``content``: a string, or a non-empty list of text parts ``{"type": "text", "text": str}``
  joined with ``"\\n"`` (as vLLM does); ``null``/absent only on an assistant message that
  carries ``tool_calls`` (or the legacy ``function_call``), where it becomes ``""``.
- ``name``: optional string.
- assistant ``tool_calls``: ``[{"id": str, "type": "function", "function": {"name": str,
  "arguments": str | object}}]``; legacy ``function_call: {"name", "arguments"}`` is read as one
  tool call.
- ``tool`` messages carry ``tool_call_id`` and legacy ``function`` messages ``name``; both become
  role ``tool`` (never ``user``), the ``function`` message keeping its ``name``. As vLLM does, a
  ``tool`` message without ``tool_call_id`` (sent by many clients and older frameworks) is
  accepted and passed on without one, and so is a ``function`` message without ``name``; with
  strict roles (``AssemblerOptions.strict_roles``, ``hermes-async render --strict-roles``) both
  are refused as OpenAI's schema does (``param`` ``messages[i].tool_call_id`` / ``.name``).

Anything else raises :class:`~hermes_async.prompt.errors.MessageValidationError` whose
``param`` names the field (validation lives in :mod:`hermes_async.prompt.parse`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple

from hermes_async.prompt.roles import ROLE_CODES, Role

_DIGEST_SIZE = 16


class ToolCall(NamedTuple):
    """One function call requested by an assistant message (``arguments`` as the client sent it)."""

    name: str
    arguments: str | dict[str, Any]
    id: str | None = None

    def to_template_dict(self) -> dict[str, Any]:
        """The OpenAI shape templates expect; JSON-object argument strings are parsed to dicts
        (as vLLM does), since most chat templates apply ``tojson`` to them."""
        args: Any = self.arguments
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                args = parsed
        fn = {"name": self.name, "arguments": args}
        out: dict[str, Any] = {"type": "function", "function": fn}
        if self.id is not None:
            out["id"] = self.id
        return out


class Message(NamedTuple):
    """A validated chat message with a canonical role (``Message(role, content, name)``).

    A NamedTuple (immutable, cheap to build: validation is on the exact-hit path).
    """

    role: Role
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    raw_role: str = ""

    def to_template_dict(self) -> dict[str, Any]:
        """The dict handed to a chat template: ``role`` and ``content``, other keys when set."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [tc.to_template_dict() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


class Conversation:
    """Validated messages plus what the assembly cache needs: role codes and content digests.

    Each message is serialized unambiguously (role code, length-prefixed content, and a JSON
    blob of name / tool calls / tool_call_id when present); :meth:`prefix_digest` is the blake2b
    digest of the first ``n`` serializations, so every message prefix has its own digest and
    ``prefix_digest(len(messages))`` is the whole conversation's. Plain ``{"role", "content"}``
    messages become :class:`Message` objects only when ``messages`` is first read (an exact
    cache hit never needs them).
    """

    __slots__ = ("_items", "role_codes", "_chunks", "_full", "_prefixes", "_messages")

    def __init__(self, items: list[Message | tuple[str, str]], role_codes: str,
                 chunks: list[bytes]) -> None:
        self._items = items
        self.role_codes = role_codes
        self._chunks = chunks  # two per message: header, body
        self._full = hashlib.blake2b(b"".join(chunks), digest_size=_DIGEST_SIZE).digest()
        self._prefixes: list[bytes] | None = None
        self._messages: tuple[Message, ...] | None = None

    @property
    def messages(self) -> tuple[Message, ...]:
        """The validated, role-normalized messages."""
        if self._messages is None:
            self._messages = tuple(
                Message(m[0], m[1], None, (), None, m[0]) if type(m) is tuple else m  # type: ignore[misc]
                for m in self._items)
        return self._messages

    def __len__(self) -> int:
        return len(self._items)

    def prefix_digest(self, n: int) -> bytes:
        """blake2b digest of the first ``n`` messages (order, roles and every field)."""
        if n == len(self._items):
            return self._full
        if self._prefixes is None:
            h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
            out = [h.digest()]
            chunks = self._chunks
            for i in range(0, len(chunks), 2):
                h.update(chunks[i])
                h.update(chunks[i + 1])
                out.append(h.copy().digest())
            self._prefixes = out
        return self._prefixes[n]

    def role_counts(self) -> dict[str, int]:
        """Number of messages per canonical role."""
        codes = self.role_codes
        return {role: codes.count(code) for role, code in ROLE_CODES.items() if code in codes}
