"""Dev mode's guard against the browser: a gateway without API keys answers only requests a
page on another site cannot make.

Why: dev mode (`CDR_DEV=1`) binds loopback and takes no keys, so anything that can reach
127.0.0.1 may call it, and a web page the developer visits can, through their browser:

* DNS rebinding: `attacker.example` first resolves to the attacker, then to 127.0.0.1; the
  page's requests then reach the gateway as same-origin for the browser, but they carry
  `Host: attacker.example`. So every request must name a loopback host (`localhost`,
  `127.x.x.x`, `[::1]`, with any port); others get 403.
* Cross-site writes: a form on another site can POST multipart or `text/plain` to the
  gateway with no preflight (that is how a document was planted). Browsers label such
  requests: `Origin` names the other site, `Sec-Fetch-Site: cross-site`. A write (any method
  but GET, HEAD, OPTIONS) whose `Origin` is not this gateway's own origin (or is `null`), or
  whose `Sec-Fetch-Site` is `cross-site` or `same-site`, gets 403. Clients that are not
  browsers send neither header and are served.

Reads stay open to any `Origin`: without CORS headers the browser keeps the answer from the
page. With API keys configured this guard is not installed: a key is what a page lacks.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from cdr.gateway.auth import is_loopback
from cdr.gateway.errors import ApiError
from cdr.gateway.limits import header

__all__ = ["DevGuardMiddleware", "loopback_host"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CROSS = frozenset({"cross-site", "same-site"})


def loopback_host(host: str | None) -> bool:
    """Whether a `Host` header value names this machine's loopback (any port)."""
    if not host:
        return False
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8088
        name, sep, rest = host[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return False
        return is_loopback(name)
    name, sep, port = host.rpartition(":")
    if not sep:
        name = host
    elif not port.isdigit():
        return False
    return is_loopback(name)




def refusal(scope: Scope) -> ApiError | None:
    """Why this request must be refused in dev mode, or None."""
    host = header(scope, b"host")
    if not loopback_host(host):
        return ApiError(403, f"this dev-mode gateway answers only requests for a loopback host "
                        f"(localhost, 127.0.0.1, [::1]), not Host {(host or '')[:100]!r}",
                        code="dev_mode_host")
    if scope.get("method", "GET").upper() in SAFE_METHODS:
        return None
    site = (header(scope, b"sec-fetch-site") or "").strip().lower()
    origin = header(scope, b"origin")
    if site in CROSS or (origin is not None and origin.strip().lower()
                         != f"{scope.get('scheme', 'http')}://{(host or '').lower()}"):
        return ApiError(403, "this dev-mode gateway takes no writes from other sites "
                        f"(Origin {(origin or '')[:100]!r}, Sec-Fetch-Site {site!r}): a page "
                        "you visit must not change your knowledge base", code="cross_site_write")
    return None


class DevGuardMiddleware:
    """Installed only without API keys (dev mode); see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (err := refusal(scope)) is not None:
            await err.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)
