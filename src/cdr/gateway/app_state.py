"""Everything a request handler needs, built once per app: settings, the CKF, the writer, the
token signer, the session store, metrics, ingest jobs; and the checks every session call runs.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cdr.cluster.ray_index import is_ray_address
from cdr.errors import EmbeddingModelMismatchError, NotFoundError
from cdr.gateway.auth import ApiKey
from cdr.gateway.ckf_snapshots import LocalKnowledgeBase
from cdr.gateway.errors import ApiError
from cdr.gateway.job_store import job_store_for
from cdr.gateway.jobs import IngestJobs
from cdr.gateway.knowledge_base import KnowledgeBase, is_empty
from cdr.gateway.live_streams import LiveStreams
from cdr.gateway.metrics import GatewayMetrics
from cdr.gateway.schemas import GenerationOptions
from cdr.gateway.selections import CachingIndex, SelectionCache
from cdr.gateway.session_record import SessionCache, SessionRecord
from cdr.gateway.session_store import SessionStore, StoredSession
from cdr.gateway.session_token import StaleTokenError, TokenPayload, TokenSigner
from cdr.gateway.settings import DEFAULT_KB, GatewaySettings
from cdr.gateway.shard_kb import ShardSetKnowledgeBase, index_root
from cdr.gateway.store_kb import StoreKnowledgeBase
from cdr.options import DEFAULTS, FACE_DEFAULTS
from cdr.retrieval.factindex import FactIndex
from cdr.session import IN_PROGRESS, Session
from cdr.stores.array_index import ArrayFactIndex
from cdr.window.headers import SAFETY_ONLY_HEADERS, crp_headers
from cdr.window.loop import EmptyKnowledgeBaseError, GenerationConfig, Generator, WindowEvent
from cdr.writers import Writer, build_writer

TOKEN_HEADER = "CRP-Session"
SET_TOKEN_HEADER = "CRP-Set-Session"
SESSION_ID_HEADER = "CRP-Session-Id"
CHAT_THREADS = 64


def writer_for(settings: GatewaySettings) -> Writer:
    """The writer `CDR_WRITER` names, with the upstream from `CDR_LLM_*`."""
    key = settings.llm_api_key
    return build_writer(settings.writer, model=settings.llm_model,
                        base_url=settings.llm_base_url,
                        api_key=None if key is None else key.get_secret_value())


def empty_kb_error(index: FactIndex | None, path: Path | None) -> EmptyKnowledgeBaseError:
    if path is None:
        where = "no CKF is configured (set CDR_CKF or pass --ckf)"
    elif index is None:
        where = f"there is no CKF at {path} yet"
    else:
        where = f"the CKF at {path} has no active facts"
    return EmptyKnowledgeBaseError(
        f"{where}: nothing to ground the document in; upload documents "
        "(POST /v1/ckf/documents) or run `cdr ingest PATH --ckf DIR`"
    )


def token_from_headers(headers: Mapping[str, str]) -> str:
    """The session token from `Authorization: Bearer` or `CRP-Session` (401 if neither)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    header = headers.get(TOKEN_HEADER.lower())
    if header and header.strip():
        return header.strip()
    raise ApiError(401, "missing session token: send `Authorization: Bearer <token>` or "
                   f"`{TOKEN_HEADER}: <token>` with the token from the last `{SET_TOKEN_HEADER}`",
                   code="missing_token")


def session_not_found(session_id: str) -> NotFoundError:
    """The one answer for a session that does not exist and for one that is not the
    caller's, so that a key learns nothing about other keys' sessions."""
    return NotFoundError(f"session {session_id!r} does not exist (never created, deleted, "
                         "or created on another gateway's store)")


def check_owner(session_id: str, record: SessionRecord, caller: ApiKey | None,
                kb: str | None = None) -> None:
    """The session's owner key, or an admin key that reaches its knowledge base, may use it;
    anyone else gets the 404 of a missing session, and so does a call through another KB's
    routes (`kb`: the KB of the route). Sessions without an owner (made in dev mode, without
    keys, or stored before sessions had owners) stay reachable by their token alone; a
    gateway without keys (`caller` None: dev mode, loopback only) reaches every session."""
    if kb is not None and record.kb_name != kb:
        raise session_not_found(session_id)
    if caller is None:
        return
    if not caller.reaches(record.kb_name):
        raise session_not_found(session_id)
    if record.owner is None or caller.allows("admin"):
        return
    if not hmac.compare_digest(caller.owner_id, record.owner):
        raise session_not_found(session_id)


def session_headers(session: Session, session_id: str, token: str | None = None,
                    last: Mapping[str, str] | None = None) -> dict[str, str]:
    """CRP headers describing a session as it stands (after its last finished window, whose
    headers `last` are kept for what only a window can say), its id and the next token."""
    headers = dict(last or {})
    headers.update(crp_headers(window=session.window_count, max_windows=session.max_windows,
                               status=session.status, completeness=session.completeness()))
    headers[SESSION_ID_HEADER] = session_id
    if token is not None:
        headers[SET_TOKEN_HEADER] = token
    return headers


class Gateway:
    """The app's state; routes reach it as `request.app.state.gateway`."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        ckf: Any = None,
        writer: Writer | None = None,
        store: SessionStore | None = None,
        signer: TokenSigner | None = None,
        name: str = DEFAULT_KB,
        metrics: GatewayMetrics | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        """One knowledge base's state. Several KBs of one gateway (`cdr.gateway.kbs`) share
        the writer, signer, session store, metrics and chat threads (passed in; then closed by
        their owner, not here) and each keep their own CKF snapshots, Phase 1 cache, session
        cache and upload writer."""
        self.name = name
        self._owns_shared = store is None and executor is None
        self.settings = settings
        initial = None if ckf is None or isinstance(ckf, str | Path) else ckf
        path = (Path(ckf) if isinstance(ckf, str | Path)
                else index_root(ckf) if ckf is not None else settings.ckf)
        self.kb: KnowledgeBase
        if initial is not None and is_ray_address(str(initial.path)):
            self.kb = ShardSetKnowledgeBase(initial, index_root(initial))  # served by Ray
        elif isinstance(initial, ArrayFactIndex):  # an external store's collection
            self.kb = StoreKnowledgeBase(initial)
        else:
            self.kb = LocalKnowledgeBase(path, initial)
        self.writer = writer if writer is not None else writer_for(settings)
        self.signer = signer if signer is not None else settings.token_signer()
        self.store = store if store is not None else settings.session_store()
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.jobs = IngestJobs(self.kb, store=job_store_for(self.store),
                               lease_seconds=settings.job_lease_seconds,
                               commit_facts=settings.upload_commit_facts, kb_name=name)
        self.sessions = SessionCache()
        self.selections = SelectionCache()
        self.streams = LiveStreams()  # the streamed runs this process writes (their resume)
        self.executor = executor if executor is not None else ThreadPoolExecutor(
            max_workers=CHAT_THREADS, thread_name_prefix="cdr-chat")

    def close(self) -> None:
        if self._owns_shared:
            self.executor.shutdown(wait=False, cancel_futures=True)
        self.kb.close()
        self.jobs.close()
        if self.jobs.store is not self.store:
            self.jobs.store.close()  # its own (closing a shared pool's view leaves the pool)
        if self._owns_shared:
            self.store.close()

    # ------------------------------------------------------------------ CKF

    def index(self, *, require_facts: bool = True) -> FactIndex:
        """The fact index for this request (the knowledge base's current snapshot). Starting a
        session needs active facts; going on with one needs a CKF (an emptied CKF then
        exhausts it, as Exit 3 intends)."""
        index = self.kb.current()
        if index is None or (require_facts and is_empty(index)):
            raise empty_kb_error(index, self.kb.path)
        return index


    def context_mode_headers(self) -> dict[str, str]:
        """Defaults for responses that say nothing more specific."""
        if self.kb.current_is_empty():
            return dict(SAFETY_ONLY_HEADERS)
        return {"CRP-Context-Mode": "full"}

    # ------------------------------------------------------------------ options

    def options(self, opts: GenerationOptions | None) -> dict[str, Any]:
        """Request options with the server's defaults filled in, checked against its caps:
        `GenerationConfig` keyword arguments, stored with the session (the window limit, the
        ranking and the profile always, the profile being the faces' default `FACES_PROFILE`
        when the request names none; the rest as the request set them, else the options'
        defaults)."""
        o = opts or GenerationOptions()
        given = o.run_options()
        cap = self.settings.max_windows_cap
        windows = given.pop("max_windows", min(DEFAULTS.max_windows, cap))
        if windows > cap:
            raise ApiError(422, f"max_windows={windows} exceeds this gateway's cap of {cap} "
                           "(CDR_MAX_WINDOWS_CAP)", param="max_windows", code="invalid_fields")
        # The profile is stored even when the request left it out, so a stored session keeps
        # the options it started with whatever the faces' default becomes; a session stored
        # without one (before FACES_PROFILE) resumes as the library's default, the spec.
        return {"max_windows": windows, "ranking": given.pop("ranking", DEFAULTS.ranking),
                **given, "profile": given.get("profile", FACE_DEFAULTS.profile)}

    def generator(self, index: FactIndex, options: Mapping[str, Any]) -> Generator:
        cfg = GenerationConfig(min_relevance=self.settings.min_relevance, **options)
        return Generator(CachingIndex(index, self.selections), self.writer, cfg)

    # ------------------------------------------------------------------ sessions

    @staticmethod
    def new_session_id() -> str:
        return uuid.uuid4().hex

    def issue(self, session_id: str, session: Session) -> str:
        return self.signer.issue(session_id, session.model_id, session.window_count,
                                 session.residual_ids)

    def verify(self, token: str, session_id: str, index: FactIndex | None) -> TokenPayload:
        """Signature, expiry, session binding and embedding model (401 / 409)."""
        model = index.model_id if index is not None else None
        return self.signer.verify(token, session_id=session_id, model_id=model)

    def load(self, session_id: str, index: FactIndex | None, *, fresh: bool = False
             ) -> tuple[StoredSession, SessionRecord]:
        """The stored row and its parsed record. Without `fresh` the record may be shared
        with other requests (read it, never change it); with `fresh` it is a private copy."""
        stored = self.store.get(session_id)
        if stored is None:
            self.sessions.discard(session_id)
            raise session_not_found(session_id)
        record = None if fresh else self.sessions.get(session_id, stored.version, index)
        if record is None:
            ngrams = index.ngram_index if index is not None else None
            record = SessionRecord.from_json(stored.data, ngrams)
            if index is not None and record.session.model_id != index.model_id:
                raise EmbeddingModelMismatchError(index.model_id, record.session.model_id,
                                                  "session")
            if not fresh:
                self.sessions.put(session_id, stored.version, index, record)
        return stored, record

    def authorize(self, session_id: str, token: str, index: FactIndex | None, *,
                  caller: ApiKey | None, fresh: bool = False, current: bool = True
                  ) -> tuple[StoredSession, SessionRecord]:
        """Every check a session call needs: token (signature, expiry, model), the session
        exists, it is the caller's (`check_owner`), and — with `current`, for every call that
        writes — the token is for its current window (else a replay: 409). Reads take a token
        of any earlier window: it proves its holder ran the session, and they answer with the
        current token, so a client that lost its place (a dropped stream) can get back in."""
        payload = self.verify(token, session_id, index)
        stored, record = self.load(session_id, index, fresh=fresh)
        check_owner(session_id, record, caller, self.name)
        if current and payload.window != record.session.window_count:
            raise StaleTokenError(payload.window, record.session.window_count)
        return stored, record

    def window_finished(self, event: WindowEvent) -> None:
        """Count a finished window (and the session's exit, if it was the last)."""
        self.metrics.window_done(event.prepared.envelope.ranking.ngram_activations)
        if event.done:
            self.metrics.session_exit(event.status)

    @staticmethod
    def require_in_progress(session_id: str, session: Session) -> None:
        if session.status != IN_PROGRESS:
            raise ApiError(409, f"session {session_id!r} has ended ({session.status}) after "
                           f"{session.window_count} windows; read its trace with GET or start "
                           "a new session", code="session_ended",
                           headers=session_headers(session, session_id))

