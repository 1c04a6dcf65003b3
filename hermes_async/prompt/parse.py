"""Validation of OpenAI chat messages into :class:`~hermes_async.prompt.messages.Message` objects.

See :mod:`hermes_async.prompt.messages` for the accepted shapes. Every malformed shape raises
:class:`MessageValidationError` whose ``param`` names the field (``messages[2].content``,
``messages[1].tool_calls[0].function.name``); the fast path for plain ``{"role", "content"}``
messages keeps an exact cache hit cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from hermes_async.prompt.errors import MessageValidationError
from hermes_async.prompt.messages import Conversation, Message, ToolCall
from hermes_async.prompt.roles import ROLE_CODES, RoleNormalizer

_ROLE_BYTES = {role: code.encode() for role, code in ROLE_CODES.items()}


def _err(msg: str, param: str) -> MessageValidationError:
    return MessageValidationError(msg, param=param)


def _content(raw: Any, p: str) -> str | None:
    if isinstance(raw, str):
        return raw
    if raw is None:
        return None
    if isinstance(raw, list):
        if not raw:
            raise _err("content must not be an empty list", f"{p}.content")
        texts = []
        for j, part in enumerate(raw):
            pp = f"{p}.content[{j}]"
            if not isinstance(part, Mapping):
                raise _err("content parts must be objects", pp)
            kind = part.get("type")
            if kind != "text":
                raise _err(f"unsupported content part type {kind!r}; only 'text' is supported",
                           f"{pp}.type")
            text = part.get("text")
            if not isinstance(text, str):
                raise _err("a text part needs a string 'text'", f"{pp}.text")
            texts.append(text)
        return "\n".join(texts)
    raise _err(f"content must be a string or a list of text parts, not {type(raw).__name__}",
               f"{p}.content")


def _opt_str(m: Mapping[str, Any], key: str, p: str) -> str | None:
    value = m.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _err(f"{key} must be a string", f"{p}.{key}")


def _tool_call(raw: Any, p: str, legacy: bool = False) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise _err("a tool call must be an object", p)
    if legacy:
        fn, fp = raw, p
        call_id = None
    else:
        kind = raw.get("type", "function")
        if kind != "function":
            raise _err(f"unsupported tool call type {kind!r}", f"{p}.type")
        call_id = _opt_str(raw, "id", p)
        fn, fp = raw.get("function"), f"{p}.function"
        if not isinstance(fn, Mapping):
            raise _err("a tool call needs a 'function' object", fp)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise _err("a function call needs a non-empty string 'name'", f"{fp}.name")
    args = fn.get("arguments", "")
    if not isinstance(args, str | dict):
        raise _err("function arguments must be a JSON string or an object", f"{fp}.arguments")
    return ToolCall(name=name, arguments=args, id=call_id)


def _tool_calls(m: Mapping[str, Any], p: str) -> tuple[ToolCall, ...]:
    raw = m.get("tool_calls")
    if raw is not None:
        if not isinstance(raw, list):
            raise _err("tool_calls must be a list", f"{p}.tool_calls")
        return tuple(_tool_call(tc, f"{p}.tool_calls[{j}]") for j, tc in enumerate(raw))
    legacy = m.get("function_call")
    if legacy is not None:
        return (_tool_call(legacy, f"{p}.function_call", legacy=True),)
    return ()


def _utf8(s: str, param: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates from JSON "\ud800" escapes
        raise _err("text is not valid Unicode (lone surrogate)", param) from e


def _parts(role: str, content: str, extra: bytes, p: str) -> tuple[bytes, bytes]:
    cb = _utf8(content, f"{p}.content")
    return b"%s%d:%d:" % (_ROLE_BYTES[role], len(cb), len(extra)), cb + extra if extra else cb


def parse_message(raw: Any, index: int,
                  normalizer: RoleNormalizer) -> tuple[Message, tuple[bytes, bytes]]:
    """Validate one raw message; returns the :class:`Message` and its serialization parts."""
    p = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise _err("each message must be an object", p)
    raw_role = raw.get("role")
    if raw_role is None or (isinstance(raw_role, str) and not raw_role.strip()):
        raise _err("message has no role", f"{p}.role")
    if not isinstance(raw_role, str):
        raise _err("role must be a string", f"{p}.role")
    role = normalizer.normalize(raw_role, param=f"{p}.role")
    content = _content(raw.get("content"), p)
    name = _opt_str(raw, "name", p) or None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id = None
    if role == "assistant":
        tool_calls = _tool_calls(raw, p)
    elif role == "tool":
        tool_call_id = _opt_str(raw, "tool_call_id", p)
        if normalizer.strict:  # OpenAI's schema; lenient (default) passes them on as vLLM does
            if raw_role.strip().lower() == "function":
                if name is None:
                    raise _err("a function message needs a 'name'", f"{p}.name")
            elif tool_call_id is None:
                raise _err("a tool message needs a 'tool_call_id'", f"{p}.tool_call_id")
    if content is None:
        if not tool_calls:
            raise _err("content is required (it may be null only on an assistant message "
                       "with tool_calls)", f"{p}.content")
        content = ""
    extra = b""
    if name is not None or tool_calls or tool_call_id is not None:
        extra = msgspec.json.encode(
            [name, tool_call_id, [[tc.id, tc.name, tc.arguments] for tc in tool_calls]],
            order="sorted")
    msg = Message(role, content, name, tool_calls, tool_call_id, raw_role)
    return msg, _parts(role, content, extra, p)


_FAST_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}


def parse_messages(raw: Any, normalizer: RoleNormalizer) -> Conversation:
    """Validate and normalize a request's ``messages``.

    Raises :class:`MessageValidationError` (``param="messages"`` for a non-list or empty list,
    a per-field param otherwise) and :class:`UnknownRoleError` under strict roles; strict roles
    also refuse a ``tool`` message without ``tool_call_id`` and a ``function`` one without
    ``name``.
    """
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise _err("messages must be a list of message objects", "messages")
    if not raw:
        raise _err("messages must contain at least one message", "messages")
    items: list[Message | tuple[str, str]] = []
    chunks: list[bytes] = []
    codes = []
    fast_roles, role_bytes, role_codes = _FAST_ROLES, _ROLE_BYTES, ROLE_CODES
    for i, m in enumerate(raw):
        # Fast path: {"role": canonical role, "content": str} and nothing else.
        if type(m) is dict and len(m) == 2:
            raw_role = m.get("role")
            role = fast_roles.get(raw_role) if type(raw_role) is str else None
            content = m.get("content")
            if role is not None and type(content) is str:
                try:
                    cb = content.encode("utf-8")
                except UnicodeEncodeError:
                    cb = _utf8(content, f"messages[{i}].content")
                items.append((role, content))
                chunks.append(b"%s%d:0:" % (role_bytes[role], len(cb)))
                chunks.append(cb)
                codes.append(role_codes[role])
                continue
        msg, (head, body) = parse_message(m, i, normalizer)
        items.append(msg)
        chunks.append(head)
        chunks.append(body)
        codes.append(role_codes[msg.role])
    return Conversation(items, "".join(codes), chunks)
