"""API keys -> tenants -> prefix-cache namespaces.

With ``[server.api_keys]`` configured, every request to a protected path needs
``Authorization: Bearer <key>``; the key's tenant becomes the request's prefix-cache namespace,
so one tenant's cached prefixes can never serve (or reveal, through ``cached_tokens``) another's.
A request's optional ``cache_salt`` (vLLM's field) splits its tenant's namespace further; it can
only narrow sharing, never widen it: the tenant always prefixes the namespace.
Without keys every request is tenant ``default``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from hermes_async.server.errors import APIError

DEFAULT_TENANT = "default"
PROTECTED_PREFIXES = ("/v1/", "/tokenize")


class Authenticator:
    """Resolves the ``Authorization`` header to a tenant (constant-time key comparison)."""

    def __init__(self, api_keys: Mapping[str, str]) -> None:
        self._keys = [(k.encode(), tenant) for k, tenant in api_keys.items()]

    @property
    def enabled(self) -> bool:
        """Whether keys are configured (else every request is :data:`DEFAULT_TENANT`)."""
        return bool(self._keys)

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of a request's ``Authorization`` header; 401 when keys are configured
        and the header is missing, malformed or carries an unknown key."""
        if not self._keys:
            return DEFAULT_TENANT
        if not authorization:
            raise _unauthorized("You didn't provide an API key. Provide it in the "
                                "Authorization header: 'Authorization: Bearer YOUR_KEY'.")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
        given = token.strip().encode()
        found: str | None = None
        for key, tenant in self._keys:  # compare against every key: no early exit
            if hmac.compare_digest(key, given):
                found = tenant
        if found is None:
            raise _unauthorized("Incorrect API key provided.")
        return found


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key",
                    headers={"WWW-Authenticate": 'Bearer realm="hermes_async"'})


def namespace_for(tenant: str, cache_salt: str | None) -> str:
    """The prefix-cache namespace of a request: its tenant, plus a digest of ``cache_salt``.

    The salt is hashed so that it never shows up in metrics labels or logs; tenant names
    cannot contain ``~``, so no (tenant, salt) pair can produce another tenant's namespace.
    """
    if cache_salt is None:
        return tenant
    digest = hashlib.blake2b(cache_salt.encode(), digest_size=8).hexdigest()
    return f"{tenant}~{digest}"


def is_protected(path: str) -> bool:
    """Paths that need an API key when keys are configured (``/health``, ``/metrics`` don't)."""
    return path.startswith(PROTECTED_PREFIXES)
