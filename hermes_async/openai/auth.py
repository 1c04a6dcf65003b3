"""API keys -> tenants -> prefix-cache namespaces.

With ``[server.api_keys]`` configured, every request to a protected path needs
``Authorization: Bearer <key>``; the key's tenant becomes the request's prefix-cache namespace,
so one tenant's cached prefixes can never serve (or reveal, through ``cached_tokens``) another's.
A request's optional ``cache_salt`` (vLLM's field) splits its tenant's namespace further; it can
only narrow sharing, never widen it: the tenant always prefixes the namespace.
Without keys every request is tenant ``default``.

The cache admin paths (``/cache/*``) resolve to a :class:`CacheScope` instead: the
``server.admin_key`` sees every namespace; a tenant's key only its own namespace (and its
``cache_salt`` splits); with no keys configured at all they are open.

:func:`resolve_caller` applies these rules to a request's path and ``Authorization`` header:
the one call a front end makes (an HTTP middleware) before calling a service.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from hermes_async.openai.errors import APIError

DEFAULT_TENANT = "default"
PROTECTED_PREFIXES = ("/v1/", "/tokenize")
CACHE_ADMIN_PREFIX = "/cache/"


@dataclass(frozen=True)
class CacheScope:
    """Which namespaces a ``/cache/*`` caller may see and manage: all (``tenant`` None) or
    one tenant's (its namespace and the ``cache_salt`` splits of it)."""

    tenant: str | None

    @property
    def is_admin(self) -> bool:
        return self.tenant is None

    def allows(self, namespace: str) -> bool:
        return self.tenant is None or namespace == self.tenant or \
            namespace.startswith(f"{self.tenant}~")

    @property
    def default_namespace(self) -> str:
        return self.tenant or DEFAULT_TENANT


class Authenticator:
    """Resolves the ``Authorization`` header to a tenant (constant-time key comparison)."""

    def __init__(self, api_keys: Mapping[str, str], admin_key: str | None = None) -> None:
        self._keys = [(k.encode(), tenant) for k, tenant in api_keys.items()]
        self._admin_key = admin_key.encode() if admin_key else None

    def cache_scope(self, authorization: str | None) -> CacheScope:
        """The scope of a ``/cache/*`` request: everything when no key is configured or the
        admin key is given; the key's tenant for a tenant key; 401 otherwise."""
        if not self._keys and self._admin_key is None:
            return CacheScope(None)
        given = _bearer(authorization)
        if self._admin_key is not None and hmac.compare_digest(self._admin_key, given):
            return CacheScope(None)
        if not self._keys:
            raise _unauthorized("Incorrect admin key provided.")
        return CacheScope(self.tenant_for(authorization))

    @property
    def enabled(self) -> bool:
        """Whether keys are configured (else every request is :data:`DEFAULT_TENANT`)."""
        return bool(self._keys)

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of a request's ``Authorization`` header; 401 when keys are configured
        and the header is missing, malformed or carries an unknown key."""
        if not self._keys:
            return DEFAULT_TENANT
        given = _bearer(authorization)
        found: str | None = None
        for key, tenant in self._keys:  # compare against every key: no early exit
            if hmac.compare_digest(key, given):
                found = tenant
        if found is None:
            raise _unauthorized("Incorrect API key provided.")
        return found


def _bearer(authorization: str | None) -> bytes:
    """The key of an ``Authorization: Bearer KEY`` header; 401 when missing or malformed."""
    if not authorization:
        raise _unauthorized("You didn't provide an API key. Provide it in the "
                            "Authorization header: 'Authorization: Bearer YOUR_KEY'.")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
    return token.strip().encode()


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


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its tenant, and for the ``/cache/*`` paths its :class:`CacheScope`
    (``None`` elsewhere)."""

    tenant: str = DEFAULT_TENANT
    scope: CacheScope | None = None


def resolve_caller(auth: Authenticator, path: str, authorization: str | None) -> Caller:
    """The caller of a request to ``path``: a cache scope on the admin paths, the key's
    tenant on the protected ones, :data:`DEFAULT_TENANT` elsewhere; 401 for a missing or
    wrong key where one is needed."""
    if path.startswith(CACHE_ADMIN_PREFIX):
        return Caller(DEFAULT_TENANT, auth.cache_scope(authorization))
    if is_protected(path):
        return Caller(auth.tenant_for(authorization))
    return Caller()


def is_protected(path: str) -> bool:
    """Paths that need an API key when keys are configured (``/health``, ``/metrics`` don't)."""
    return path.startswith(PROTECTED_PREFIXES)
