"""Citations: every sentence of a document traced to the facts it rests on.

`cdr.citations.attribute` checks and repairs what a writer cited, `cdr.citations.markers`
takes the writer's window-local refs out and puts the document's numbers in,
`cdr.citations.support` scores a fact's support of a sentence, and `cdr.citations.sources`
writes the closing list. docs/citations.md explains the design and its calibration.
"""

from cdr.citations.attribute import (
    CITED,
    REPAIRED,
    SENTENCE_STATUSES,
    UNSUPPORTED,
    Citer,
    GivenFact,
    SentenceCitation,
    WindowCitations,
    number_facts,
    rendered,
)
from cdr.citations.markers import CITATION_STYLES, CitationStyle, take_writer_markers
from cdr.citations.sources import SourceEntry, sources_markdown
from cdr.citations.support import SUPPORT_THRESHOLD

__all__ = [
    "CITATION_STYLES", "CITED", "REPAIRED", "SENTENCE_STATUSES", "SUPPORT_THRESHOLD",
    "UNSUPPORTED", "CitationStyle", "Citer", "GivenFact", "SentenceCitation", "SourceEntry",
    "WindowCitations", "number_facts", "rendered", "sources_markdown", "take_writer_markers",
]
