"""``GET /dashboard``: the aiohttp server's page, served the same way by the ASGI app.

The page is package data of ``hermes_async`` (``server/static/dashboard.html``), read through
:mod:`importlib.resources` without importing ``hermes_async.server`` (nor aiohttp); it goes
out with the same headers: a Content-Security-Policy that allows only the page's own inline
script (by its sha256), inline styles and requests to this origin.
"""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import resources

from hermes_async.openai.responses import RawResponse

DASHBOARD_PATH = "/dashboard"
PAGE = "server/static/dashboard.html"
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)
POLICY = ("default-src 'self'; script-src {scripts}; style-src 'unsafe-inline'; "
          "connect-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
          "form-action 'none'; frame-ancestors 'none'")


def script_hash(script: str) -> str:
    """A CSP source for one inline script."""
    digest = hashlib.sha256(script.encode()).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


def dashboard_page() -> RawResponse:
    """The page as a response (read the file once and keep the response: it never changes)."""
    html = resources.files("hermes_async").joinpath(PAGE).read_text(encoding="utf-8")
    scripts = " ".join(script_hash(s) for s in INLINE_SCRIPT.findall(html))
    return RawResponse(html.encode(), "text/html; charset=utf-8", headers={
        "Content-Security-Policy": POLICY.format(scripts=scripts),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    })
