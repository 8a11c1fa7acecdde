"""`/docs` (Swagger UI) and `/redoc`: off by default, and under a strict CSP when on.

Why off: both pages load their script and CSS from a public CDN, and they run on the
gateway's origin, the origin of `/ui/`, whose pages keep an API key in sessionStorage. Any
script on that origin can read it, so a compromised CDN would get the key. `/openapi.json`
(the machine-readable description) stays open; `CDR_API_DOCS=1` turns the two pages on for a
development gateway.

When on, each page gets a Content-Security-Policy that allows only its own inline script (by
hash) and the CDN's script, and fetches to this origin (the page loads `/openapi.json`): no
other code, no framing, no forms.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

__all__ = ["install_api_docs", "page_csp"]

CDN = "https://cdn.jsdelivr.net"
_INLINE = re.compile(r"<script>(.*?)</script>", re.S)


def _hashes(pattern: re.Pattern[str], html: str) -> str:
    return " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.encode("utf-8")).digest()).decode()
        + "'" for m in pattern.findall(html))


def page_csp(html: str) -> str:
    """The policy for one docs page: scripts only from the CDN and the page's own inline
    script (by hash), fetches to this origin only. Styles may be inline: ReDoc injects its
    styles at run time, and a style cannot run code."""
    scripts = " ".join(filter(None, (_hashes(_INLINE, html), CDN)))
    return (f"default-src 'none'; script-src {scripts}; "
            f"style-src {CDN} https://fonts.googleapis.com 'unsafe-inline'; "
            f"img-src {CDN} https://fastapi.tiangolo.com data:; "
            "font-src https://fonts.gstatic.com data:; connect-src 'self'; worker-src blob:; "
            "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")


def _page(html: str) -> HTMLResponse:
    return HTMLResponse(html, headers={
        "Content-Security-Policy": page_csp(html), "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"})


def install_api_docs(app: FastAPI) -> None:
    """Serve `/docs` and `/redoc` with their CSP (the app must be built with `docs_url` and
    `redoc_url` None, so FastAPI's own unguarded routes do not exist)."""
    title = f"{app.title} — API"
    swagger = bytes(get_swagger_ui_html(openapi_url="/openapi.json", title=title).body).decode()
    redoc = bytes(get_redoc_html(openapi_url="/openapi.json", title=title).body).decode()

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return _page(swagger)

    @app.get("/redoc", include_in_schema=False)
    def redoc_page() -> HTMLResponse:
        return _page(redoc)
