"""The sources list a cited document ends with: one entry per number, readable for any fact.

An entry names the fact's document and section path (the CKF's section path begins with the
document's title) and where it was ingested from, and quotes the fact's opening words so a
reader can find the passage. Everything in it comes from ingested documents, so it is escaped:
a title holding Markdown or HTML renders as the text it is, never as markup.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

EXCERPT_WORDS = 16
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|<~])")


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """What the document says of the fact numbered `number`."""

    number: int
    fact_id: str
    source: str
    section: str
    excerpt: str

    @property
    def title(self) -> str:
        """The document's title (the section path's first part), else its file's name, else
        the fact's id: an entry is never blank."""
        head = self.section.split(" > ")[0].strip() if self.section else ""
        if head:
            return head
        name = PurePosixPath(self.source.replace("\\", "/")).name if self.source else ""
        return name or f"fact {self.fact_id[:12]}"

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "fact_id": self.fact_id, "source": self.source,
                "section": self.section, "title": self.title, "excerpt": self.excerpt}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceEntry:
        return cls(int(data["number"]), str(data["fact_id"]), str(data.get("source", "")),
                   str(data.get("section", "")), str(data.get("excerpt", "")))


def excerpt(content: str, words: int = EXCERPT_WORDS) -> str:
    """The fact's opening words, on one line."""
    parts = content.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def escape_markdown(text: str) -> str:
    """`text` as literal Markdown: every character CommonMark or HTML would read as markup
    is backslash-escaped, line breaks become spaces."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def entry_line(entry: SourceEntry) -> str:
    """One entry's text after its number: where the fact comes from, then its words."""
    where = escape_markdown(entry.section or entry.title)
    if entry.source:
        where += f" — {escape_markdown(entry.source)}"
    quote = f": “{escape_markdown(entry.excerpt)}”" if entry.excerpt else ""
    return where + quote


def sources_markdown(entries: Sequence[SourceEntry], style: str) -> str:
    """The document's closing list: footnote definitions in the footnotes style, else a
    `## Sources` section numbered as the markers are. Empty when nothing was cited."""
    if not entries or style == "off":
        return ""
    ordered = sorted(entries, key=lambda e: e.number)
    if style == "footnotes":
        return "\n".join(f"[^{e.number}]: {entry_line(e)}" for e in ordered) + "\n"
    # An ordered list when the numbers run 1…N (a whole document), else each marked as cited.
    whole = [e.number for e in ordered] == list(range(1, len(ordered) + 1))
    lines = [f"{e.number}. {entry_line(e)}" if whole else f"- [{e.number}] {entry_line(e)}"
             for e in ordered]
    return "## Sources\n\n" + "\n".join(lines) + "\n"
