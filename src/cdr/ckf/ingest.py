"""Ingest: files or texts → parsed → facts → embedded (only what is new) → committed.

Work is committed in batches of documents, each an atomic store transaction, so a killed
ingest keeps every batch it finished and the next run resumes: finished documents are
unchanged (same content hash) and cost nothing, and content already embedded is reused by
its hash. Embedding runs outside the store's write lock; readers are never blocked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cdr.ckf.chunk import DEFAULT_CHUNKING, ChunkConfig, chunk_blocks
from cdr.ckf.handle import CKF
from cdr.ckf.html_main import extractor_id
from cdr.ckf.kinds import DEFAULT_KIND, REGISTRY, declared_settings, kind_for_suffix
from cdr.ckf.parse import PARSER_VERSION
from cdr.ckf.records import (
    SOURCE_TYPE_IMPORTANCE,
    FactDraft,
    check_importance,
    normalize_source_type,
)
from cdr.ckf.sources import (
    EmptyDocument,
    SkipDocument,
    decode_text,
    discover,
    kind_of,
    max_file_bytes,
    parse_bytes,
    read_file,
)
from cdr.errors import InvalidInputError
from cdr.retrieval.fact_recipe import fact_text
from cdr.text.sentences import CJK_BYTES, CJK_CUT

log = logging.getLogger("cdr.ckf")

# progress(stage, done, total): stage "read" (documents) or "embed" (texts).
IngestProgress = Callable[[str, int, int], None]


@dataclass(slots=True)
class DocumentInput:
    """A document given as content rather than a path (uploads, URLs fetched elsewhere)."""

    source: str
    data: bytes | str
    kind: str | None = None  # "md", "txt", "html", "pdf"; None: from the source's suffix
    source_type: str | None = None
    importance: float | None = None


@dataclass(slots=True)
class IngestReport:
    documents: int = 0  # documents ingested (new + changed + unchanged)
    documents_new: int = 0
    documents_changed: int = 0
    documents_unchanged: int = 0
    facts_added: int = 0  # facts documents gained (new content or content held elsewhere)
    facts_kept: int = 0  # facts documents still hold
    facts_removed: int = 0  # facts changed documents no longer hold
    embedded: int = 0  # texts sent to the embedding model
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    # (path, reason): files that hold no fact (empty, or under one fact's worth of text);
    # nothing is wrong with them, so they do not make `cdr ingest` exit 3
    empty: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what was worked around)
    stale: list[str] = field(default_factory=list)  # sources gone from re-ingested directories
    seconds: float = 0.0

    def left_out(self, source: str, why: SkipDocument) -> None:
        """Record a file not ingested: in `empty` when it holds no fact, else in `skipped`."""
        (self.empty if isinstance(why, EmptyDocument) else self.skipped).append((source,
                                                                                 str(why)))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["skipped"] = [{"path": p, "reason": r} for p, r in self.skipped]
        d["empty"] = [{"path": p, "reason": r} for p, r in self.empty]
        d["warnings"] = [{"path": p, "warning": w} for p, w in self.warnings]
        return d


@dataclass(slots=True)
class _Planned:
    source: str
    kind: str
    title: str | None
    content_hash: str
    size: int
    source_type: str
    importance: float
    drafts: list[FactDraft] | None  # None: unchanged, only touch
    doc_id: str | None = None
    warnings: list[str] = field(default_factory=list)


def _settings(declared: dict[str, str], doc: DocumentInput, source_type: str,
              importance: float | None) -> tuple[str, float]:
    """Most specific wins: the caller's per-document values, then what the document declares,
    then the ingest's importance, then the source type's default weight."""
    doc_type = doc.source_type or declared.get("source_type")
    st = normalize_source_type(doc_type or source_type)
    if doc.importance is not None:
        return st, check_importance(doc.importance, f"importance of {doc.source}")
    if "importance" in declared:
        return st, check_importance(declared["importance"], "declared importance")
    if doc_type is None and importance is not None:
        return st, importance
    return st, SOURCE_TYPE_IMPORTANCE[st]


def _plan(ckf: CKF, doc: DocumentInput, source_type: str, importance: float | None,
          chunking: ChunkConfig) -> _Planned:
    data = doc.data.encode("utf-8") if isinstance(doc.data, str) else bytes(doc.data)
    kind = doc.kind or kind_of(doc.source, DEFAULT_KIND)
    if kind not in REGISTRY:
        raise SkipDocument(f"unsupported document kind {kind!r}")
    # The bytes plus how they are cut into facts: a new chunking re-chunks unchanged files.
    extractor = f" html {extractor_id()}" if kind == "html" else ""
    # A text with CJK in it is cut by the rule that knows its sentence ends (cdr.text.sentences):
    # its hash says so, so such a document is cut anew; every other document keeps its hash.
    cjk = CJK_CUT if CJK_BYTES.search(data) else ""
    recipe = f"cdr-ckf parser {PARSER_VERSION}{extractor}{cjk} {chunking!r}\0".encode()
    content_hash = hashlib.sha256(recipe + data).hexdigest()
    text = "" if REGISTRY[kind].binary else decode_text(data, kind)[0]
    try:
        st, imp = _settings(declared_settings(kind, text), doc, source_type, importance)
    except InvalidInputError as e:
        raise SkipDocument(str(e)) from None
    state = ckf.document_state(doc.source)
    if state is not None and state["content_hash"] == content_hash:
        return _Planned(doc.source, kind, state["title"], content_hash, len(data), st, imp,
                        None, state["doc_id"])
    parsed = parse_bytes(data, kind)
    try:
        drafts = chunk_blocks(parsed.blocks, chunking)
    except Exception as exc:  # one hostile file must not end the ingest of the others
        raise SkipDocument(f"could not cut into facts: {type(exc).__name__}: {exc}") from None
    if not drafts:
        raise EmptyDocument(f"no facts: its text is under {chunking.min_tokens} tokens")
    return _Planned(doc.source, kind, parsed.title, content_hash, len(data), st, imp, drafts,
                    warnings=list(parsed.warnings))


def _batches(plans: list[_Planned], new_first: dict[str, int], commit_every: int
             ) -> Iterable[tuple[list[_Planned], list[str]]]:
    """Consecutive documents whose new texts add up to about `commit_every`."""
    batch: list[_Planned] = []
    ids: list[str] = []
    for k, p in enumerate(plans):
        batch.append(p)
        if p.drafts:
            ids.extend(d.id for d in p.drafts if new_first.get(d.id) == k)
        if len(ids) >= commit_every or len(batch) >= 4 * commit_every:
            yield batch, ids
            batch, ids = [], []
    if batch:
        yield batch, ids


def ingest_documents(
    ckf: CKF,
    docs: Iterable[DocumentInput],
    *,
    source_type: str = "user",
    importance: float | None = None,
    progress: IngestProgress | None = None,
    chunking: ChunkConfig = DEFAULT_CHUNKING,
    batch_size: int = 32,
    commit_every: int = 1024,
    total_hint: int | None = None,
    report: IngestReport | None = None,
) -> IngestReport:
    """Ingest documents given as content. Returns what happened, document by document
    summed up; failures of single documents are in `report.skipped`, not exceptions.

    Documents are read, parsed and committed as they come, a group of about `commit_every`
    new facts at a time: a folder larger than memory is never held whole, and a failure late
    in it (a kill, a full disk) loses no group already committed."""
    started = time.perf_counter()
    source_type = normalize_source_type(source_type)
    if importance is not None:
        importance = check_importance(importance)
    if commit_every < 1:
        raise InvalidInputError(f"commit_every must be ≥ 1, got {commit_every}")
    rep = report if report is not None else IngestReport()
    group = _Group(ckf, rep, progress, batch_size, commit_every)
    seen_sources: set[str] = set()
    for k, doc in enumerate(docs):
        if progress:
            progress("read", k, total_hint or 0)
        if doc.source in seen_sources:
            continue
        seen_sources.add(doc.source)
        try:
            plan = _plan(ckf, doc, source_type, importance, chunking)
        except SkipDocument as e:
            rep.left_out(doc.source, e)
            continue
        except Exception as e:  # one hostile file must not end the ingest of the others
            rep.skipped.append((doc.source, f"could not be read: {type(e).__name__}: {e}"))
            continue
        for w in plan.warnings:
            log.warning("%s: %s", doc.source, w)
            rep.warnings.append((doc.source, w))
        group.add(plan, max(0, (total_hint or 0) - k - 1))
    if progress:
        progress("read", len(seen_sources), len(seen_sources))
    group.commit()
    if progress:
        progress("embed", group.done, group.done)  # the estimate's last word: the count
    rep.documents = rep.documents_new + rep.documents_changed + rep.documents_unchanged
    rep.seconds += time.perf_counter() - started
    return rep


class _Group:
    """The documents planned since the last commit, committed once their new facts reach
    `commit_every` (or the documents 4x that, for a run of unchanged ones)."""

    def __init__(self, ckf: CKF, rep: IngestReport, progress: IngestProgress | None,
                 batch_size: int, commit_every: int) -> None:
        self.ckf, self.rep, self.progress = ckf, rep, progress
        self.batch_size, self.commit_every = batch_size, commit_every
        self.plans: list[_Planned] = []
        self.facts = 0  # drafts of the planned documents, an upper bound of their new facts
        self.done = 0  # texts embedded so far, the whole ingest
        self.planned_docs = 0
        self.planned_facts = 0
        self.remaining_docs = 0

    def add(self, plan: _Planned, remaining_docs: int) -> None:
        self.plans.append(plan)
        n = len(plan.drafts or ())
        self.facts += n
        self.planned_docs += 1
        self.planned_facts += n
        self.remaining_docs = remaining_docs
        if self.facts >= self.commit_every or len(self.plans) >= 4 * self.commit_every:
            self.commit()

    def _tick(self, k: int) -> None:
        self.done += k
        if self.progress:
            # facts to go: this group's, and the documents not read yet at the mean so far
            per_doc = self.planned_facts / max(self.planned_docs, 1)
            total = max(self.done, self.planned_facts, round(
                self.planned_facts + per_doc * self.remaining_docs))
            self.progress("embed", self.done, total)

    def commit(self) -> None:
        """Embed what is new in the planned documents and commit them."""
        plans, self.plans, self.facts = self.plans, [], 0
        if not plans:
            return
        ckf, rep = self.ckf, self.rep
        # Which texts are new to the store, and which document brings each first.
        first: dict[str, int] = {}
        for k, p in enumerate(plans):
            for d in p.drafts or ():
                first.setdefault(d.id, k)
        known = ckf.known_ids(list(first))
        new_first = {i: k for i, k in first.items() if i not in known}
        recipe = ckf.recipe

        def texts_of(drafts: Sequence[FactDraft], title: str | None) -> list[str]:
            """What the model reads for each fact: the fact, with its context under the
            CKF's recipe (`cdr.retrieval.fact_recipe`)."""
            return [fact_text(recipe, d.content, title, d.section) for d in drafts]

        prefetch = getattr(ckf.embedder, "prefetch", None)
        if prefetch is not None and new_first:  # cdr.cluster.ray_ingest: embed ahead
            prefetch([t for k, p in enumerate(plans) for t in texts_of(
                [d for d in (p.drafts or ()) if new_first.get(d.id) == k], p.title)],
                batch_size=self.batch_size)

        def embed(texts: list[str]) -> np.ndarray:
            if not texts:
                return np.zeros((0, ckf.dim), dtype=np.float32)
            vecs = ckf.embedder.encode(texts, batch_size=self.batch_size, progress=self._tick)
            rep.embedded += len(texts)
            return vecs

        def embed_drafts(drafts: list[FactDraft], title: str | None) -> np.ndarray:
            return embed(texts_of(drafts, title))

        for batch, ids in _batches(plans, new_first, self.commit_every):
            # A fact two documents of the batch hold is embedded in the context (title,
            # section) of the first, which brings it (`new_first`), not of the last.
            by_id: dict[str, tuple[FactDraft, str | None]] = {}
            for p in batch:
                for d in p.drafts or ():
                    by_id.setdefault(d.id, (d, p.title))
            texts = [fact_text(recipe, by_id[i][0].content, by_id[i][1], by_id[i][0].section)
                     for i in ids]
            vectors = dict(zip(ids, embed(texts), strict=True))
            with ckf.writing() as txn:
                for p in batch:
                    if p.drafts is None:
                        assert p.doc_id is not None
                        txn.touch_document(p.doc_id, source_type=p.source_type,
                                           importance=p.importance)
                        rep.documents_unchanged += 1
                        rep.facts_kept += txn.document_fact_count(p.doc_id)
                        continue
                    existed = ckf.document_state(p.source) is not None
                    change = txn.put_document(
                        source=p.source, kind=p.kind, title=p.title,
                        content_hash=p.content_hash, size=p.size, source_type=p.source_type,
                        importance=p.importance, drafts=p.drafts, vectors=vectors,
                        embed_missing=embed_drafts,
                    )
                    if existed:
                        rep.documents_changed += 1
                    else:
                        rep.documents_new += 1
                    rep.facts_added += change.added
                    rep.facts_kept += change.kept
                    rep.facts_removed += change.removed


def ingest(
    ckf: CKF,
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    source_type: str = "user",
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    importance: float | None = None,
    progress: IngestProgress | None = None,
    chunking: ChunkConfig = DEFAULT_CHUNKING,
    batch_size: int = 32,
    commit_every: int = 1024,
    max_file_bytes: int | None = None,
    follow_symlinks: bool = False,
) -> IngestReport:
    """Ingest files and directories (recursively; `include`/`exclude` globs). Documents that
    vanished from a directory ingested before are marked STALE (their facts stay selectable,
    flagged) and listed in `report.stale`. Only regular files of at most `max_file_bytes`
    (default `cdr.ckf.sources.max_file_bytes()`) are read, and links out of a folder only with
    `follow_symlinks`; every other file is listed in `report.skipped` with why."""
    started = time.perf_counter()
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    source_type = normalize_source_type(source_type)
    if importance is not None:
        importance = check_importance(importance)
    limit = check_max_file_bytes(max_file_bytes)
    candidates, roots = discover(paths, include, exclude, follow_symlinks)
    rep = IngestReport()
    ingest_documents(ckf, read_inputs(candidates, rep, limit), source_type=source_type,
                     importance=importance, progress=progress, chunking=chunking,
                     batch_size=batch_size,
                     commit_every=commit_every, total_hint=len(candidates), report=rep)
    rep.stale = mark_vanished(ckf, roots)
    rep.seconds = time.perf_counter() - started
    return rep


def check_max_file_bytes(value: int | None) -> int:
    """The size limit an ingest reads files under: `value`, else the setting's."""
    if value is None:
        return max_file_bytes()
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"max_file_bytes must be a whole number ≥ 1, got {value!r}")
    return value


def read_inputs(candidates: Iterable[Any], report: IngestReport,
                max_bytes: int | None = None) -> Iterator[DocumentInput]:
    """Files read lazily, one at a time (a folder can be larger than memory); a file that
    cannot be read, or that discovery refused, is recorded in `report.skipped` with its
    reason and the rest go on."""
    limit = check_max_file_bytes(max_bytes)
    for c in candidates:
        if getattr(c, "refused", None):
            report.skipped.append((str(c.path), str(c.refused)))
            continue
        try:
            data = read_file(c.path, limit)
        except SkipDocument as e:
            report.left_out(str(c.path), e)
            continue
        known = kind_for_suffix(c.path.suffix)
        yield DocumentInput(str(c.path), data, DEFAULT_KIND if known is None else known.name)


def mark_vanished(ckf: CKF, roots: Sequence[Path]) -> list[str]:
    gone: list[str] = []
    for root in roots:
        prefix = str(root).rstrip(os.sep) + os.sep
        for d in ckf.documents():
            if d["source"].startswith(prefix) and not os.path.exists(d["source"]):
                gone.append(d["source"])
    todo = [s for s in gone if ckf.document(s)["status"] != "STALE"]
    if todo:
        with ckf.writing() as txn:
            for s in todo:
                txn.set_document_status(ckf.document(s)["doc_id"], "STALE")
    return gone


def ingest_texts(
    ckf: CKF,
    docs: Iterable[DocumentInput | tuple[str, bytes | str]],
    **kwargs: Any,
) -> IngestReport:
    """`ingest_documents` accepting `(source, content)` pairs as well."""
    items = [d if isinstance(d, DocumentInput) else DocumentInput(d[0], d[1]) for d in docs]
    return ingest_documents(ckf, items, total_hint=len(items), **kwargs)
