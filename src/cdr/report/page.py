"""The page around a report body: inline stylesheet and script, and a Content-Security-Policy
that allows exactly those two (by SHA-256 hash) and nothing remote. The static report carries
the policy in a `<meta>` tag; the gateway also sends it as a header (`csp_header`)."""

from __future__ import annotations

import base64
import hashlib
from functools import cache
from html import escape
from importlib import resources


@cache
def asset(name: str) -> str:
    return resources.files("cdr.report").joinpath("static", name).read_text("utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def csp(*, connect: bool = False) -> str:
    """The policy: no default source; the one stylesheet and script by hash; images only as
    data URIs; fetches only to the page's own origin (the gateway's live view)."""
    connect_src = "'self'" if connect else "'none'"
    return (f"default-src 'none'; style-src {_sha256(asset('report.css'))}; "
            f"script-src {_sha256(asset('report.js'))}; img-src data:; "
            f"connect-src {connect_src}; base-uri 'none'; form-action 'none'")


def csp_header() -> str:
    """The policy as a response header (frame-ancestors only works there, not in `<meta>`)."""
    return csp(connect=True) + "; frame-ancestors 'none'"


def page(title: str, body: str, *, attrs: str = "", connect: bool = False) -> str:
    """A whole HTML document. `body` must already be escaped HTML; `attrs` are extra
    attributes of `<body>` (escaped by the caller)."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{escape(csp(connect=connect))}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="referrer" content="no-referrer"><link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{asset('report.css')}</style></head>"
        f"<body{attrs}>{body}<script>{asset('report.js')}</script></body></html>\n"
    )
