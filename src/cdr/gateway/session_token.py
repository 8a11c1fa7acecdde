"""Signed session tokens (SPEC-007 style), carried in `CRP-Set-Session`: standard JWTs.

A token is a compact JWS (RFC 7519): `header.payload.signature`, HS256, with the key id in the
header's `kid` and the registered `iat`/`exp` claims beside ours (`sid` session id, `mid`
embedding model id, `w` window, `r` open sub-query ids, `jti` nonce, `v` layout version). Any
client can read one with a stock JWT library; PyJWT does the encoding and the signature check
here, so no hand-written token format remains. The token lets a stateless replica check, before
touching the session store, that the caller holds a token we issued, for this session, not
expired, for the current window and for the CKF's embedding model (SPEC-024 §2.5). The payload
is signed, not encrypted: it holds nothing secret (ids, counters).

Why a key per session: the HMAC key is HKDF-SHA256(master secret, info = session id)
(`cryptography`'s HKDF), so a token is only ever valid for the session it names, and a verifier
that knows which session it serves derives that session's key, making cross-session reuse fail
the signature check itself. A client that wants to verify a token itself derives the same key
(`TokenSigner.session_key`) and calls `jwt.decode(token, key, algorithms=["HS256"])`.

Why a key id: the master secret can rotate. `TokenSigner` signs with the active key and
verifies with any key still in the ring, so tokens issued before a rotation keep working until
the old key is removed. `CDR_SIGNING_SECRET` holds either one secret or a ring
`kid1:secret1,kid2:secret2` whose first entry is the active key (see `parse_signing_secret`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cdr.errors import CdrError, EmbeddingModelMismatchError, InvalidInputError

__all__ = [
    "DEFAULT_KID",
    "MIN_SECRET_CHARS",
    "ExpiredTokenError",
    "InvalidTokenError",
    "StaleTokenError",
    "TokenError",
    "TokenModelMismatchError",
    "TokenPayload",
    "TokenSigner",
    "hkdf_sha256",
    "parse_signing_secret",
]

TOKEN_VERSION = 2  # 1 was the hand-written two-part format
ALGORITHM = "HS256"
DEFAULT_KID = "default"
MIN_SECRET_CHARS = 16
MAX_TOKEN_CHARS = 65_536
_HKDF_SALT = b"cdr-session-token-v1"
_KID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_PAYLOAD_KEYS = frozenset({"v", "sid", "mid", "w", "r", "iat", "exp", "jti"})
_HEADER_KEYS = frozenset({"alg", "typ", "kid"})


class TokenError(CdrError):
    """A session token that must not be honoured; `http_status` is what the gateway answers."""

    http_status = 401


class InvalidTokenError(TokenError, ValueError):
    """Malformed token, bad signature, unknown key id, or a token of another session."""

    http_status = 401


class ExpiredTokenError(TokenError):
    """The token's expiry has passed; the client must start again or refresh."""

    http_status = 401

    def __init__(self, expired_at: int, now: float) -> None:
        self.expired_at = expired_at
        self.now = now
        super().__init__(f"session token expired at {expired_at} (now {int(now)})")


class StaleTokenError(TokenError):
    """A validly signed token for another window than the session's current one (a replay)."""

    http_status = 409

    def __init__(self, token_window: int, current_window: int) -> None:
        self.token_window = token_window
        self.current_window = current_window
        if token_window < current_window:
            why = "replayed: the session has moved on; use the token from the latest response"
        else:
            why = "ahead of the stored session state"
        super().__init__(
            f"session token is for window {token_window} but the session is at window "
            f"{current_window} ({why})"
        )


class TokenModelMismatchError(TokenError, EmbeddingModelMismatchError):
    """The token was issued under another embedding model than the CKF serving it (§2.5)."""

    http_status = 409

    def __init__(self, expected: str, got: str) -> None:
        EmbeddingModelMismatchError.__init__(self, expected, got)
        self.args = (
            f"embedding model mismatch: the session token was issued for model {got!r}, but "
            f"this CKF uses {expected!r}; coverage from one model cannot score facts of another",
        )


@dataclass(frozen=True, slots=True)
class TokenPayload:
    """What a token asserts. `residual_ids` are the sub-query ids still open (SPEC-024 §3.3)."""

    session_id: str
    model_id: str
    window: int
    residual_ids: tuple[int | str, ...]
    issued_at: int
    expires_at: int
    nonce: str
    kid: str

    def to_json(self) -> dict[str, object]:
        """The JWT claims (the key id travels in the header, not here)."""
        return {
            "v": TOKEN_VERSION,
            "sid": self.session_id,
            "mid": self.model_id,
            "w": self.window,
            "r": list(self.residual_ids),
            "iat": self.issued_at,
            "exp": self.expires_at,
            "jti": self.nonce,
        }

    @classmethod
    def from_json(cls, obj: object, kid: str) -> TokenPayload:
        """Strict: any unexpected key or type is an invalid token, never a silent default."""
        if not isinstance(obj, dict) or set(obj) != _PAYLOAD_KEYS or obj["v"] != TOKEN_VERSION:
            raise InvalidTokenError("session token payload has an unknown layout or version")
        strs = ("sid", "mid", "jti")
        ints = ("w", "iat", "exp")
        if not all(isinstance(obj[k], str) for k in strs) or not all(
            type(obj[k]) is int for k in ints
        ):
            raise InvalidTokenError("session token payload has a field of the wrong type")
        residual = obj["r"]
        if not isinstance(residual, list) or not all(
            type(x) is int or isinstance(x, str) for x in residual
        ):
            raise InvalidTokenError("session token residual ids must be a list of ints or strings")
        return cls(
            session_id=obj["sid"],
            model_id=obj["mid"],
            window=obj["w"],
            residual_ids=tuple(residual),
            issued_at=obj["iat"],
            expires_at=obj["exp"],
            nonce=obj["jti"],
            kid=kid,
        )


def hkdf_sha256(ikm: bytes, *, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 HKDF with SHA-256 (extract, then expand), by `cryptography`."""
    if not 0 < length <= 255 * 32:
        raise InvalidInputError(f"HKDF length must be in 1..{255 * 32}, got {length}")
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt or None, info=info).derive(
        ikm
    )


@functools.lru_cache(maxsize=4096)
def _session_key(master: bytes, session_id: str) -> bytes:
    """HKDF per (master secret, session), remembered: every request of a session verifies one
    token and issues the next, so the same key was derived twice per request. The
    cache is keyed on the secret, so a rotated ring derives anew; it holds at most 4,096
    sessions' keys, so requests naming many sessions only churn it."""
    return hkdf_sha256(master, salt=_HKDF_SALT, info=session_id.encode("utf-8"))


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """Decode strictly: only the canonical unpadded encoding of some bytes is accepted, so no
    two token strings carry the same bytes (a lenient decoder ignores the spare low bits of the
    last character, so an edited last character could otherwise still verify)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidTokenError("session token is not valid base64url") from exc
    if _b64encode(raw) != text:
        raise InvalidTokenError("session token is not canonical base64url")
    return raw


def parse_signing_secret(value: str) -> tuple[dict[str, bytes], str]:
    """Read `CDR_SIGNING_SECRET`: one secret (key id `default`) or `kid:secret,kid:secret`
    (first entry active). A value whose every comma-separated item looks like `kid:secret`
    is a ring, so a lone secret that contains ':' is read as a one-entry ring; that is still
    a valid, stable key, but write `default:<secret>` to be explicit."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError("CDR_SIGNING_SECRET is empty")
    items = [item.strip() for item in value.split(",")]
    as_ring = [item.partition(":") for item in items]
    if all(sep and _KID_RE.fullmatch(kid) and secret for kid, sep, secret in as_ring):
        pairs = [(kid, secret) for kid, _, secret in as_ring]
    elif len(items) == 1:
        pairs = [(DEFAULT_KID, value.strip())]
    else:
        raise InvalidInputError(
            "CDR_SIGNING_SECRET looks like a key ring but an entry is not `kid:secret` "
            "(kid: 1-64 of A-Z a-z 0-9 _ . -, secret non-empty)"
        )
    keys: dict[str, bytes] = {}
    for kid, secret in pairs:
        if kid in keys:
            raise InvalidInputError(f"CDR_SIGNING_SECRET lists key id {kid!r} twice")
        if len(secret) < MIN_SECRET_CHARS:
            raise InvalidInputError(
                f"CDR_SIGNING_SECRET key {kid!r} is {len(secret)} characters; use at least "
                f"{MIN_SECRET_CHARS} (e.g. python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))')"
            )
        keys[kid] = secret.encode("utf-8")
    return keys, pairs[0][0]


class TokenSigner:
    """Issues and verifies tokens with a key ring; thread-safe (holds no mutable state)."""

    def __init__(
        self,
        keys: Mapping[str, bytes],
        active_kid: str,
        ttl_seconds: int = 3600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not keys:
            raise InvalidInputError("token signer needs at least one key")
        for kid, key in keys.items():
            if not isinstance(kid, str) or not _KID_RE.fullmatch(kid):
                raise InvalidInputError(f"key id {kid!r} must be 1-64 of A-Z a-z 0-9 _ . -")
            if not isinstance(key, bytes | bytearray) or not key:
                raise InvalidInputError(f"key {kid!r} must be non-empty bytes")
        if active_kid not in keys:
            raise InvalidInputError(f"active key id {active_kid!r} is not in the key ring")
        if type(ttl_seconds) is not int or ttl_seconds <= 0:
            raise InvalidInputError(f"ttl_seconds must be a positive int, got {ttl_seconds!r}")
        self._keys = {kid: bytes(key) for kid, key in keys.items()}
        self.active_kid = active_kid
        self.ttl_seconds = ttl_seconds
        self._clock = clock

    @classmethod
    def from_secret(cls, value: str, **kwargs: object) -> TokenSigner:
        """Build from a `CDR_SIGNING_SECRET` string."""
        keys, active = parse_signing_secret(value)
        return cls(keys, active, **kwargs)  # type: ignore[arg-type]

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def session_key(self, kid: str, session_id: str) -> bytes:
        """The HS256 key of one session's tokens: HKDF(master secret of `kid`, session id).
        Public so a trusted client holding the secret can verify tokens with a stock JWT
        library."""
        if kid not in self._keys:
            raise InvalidInputError(f"key id {kid!r} is not in the key ring")
        return _session_key(self._keys[kid], session_id)

    def issue(
        self,
        session_id: str,
        model_id: str,
        window: int,
        residual_ids: Sequence[int | str] = (),
    ) -> str:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInputError("session_id must be a non-empty string")
        if not isinstance(model_id, str) or not model_id:
            raise InvalidInputError("model_id must be a non-empty string")
        if type(window) is not int or window < 0:
            raise InvalidInputError(f"window must be a non-negative int, got {window!r}")
        residual = tuple(residual_ids)
        if not all(type(x) is int or isinstance(x, str) for x in residual):
            raise InvalidInputError("residual_ids must be ints or strings")
        now = int(self._clock())
        payload = TokenPayload(
            session_id=session_id,
            model_id=model_id,
            window=window,
            residual_ids=residual,
            issued_at=now,
            expires_at=now + self.ttl_seconds,
            nonce=secrets.token_urlsafe(12),
            kid=self.active_kid,
        )
        key = self.session_key(self.active_kid, session_id)
        return jwt.encode(
            payload.to_json(),
            key,
            algorithm=ALGORITHM,
            headers={"kid": self.active_kid, "typ": "JWT"},
            json_encoder=_Utf8Json,
        )

    def verify(
        self,
        token: str,
        *,
        session_id: str | None = None,
        current_window: int | None = None,
        model_id: str | None = None,
    ) -> TokenPayload:
        """Check signature, then expiry, then that the token is for `session_id`, the CKF's
        `model_id` and the session's `current_window` (each only when given).

        With `session_id` given, the key is derived from it rather than from the payload, so
        a token of another session fails as a bad signature. Expiry is checked here against
        the signer's clock (not PyJWT's), so a token is refused at exactly `exp`.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise InvalidTokenError("session token is missing, not a string, or too long")
        parts = token.split(".")
        if len(parts) != 3 or not all(parts):
            raise InvalidTokenError("session token must be a JWT: three base64url parts "
                                    "joined by '.'")
        raw = [_b64decode(part) for part in parts]
        try:
            header = json.loads(raw[0].decode("utf-8"))
            claims = json.loads(raw[1].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise InvalidTokenError("session token header or payload is not JSON") from exc
        if (not isinstance(header, dict) or set(header) != _HEADER_KEYS
                or header["alg"] != ALGORITHM or header["typ"] != "JWT"
                or not isinstance(header["kid"], str)):
            raise InvalidTokenError(f"session token header must be exactly alg {ALGORITHM}, "
                                    "typ JWT and a kid")
        kid = header["kid"]
        if kid not in self._keys:
            raise InvalidTokenError(
                f"session token was signed with key id {kid!r}, which is not (or no "
                "longer) in the key ring"
            )
        claimed = claims.get("sid") if isinstance(claims, dict) else None
        key_session = claimed if session_id is None else session_id
        if not isinstance(key_session, str):
            raise InvalidTokenError("session token payload has an unknown layout or version")
        try:
            decoded = jwt.decode(
                token,
                self.session_key(kid, key_session),
                algorithms=[ALGORITHM],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
            )
        except jwt.InvalidSignatureError as exc:
            raise InvalidTokenError("session token signature does not match") from exc
        except jwt.PyJWTError as exc:
            raise InvalidTokenError(f"session token is not a valid JWT ({exc})") from exc
        payload = TokenPayload.from_json(decoded, kid)
        if session_id is not None and payload.session_id != session_id:
            raise InvalidTokenError("session token belongs to another session")
        now = self._clock()
        if now >= payload.expires_at:
            raise ExpiredTokenError(payload.expires_at, now)
        if model_id is not None and payload.model_id != model_id:
            raise TokenModelMismatchError(expected=model_id, got=payload.model_id)
        if current_window is not None and payload.window != current_window:
            raise StaleTokenError(payload.window, current_window)
        return payload


class _Utf8Json(json.JSONEncoder):
    """Compact JSON that keeps non-ASCII ids as UTF-8 (shorter tokens than \\u escapes)."""

    def __init__(self, **kwargs: object) -> None:
        kwargs["ensure_ascii"] = False
        super().__init__(**kwargs)  # type: ignore[arg-type]
