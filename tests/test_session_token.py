"""Session tokens (standard JWTs): round trip, every tamper refused, expiry, replay, model
mismatch, rotation, and a stock `jwt.decode` reading what we issue."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.errors import CdrError, EmbeddingModelMismatchError, InvalidInputError
from cdr.gateway.session_token import (
    DEFAULT_KID,
    ExpiredTokenError,
    InvalidTokenError,
    StaleTokenError,
    TokenError,
    TokenModelMismatchError,
    TokenSigner,
    hkdf_sha256,
    parse_signing_secret,
)

KEY_A = b"a" * 32
KEY_B = b"b" * 32
MODEL = "potion-base-8M@256"
B64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def signer(clock: Clock | None = None, **kw) -> TokenSigner:
    return TokenSigner({"k1": KEY_A}, "k1", clock=clock or Clock(), **kw)


def test_hkdf_matches_rfc5869_test_vectors() -> None:
    # RFC 5869 A.1 (basic) and A.3 (zero-length salt and info).
    ikm = bytes.fromhex("0b" * 22)
    okm = hkdf_sha256(
        ikm,
        salt=bytes.fromhex("000102030405060708090a0b0c"),
        info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        length=42,
    )
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )
    assert hkdf_sha256(ikm, salt=b"", info=b"", length=42).hex() == (
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
    )


def test_round_trip_returns_every_field() -> None:
    clock = Clock()
    s = signer(clock, ttl_seconds=600)
    token = s.issue("sess-1", MODEL, 3, [2, 5, "intro"])
    p = s.verify(token, session_id="sess-1", current_window=3, model_id=MODEL)
    assert (p.session_id, p.model_id, p.window, p.residual_ids) == (
        "sess-1",
        MODEL,
        3,
        (2, 5, "intro"),
    )
    assert (p.issued_at, p.expires_at, p.kid) == (1_700_000_000, 1_700_000_600, "k1")
    assert len(p.nonce) == 16
    # Without the optional checks, verify still returns the same payload.
    assert s.verify(token) == p


def _b64json(part: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_payload_is_readable_json_and_nonces_differ() -> None:
    s = signer()
    t1, t2 = s.issue("s", MODEL, 0, []), s.issue("s", MODEL, 0, [])
    header, claims, _ = t1.split(".")
    assert _b64json(header) == {"alg": "HS256", "typ": "JWT", "kid": "k1"}
    body = _b64json(claims)
    assert body["sid"] == "s" and body["mid"] == MODEL and body["w"] == 0 and body["r"] == []
    assert t1 != t2
    assert s.verify(t1).nonce != s.verify(t2).nonce


def test_every_single_character_tamper_is_refused() -> None:
    s = signer()
    token = s.issue("sess-1", MODEL, 2, [1, 2, 3])
    for i, ch in enumerate(token):
        for repl in {B64_ALPHABET[(B64_ALPHABET.find(ch) + 1) % 64], ".", "="}:
            if repl == ch:
                continue
            tampered = token[:i] + repl + token[i + 1 :]
            with pytest.raises(InvalidTokenError):
                s.verify(tampered, session_id="sess-1")
            with pytest.raises(InvalidTokenError):
                s.verify(tampered)
    # Truncation and extension are refused too.
    for bad in (token[:-1], token + "A", token[1:], token + ".x", "", "no-dot-here"):
        with pytest.raises(InvalidTokenError):
            s.verify(bad)


def test_forged_payload_with_valid_layout_is_refused() -> None:
    s = signer()
    token = s.issue("sess-1", MODEL, 2, [1])
    header, claims, sig = token.split(".")
    body = _b64json(claims)
    body["w"] = 7
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidTokenError, match="signature"):
        s.verify(f"{header}.{forged}.{sig}")


def _forge(header: dict, claims: dict, key: bytes = b"") -> str:
    """A token with exactly this header, HMAC-signed by hand (unsigned for alg none), so
    no library adds or fixes a header field."""

    def enc(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = ".".join(enc(json.dumps(d, separators=(",", ":")).encode()) for d in (header, claims))
    if header["alg"] == "none":
        return head + "."
    digest = {"HS256": hashlib.sha256, "HS512": hashlib.sha512}[header["alg"]]
    return f"{head}.{enc(hmac.new(key, head.encode(), digest).digest())}"


def test_stock_jwt_decode_reads_a_token_with_the_derived_key() -> None:
    clock = Clock(now=__import__("time").time())
    s = signer(clock, ttl_seconds=600)
    token = s.issue("sess-9", MODEL, 4, [1, "intro"])
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "typ": "JWT", "kid": "k1"}
    claims = jwt.decode(token, s.session_key("k1", "sess-9"), algorithms=["HS256"])
    assert (claims["sid"], claims["mid"], claims["w"], claims["r"]) == (
        "sess-9", MODEL, 4, [1, "intro"])
    assert claims["exp"] - claims["iat"] == 600 and isinstance(claims["jti"], str)
    # Another session's key, or the master secret itself, does not verify it.
    for wrong in (s.session_key("k1", "sess-8"), KEY_A):
        with pytest.raises(jwt.InvalidSignatureError):
            jwt.decode(token, wrong, algorithms=["HS256"])
    with pytest.raises(InvalidInputError, match="not in the key ring"):
        s.session_key("nope", "sess-9")


def test_other_algorithms_and_extra_header_fields_are_refused() -> None:
    s = signer()
    good = s.issue("s", MODEL, 0, [])
    claims = _b64json(good.split(".")[1])
    key = s.session_key("k1", "s")
    for header in (
        {"alg": "none", "typ": "JWT", "kid": "k1"},
        {"alg": "HS512", "typ": "JWT", "kid": "k1"},
        {"alg": "HS256", "typ": "JWT", "kid": "k1", "jku": "http://example.invalid/"},
        {"alg": "HS256", "kid": "k1"},
    ):
        with pytest.raises(InvalidTokenError, match=r"header|three base64url parts"):
            s.verify(_forge(header, claims, key))
    # The same claims, our header, our key: accepted (the forger is faithful).
    assert s.verify(_forge({"alg": "HS256", "typ": "JWT", "kid": "k1"}, claims, key)).window == 0


@pytest.mark.parametrize("bad", [None, 17, b"abc.def", "a" * 70_000])
def test_non_string_or_huge_token_is_invalid(bad: object) -> None:
    with pytest.raises(InvalidTokenError):
        signer().verify(bad)  # type: ignore[arg-type]


def test_expired_token_is_refused_at_exactly_expiry() -> None:
    clock = Clock()
    s = signer(clock, ttl_seconds=60)
    token = s.issue("s", MODEL, 0, [])
    clock.now += 59.5
    assert s.verify(token).window == 0
    clock.now += 0.5
    with pytest.raises(ExpiredTokenError) as err:
        s.verify(token)
    assert err.value.http_status == 401
    assert err.value.expired_at == 1_700_000_060


def test_replayed_token_of_an_earlier_window_is_stale() -> None:
    s = signer()
    old = s.issue("s", MODEL, 1, [1, 2])
    new = s.issue("s", MODEL, 2, [2])
    assert s.verify(new, current_window=2).window == 2
    with pytest.raises(StaleTokenError) as err:
        s.verify(old, current_window=2)
    assert err.value.http_status == 409
    assert (err.value.token_window, err.value.current_window) == (1, 2)
    assert "replayed" in str(err.value)
    with pytest.raises(StaleTokenError, match="ahead"):
        s.verify(new, current_window=1)


def test_model_mismatch_names_both_ids() -> None:
    s = signer()
    token = s.issue("s", "model-one", 0, [])
    with pytest.raises(TokenModelMismatchError) as err:
        s.verify(token, model_id="model-two")
    e = err.value
    assert isinstance(e, EmbeddingModelMismatchError) and isinstance(e, TokenError)
    assert e.http_status == 409
    assert (e.expected, e.got) == ("model-two", "model-one")
    assert "'model-one'" in str(e) and "'model-two'" in str(e)


def test_error_hierarchy_and_statuses() -> None:
    for cls, status in [
        (InvalidTokenError, 401),
        (ExpiredTokenError, 401),
        (StaleTokenError, 409),
        (TokenModelMismatchError, 409),
    ]:
        assert issubclass(cls, TokenError) and issubclass(cls, CdrError)
        assert cls.http_status == status


def test_rotation_old_key_verifies_while_in_ring_then_fails() -> None:
    clock = Clock()
    old_signer = TokenSigner({"old": KEY_A}, "old", clock=clock)
    token = old_signer.issue("s", MODEL, 4, [9])
    rotated = TokenSigner({"new": KEY_B, "old": KEY_A}, "new", clock=clock)
    assert rotated.verify(token, session_id="s").kid == "old"
    assert rotated.verify(rotated.issue("s", MODEL, 4, [9])).kid == "new"
    retired = TokenSigner({"new": KEY_B}, "new", clock=clock)
    with pytest.raises(InvalidTokenError, match="'old'"):
        retired.verify(token)
    # Same kid, different secret: the signature check catches it.
    swapped = TokenSigner({"old": KEY_B}, "old", clock=clock)
    with pytest.raises(InvalidTokenError, match="signature"):
        swapped.verify(token)


def test_token_of_session_a_does_not_verify_as_session_b() -> None:
    s = signer()
    token_a = s.issue("session-a", MODEL, 0, [])
    assert s.verify(token_a, session_id="session-a").session_id == "session-a"
    with pytest.raises(InvalidTokenError):
        s.verify(token_a, session_id="session-b")


def test_per_session_keys_differ() -> None:
    # Same payload fields signed for two sessions use different MAC keys: swapping the
    # signature of one token onto another session's payload is refused.
    s = signer()
    a, b = s.issue("a", MODEL, 0, []), s.issue("b", MODEL, 0, [])
    with pytest.raises(InvalidTokenError):
        s.verify(a.rsplit(".", 1)[0] + "." + b.rsplit(".", 1)[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": {}, "active_kid": "k"}, "at least one key"),
        ({"keys": {"k": KEY_A}, "active_kid": "x"}, "'x' is not in the key ring"),
        ({"keys": {"bad kid": KEY_A}, "active_kid": "bad kid"}, "key id"),
        ({"keys": {"k": b""}, "active_kid": "k"}, "non-empty bytes"),
        ({"keys": {"k": KEY_A}, "active_kid": "k", "ttl_seconds": 0}, "ttl_seconds"),
    ],
)
def test_signer_rejects_bad_configuration(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        TokenSigner(**kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", MODEL, 0, []), "session_id"),
        (("s", "", 0, []), "model_id"),
        (("s", MODEL, -1, []), "window"),
        (("s", MODEL, True, []), "window"),
        (("s", MODEL, 0, [1.5]), "residual_ids"),
    ],
)
def test_issue_rejects_bad_fields(args: tuple, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        signer().issue(*args)


def test_parse_single_secret_and_ring() -> None:
    secret = "s3cret-s3cret-s3cret"
    assert parse_signing_secret(secret) == ({DEFAULT_KID: secret.encode()}, DEFAULT_KID)
    keys, active = parse_signing_secret(f" k2:{'x' * 20} , k1:{'y' * 20}")
    assert active == "k2"
    assert keys == {"k2": b"x" * 20, "k1": b"y" * 20}
    assert list(keys) == ["k2", "k1"]
    # A secret with characters outside the kid alphabet before ':' stays one secret.
    odd = "p@ss:word-long-enough-here"
    assert parse_signing_secret(odd) == ({DEFAULT_KID: odd.encode()}, DEFAULT_KID)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty"),
        ("short", "at least 16"),
        (f"k1:{'x' * 20},k1:{'y' * 20}", "twice"),
        (f"k1:{'x' * 20},nocolon", "kid:secret"),
        (f"k1:{'x' * 20},k2:short", "'k2' is 5 characters"),
    ],
)
def test_parse_rejects_bad_secrets(value: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_signing_secret(value)


def test_from_secret_ring_rotates() -> None:
    clock = Clock()
    old = TokenSigner.from_secret(f"k1:{'x' * 20}", clock=clock)
    token = old.issue("s", MODEL, 0, [])
    new = TokenSigner.from_secret(f"k2:{'z' * 20},k1:{'x' * 20}", clock=clock)
    assert new.active_kid == "k2" and new.kids == ("k2", "k1")
    assert new.verify(token).kid == "k1"


ids = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=12))


@settings(max_examples=200, deadline=None)
@given(
    session_id=st.text(min_size=1, max_size=40),
    model_id=st.text(min_size=1, max_size=40),
    window=st.integers(0, 10_000),
    residual=st.lists(ids, max_size=30),
    ttl=st.integers(1, 10**7),
    now=st.floats(0, 4e9, allow_nan=False),
)
def test_property_round_trip_and_signature_binding(
    session_id: str, model_id: str, window: int, residual: list, ttl: int, now: float
) -> None:
    clock = Clock(now)
    s = TokenSigner({"k1": KEY_A, "k0": KEY_B}, "k1", ttl_seconds=ttl, clock=clock)
    token = s.issue(session_id, model_id, window, residual)
    p = s.verify(token, session_id=session_id, current_window=window, model_id=model_id)
    assert (p.session_id, p.model_id, p.window) == (session_id, model_id, window)
    assert list(p.residual_ids) == residual
    assert p.expires_at - p.issued_at == ttl and p.issued_at == int(now)
    with pytest.raises(InvalidTokenError):
        s.verify(token, session_id=session_id + "x")
    clock.now = p.expires_at
    with pytest.raises(ExpiredTokenError):
        s.verify(token)
