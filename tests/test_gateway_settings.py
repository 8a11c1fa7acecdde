"""Gateway settings: environment, env files, defaults, and the refusal to serve unsigned."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from cdr.gateway.auth import hash_key
from cdr.gateway.session_token import InvalidTokenError
from cdr.gateway.settings import GatewayConfigError, GatewaySettings, load_settings

SECRET = "0123456789abcdef-secret"
KEYS = "admin:" + hash_key("cdr_Xq3vT9LmP2wR8sK4nB7yH1cJ6dF0gA5e")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("CDR_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray ./.env
    return tmp_path


def test_defaults() -> None:
    s = GatewaySettings()
    assert (s.ckf, s.writer, s.dev, s.signing_secret, s.session_db) == (
        None,
        "extractive",
        False,
        None,
        None,
    )
    assert (s.token_ttl_seconds, s.max_body_bytes, s.max_windows_cap, s.min_relevance) == (
        3600,
        10_000_000,
        20,
        None,
    )


def test_environment_is_read_and_secrets_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_CKF", "/data/ckf")
    monkeypatch.setenv("CDR_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("CDR_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("CDR_WRITER", "openai")
    monkeypatch.setenv("CDR_LLM_MODEL", "gpt-x")
    monkeypatch.setenv("CDR_MAX_WINDOWS_CAP", "5")
    monkeypatch.setenv("CDR_MIN_RELEVANCE", "0.3")
    monkeypatch.setenv("CDR_DEV", "1")
    s = GatewaySettings()
    assert s.ckf == Path("/data/ckf")
    assert s.session_db == Path("/data/ckf/sessions.sqlite3")
    assert (s.writer, s.llm_model, s.max_windows_cap, s.min_relevance, s.dev) == (
        "openai",
        "gpt-x",
        5,
        0.3,
        True,
    )
    assert s.llm_api_key is not None and s.llm_api_key.get_secret_value() == "sk-very-secret"
    assert SECRET not in repr(s) and "sk-very-secret" not in repr(s)


def test_config_file_then_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.env"
    cfg.write_text(f"CDR_SIGNING_SECRET={SECRET}\nCDR_TOKEN_TTL_SECONDS=120\nOTHER=1\n")
    monkeypatch.setenv("CDR_CONFIG", str(cfg))
    s = GatewaySettings()
    assert s.token_ttl_seconds == 120
    assert s.signing_secret is not None and s.signing_secret.get_secret_value() == SECRET
    monkeypatch.setenv("CDR_TOKEN_TTL_SECONDS", "60")
    assert GatewaySettings().token_ttl_seconds == 60


def test_dotenv_in_cwd_is_read(clean_env: Path) -> None:
    (clean_env / ".env").write_text("CDR_MAX_BODY_BYTES=1234\n")
    assert GatewaySettings().max_body_bytes == 1234


def test_missing_config_file_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_CONFIG", "/nonexistent/gateway.env")
    with pytest.raises(GatewayConfigError, match="CDR_CONFIG"):
        GatewaySettings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CDR_WRITER", "bogus"),
        ("CDR_TOKEN_TTL_SECONDS", "0"),
        ("CDR_MAX_WINDOWS_CAP", "0"),
        ("CDR_MIN_RELEVANCE", "2"),
        ("CDR_MAX_BODY_BYTES", "lots"),
    ],
)
def test_bad_values_are_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("CDR_").lower()):
        GatewaySettings()


def test_empty_env_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDR_CKF", "")
    assert GatewaySettings().ckf is None


def test_serving_without_secret_is_refused_outside_dev(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="CDR_SIGNING_SECRET is not set"):
        GatewaySettings(ckf=tmp_path).validate_for_serving()
    with pytest.raises(GatewayConfigError, match="at least 16"):
        GatewaySettings(ckf=tmp_path, signing_secret="short").validate_for_serving()
    with pytest.raises(GatewayConfigError, match="CDR_API_KEYS is not set"):
        GatewaySettings(ckf=tmp_path, signing_secret=SECRET).validate_for_serving()
    ok = GatewaySettings(ckf=tmp_path, signing_secret=SECRET,
                         api_keys=KEYS).validate_for_serving()
    assert ok.session_db == tmp_path / "sessions.sqlite3"
    assert [k.scope for k in ok.key_ring().keys] == ["admin"]


@pytest.mark.parametrize("secret", ["aaaaaaaaaaaaaaaa", "abcabcabcabcabcabcab",
                                    "abababababababababababababababab"])
def test_weak_signing_secrets_are_refused(tmp_path: Path, secret: str) -> None:
    with pytest.raises(GatewayConfigError, match=r"CDR_SIGNING_SECRET .*guessable"):
        GatewaySettings(ckf=tmp_path, signing_secret=secret,
                        api_keys=KEYS).validate_for_serving()


@pytest.mark.parametrize("keys,match", [
    ("", "CDR_API_KEYS is not set"),
    ("root:sha256:" + "0" * 64, "scope one of generate, admin"),
    ("admin", "scope:key"),
    ("admin:sha256:abc", "64 hex digits"),
    ("generate:short", "at least 24"),
    ("generate:" + "ab" * 20, "guessable"),
])
def test_bad_api_keys_are_refused(tmp_path: Path, keys: str, match: str) -> None:
    with pytest.raises(GatewayConfigError, match=match):
        GatewaySettings(ckf=tmp_path, signing_secret=SECRET,
                        api_keys=keys or None).validate_for_serving()


def test_plain_keys_are_hashed_on_load(tmp_path: Path) -> None:
    plain = "cdr_Zr8pQ2mW5tY1uI7oL3kJ9hG4fD6sA0xC"
    s = GatewaySettings(ckf=tmp_path, signing_secret=SECRET,
                        api_keys=f"generate:{plain}, {KEYS}").validate_for_serving()
    ring = s.key_ring()
    assert ring is not None
    found = ring.find(plain)
    assert found is not None and found.scope == "generate"
    assert found.digest.hex() == hash_key(plain).removeprefix("sha256:")
    assert ring.find("cdr_Xq3vT9LmP2wR8sK4nB7yH1cJ6dF0gA5e").scope == "admin"
    assert ring.find(plain + "x") is None


def test_dev_mode_needs_no_keys(tmp_path: Path) -> None:
    assert GatewaySettings(dev=True).validate_for_serving().key_ring() is None


@pytest.mark.parametrize("name,value", [("CDR_TOKEN_TTL_SECONDS", "0"),
                                        ("CDR_TOKEN_TTL_SECONDS", "abc"),
                                        ("CDR_MAX_BODY_BYTES", "0"),
                                        ("CDR_READ_TIMEOUT_SECONDS", "-1")])
def test_load_settings_reports_one_line(monkeypatch: pytest.MonkeyPatch, name: str,
                                        value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(GatewayConfigError) as info:
        load_settings()
    text = str(info.value)
    assert text.startswith(f"{name}={value!r}: ") and "\n" not in text


def test_other_serving_checks(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="CDR_SESSION_DB"):
        GatewaySettings(signing_secret=SECRET, api_keys=KEYS).validate_for_serving()
    with pytest.raises(GatewayConfigError, match="CDR_LLM_MODEL"):
        GatewaySettings(
            ckf=tmp_path, signing_secret=SECRET, writer="anthropic", api_keys=KEYS
        ).validate_for_serving()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(GatewayConfigError, match="not a directory"):
        GatewaySettings(ckf=a_file, signing_secret=SECRET,
                        api_keys=KEYS).validate_for_serving()


def test_dev_mode_gets_temp_db_and_a_stable_throwaway_key() -> None:
    s = GatewaySettings(dev=True).validate_for_serving()
    assert s.session_db is not None and s.session_db.name.endswith(".sqlite3")
    assert s.session_db.parent == Path(tempfile.gettempdir())
    signer = s.token_signer()
    token = signer.issue("sess", "model", 0, [])
    assert s.token_signer().verify(token).session_id == "sess"
    with pytest.raises(InvalidTokenError):
        GatewaySettings(dev=True).token_signer().verify(token)


def test_token_signer_uses_ring_and_ttl() -> None:
    s = GatewaySettings(signing_secret=f"new:{'n' * 20},old:{'o' * 20}", token_ttl_seconds=90)
    signer = s.token_signer(clock=lambda: 1000.0)
    assert signer.kids == ("new", "old") and signer.active_kid == "new"
    p = signer.verify(signer.issue("s", "m", 0, []))
    assert (p.kid, p.expires_at - p.issued_at) == ("new", 90)
    with pytest.raises(GatewayConfigError):
        GatewaySettings().token_signer()


def test_session_store_opens_configured_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CDR_SESSION_DB", str(tmp_path / "db" / "s.sqlite3"))
    monkeypatch.setenv("CDR_SESSION_DB_SYNCHRONOUS", "FULL")
    store = GatewaySettings().session_store()
    try:
        store.create("a", "{}")
        assert store._connect().execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
    finally:
        store.close()
    assert (tmp_path / "db" / "s.sqlite3").is_file()
    with pytest.raises(GatewayConfigError):
        GatewaySettings(session_db=None).session_store()
