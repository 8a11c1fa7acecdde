"""What a service needs around the API: a request id and one log record per request, JSON
logs, per-key rate limits, and a readiness probe.

* `RequestLogMiddleware` (outermost): takes the path out of `--root-path`'s prefix, takes the
  client's `X-Request-ID` when it is a plain token (else makes one), echoes it on the
  response, and logs one record per request on the `cdr.request` logger: id, method, path,
  status, duration, key id, client. Never the query, the headers or the body: they are
  where keys travel (a hostile test sends keys in all three and greps the log).
* `JsonFormatter`: one JSON object per log line (`cdr serve --log-format json`), messages
  passed through `cdr.gateway.redact` so a secret quoted in an error is masked.
* `RateLimitMiddleware` (inside the key check): `CDR_RATE_LIMITS="generate=60/minute;
  admin=600/minute"`, per scope, counted per key (per client address in dev mode, where
  there are no keys) by the `limits` library's moving window. Over the limit: 429 with
  `Retry-After`. Counters live in the process (`memory://`) unless `CDR_RATE_LIMIT_STORAGE`
  names shared storage (`redis://...`, which `limits` supports), so replicas share them.
* `readiness`: `/readyz` is 200 only when every knowledge base has a snapshot and answers a
  query, and the session store answers a read; else 503 naming what failed.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cdr import settings as cdr_settings
from cdr.gateway.redact import is_bind_line, redact
from cdr.gateway.settings import GatewayConfigError

__all__ = ["REQUEST_ID_HEADER", "JsonFormatter", "RateLimitMiddleware", "RequestLogMiddleware",
           "load_rate_limits", "log_config", "readiness", "too_many_requests"]

REQUEST_ID_HEADER = "X-Request-ID"
REQUEST_LOGGER = "cdr.request"
_SAFE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_RECORD_FIELDS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "color_message"}

log = logging.getLogger(REQUEST_LOGGER)


class GatewayOpsError(GatewayConfigError):
    """A bad `CDR_RATE_LIMITS` or log setting: one line naming the variable."""


# ----------------------------------------------------------------------------- logging


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message (secrets masked), and any
    extra fields the record carries (the request log's id, path, status...)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(message := record.getMessage(),
                              keep_addresses=is_bind_line(record.name, message)),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                out[key] = value if isinstance(value, int | float | bool | None) else redact(
                    str(value))
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The plain format, with messages masked like the JSON one."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record),
                      keep_addresses=is_bind_line(record.name, record.getMessage()))


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def log_config(level: str = "info", fmt: str = "text") -> dict[str, Any]:
    """A `logging.config.dictConfig` for the gateway and uvicorn (given to `uvicorn.run`, so
    every worker process sets it up the same way). In JSON mode uvicorn's access log is off:
    the request log replaces it, one object per request."""
    if fmt not in LOG_FORMATS:
        raise GatewayOpsError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, "
                              f"got {fmt!r}")
    if level.lower() not in LOG_LEVELS:
        raise GatewayOpsError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, "
                              f"got {level!r}")
    formatter = ({"()": f"{__name__}.JsonFormatter"} if fmt == "json" else
                 {"()": f"{__name__}.TextFormatter",
                  "format": "%(levelname)s %(name)s: %(message)s"})
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": formatter},
        "handlers": {"main": {"class": "logging.StreamHandler", "formatter": "main",
                              "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["main"], "level": lvl},
        "loggers": {
            "uvicorn": {"level": lvl, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": lvl, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING" if fmt == "json" else lvl, "handlers": [],
                               "propagate": True},
        },
    }


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            out: str | None = value.decode("latin-1")
            return out
    return None


class RequestLogMiddleware:
    """Request id in, request id out, one log record per request (see the module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root = scope.get("root_path") or ""
        if root and (scope["path"] == root or scope["path"].startswith(root + "/")):
            # uvicorn's --root-path puts the prefix in front of the path; the key check and
            # the open paths (/healthz, /readyz) must see the path the routes are named by.
            scope["path"] = scope["path"][len(root):] or "/"
        given = _header(scope, b"x-request-id")
        rid = given if given and _SAFE_ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        start = time.perf_counter()
        status = 500
        sent = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"],
                                      (REQUEST_ID_HEADER.lower().encode(), rid.encode())]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            key = scope.get("state", {}).get("api_key")
            client = scope.get("client")
            log.info("%s %s %d", scope.get("method", ""), scope.get("path", ""), status,
                     extra={"request_id": rid, "method": scope.get("method", ""),
                            "path": scope.get("path", ""), "status": status,
                            "duration_ms": round((time.perf_counter() - start) * 1000, 1),
                            "bytes": sent, "key_id": getattr(key, "id", None),
                            "scope": getattr(key, "scope", None),
                            "client": client[0] if client else None})


# ----------------------------------------------------------------------------- workers


def worker_environment(settings: Any, overrides: dict[str, Any]) -> dict[str, str]:
    """What `cdr serve --workers N` hands its worker processes, which build the app from the
    environment: the command line's KBs, the session store the parent resolved (so every
    worker shares one), and one signing secret (dev mode would otherwise draw one per
    process, and a token from one worker would fail on the next)."""
    import secrets

    env: dict[str, str] = {}
    for key, var in (("ckf", "CDR_CKF"), ("kbs", "CDR_KBS"), ("kb_config", "CDR_KB_CONFIG")):
        if overrides.get(key) is not None:
            env[var] = str(overrides[key])
    if settings.session_db is not None:
        env["CDR_SESSION_DB"] = str(settings.session_db)
    if settings.signing_secret is None or not settings.signing_secret.get_secret_value():
        env["CDR_SIGNING_SECRET"] = secrets.token_urlsafe(32)
    env["CDR_READ_TIMEOUT_SECONDS"] = str(settings.read_timeout_seconds)
    return env


def __getattr__(name: str) -> Any:
    """`WorkerH11Protocol`: the guarded HTTP protocol (`cdr.gateway.protocol`) for worker
    processes, which uvicorn imports by name; its header deadline comes from the environment
    `worker_environment` set."""
    if name == "WorkerH11Protocol":
        from cdr.gateway.protocol import guarded_h11

        return guarded_h11(float(cdr_settings.env("CDR_READ_TIMEOUT_SECONDS", "15")))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- rate limits


@dataclass(frozen=True)
class RateLimits:
    """Per-scope limits (`limits` items) and the limiter that counts them."""

    per_scope: dict[str, Any]
    limiter: Any

    def hit(self, scope_name: str, who: str) -> float | None:
        """None when allowed, else the seconds until the window has room again."""
        item = self.per_scope.get(scope_name)
        if item is None:
            return None
        if self.limiter.hit(item, scope_name, who):
            return None
        stats = self.limiter.get_window_stats(item, scope_name, who)
        out: float | None = max(1.0, stats.reset_time - time.time())
        return out


def load_rate_limits(env: dict[str, str] | None = None) -> RateLimits | None:
    """`CDR_RATE_LIMITS` parsed (None when unset): `scope=N/period[;scope=N/period]`, scopes
    `generate`, `admin` and `dev` (dev mode's callers), periods as `limits` writes them
    (`60/minute`, `10/second`, `1000/hour`)."""
    from limits import parse
    from limits.storage import storage_from_string
    from limits.strategies import MovingWindowRateLimiter

    from cdr.gateway.auth import SCOPES

    env = cdr_settings.environment() if env is None else env
    raw = env.get("CDR_RATE_LIMITS", "").strip()
    if not raw:
        return None
    per_scope: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in raw.split(";"))):
        name, sep, spec = part.partition("=")
        name = name.strip()
        if not sep or name not in (*SCOPES, "dev"):
            raise GatewayOpsError(
                f"CDR_RATE_LIMITS: {part!r} is not scope=N/period with scope one of "
                f"{', '.join((*SCOPES, 'dev'))}")
        try:
            per_scope[name] = parse(spec.strip())
        except ValueError:
            raise GatewayOpsError(f"CDR_RATE_LIMITS: {spec.strip()!r} is not a rate such as "
                                  "60/minute") from None
    uri = env.get("CDR_RATE_LIMIT_STORAGE", "memory://")
    try:
        storage = storage_from_string(uri)
    except Exception as exc:
        raise GatewayOpsError(f"CDR_RATE_LIMIT_STORAGE {uri!r}: {exc}") from None
    return RateLimits(per_scope, MovingWindowRateLimiter(storage))


class RateLimitMiddleware:
    """429 with `Retry-After` once a key used its scope's budget (inside the key check, which
    recorded the key; open paths such as /healthz carry no key and are never limited)."""

    def __init__(self, app: ASGIApp, *, limits: RateLimits,
                 refuse: Callable[[float], ASGIApp]) -> None:
        self.app, self.limits, self.refuse = app, limits, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from cdr.gateway.auth import OPEN_PATHS

        if scope["type"] == "http" and scope.get("path") not in OPEN_PATHS:
            state = scope.get("state", {})
            key = state.get("api_key")
            if key is not None:
                wait = self.limits.hit(key.scope, key.id)
            elif "api_key" in state and scope.get("client"):  # dev mode: by client address
                wait = self.limits.hit("dev", scope["client"][0])
            else:
                wait = None
            if wait is not None:
                await self.refuse(wait)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def too_many_requests(wait: float) -> ASGIApp:
    """The 429 response: JSON like every other error, with `Retry-After` in whole seconds."""
    import math

    from cdr.gateway.errors import ApiError

    seconds = str(math.ceil(wait))
    return ApiError(429, f"rate limit of this key's scope reached; retry in {seconds} s",
                    code="rate_limited", headers={"Retry-After": seconds}).response()


# ----------------------------------------------------------------------------- readiness


def readiness(kbs: Any, store: Any) -> tuple[bool, dict[str, Any]]:
    """Whether every knowledge base answers a query and the session store answers a read."""
    import numpy as np

    report: dict[str, Any] = {"kbs": {}, "store": "ok"}
    ready = True
    for each in kbs:
        name = getattr(each, "name", "default")
        try:
            index = each.kb.current()
            if index is None:
                raise RuntimeError("no snapshot loaded")
            probe = np.zeros(int(index.dim), dtype=np.float32)
            probe[0] = 1.0
            index.select(probe, -1.0, 1)
            report["kbs"][name] = "ok"
        except Exception as exc:
            ready = False
            report["kbs"][name] = f"{type(exc).__name__}: {redact(str(exc))}"[:200]
    try:
        store.get("readyz-probe-" + uuid.uuid4().hex)
    except Exception as exc:
        ready = False
        report["store"] = f"{type(exc).__name__}: {redact(str(exc))}"[:200]
    report["status"] = "ready" if ready else "not ready"
    return ready, report


# `/readyz`: a result this fresh is answered again (orchestrators probe every few seconds, and
# under load a crowd of probes must not each scan every knowledge base); a probe slower than
# the timeout answers 503 at once (a container's health check gives up after 4 s).
READY_TTL_SECONDS = 1.0
READY_TIMEOUT_SECONDS = 2.0


class ReadinessProbe:
    """`readiness` on a thread of its own, one at a time, its result reused for
    `READY_TTL_SECONDS`: `/readyz` never waits for a chat thread or the request thread pool,
    so generation cannot starve it."""

    def __init__(self, kbs: Any, store: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.kbs, self.store = kbs, store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdr-ready")
        self._last: tuple[float, bool, dict[str, Any]] | None = None
        self._pending: Any = None

    async def check(self) -> tuple[bool, dict[str, Any]]:
        import asyncio
        import time

        now = time.monotonic()
        if self._last is not None and now - self._last[0] < READY_TTL_SECONDS:
            return self._last[1], self._last[2]
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().run_in_executor(
                self._executor, readiness, self.kbs, self.store)
        try:
            ready, report = await asyncio.wait_for(asyncio.shield(self._pending),
                                                   READY_TIMEOUT_SECONDS)
        except TimeoutError:
            return False, {"status": "not ready",
                           "error": f"the readiness probe took over {READY_TIMEOUT_SECONDS:g} s"}
        self._last = (time.monotonic(), ready, report)
        return ready, report

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
