"""Contextual Knowledge Fabric: documents → facts with embeddings, stored durably, selected fast.

    ckf = CKF.open_or_create("docs.ckf")            # default offline model
    report = ingest(ckf, ["handbook/"], source_type="official", include=["*.md"])
    sel = ckf.select(ckf.encode_query("partial indexes"), min_relevance=0.4, limit=50)
    facts = ckf.facts(sel.indices)

`CKFSnapshot` is the read side (the local `cdr.retrieval.factindex.FactIndex`), `CKFCommitter`
the side that writes (file lifecycle, locking, all changes); `CKF` is a snapshot that refreshes
itself and forwards administration to its committer.
"""

from cdr.ckf.chunk import DEFAULT_CHUNKING, ChunkConfig, chunk_blocks, fact_id
from cdr.ckf.committer import CKFBusyError, CKFCommitter
from cdr.ckf.handle import CKF
from cdr.ckf.ingest import (
    DocumentInput,
    IngestProgress,
    IngestReport,
    ingest,
    ingest_documents,
    ingest_texts,
)
from cdr.ckf.kinds import DocumentKind, declared_settings, parse
from cdr.ckf.parse import parse_html, parse_markdown, parse_pdf, parse_text
from cdr.ckf.records import (
    MAX_FACT_TOKENS,
    MIN_FACT_TOKENS,
    SELECTABLE_STATUSES,
    SOURCE_TYPE_IMPORTANCE,
    Block,
    Fact,
    FactDraft,
    FactStatus,
    ParsedDocument,
    Selection,
    normalize_source_type,
)
from cdr.ckf.snapshot import CKFSnapshot
from cdr.text.sentences import split_sentences

__all__ = [
    "CKF",
    "DEFAULT_CHUNKING",
    "MAX_FACT_TOKENS",
    "MIN_FACT_TOKENS",
    "SELECTABLE_STATUSES",
    "SOURCE_TYPE_IMPORTANCE",
    "Block",
    "CKFBusyError",
    "CKFCommitter",
    "CKFSnapshot",
    "ChunkConfig",
    "DocumentInput",
    "DocumentKind",
    "Fact",
    "FactDraft",
    "FactStatus",
    "IngestProgress",
    "IngestReport",
    "ParsedDocument",
    "Selection",
    "chunk_blocks",
    "declared_settings",
    "fact_id",
    "ingest",
    "ingest_documents",
    "ingest_texts",
    "normalize_source_type",
    "parse",
    "parse_html",
    "parse_markdown",
    "parse_pdf",
    "parse_text",
    "split_sentences",
]
