"""Typed errors of prompt assembly.

Every error a client can cause is a :class:`PromptError`: a ``ValueError`` that carries the
OpenAI-style ``param`` (the offending field, e.g. ``messages[2].content``) and a short ``code``.
The server turns any ``PromptError`` into HTTP 400 with the body :meth:`PromptError.to_openai_error`
(``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``).
"""

from __future__ import annotations


class PromptError(ValueError):
    """A request's messages, tools or options cannot be assembled into a prompt (HTTP 400).

    ``param`` names the offending field in OpenAI's notation (``messages[0].role``,
    ``messages[3].content[1].text``, ``tools``) or is ``None``; ``code`` is a stable
    machine-readable reason.
    """

    code = "invalid_prompt"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code

    def to_openai_error(self) -> dict[str, dict[str, str | None]]:
        """The OpenAI error object for this error (status 400)."""
        return {
            "error": {
                "message": str(self),
                "type": "invalid_request_error",
                "param": self.param,
                "code": self.code,
            }
        }


class MessageValidationError(PromptError):
    """A message is malformed: missing role, content of the wrong type, empty part list, ..."""

    code = "invalid_message"


class UnknownRoleError(MessageValidationError):
    """A message has a role outside the normalization table while ``strict_roles`` is on."""

    code = "unknown_role"


class TemplateRenderError(PromptError):
    """The chat template refused the conversation (roles must alternate, ...) or failed on it."""

    code = "template_error"


class TemplateConfigError(ValueError):
    """A template definition (TOML file or chat template source) is invalid. Not a client error."""


class ProtectedTokenizationError(RuntimeError):
    """Internal invariant broken: plain text produced a control-token id. Never a client error."""
