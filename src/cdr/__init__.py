"""cdr — Coverage-Differential Retrieval (CRP-SPEC-024) for multi-window long-form generation.

Public API: the ranking core, session state and exits; the CKF, loop, writers and gateway are
imported lazily from their modules (`cdr.ckf`, `cdr.window.loop`, `cdr.writers`, `cdr.gateway`)
so that `import cdr` stays cheap.
"""

from typing import TYPE_CHECKING

from cdr.coverage import CoverageEntry, CoverageSet, ResidualSet, SubQuery
from cdr.errors import (
    CdrError,
    EmbeddingModelMismatchError,
    InvalidInputError,
    NotFoundError,
    UpstreamError,
)
from cdr.ngrams import NgramBlacklist, NgramIndex, ngram_hashes, tokenize
from cdr.options import RunOptions
from cdr.ranking import (
    CDR_MIN_RELEVANCE,
    COVERAGE_PENALTY_CAP,
    MIN_NOVELTY_FLOOR,
    RANKING_MODES,
    Ranking,
    cdr_scores,
    rank,
    rank_all,
)
from cdr.session import EXIT_REASONS, Session, depth_from_words, exit_reason

__version__ = "0.1.0"

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers only
    from cdr.citations import SourceEntry, WindowCitations
    from cdr.ckf.handle import CKF
    from cdr.ckf.ingest import ingest
    from cdr.retrieval.embed import default_embedder, get_embedder
    from cdr.retrieval.factindex import FactIndex
    from cdr.trace import build_trace
    from cdr.window.cite import document_of
    from cdr.window.config import GenerationConfig
    from cdr.window.length import LengthReport, length_score
    from cdr.window.loop import Generator, WindowEvent
    from cdr.window.repeat_guard import RepeatGuard
    from cdr.writers import get_writer

# Heavier parts, imported on first use so that `import cdr` stays cheap.
_LAZY = {
    "CKF": "cdr.ckf.handle",
    "FactIndex": "cdr.retrieval.factindex",
    "ingest": "cdr.ckf.ingest",
    "Generator": "cdr.window.loop",
    "GenerationConfig": "cdr.window.config",
    "WindowEvent": "cdr.window.loop",
    "get_writer": "cdr.writers",
    "default_embedder": "cdr.retrieval.embed",
    "get_embedder": "cdr.retrieval.embed",
    "build_trace": "cdr.trace",
    "RepeatGuard": "cdr.window.repeat_guard",
    "LengthReport": "cdr.window.length",
    "length_score": "cdr.window.length",
    "WindowCitations": "cdr.citations",
    "SourceEntry": "cdr.citations",
    "document_of": "cdr.window.cite",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cdr' has no attribute {name!r}")

__all__ = [  # noqa: RUF022 - grouped: eager names, then the lazy ones
    "CKF",
    "FactIndex",
    "GenerationConfig",
    "Generator",
    "LengthReport",
    "RepeatGuard",
    "SourceEntry",
    "WindowCitations",
    "WindowEvent",
    "build_trace",
    "default_embedder",
    "document_of",
    "get_embedder",
    "get_writer",
    "ingest",
    "length_score",
    "CDR_MIN_RELEVANCE",
    "COVERAGE_PENALTY_CAP",
    "EXIT_REASONS",
    "MIN_NOVELTY_FLOOR",
    "RANKING_MODES",
    "CdrError",
    "CoverageEntry",
    "CoverageSet",
    "EmbeddingModelMismatchError",
    "InvalidInputError",
    "NgramBlacklist",
    "NgramIndex",
    "NotFoundError",
    "Ranking",
    "RunOptions",
    "ResidualSet",
    "Session",
    "SubQuery",
    "UpstreamError",
    "__version__",
    "cdr_scores",
    "depth_from_words",
    "exit_reason",
    "ngram_hashes",
    "rank",
    "rank_all",
    "tokenize",
]
