"""Gateway configuration from `CDR_*` environment variables and an optional env file.

Precedence (highest first): keyword arguments, environment, the env file named by
`CDR_CONFIG` (else `./.env` when present), field defaults. Secrets are `SecretStr` so they
never appear in a repr, a log line or a traceback.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, PrivateAttr, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from cdr import settings as cdr_settings
from cdr.errors import InvalidInputError
from cdr.gateway.auth import KeyConfigError, KeyRing, parse_api_keys, weak_secret_reason
from cdr.gateway.session_store import SessionStore, SQLiteSessionStore
from cdr.gateway.session_store_postgres import is_postgres_url
from cdr.gateway.session_token import DEFAULT_KID, TokenSigner, parse_signing_secret
from cdr.writers import DEFAULT_WRITER, WriterName, needs_model

__all__ = ["DEFAULT_KB", "GatewayConfigError", "GatewaySettings", "load_settings",
           "parse_kb_specs", "read_kb_config"]

SESSION_DB_NAME = "sessions.sqlite3"
DEFAULT_KB = "default"  # the name of `--ckf` / `CDR_CKF`, served by the un-named routes


class GatewayConfigError(InvalidInputError):
    """The gateway cannot serve with this configuration; the message names the variable."""


class PostgresUrl(str):
    """`CDR_SESSION_DB` when it is a postgresql:// URL (kept verbatim, never a Path)."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        def check(value: Any) -> PostgresUrl:
            if isinstance(value, str) and is_postgres_url(value):
                return cls(value)
            raise ValueError("not a postgresql:// URL")

        return core_schema.no_info_plain_validator_function(check)


class RayIndexUrl(str):
    """`CDR_CKF` when it is a `ray://HOST:PORT/ABS_PATH` address, as checked by the one
    parser (`cdr.cluster.ray_index.parse_address`); the settings then hold its directory in `ckf`
    and the address in `ray_address`."""


def _ckf_location(value: Any) -> Path | None:
    """A ray:// string is an address or an error, never a relative directory named 'ray:';
    anything else is a path."""
    from cdr.cluster.ray_index import is_ray_address, parse_address

    if value is None:
        return None
    if isinstance(value, str) and is_ray_address(value):
        try:
            return RayIndexUrl(str(parse_address(value)))  # type: ignore[return-value]
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise ValueError(f"want a directory or a ray:// address, not {type(value).__name__}")


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CDR_",
        env_file=".env",
        env_file_encoding="utf-8",
        env_ignore_empty=True,  # `CDR_CKF=` means unset, not Path("") == the cwd
        extra="ignore",
    )

    # A CKF directory, or a shard set served by Ray (`ray://HOST:PORT/ABS_PATH`).
    ckf: Annotated[Path | None, PlainValidator(_ckf_location)] = None
    writer: WriterName = DEFAULT_WRITER  # the registry's names (cdr.writers)
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    signing_secret: SecretStr | None = None
    dev: bool = False
    # Swagger UI at /docs and ReDoc at /redoc (scripts from a CDN, under a strict CSP): off
    # unless asked for, since they run third-party code on the gateway's origin.
    api_docs: bool = False
    # More knowledge bases, by name: `name=path,name=ray://...` (`cdr serve --kb NAME=PATH`),
    # and a TOML file with a [kbs] table of name = "path" (`--kb-config`).
    kbs: str | None = None
    kb_config: Path | None = None
    # A file path (SQLite) or a postgresql:// URL (shared by gateway replicas).
    session_db: PostgresUrl | Path | None = None
    # NORMAL survives process crashes; FULL also power cuts, at one fsync per session write.
    session_db_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    token_ttl_seconds: int = Field(3600, gt=0)
    max_body_bytes: int = Field(10_000_000, gt=0)
    max_windows_cap: int = Field(20, ge=1)
    min_relevance: float | None = Field(None, ge=-1.0, le=1.0)
    # `scope:key` entries (see cdr.gateway.auth); required unless CDR_DEV=1.
    api_keys: SecretStr | None = None
    # Deadline for a request's headers, and for its whole body once the headers are in.
    read_timeout_seconds: float = Field(15.0, gt=0, le=3600)
    # How long an idle keep-alive connection stays open. Longer than the 5 s that httpx (and
    # so the `openai` package) keeps an idle connection: when both sides use 5 s, a busy
    # server closes the socket just as the client reuses it, and the client's POST fails with
    # "connection reset by peer" (seen in the 50-session concurrency test under load).
    keepalive_seconds: float = Field(30.0, gt=0, le=3600)
    # Request line plus headers; larger is answered 431.
    max_header_bytes: int = Field(32_768, ge=1024, le=1 << 20)
    # `--ckf ray://...`: how long a request waits for a dead shard actor to come back
    # before it fails with a 503 naming the shard.
    ray_retry_seconds: float = Field(60.0, gt=0, le=3600)
    # An upload job's lease: a replica killed mid-job has its jobs marked failed this long
    # after its last renewal (renewed every third of it).
    job_lease_seconds: float = Field(30.0, ge=1, le=3600)
    # Facts per committed batch of an upload job (what a killed replica can lose at most).
    upload_commit_facts: int = Field(256, ge=1, le=100_000)
    # Admission of chat completion runs (cdr.gateway.admission): `chat_threads` write at once,
    # past them `max_waiting_runs` may wait, past that a 503 with Retry-After; one key may have
    # `max_runs_per_key` admitted, past that a 429.
    chat_threads: int = Field(64, ge=1, le=4096)
    max_waiting_runs: int = Field(64, ge=0, le=100_000)
    max_runs_per_key: int = Field(32, ge=1, le=100_000)
    # A stream resumed with Last-Event-ID waits this long for the run it takes over to store
    # its window (cdr.gateway.stream_resume).
    resume_wait_seconds: float = Field(60.0, ge=0, le=3600)

    _dev_secret: str | None = PrivateAttr(default=None)
    _ray_address: str | None = PrivateAttr(default=None)

    def __init__(self, **values: Any) -> None:
        """`CDR_CONFIG` names the env file; a named file that does not exist is an error
        rather than silently ignored (a typo would otherwise serve with defaults)."""
        if "_env_file" not in values and (config := cdr_settings.env("CDR_CONFIG")):
            if not Path(config).is_file():
                raise GatewayConfigError(f"CDR_CONFIG names {config!r}, which is not a file")
            values["_env_file"] = config
        super().__init__(**values)

    @model_validator(mode="after")
    def _default_session_db(self) -> GatewaySettings:
        """Sessions live beside the CKF so one directory is the whole deployment's state; in
        dev without a CKF, a fresh temp path (sessions then end with the process's tmp).
        A Ray address leaves its shard-set directory in `ckf` (what every path default and
        check below wants) and itself in `ray_address`."""
        if isinstance(self.ckf, RayIndexUrl):
            from cdr.cluster.ray_index import parse_address

            self._ray_address = str(self.ckf)
            self.ckf = parse_address(self._ray_address).path
        if self.session_db is None:
            first = next((p for p in self.named_kbs().values() if not is_index_address(p)),
                         None) if self.ckf is None and (self.kbs or self.kb_config) else None
            if self.ckf is not None:
                self.session_db = self.ckf / SESSION_DB_NAME
            elif first is not None:  # one store for every KB, beside the first local one
                self.session_db = Path(first) / SESSION_DB_NAME
            elif self.dev:
                name = f"cdr-sessions-{os.getpid()}-{uuid.uuid4().hex[:12]}.sqlite3"
                self.session_db = Path(tempfile.gettempdir()) / name
        return self

    def named_kbs(self) -> dict[str, str]:
        """Every knowledge base by name, in order: `default` (`CDR_CKF` / `--ckf`), then
        `CDR_KBS` (`--kb`), then the `--kb-config` file. A name given twice is an error."""
        out: dict[str, str] = {}
        sources: list[tuple[str, dict[str, str]]] = []
        if self.ckf is not None:
            sources.append(("CDR_CKF", {DEFAULT_KB: self._ray_address or str(self.ckf)}))
        if self.kbs:
            sources.append(("CDR_KBS", parse_kb_specs(self.kbs.split(","), "CDR_KBS")))
        if self.kb_config is not None:
            sources.append((str(self.kb_config), read_kb_config(self.kb_config)))
        for where, kbs in sources:
            for name, path in kbs.items():
                if name in out:
                    raise GatewayConfigError(f"knowledge base {name!r} is given twice (again in "
                                             f"{where}); each name names one KB")
                out[name] = path
        return out

    @property
    def ray_address(self) -> str | None:
        """`ray://HOST:PORT/ABS_PATH` when `CDR_CKF` (or `--ckf`) named a Ray-served shard
        set, else None (a local CKF directory)."""
        return self._ray_address

    def validate_for_serving(self) -> GatewaySettings:
        """Refuse to serve on a configuration that would be insecure or fail at first use."""
        if self.signing_secret is None or not self.signing_secret.get_secret_value().strip():
            if not self.dev:
                raise GatewayConfigError(
                    "CDR_SIGNING_SECRET is not set: the gateway signs session tokens with it. "
                    "Set it (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
                    ", or a rotation ring 'kid1:secret1,kid2:secret2'), or set CDR_DEV=1 for "
                    "a throwaway per-process secret"
                )
        else:
            try:
                ring, _ = parse_signing_secret(self.signing_secret.get_secret_value())
            except InvalidInputError as exc:
                raise GatewayConfigError(str(exc)) from exc
            for kid, secret in ring.items():
                reason = weak_secret_reason(secret.decode("utf-8", "replace"))
                if reason is not None:
                    raise GatewayConfigError(f"CDR_SIGNING_SECRET (key {kid!r}) {reason}")
        self.key_ring()  # raises on a bad CDR_API_KEYS, or on none outside dev mode
        if self.session_db is None:
            raise GatewayConfigError(
                "no session store: set CDR_CKF (sessions go to <ckf>/sessions.sqlite3) or "
                "CDR_SESSION_DB"
            )
        if needs_model(self.writer) and not self.llm_model:
            raise GatewayConfigError(
                f"CDR_WRITER={self.writer} needs CDR_LLM_MODEL (the upstream model name)"
            )
        if self.ckf is not None and self.ckf.exists() and not self.ckf.is_dir():
            raise GatewayConfigError(f"CDR_CKF={self.ckf} exists but is not a directory")
        return self

    def key_ring(self) -> KeyRing | None:
        """The API keys; None means no authentication, which only dev mode allows."""
        raw = self.api_keys.get_secret_value() if self.api_keys is not None else ""
        if not raw.strip():
            if self.dev:
                return None
            raise GatewayConfigError(
                "CDR_API_KEYS is not set: outside dev mode every call needs an API key. Run "
                "`cdr keygen --scope admin` and set CDR_API_KEYS to the entry it prints, or "
                "set CDR_DEV=1 for an unauthenticated gateway on loopback only")
        try:
            return KeyRing(parse_api_keys(raw))
        except KeyConfigError as exc:
            raise GatewayConfigError(str(exc)) from None

    def signing_ring(self) -> tuple[dict[str, bytes], str]:
        """The key ring and active key id; in dev without a secret, a random one made once
        per settings object (tokens then die with the process)."""
        if self.signing_secret is not None and self.signing_secret.get_secret_value().strip():
            return parse_signing_secret(self.signing_secret.get_secret_value())
        if not self.dev:
            raise GatewayConfigError("CDR_SIGNING_SECRET is not set and CDR_DEV is off")
        if self._dev_secret is None:
            self._dev_secret = secrets.token_urlsafe(32)
        return {DEFAULT_KID: self._dev_secret.encode()}, DEFAULT_KID

    def token_signer(self, **kwargs: Any) -> TokenSigner:
        keys, active = self.signing_ring()
        return TokenSigner(keys, active, ttl_seconds=self.token_ttl_seconds, **kwargs)

    def session_store(self) -> SessionStore:
        """Open the configured session store (call after `validate_for_serving`): PostgreSQL
        for a postgresql:// URL, else the SQLite file."""
        if self.session_db is None:
            raise GatewayConfigError("no session store: set CDR_CKF or CDR_SESSION_DB")
        if isinstance(self.session_db, PostgresUrl):
            from cdr.gateway.session_store_postgres import PostgresSessionStore

            return PostgresSessionStore(str(self.session_db))
        return SQLiteSessionStore(self.session_db, synchronous=self.session_db_synchronous)


def is_ray_address(value: str) -> bool:
    from cdr.cluster.ray_index import is_ray_address as check

    return check(value)


def is_index_address(value: str) -> bool:
    """A knowledge base named by an address, not a local directory: a Ray-served shard set
    or an external store's collection (`cdr.stores`)."""
    from cdr.stores.qdrant import is_qdrant_address

    return is_ray_address(value) or is_qdrant_address(value)


def _check_kb_name(name: str, where: str) -> str:
    from cdr.gateway.auth import KB_NAME

    if not KB_NAME.match(name):
        raise GatewayConfigError(f"{where}: {name!r} is not a knowledge base name (1-64 "
                                 "letters, digits, '_', '.' or '-', starting with a letter or "
                                 "digit)")
    return name


def parse_kb_specs(specs: list[str], where: str = "--kb") -> dict[str, str]:
    """`NAME=PATH` items (PATH a CKF directory, `ray://HOST:PORT/ABS_PATH` or a
    `qdrant:` collection address) → {name: path}."""
    out: dict[str, str] = {}
    for spec in (s.strip() for s in specs):
        if not spec:
            continue
        name, sep, path = spec.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not path:
            raise GatewayConfigError(f"{where} {spec[:80]!r}: give NAME=PATH (a CKF directory, "
                                     "ray://HOST:PORT/ABS_PATH or qdrant:PATH?collection=NAME)")
        _check_kb_name(name, where)
        if name in out:
            raise GatewayConfigError(f"{where}: knowledge base {name!r} is given twice")
        out[name] = path
    return out


def read_kb_config(path: Path) -> dict[str, str]:
    """The `[kbs]` table of a TOML file: `name = "path"`; relative paths are relative to the
    file's directory (so a config and its KBs move together)."""
    import tomllib

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GatewayConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GatewayConfigError(f"{path} is not TOML: {' '.join(str(exc).split())}") from None
    table = data.get("kbs")
    if not isinstance(table, dict):
        raise GatewayConfigError(f"{path} needs a [kbs] table of name = \"path\" lines")
    out: dict[str, str] = {}
    for name, value in table.items():
        _check_kb_name(name, str(path))
        if not isinstance(value, str) or not value.strip():
            raise GatewayConfigError(f"{path}: kbs.{name} must be a path, a ray:// or a "
                                     "qdrant: address (a string)")
        value = value.strip()
        out[name] = value if is_index_address(value) else str(path.parent / value)
    return out


def load_settings(**overrides: Any) -> GatewaySettings:
    """`GatewaySettings` from the environment, with a bad value reported as one
    `GatewayConfigError` line naming the variable (not pydantic's multi-line report)."""
    try:
        return GatewaySettings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first.get("loc") else ""
        name = f"CDR_{field.upper()}" if field else "configuration"
        value = cdr_settings.env(name) if field else None
        # Never echo a value that may hold a credential (keys, secrets, a database URL).
        # CDR_CKF too: its parser names the problem, and an address may hold one by mistake.
        private = any(w in field for w in ("secret", "key", "db", "url", "ckf"))
        shown = "" if value is None or private else f"={value!r}"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise GatewayConfigError(f"{name}{shown}: {msg}{more}") from None
