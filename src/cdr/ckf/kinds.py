"""The document kinds ingest reads, in one registry: suffixes, binary or not, parser,
availability and what a document may declare about itself.

Finding files (`cdr.ckf.sources.discover`), decoding and parsing them
(`cdr.ckf.sources.parse_bytes`), planning an ingest (`cdr.ckf.ingest`) and the gateway's upload
route (`cdr.gateway.routes_ckf`) all ask this table, so a kind is added in one place and a kind
that needs an optional extra (PDF needs pypdf, the `pdf` extra) is refused the same way
everywhere, with the extra named. A file whose suffix is not registered is not picked up from
a folder, a document given without a kind is read as plain text, and an upload of one is
refused (415), as before the registry.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass

from cdr.ckf.html_blocks import parse_html
from cdr.ckf.markdown_blocks import front_matter, parse_markdown
from cdr.ckf.parse import parse_pdf, parse_text
from cdr.ckf.records import ParsedDocument
from cdr.errors import InvalidInputError

# What a document may say about its own source type and importance, read without a full parse
# (an unchanged document costs no parsing).
DECLARABLE = ("source_type", "importance")
_HTML_META = {
    key: re.compile(
        rf"""<meta[^>]+name\s*=\s*["']cdr-{name}["'][^>]*content\s*=\s*["']([^"']+)""", re.I)
    for key, name in (("source_type", "source-type"), ("importance", "importance"))
}


def _markdown_declares(text: str) -> dict[str, str]:
    """Markdown front matter: `source_type:`, `importance:`."""
    meta, _ = front_matter(text[:20000].splitlines())
    return {k: meta[k] for k in DECLARABLE if k in meta}


def _html_declares(text: str) -> dict[str, str]:
    """HTML `<meta name="cdr-source-type|cdr-importance" content=...>` in the page's head."""
    head = text[:50000]
    return {key: m.group(1).strip() for key, rx in _HTML_META.items() if (m := rx.search(head))}


@dataclass(frozen=True)
class DocumentKind:
    """One kind of document: how it is recognised, read and parsed.

    A text kind is decoded (`cdr.ckf.sources.decode_text`) and parsed from text; a binary kind
    is parsed from its bytes, which must start with `magic`. `module` is the optional
    dependency the parser imports and `extra` the package extra that installs it; without it
    the kind is registered but unavailable, and refused with a message naming the extra."""

    name: str
    label: str
    suffixes: tuple[str, ...]
    binary: bool = False
    parse_text: Callable[[str], ParsedDocument] | None = None
    parse_bytes: Callable[[bytes], ParsedDocument] | None = None
    magic: bytes = b""
    module: str | None = None
    extra: str | None = None
    declares: Callable[[str], dict[str, str]] | None = None
    no_text: str = "no text content"

    @property
    def available(self) -> bool:
        """Whether the parser's optional dependency (if any) is installed."""
        return self.module is None or importlib.util.find_spec(self.module) is not None

    def missing(self) -> str:
        """Why the kind cannot be read here: the dependency and the extra that installs it."""
        return (f"{self.label} support needs {self.module}: "
                f"pip install 'cdr-retrieval[{self.extra}]'")


REGISTRY: dict[str, DocumentKind] = {k.name: k for k in (
    DocumentKind("md", "Markdown", (".md", ".markdown", ".mdown", ".mkd"),
                 parse_text=parse_markdown, declares=_markdown_declares),
    DocumentKind("txt", "plain text", (".txt", ".text", ".rst"), parse_text=parse_text),
    DocumentKind("html", "HTML", (".html", ".htm", ".xhtml"), parse_text=parse_html,
                 declares=_html_declares),
    DocumentKind("pdf", "PDF", (".pdf",), binary=True, parse_bytes=parse_pdf, magic=b"%PDF-",
                 module="pypdf", extra="pdf",
                 no_text="PDF has no extractable text (scanned images?)"),
)}
KINDS = tuple(REGISTRY)
KIND_BY_SUFFIX = {suffix: k.name for k in REGISTRY.values() for suffix in k.suffixes}
# What a document given without a kind (or a suffix the registry lacks) is read as.
DEFAULT_KIND = "txt"


def document_kind(name: str) -> DocumentKind:
    """The registered kind called `name`, or a clear error listing the kinds."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InvalidInputError(f"unknown document kind {name!r}; expected one of "
                                f"{', '.join(KINDS)}") from None


def kind_for_suffix(suffix: str) -> DocumentKind | None:
    """The kind a file suffix (".md", any case) names, or None."""
    name = KIND_BY_SUFFIX.get(suffix.lower())
    return None if name is None else REGISTRY[name]


def available_suffixes() -> list[str]:
    """The suffixes of the kinds this installation can read, sorted."""
    return sorted(s for k in REGISTRY.values() if k.available for s in k.suffixes)


def declared_settings(kind: str, text: str) -> dict[str, str]:
    """What a document says about its own source type / importance (`DECLARABLE`): Markdown
    front matter, HTML `<meta name="cdr-source-type|cdr-importance">`; nothing for the other
    kinds. Read without a full parse, so an unchanged document costs no parsing."""
    declares = REGISTRY[kind].declares if kind in REGISTRY else None
    return declares(text) if declares is not None else {}


def parse(kind: str, text: str) -> ParsedDocument:
    """Parse decoded text of one of the text kinds ("md", "txt", "html")."""
    k = REGISTRY.get(kind)
    if k is None or k.parse_text is None:
        text_kinds = [n for n, r in REGISTRY.items() if r.parse_text is not None]
        raise InvalidInputError(f"unknown document kind {kind!r}; expected one of "
                                f"{', '.join(text_kinds)}")
    return k.parse_text(text)


def pdf_available() -> bool:
    """Whether PDFs can be read (pypdf, the `pdf` extra, is installed)."""
    return REGISTRY["pdf"].available
