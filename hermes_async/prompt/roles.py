"""Role normalization (seed section 2.1).

Raw roles from clients are mapped onto four canonical roles with a fixed table. An unknown
role maps to ``user``, is counted per distinct raw role on the
:class:`RoleNormalizer` that saw it, and is logged once per distinct role per normalizer; with
``strict=True`` it raises :class:`UnknownRoleError` instead (HTTP 400).

Tool results are never rendered as user turns: ``tool`` and the legacy ``function`` both map to
``tool``. Strict roles also make :mod:`hermes_async.prompt.parse` refuse a ``tool`` message
without ``tool_call_id`` and a ``function`` message without ``name`` (accepted otherwise, as
vLLM accepts them).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Final, Literal

from hermes_async.prompt.errors import UnknownRoleError

Role = Literal["system", "user", "assistant", "tool"]

CANONICAL_ROLES: Final[tuple[Role, ...]] = ("system", "user", "assistant", "tool")

#: The normalization table; keys are lower-cased, stripped raw roles.
ROLE_TABLE: Final[dict[str, Role]] = {
    "system": "system",
    "system_prompt": "system",
    "human": "user",
    "prompter": "user",
    "user": "user",
    "bot": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}

#: One-letter codes used in the role sequence of assembly-cache keys.
ROLE_CODES: Final[dict[str, str]] = {"system": "s", "user": "u", "assistant": "a", "tool": "t"}

logger = logging.getLogger(__name__)


class RoleNormalizer:
    """Maps raw roles to canonical ones and keeps the unknown-role counters.

    ``unknown_role_counts`` (read it with :meth:`unknown_role_counts`) counts each distinct
    unknown raw role (lower-cased, stripped) mapped to ``user``; metrics exporters read it. The
    first time a distinct unknown role is seen it is logged at WARNING. Thread-safe.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._unknown: Counter[str] = Counter()
        self._lock = threading.Lock()

    def normalize(self, raw_role: str, *, param: str = "role") -> Role:
        """Canonical role for ``raw_role`` (a ``str``; the caller checks the type).

        Raises :class:`UnknownRoleError` (with ``param``) for an unknown role when strict.
        """
        role = ROLE_TABLE.get(raw_role)
        if role is not None:
            return role
        key = raw_role.strip().lower()
        role = ROLE_TABLE.get(key)
        if role is not None:
            return role
        if self.strict:
            raise UnknownRoleError(
                f"unknown role {raw_role!r}; expected one of "
                f"{', '.join(sorted(ROLE_TABLE))}",
                param=param,
            )
        with self._lock:
            first = key not in self._unknown
            self._unknown[key] += 1
        if first:
            logger.warning("unknown message role %r mapped to 'user'", key)
        return "user"

    def unknown_role_counts(self) -> dict[str, int]:
        """How often each distinct unknown role was mapped to ``user`` (a copy)."""
        with self._lock:
            return dict(self._unknown)

    @property
    def unknown_roles_total(self) -> int:
        """Total number of messages whose role was unknown."""
        with self._lock:
            return sum(self._unknown.values())
