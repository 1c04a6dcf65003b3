"""OpenAI's error object and the mapping of every failure to a status and that object.

Every error the API answers is ``{"error": {"message", "type", "param", "code"}}``:

====  =========================  ==================================================
400   invalid_request_error      bad JSON or schema (``param`` names the field), an
                                 out-of-range parameter, ``context_length_exceeded``
401   invalid_request_error      ``invalid_api_key`` (missing or wrong key)
403   permission_error           ``namespace_forbidden`` (``/cache/*``: another tenant's)
404   invalid_request_error      ``model_not_found``; unknown route ``not_found``
408   timeout_error              ``request_timeout`` (the body arrived too slowly)
409   invalid_request_error      ``namespace_busy`` (reset while requests run there),
                                 ``pin_limit_reached`` (the pin cap refused a pin)
413   invalid_request_error      ``request_too_large``
414   invalid_request_error      ``uri_too_long`` (the request line is past its limit)
429   rate_limit_error           ``queue_full`` (with ``Retry-After``)
431   invalid_request_error      ``request_header_fields_too_large`` (too many or too large)
500   server_error               ``internal_error``, a failed model step
503   service_unavailable_error  ``model_loading``, ``shutting_down``, ``model_load_failed``
504   timeout_error              ``request_timeout``
====  =========================  ==================================================

Plain code: a front end turns its own framework's HTTP errors (unknown route, wrong method)
into an :class:`APIError` with :func:`http_error` and everything else with
:func:`to_api_error`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from hermes_async.engine.errors import EngineError, NamespaceBusyError, QueueFullError
from hermes_async.prompt import PromptError
from hermes_async.types import InvalidParameter

log = logging.getLogger("hermes_async.openai")

_HTTP_CODES = MappingProxyType({
    400: "bad_request", 401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed",
    413: "request_too_large", 414: "uri_too_long", 415: "unsupported_media_type",
    431: "request_header_fields_too_large"})
_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


class APIError(Exception):
    """An error answered to the client as an OpenAI error object with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None, counted: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})
        self.counted = counted  # already in hermes_request_errors_total (the engine's own)

    def body(self) -> dict[str, dict[str, Any]]:
        """The OpenAI error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def http_error(status: int, message: str) -> APIError:
    """A front end's own HTTP error (unknown route 404, wrong method 405, ...) as an
    :class:`APIError`; ``code`` from the status (``not_found``, ``method_not_allowed``)."""
    return APIError(status, message, code=_HTTP_CODES.get(status, f"http_{status}"))


def unavailable(message: str, code: str, retry_after_s: int | None = None) -> APIError:
    """A 503 (the engine is loading, failed to load or is shutting down)."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return APIError(503, message, type="service_unavailable_error", code=code, headers=headers)


def context_length_error(param: str, max_model_len: int, prompt_tokens: int,
                         max_tokens: int | None) -> APIError:
    """400 ``context_length_exceeded`` in OpenAI's wording."""
    asked = prompt_tokens + (max_tokens or 0)
    what = f"{prompt_tokens} in the {param}"
    if max_tokens:
        what += f", {max_tokens} in the completion"
    return APIError(400, f"This model's maximum context length is {max_model_len} tokens. "
                    f"However, you requested {asked} tokens ({what}). Please reduce the length "
                    f"of the {param} or completion.", param=param, code="context_length_exceeded")


def validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> APIError:
    """400 for a body that is not JSON or does not match the schema; ``param`` names the
    field (``messages[0].role``, ``max_tokens``) as far as the decoder tells it."""
    if not isinstance(exc, msgspec.ValidationError):
        return APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json")
    message = str(exc)
    path = ""
    if m := _AT_PATH.search(message):
        path = m["path"].lstrip(".")
    if m := _MISSING.search(message):
        path = f"{path}.{m['field']}" if path else m["field"]
    return APIError(400, f"invalid request: {message}", param=path or None,
                    code="invalid_value" if path else "invalid_request")


def to_api_error(exc: BaseException, retry_after_s: int) -> APIError:
    """Map any exception of a request to the :class:`APIError` answered for it (anything
    unexpected: a logged 500 ``internal_error``)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, msgspec.ValidationError | msgspec.DecodeError):
        return validation_error(exc)
    if isinstance(exc, PromptError):
        return APIError(400, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, InvalidParameter):
        return APIError(400, str(exc), param=exc.param, code=exc.code or "invalid_value")
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc), type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": str(retry_after_s)})
    if isinstance(exc, NamespaceBusyError):
        return APIError(409, str(exc), param="namespace", code="namespace_busy")
    if isinstance(exc, EngineError):
        return unavailable(str(exc), "shutting_down")
    log.exception("unexpected error handling a request", exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}", type="server_error",
                    code="internal_error")
