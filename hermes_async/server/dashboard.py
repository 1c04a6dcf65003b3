"""``GET /dashboard``: one self-contained HTML page that polls ``GET /cache/stats``.

The page (``static/dashboard.html``, package data) draws the three cache figures on one chart
(assembly hit rate, prefix hit rate, average matched length), the KV pool, running and waiting
requests, per-namespace figures and the dynamic-field divergence table. It loads nothing from
elsewhere (no CDN, fonts or scripts), so it works offline; the API key, when keys are
configured, comes from ``?key=`` or an input field and stays in the tab's ``sessionStorage``.

The file is read once per process; its Content-Security-Policy allows only the page's own
inline script (by its sha256), inline styles and requests to this origin.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

from aiohttp import web

PAGE = "static/dashboard.html"
_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


@functools.cache
def page() -> tuple[bytes, str]:
    """The page's bytes and its Content-Security-Policy (the inline scripts' hashes)."""
    html = resources.files("hermes_async.server").joinpath(PAGE).read_text(encoding="utf-8")
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in _SCRIPT.findall(html))
    csp = "; ".join([
        "default-src 'self'",
        f"script-src {hashes}",
        "style-src 'unsafe-inline'",
        "connect-src 'self'",
        "img-src 'self' data:",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ])
    return html.encode(), csp


async def dashboard(request: web.Request) -> web.Response:
    """The dashboard page (open to all: it holds no data; ``/cache/stats`` is what needs a
    key)."""
    body, csp = page()
    return web.Response(body=body, headers={
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    })
