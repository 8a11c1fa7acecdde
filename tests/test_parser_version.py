"""`PARSER_VERSION` names what parsing and chunking make of a document: it is part of every
document's content hash (`cdr.ckf.ingest`), so an unchanged file is cut into facts again only
when it changes. This pins the facts a fixed set of Markdown and plain-text documents yields at
the current version: a change to the parser or the chunker that moves them fails here until
the version is bumped (and the new digest recorded), so existing CKFs do not keep facts cut the
old way under a hash that says they are current."""

from __future__ import annotations

import hashlib
import json

from cdr.ckf.chunk import DEFAULT_CHUNKING, chunk_blocks
from cdr.ckf.parse import PARSER_VERSION
from cdr.ckf.sources import parse_bytes

# PARSER_VERSION → sha256 of the facts `_documents()` yields (id, section, location, code
# flag, tokens, content). A new version adds its line; an old line stays as the record.
DIGESTS = {
    2: "2d6d0f8d8a7a18f8f603c7094f7fd1cbcb2c14aa3748c8055b1af243229b09e9",
}


def _paragraph(seed: int, words: int) -> str:
    vocab = ("window", "fact", "coverage", "envelope", "section", "novelty", "residual",
             "anchor", "token", "budget", "ranking", "document", "heading", "chunk")
    return " ".join(vocab[(seed * 7 + i * 3) % len(vocab)] + ("." if i % 11 == 10 else "")
                    for i in range(words)) + "."


def _documents() -> list[tuple[str, bytes]]:
    md = ["# Guide", "", _paragraph(1, 40), "", "## Short", "", "Tiny.", "",
          "## Long", "", _paragraph(2, 700), "", "### Lists", "",
          *[f"- item {i}: {_paragraph(i, 12)}" for i in range(30)], "",
          "```python", *[f"x{i} = {i}" for i in range(120)], "```", "",
          "## Table", "", "| a | b |", "|---|---|", *[f"| {i} | {_paragraph(i, 6)} |"
                                                      for i in range(40)]]
    text = "\n\n".join(_paragraph(i, 30 + 17 * i) for i in range(12))
    return [("md", "\n".join(md).encode()), ("txt", text.encode())]


def _digest() -> str:
    facts = []
    for kind, data in _documents():
        for f in chunk_blocks(parse_bytes(data, kind).blocks, DEFAULT_CHUNKING):
            facts.append([kind, f.id, f.section, f.location, f.is_code, f.tokens, f.content])
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()


def test_parsing_and_chunking_are_what_the_parser_version_says():
    assert PARSER_VERSION in DIGESTS, f"record the digest of PARSER_VERSION {PARSER_VERSION}"
    assert _digest() == DIGESTS[PARSER_VERSION], (
        "parsing or chunking now cuts the documents into other facts: bump "
        "cdr.ckf.parse.PARSER_VERSION (so CKFs re-chunk unchanged files) and record the new "
        "digest in DIGESTS")
