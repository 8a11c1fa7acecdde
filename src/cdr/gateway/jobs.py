"""Background ingest of uploaded documents.

An upload is checked (type, decodable, has text) while the client waits, so a bad file gets a
4xx naming the problem; the accepted files go to a staging directory and a job embeds and
commits them on the CKF's single writer thread. Embedding 100 facts takes seconds, which a
request should not wait for. A job runs on the replica that accepted the upload (its files are
there); its status is written to the job store (`job_store.py`) at each step, so any replica
sharing that store answers for it, and it survives a restart. The replica holds a lease on
each of its unfinished jobs and renews it (`job_store.py`); a replica killed mid-job stops
renewing, and whichever replica reads the job next (or starts up) marks it failed, saying
that what was committed is in the CKF and that uploading the same files again finishes it.

Uploaded documents get the source `upload/<file name>`, so uploading a file of the same name
again updates that document (unchanged content costs nothing) instead of adding a copy.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdr.errors import NotFoundError
from cdr.gateway.job_store import reap_job
from cdr.gateway.knowledge_base import KnowledgeBase
from cdr.gateway.session_store import MemorySessionStore, SessionStore, update_with_retry

log = logging.getLogger("cdr.gateway")
UPLOAD_PREFIX = "upload/"
MAX_JOBS_KEPT = 1000
LEASE_SECONDS = 30.0
# Facts per committed batch of an upload: a killed replica loses at most about this much
# embedding work, and each commit costs one transaction.
UPLOAD_COMMIT_FACTS = 256


@dataclass
class StagedFile:
    name: str  # the client's file name (base name only)
    path: Path
    kind: str


@dataclass
class IngestJob:
    id: str
    files: list[StagedFile]
    source_type: str
    importance: float | None
    status: str = "queued"
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    report: dict[str, Any] | None = None
    documents: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    kb: str = "default"  # the knowledge base it writes to

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "kb": self.kb, "status": self.status,
            "files": [f.name for f in self.files],
            "created": self.created, "started": self.started, "finished": self.finished,
            "report": self.report, "documents": self.documents, "error": self.error,
        }


def _outcome(documents: int, skipped: list[tuple[str, str]]) -> tuple[str, str | None]:
    """A job that left no document in the CKF failed, whatever the reason (every file
    skipped: too short, no text, unreadable): a client polling for `succeeded` must not be told
    its 3-word upload worked. Some files skipped beside ingested ones is a success whose
    report lists the skipped."""
    if documents > 0:
        return "succeeded", None
    reasons = "; ".join(f"{name.removeprefix(UPLOAD_PREFIX)}: {why}" for name, why in skipped)
    return "failed", f"nothing ingested: {reasons or 'no documents'}"


@dataclass(frozen=True)
class StoredJob:
    """A job's status as stored (possibly written by another replica)."""

    data: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def status(self) -> str:
        return str(self.data["status"])

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


class IngestJobs:
    def __init__(self, kb: KnowledgeBase, staging_root: Path | None = None,
                 store: SessionStore | None = None, *, lease_seconds: float = LEASE_SECONDS,
                 commit_facts: int = UPLOAD_COMMIT_FACTS, kb_name: str = "default") -> None:
        self.kb = kb
        self.kb_name = kb_name  # jobs of other KBs in a shared store are not found here
        self.store: SessionStore = store if store is not None else MemorySessionStore()
        # Not inside the CKF directory: `CKF.create` wants that empty on the first upload.
        self.staging_root = staging_root
        self.lease_seconds = float(lease_seconds)
        self.commit_facts = int(commit_facts)
        # Which replica runs a job: random per process, logged with its PID (never shown to
        # clients, who only learn that the lease ran out).
        self.owner = uuid.uuid4().hex
        self._leases: SessionStore | None = (
            self.store if isinstance(self.store, SessionStore) else None)
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        log.info("ingest jobs of this replica are leased as owner %s", self.owner)

    def staging_dir(self) -> Path:
        """A fresh directory for one upload's files (removed when its job ends)."""
        if self.staging_root is not None:
            self.staging_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="cdr-upload-", dir=self.staging_root))

    def submit(self, files: list[StagedFile], source_type: str,
               importance: float | None) -> IngestJob:
        job = IngestJob(uuid.uuid4().hex, files, source_type, importance, kb=self.kb_name)
        self.store.create(job.id, json.dumps(job.to_json()))
        self._lease(job.id)
        self._prune()
        self.kb.submit(lambda: self._run(job))
        return job

    # ------------------------------------------------------------------ leases

    def _lease(self, job_id: str) -> None:
        if self._leases is None:
            return
        if self._leases.take_lease(job_id, self.owner, time.time() + self.lease_seconds):
            with self._held_lock:
                self._held.add(job_id)
            self._start_heartbeat()

    def _release(self, job_id: str) -> None:
        with self._held_lock:
            held = job_id in self._held
            self._held.discard(job_id)
        if held and self._leases is not None:
            self._leases.renew_lease(job_id, self.owner, None)

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name="cdr-job-lease",
                                               daemon=True)
            self._heartbeat.start()

    def _beat(self) -> None:
        """Renew every held lease each third of its length (two missed beats still hold)."""
        while not self._stop.wait(self.lease_seconds / 3):
            with self._held_lock:
                held = sorted(self._held)
            for job_id in held:
                try:
                    ok = self._leases.renew_lease(  # type: ignore[union-attr]
                        job_id, self.owner, time.time() + self.lease_seconds)
                except Exception:
                    log.exception("could not renew the lease of ingest job %s", job_id)
                    continue
                if not ok:
                    log.warning("ingest job %s: lease lost (another replica marked it "
                                "failed); its final status will still be written", job_id)
                    with self._held_lock:
                        self._held.discard(job_id)

    def reap(self, job_id: str) -> dict[str, Any] | None:
        """Mark `job_id` failed if its owner's lease ran out (see `job_store.reap_job`)."""
        if self._leases is None:
            return None
        out = reap_job(self._leases, job_id)
        if out is not None:
            log.warning("ingest job %s: its replica's lease ran out; marked failed", job_id)
        return out

    def reap_expired(self) -> list[str]:
        """On start: fail every job whose owner stopped renewing (e.g. killed replicas)."""
        if self._leases is None:
            return []
        return [j for j in self._leases.expired_ids(time.time()) if self.reap(j) is not None]

    def close(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)

    def get(self, job_id: str) -> StoredJob:
        stored = self.store.get(job_id)
        data = json.loads(stored.data) if stored is not None else None
        if data is None or data.get("kb", "default") != self.kb_name:
            raise NotFoundError(f"no ingest job {job_id!r} (the newest {MAX_JOBS_KEPT} jobs "
                                "are kept)")
        if data.get("status") in ("queued", "running"):
            data = self.reap(job_id) or data
        return StoredJob(data)

    def _save(self, job: IngestJob) -> None:
        """Write the job's status through to the store (only this replica writes it)."""
        data = json.dumps(job.to_json())
        update_with_retry(self.store, job.id, lambda _old: data)

    def _prune(self) -> None:
        """Keep the newest MAX_JOBS_KEPT jobs; runs when there are 10% more, so a list of
        ids and one read per job happen once per ~100 uploads, not on each."""
        ids = self.store.list_ids()
        if len(ids) <= MAX_JOBS_KEPT * 11 // 10:
            return
        rows = [r for r in (self.store.get(i) for i in ids) if r is not None]
        rows.sort(key=lambda r: (r.created, r.id))
        for row in rows[: len(rows) - MAX_JOBS_KEPT]:
            self.store.delete(row.id)

    def _run(self, job: IngestJob) -> None:
        """On the writer thread; every failure ends up in the job, never lost in a future."""
        from cdr.ckf.ingest import DocumentInput, IngestReport, ingest_documents

        job.status, job.started = "running", time.time()
        try:
            self._save(job)
            docs = [DocumentInput(UPLOAD_PREFIX + f.name, f.path.read_bytes(), f.kind)
                    for f in job.files]
            report = IngestReport()
            owner: dict[int, Any] = {}
            # One CKF: one group. A shard set: each document to its owning shard.
            for ckf, positions in self.kb.route([d.source for d in docs]):
                ingest_documents(ckf, [docs[p] for p in positions],
                                 source_type=job.source_type, importance=job.importance,
                                 commit_every=self.commit_facts, report=report)
                owner.update(dict.fromkeys(positions, ckf))
            job.report = report.to_dict()
            for pos, d in enumerate(docs):
                state = owner[pos].document_state(d.source)
                job.documents.append({
                    "source": d.source,
                    "doc_id": state["doc_id"] if state else None,
                    "facts": int(state["n_facts"]) if state else 0,
                    "status": state["status"] if state else None,
                })
            self.kb.reload()  # readers see the new facts before the job says it is done
            job.status, job.error = _outcome(report.documents, report.skipped + report.empty)
        except Exception as exc:
            log.exception("ingest job %s failed", job.id)
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            job.finished = time.time()
            try:
                self._save(job)
            except Exception:
                log.exception("could not store the status of ingest job %s", job.id)
            try:
                self._release(job.id)
            except Exception:
                log.exception("could not release the lease of ingest job %s", job.id)
            if job.files:
                shutil.rmtree(job.files[0].path.parent, ignore_errors=True)
