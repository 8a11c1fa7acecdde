"""Named knowledge bases: one gateway, several CKFs, and which of them a key may see.

Each KB is a `Gateway` of its own (its CKF snapshots and their refresh, its Phase 1 cache,
its session cache, its upload writer and jobs) built around what all of them share: the
settings, the writer, the token signer, the session store (one table: a session records its
KB), the metrics and the chat threads. So a second KB adds no work to a request on the first:
nothing a request touches is looked up across KBs.

Who sees what: `resolve(name, key)` is the only way from a route to a KB. A name that does not
exist and a name the key does not reach give the same 404 (`kb_not_found`), so a key cannot
learn which other KBs a gateway serves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import Path as PathParam
from fastapi import Request

from cdr.gateway.admission import Admission
from cdr.gateway.app_state import Gateway
from cdr.gateway.auth import ApiKey
from cdr.gateway.errors import ApiError
from cdr.gateway.metrics import GatewayMetrics
from cdr.gateway.settings import DEFAULT_KB, GatewaySettings
from cdr.writers import Writer

__all__ = ["KnowledgeBases", "kb_gateway", "kb_not_found", "use_default_kb", "use_named_kb"]


def kb_not_found(name: str) -> ApiError:
    """The one answer for a KB that does not exist and for one the key does not reach."""
    return ApiError(404, f"no knowledge base {name[:64]!r}", code="kb_not_found")


class KnowledgeBases:
    """The gateway's KBs by name (`default` is `--ckf`); see the module docstring."""

    def __init__(self, settings: GatewaySettings, specs: Mapping[str, Any], *,
                 writer: Writer | None = None) -> None:
        from cdr.gateway.app_state import writer_for

        self.settings = settings
        self.writer = writer if writer is not None else writer_for(settings)
        self.signer = settings.token_signer()
        self.store = settings.session_store()
        self.metrics = GatewayMetrics()
        self.executor = ThreadPoolExecutor(max_workers=settings.chat_threads,
                                           thread_name_prefix="cdr-chat")
        self.admission = Admission(settings.chat_threads, settings.max_waiting_runs,
                                   settings.max_runs_per_key, self.metrics)
        self.by_name: dict[str, Gateway] = {}
        try:
            for name, ckf in (specs or {DEFAULT_KB: None}).items():
                self.by_name[name] = Gateway(
                    settings, ckf=ckf, writer=self.writer, store=self.store,
                    signer=self.signer, name=name, metrics=self.metrics,
                    executor=self.executor)
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Iterator[Gateway]:
        return iter(self.by_name.values())

    @property
    def main(self) -> Gateway:
        """The KB that answers for the gateway as a whole (health, default headers): the
        default KB, else the first one named."""
        return self.by_name.get(DEFAULT_KB) or next(iter(self.by_name.values()))

    def names_for(self, key: ApiKey | None) -> list[str]:
        """The KB names `key` reaches, in configuration order (all of them without keys)."""
        return [n for n in self.by_name if key is None or key.reaches(n)]

    def resolve(self, name: str, key: ApiKey | None) -> Gateway:
        """The KB `name` for `key`, or the 404 of a KB that does not exist."""
        gw = self.by_name.get(name)
        if gw is None or (key is not None and not key.reaches(name)):
            raise kb_not_found(name)
        return gw

    def close(self) -> None:
        for gw in self.by_name.values():
            gw.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.store.close()


def _caller(request: Request) -> ApiKey | None:
    return getattr(request.state, "api_key", None)


def use_default_kb(request: Request) -> None:
    """Dependency of the un-named routes (`/v1/ckf/...`, `/v1/sessions/...`): the default KB."""
    kbs: KnowledgeBases = request.app.state.kbs
    request.state.kb_gateway = kbs.resolve(DEFAULT_KB, _caller(request))
    request.state.kb_prefix = None


def use_named_kb(request: Request, kb: Annotated[str, PathParam(
        description="The knowledge base's name (`cdr serve --kb NAME=PATH`).")]) -> None:
    """Dependency of `/v1/kbs/{kb}/...`: that KB, if the key reaches it (else 404)."""
    kbs: KnowledgeBases = request.app.state.kbs
    request.state.kb_gateway = kbs.resolve(kb, _caller(request))
    request.state.kb_prefix = f"/v1/kbs/{kb}"


def kb_gateway(request: Request) -> Gateway:
    """The KB the route's dependency chose."""
    return request.state.kb_gateway  # type: ignore[no-any-return]
