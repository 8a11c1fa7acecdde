"""A block of a parsed document: the one unit both parsers hand on.

Documents being ingested (`cdr.ckf.parse`: Markdown, HTML, plain text, PDF) and the Markdown a
model writes (`cdr.text.markdown`) are read into the same thing: a run of text with the path of
headings above it. The chunker needs where it came from (`location`) and whether it is code;
Stage 8 and the repeat guard need its kind, its heading level and its source lines. One class
carries both, so a "block" means one thing in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("paragraph", "heading", "list", "code", "quote", "table", "rule")


@dataclass(frozen=True, slots=True)
class Block:
    """One top-level block, in reading order.

    `section` is the path of headings above it (outermost first); `location` says where it is
    in its document ("line 12", "page 3"); `kind` is one of KINDS, and `is_code` is true
    exactly when the kind is "code" (either one given sets the other). `start`/`end` are
    0-based source lines (`end` exclusive) and `level` a heading's level (7: a bold label line
    a model did not mark up), where the parser knows them.
    """

    text: str
    section: tuple[str, ...] = ()
    location: str = ""
    is_code: bool = False
    kind: str = "paragraph"
    start: int = 0
    end: int = 0
    level: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"block kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.is_code and self.kind != "code":
            object.__setattr__(self, "kind", "code")
        elif self.kind == "code":
            object.__setattr__(self, "is_code", True)

    @property
    def heading(self) -> str | None:
        """The nearest heading above the block."""
        return self.section[-1] if self.section else None
