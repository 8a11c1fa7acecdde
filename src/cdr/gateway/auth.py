"""API keys for the gateway: who may call it, with which scope, on which knowledge bases.

`CDR_API_KEYS` is a comma-separated list of entries:

    scope:key                  every knowledge base (the original format)
    scope@kb1+kb2:key          only the knowledge bases named (`cdr serve --kb NAME=PATH`)
    scope@*:key                every knowledge base, said explicitly

`scope` is `generate` (chat completions, sidecar sessions, reading the CKF) or `admin`
(everything, including CKF writes and deletes). A KB name is 1-64 characters of letters,
digits, `_`, `.` and `-`, starting with a letter or digit. `key` is either the key's hash,
`sha256:<64 hex digits>` (what to put in a config file: a leaked config then does not leak
the keys), or a plain key, which is hashed on load. `cdr keygen [--kb NAME]...` prints a
fresh key and its entry. One key may appear in one entry only (its scope and KBs are then
never ambiguous).

Why SHA-256 and not a slow password hash: keys are generated, 256-bit random strings, so
brute force over their hashes is hopeless; a slow hash would only cost every request time.
Plain keys given in the environment must look random (see `weak_secret_reason`).

Clients send `Authorization: Bearer <key>`, which is what the official OpenAI clients do with
their `api_key`. A missing or unknown key is 401 (with `WWW-Authenticate: Bearer`); a known
key without the scope the call needs is 403.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import re
import secrets
from collections import Counter
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from cdr.gateway.errors import ApiError

__all__ = [
    "KB_NAME",
    "SCOPES",
    "ApiKey",
    "AuthMiddleware",
    "KeyConfigError",
    "KeyRing",
    "format_key_entry",
    "hash_key",
    "new_key",
    "parse_api_keys",
    "parse_kb_list",
    "required_scope",
    "weak_secret_reason",
]

SCOPES = ("generate", "admin")
MIN_KEY_CHARS = 24
MIN_SECRET_BITS = 64.0
# Paths anyone may call: liveness, readiness, Prometheus scraping and the API description.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc",
                        "/docs/oauth2-redirect"})
_HASH = re.compile(r"^sha256:([0-9a-f]{64})$")
# A knowledge base's name: safe in a URL path segment, a model id (`cdr/<name>`) and a key entry.
KB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ALL_KBS = "*"
# A named KB's CKF routes (documents, jobs, stats): writes there need admin, as on /v1/ckf/.
_KB_CKF = re.compile(r"^/v1/kbs/[^/]*/(?!sessions(/|$))")
# The inspector's page shells: fixed HTML with no data, which a browser must be able to load by
# plain navigation (it cannot send headers); their script sends the credential from the URL
# fragment to the JSON endpoints under /ui/api/, which stay behind the key.
_UI_SHELL = re.compile(r"^/ui/(sessions/[A-Za-z0-9_-]{1,64})?$")


class KeyConfigError(ValueError):
    """`CDR_API_KEYS` cannot be used; the message says which entry and why."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key: its scope and the SHA-256 of the key. `id` (the first 8 hex digits
    of the hash) names it in logs without revealing it."""

    scope: str
    digest: bytes
    kbs: frozenset[str] | None = None  # None: every knowledge base

    @property
    def id(self) -> str:
        return self.digest.hex()[:8]

    @property
    def owner_id(self) -> str:
        """What a session stores as its owner: 64 bits of the key's hash, so two configured
        keys never share it by chance (the 8 digits of `id` are for logs), yet the stored
        value is not the hash `CDR_API_KEYS` holds."""
        return self.digest.hex()[:16]

    def allows(self, scope: str) -> bool:
        return self.scope == "admin" or self.scope == scope

    def reaches(self, kb: str) -> bool:
        """Whether this key may use knowledge base `kb` at all."""
        return self.kbs is None or kb in self.kbs


def hash_key(key: str) -> str:
    """`sha256:<hex>`: the form of a key to store in `CDR_API_KEYS`."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh random key (256 bits), recognisable by its `cdr_` prefix."""
    return "cdr_" + secrets.token_urlsafe(32)


def weak_secret_reason(value: str, min_chars: int = 16) -> str | None:
    """Why `value` is too weak to be a secret, or None.

    The estimate is the string's length times the Shannon entropy of its own characters, a
    crude upper bound on its randomness that still catches what people actually type:
    `aaaaaaaaaaaaaaaa` (0 bits), `abcabcabcabcabcabc` (~29 bits), `password1234567890` (~60).
    A random 32-character URL-safe string scores ~150 bits, a four-word passphrase ~100.
    """
    if len(value) < min_chars:
        return f"is {len(value)} characters; use at least {min_chars}"
    counts = Counter(value)
    per_char = abs(sum(c / len(value) * math.log2(c / len(value)) for c in counts.values()))
    bits = per_char * len(value)
    if bits < MIN_SECRET_BITS:
        return (f"looks guessable (about {bits:.0f} bits of entropy, {len(counts)} distinct "
                f"characters); use at least {MIN_SECRET_BITS:.0f} bits, e.g. "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return None


def parse_kb_list(text: str, where: str) -> frozenset[str] | None:
    """`kb1+kb2` → those names; `*` → None (every KB). `KeyConfigError` names the problem,
    prefixed by `where`."""
    names = text.split("+")
    if names == [ALL_KBS]:
        return None
    if ALL_KBS in names:
        raise KeyConfigError(f"{where}: '*' alone means every knowledge base; it cannot be "
                             "combined with names")
    for name in names:
        if not KB_NAME.match(name):
            raise KeyConfigError(
                f"{where}: {name!r} is not a knowledge base name (1-64 letters, digits, "
                "'_', '.' or '-', starting with a letter or digit)")
    return frozenset(names)


def format_key_entry(scope: str, hashed: str, kbs: frozenset[str] | None = None) -> str:
    """The `CDR_API_KEYS` entry for a key hash (`sha256:<hex>`): the original `scope:hash`
    for every KB, `scope@a+b:hash` for named ones (sorted, so one set has one spelling)."""
    if kbs is None:
        return f"{scope}:{hashed}"
    return f"{scope}@{'+'.join(sorted(kbs))}:{hashed}"


def parse_api_keys(raw: str) -> list[ApiKey]:
    """The keys in a `CDR_API_KEYS` value; `KeyConfigError` names the first bad entry."""
    keys: list[ApiKey] = []
    entries = [e.strip() for e in raw.replace("\n", ",").split(",") if e.strip()]
    if not entries:
        raise KeyConfigError("CDR_API_KEYS is empty: give scope:key entries, e.g. "
                             "admin:sha256:<hex> (cdr keygen prints one)")
    seen: dict[bytes, int] = {}
    for n, entry in enumerate(entries, 1):
        head, sep, value = entry.partition(":")
        scope, at, kb_text = head.strip().partition("@")
        scope = scope.strip().lower()
        if not sep or scope not in SCOPES:
            raise KeyConfigError(f"CDR_API_KEYS entry {n} must be scope:key or "
                                 f"scope@kb1+kb2:key with scope one of {', '.join(SCOPES)} "
                                 f"(got scope {scope!r})")
        where = f"CDR_API_KEYS entry {n}"
        kbs = parse_kb_list(kb_text.strip(), where) if at else None
        value = value.strip()
        if value.startswith("sha256:"):
            m = _HASH.match(value.lower())
            if m is None:
                raise KeyConfigError(f"{where}: a hash must be sha256: and 64 hex digits")
            digest = bytes.fromhex(m.group(1))
        else:
            reason = weak_secret_reason(value, MIN_KEY_CHARS)
            if reason is not None:
                raise KeyConfigError(f"{where}: the key {reason}")
            digest = hashlib.sha256(value.encode("utf-8")).digest()
        if digest in seen:
            raise KeyConfigError(f"CDR_API_KEYS entries {seen[digest]} and {n} are the same "
                                 "key: give each key one entry (one scope, its KBs joined "
                                 "by '+')")
        seen[digest] = n
        keys.append(ApiKey(scope, digest, kbs))
    return keys


class KeyRing:
    """The configured keys; `find` compares a presented key against every one of them in
    constant time (no early exit that would time which key matched)."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self.keys = list(keys)

    def find(self, presented: str) -> ApiKey | None:
        digest = hashlib.sha256(presented.encode("utf-8", "replace")).digest()
        found = None
        for key in self.keys:
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found


def required_scope(method: str, path: str) -> str | None:
    """The scope a call needs: None for the open paths, `admin` for any change to the CKF,
    `generate` for everything else (including unknown paths, so that a caller without a key
    learns nothing about which routes exist)."""
    if path in OPEN_PATHS:
        return None
    if method.upper() in ("GET", "HEAD") and _UI_SHELL.match(path):
        return None
    if (path.startswith("/v1/ckf/") or _KB_CKF.match(path)) \
            and method.upper() not in ("GET", "HEAD", "OPTIONS"):
        return "admin"
    return "generate"


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The credential of an `Authorization: Bearer` header, if any."""
    for k, v in headers:
        if k == b"authorization":
            scheme, _, value = v.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and value.strip():
                return value.strip()
            return None
    return None


class AuthMiddleware:
    """Checks the API key before any route runs (so a refused request never reaches a body
    parser, a store or the CKF) and records the key in `request.state.api_key`.

    Without a key ring (dev mode), requests are only served to loopback clients: a dev
    gateway exposed by mistake on a public interface refuses everyone else.
    """

    def __init__(self, app: ASGIApp, *, ring: KeyRing | None) -> None:
        self.app = app
        self.ring = ring

    @staticmethod
    async def on_refusal(scope: Scope, err: ApiError, receive: Receive, send: Send) -> None:
        await err.response()(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})
        need = required_scope(scope.get("method", "GET"), scope.get("path", ""))
        if self.ring is None:
            client = scope.get("client")
            if need is not None and not is_loopback(client[0] if client else None):
                await self.on_refusal(scope, ApiError(
                    403, "this gateway runs in dev mode (CDR_DEV=1, no API keys) and serves "
                    "loopback clients only", code="dev_mode_loopback_only"), receive, send)
                return
            scope["state"]["api_key"] = None
            await self.app(scope, receive, send)
            return
        if need is None:
            await self.app(scope, receive, send)
            return
        presented = bearer(scope.get("headers", []))
        challenge = {"WWW-Authenticate": 'Bearer realm="cdr"'}
        if presented is None:
            await self.on_refusal(scope, ApiError(
                401, "missing API key: send `Authorization: Bearer <key>` (the OpenAI "
                "clients' api_key)", code="missing_api_key", headers=challenge), receive, send)
            return
        key = self.ring.find(presented)
        if key is None:
            await self.on_refusal(scope, ApiError(
                401, "invalid API key", code="invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="cdr", error="invalid_token"'}),
                receive, send)
            return
        if not key.allows(need):
            await self.on_refusal(scope, ApiError(
                403, f"this API key has scope {key.scope!r}; {scope.get('method')} "
                f"{scope.get('path')} needs {need!r}", code="insufficient_scope"),
                receive, send)
            return
        scope["state"]["api_key"] = key
        await self.app(scope, receive, send)
