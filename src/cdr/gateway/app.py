"""The gateway app: `create_app()` for uvicorn (`--factory`) and tests, `serve()` for the CLI.

Endpoints (OpenAPI at `/openapi.json`; `/docs` and `/redoc` only with `CDR_API_DOCS=1`):

    POST   /v1/chat/completions        OpenAI wire format, multi-window CDR (stream or not)
    POST   /v1/sessions                sidecar: start a session
    POST   /v1/sessions/{id}/envelope  sidecar: the next window's envelope
    POST   /v1/sessions/{id}/windows   sidecar: report a window's text
    GET    /v1/sessions/{id}           the trace
    DELETE /v1/sessions/{id}
    POST   /v1/ckf/documents           upload (background ingest) -> job
    GET    /v1/ckf/jobs/{id}, GET /v1/ckf/stats, GET /v1/ckf/documents,
    DELETE /v1/ckf/documents/{id}
    GET    /healthz, GET /metrics
    GET    /ui/, /ui/sessions/{id}    run inspector pages (see `routes_ui.py`)

Errors are `{"error": {"type", "message", "param", "code", ...}}` (see `errors.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.config
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from cdr import settings as cdr_settings
from cdr.errors import CdrError
from cdr.gateway import routes_chat, routes_ckf, routes_models, routes_sessions, routes_ui
from cdr.gateway.access_log import install_access_log_filter
from cdr.gateway.api_docs import install_api_docs
from cdr.gateway.auth import AuthMiddleware, is_loopback
from cdr.gateway.dev_guard import DevGuardMiddleware
from cdr.gateway.errors import ApiError, from_cdr_error, from_validation_errors
from cdr.gateway.kbs import KnowledgeBases, use_default_kb, use_named_kb
from cdr.gateway.metrics import render_metrics
from cdr.gateway.middleware import GatewayMiddleware
from cdr.gateway.ops import (
    RateLimitMiddleware,
    ReadinessProbe,
    RequestLogMiddleware,
    load_rate_limits,
    too_many_requests,
)
from cdr.gateway.paths import public_path
from cdr.gateway.redact import register_path, register_secret
from cdr.gateway.schemas import Health
from cdr.gateway.settings import (
    DEFAULT_KB,
    SESSION_DB_NAME,
    GatewayConfigError,
    GatewaySettings,
    is_index_address,
    is_ray_address,
    load_settings,
    parse_kb_specs,
)
from cdr.gateway.shard_kb import index_root
from cdr.gateway.tracing import TracingMiddleware
from cdr.window.telemetry import available as telemetry_available
from cdr.writers import Writer

__all__ = ["create_app", "serve"]

log = logging.getLogger("cdr.gateway")


def open_ray_index(settings: GatewaySettings) -> Any:
    """The Ray-served shard set the settings name (`CDR_CKF` / `--ckf ray://...`), or None
    for a local CKF directory."""
    if settings.ray_address is None:
        return None
    from cdr.knowledge_base import open_fact_index

    return open_fact_index(settings.ray_address, retry_seconds=settings.ray_retry_seconds)


def create_app(
    settings: GatewaySettings | None = None,
    *,
    ckf: Any = None,
    writer: Writer | None = None,
) -> FastAPI:
    """Build the app. `settings` default to the environment (`CDR_*`); `ckf` (a `CKF` or a
    directory) and `writer` override what the settings name. Refuses insecure or unusable
    settings (no signing secret or API keys outside dev mode, no session store)."""
    settings = settings or load_settings()
    if ckf is None:
        ckf = open_ray_index(settings)  # CDR_CKF=ray://... read by the factory itself
    if ckf is not None:
        path = Path(ckf) if isinstance(ckf, str | Path) else index_root(ckf)
        settings = settings.model_copy(update={
            "ckf": path, "session_db": settings.session_db or path / SESSION_DB_NAME})
    settings.validate_for_serving()
    ring = settings.key_ring()
    rate_limits = load_rate_limits()  # CDR_RATE_LIMITS (cdr.gateway.ops); None when unset
    specs: dict[str, Any] = dict(settings.named_kbs())
    if ckf is not None:
        specs[DEFAULT_KB] = ckf
    for name, spec in specs.items():
        if isinstance(spec, str) and is_ray_address(spec):
            from cdr.knowledge_base import open_fact_index

            specs[name] = open_fact_index(spec, retry_seconds=settings.ray_retry_seconds)
        elif isinstance(spec, str) and is_index_address(spec):  # an external store
            from cdr.knowledge_base import open_fact_index

            try:
                specs[name] = open_fact_index(spec)
            except CdrError as exc:  # one line naming the KB (cdr serve exits 2 on it)
                raise GatewayConfigError(f"knowledge base {name!r}: {exc}") from None
    for where in (settings.ckf, settings.session_db, Path.cwd(), tempfile.gettempdir(),
                  *(p for p in specs.values() if isinstance(p, str | Path))):
        register_path(where)
    if settings.llm_api_key is not None:
        register_secret(settings.llm_api_key.get_secret_value())
    blas_threads = _blas_threads()
    kbs = KnowledgeBases(settings, specs, writer=writer)
    gw = kbs.main
    probe = ReadinessProbe(kbs, gw.store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limiter = _limit_blas(blas_threads)
        loop = asyncio.get_running_loop()
        for each in kbs:
            await loop.run_in_executor(None, each.kb.warm)
        # Jobs of replicas killed mid-upload: failed now rather than `running` forever.
        try:
            await loop.run_in_executor(None, gw.jobs.reap_expired)  # one store for all KBs
        except Exception:  # the store may be briefly down; GET /jobs reaps them later
            log.exception("could not check upload jobs for expired leases")
        for each in kbs:
            each.kb.start_watching()
        try:
            yield
        finally:
            probe.close()
            kbs.close()
            if limiter is not None:
                limiter.restore_original_limits()

    app = FastAPI(
        title="cdr gateway",
        summary="Coverage-Differential Retrieval (CRP-SPEC-024) over HTTP: an OpenAI-compatible "
                "relay and a sidecar API.",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,  # see cdr.gateway.api_docs: off unless CDR_API_DOCS=1, with a CSP
        redoc_url=None,
        **_no_fastapi_tracing(),
    )
    if settings.api_docs:
        install_api_docs(app)
    install_access_log_filter()
    app.state.gateway = gw  # the default KB (else the first): health, default headers
    app.state.kbs = kbs
    app.include_router(routes_chat.router)
    app.include_router(routes_models.router)
    default, named = [Depends(use_default_kb)], [Depends(use_named_kb)]
    app.include_router(mounted(routes_sessions.router, "/v1/sessions", default))
    app.include_router(mounted(routes_sessions.router, "/v1/kbs/{kb}/sessions", named))
    app.include_router(mounted(routes_ckf.router, "/v1/ckf", default))
    app.include_router(mounted(routes_ckf.router, "/v1/kbs/{kb}", named))
    app.include_router(routes_ui.router)
    _install_error_handlers(app)
    if rate_limits is not None:  # inside the key check, which records the key
        app.add_middleware(RateLimitMiddleware, limits=rate_limits, refuse=too_many_requests)
    # Added last = outermost: refusals by the key check are counted and get JSON bodies.
    app.add_middleware(AuthMiddleware, ring=ring)
    if ring is None:  # dev mode: no keys, so refuse what only a web page would send
        app.add_middleware(DevGuardMiddleware)
    app.add_middleware(GatewayMiddleware, metrics=gw.metrics,
                       max_body_bytes=settings.max_body_bytes,
                       default_headers=gw.context_mode_headers,
                       read_timeout=settings.read_timeout_seconds,
                       max_header_bytes=settings.max_header_bytes)
    if telemetry_available():  # cdr-retrieval[otel]: a span per request
        app.add_middleware(TracingMiddleware)
    app.add_middleware(RequestLogMiddleware)  # outermost: every response gets its request id

    @app.get("/readyz", tags=["ops"], summary="Readiness: the KBs and the session store answer",
             responses={503: {"description": "a knowledge base or the session store failed"}})
    async def readyz() -> JSONResponse:
        ready, report = await probe.check()  # its own thread: generation cannot starve it
        return JSONResponse(report, status_code=200 if ready else 503)

    # In-memory only, answered on the event loop (no thread pool to wait for).
    @app.get("/healthz", response_model=Health, tags=["ops"], summary="Liveness and readiness")
    async def healthz() -> dict[str, Any]:
        index = gw.kb.current()
        info = None
        if index is not None:
            info = {"path": public_path(str(index.path)), "model_id": index.model_id,
                    "generation": index.generation, "active_facts": int(index.active.sum())}
        return {"status": "ok", "writer": gw.writer.name, "ckf": info}

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics",
             response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        body, content_type = render_metrics(gw.metrics.registry)
        return Response(body, media_type=content_type)

    return app


def mounted(template: APIRouter, prefix: str, dependencies: list[Any]) -> APIRouter:
    """`template`'s routes under `prefix`, each route carrying its whole path.

    Why not `include_router(template, prefix=...)`: that leaves the matched route's own path
    without the prefix (`/{session_id}/envelope`), and the metrics label requests by the
    matched route's template, which must tell `/v1/sessions/...` from `/v1/kbs/{kb}/...`."""
    out = APIRouter(prefix=prefix, dependencies=dependencies)
    for route in template.routes:
        assert isinstance(route, APIRoute)
        out.add_api_route(
            route.path, route.endpoint, methods=sorted(route.methods or ()),
            response_model=route.response_model, status_code=route.status_code,
            responses=route.responses, summary=route.summary, tags=route.tags,
            description=route.description, name=route.name,
            response_class=route.response_class, include_in_schema=route.include_in_schema)
    return out


def _no_fastapi_tracing() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry spans (recent versions) record the query string, where a
    client may have put a key; `cdr.gateway.tracing` makes the request span instead, without it."""
    import inspect

    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False}}
    return {}


def _blas_threads() -> int:
    """`CDR_BLAS_THREADS` (default 1; 0 leaves BLAS as it is).

    Why one: the gateway runs requests in parallel threads, each doing a matrix-vector
    product over the CKF. Multi-threaded BLAS inside each of them oversubscribes the cores and
    its spinning worker threads wait on each other: measured on 2 cores with 32 concurrent
    envelope clients on a 100k-fact CKF, 6.6 req/s with OpenBLAS's default threads against
    36 req/s with one thread per call (bench/gateway.py)."""
    raw = cdr_settings.env("CDR_BLAS_THREADS", "").strip() or "1"
    try:
        value = int(raw)
    except ValueError:
        raise GatewayConfigError(f"CDR_BLAS_THREADS must be an integer, got {raw!r}") from None
    if value < 0:
        raise GatewayConfigError(f"CDR_BLAS_THREADS must be >= 0, got {value}")
    return value


def _limit_blas(threads: int) -> Any:
    if threads == 0:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.warning("threadpoolctl is not installed: BLAS keeps its default threads, which "
                    "slows concurrent requests down (pip install threadpoolctl)")
        return None
    return threadpool_limits(limits=threads, user_api="blas")


def _version() -> str:
    from cdr import __version__

    return __version__


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(CdrError)
    async def cdr_error(_: Request, exc: CdrError) -> JSONResponse:
        return from_cdr_error(exc).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_errors(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint {request.url.path!r}; see /openapi.json"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path!r}"
        return ApiError(exc.status_code, message, code=getattr(exc, "code", None),
                        headers=dict(exc.headers or {})).response()


def serve(ckf: Path | str | None, host: str = "127.0.0.1", port: int = 8088,
          kbs: list[str] | None = None, kb_config: Path | str | None = None, *,
          workers: int = 1, log_level: str = "info", log_format: str = "text",
          root_path: str = "") -> None:
    """`cdr serve`: settings from the environment, `--ckf` over `CDR_CKF`, `--kb NAME=PATH`
    (repeatable) over `CDR_KBS`, `--kb-config FILE` over `CDR_KB_CONFIG`; blocks.

    Raises `GatewayConfigError` (one line, naming the variable) on a bad configuration, and
    for dev mode on a non-loopback `host`. Uses the guarded HTTP protocol
    (`cdr.gateway.protocol`): a header deadline and JSON bodies for connection-level errors.
    """
    import uvicorn

    from cdr.gateway.protocol import guarded_h11

    # `--ckf` and `CDR_CKF` go through the same settings field, so a ray:// address is parsed
    # by one parser either way (settings keep its directory in `ckf`).
    overrides: dict[str, Any] = {} if ckf is None else {"ckf": str(ckf)}
    if kbs:
        specs = parse_kb_specs(kbs, "--kb")
        if any("," in p for p in specs.values()):
            raise GatewayConfigError("--kb: a path with a comma cannot be given here; list "
                                     "that KB in a --kb-config file")
        overrides["kbs"] = ",".join(f"{n}={p}" for n, p in specs.items())
    if kb_config is not None:
        overrides["kb_config"] = Path(kb_config)
    settings = load_settings(**overrides)
    settings.named_kbs()  # a bad or clashing KB list stops here, before anything opens
    if settings.dev and not is_loopback(host):
        raise GatewayConfigError(
            f"CDR_DEV=1 serves on loopback only (127.0.0.1, ::1, localhost), not {host!r}: "
            "dev mode has no API keys and may have a throwaway signing secret")
    from cdr.gateway.ops import log_config, worker_environment

    logs = log_config(log_level, log_format)  # a bad level or format stops here
    logging.config.dictConfig(logs)
    common: dict[str, Any] = dict(
        host=host, port=port, log_config=logs, log_level=log_level.lower(),
        access_log=log_format != "json",  # JSON: the request log is the access log
        timeout_graceful_shutdown=5, timeout_keep_alive=settings.keepalive_seconds,
        h11_max_incomplete_event_size=settings.max_header_bytes, root_path=root_path)
    if workers > 1:  # each worker builds the app from the environment the parent completes
        settings.validate_for_serving()
        load_rate_limits()
        cdr_settings.export(worker_environment(settings, overrides))
        log.info("cdr gateway on http://%s:%d: %d workers (knowledge bases %s, writer %s)",
                 host, port, workers, ", ".join(settings.named_kbs()) or "none",
                 settings.writer)
        # A worker opens the KBs and loads the embedder before it answers uvicorn's health
        # check: on a busy machine that takes longer than uvicorn's 5 s default.
        uvicorn.run("cdr.gateway.app:create_app", factory=True, workers=workers,
                    http="cdr.gateway.ops:WorkerH11Protocol", timeout_worker_healthcheck=120,
                    **common)
        return
    index = open_ray_index(settings)
    app = create_app(settings, ckf=index)
    log.info("cdr gateway on http://%s:%d (knowledge bases %s, writer %s)", host, port,
             ", ".join(app.state.kbs.by_name) or "none", settings.writer)
    uvicorn.run(app, http=guarded_h11(settings.read_timeout_seconds), **common)
