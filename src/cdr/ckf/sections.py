"""The heading path of a document being parsed, shared by every format's parser."""

from __future__ import annotations


class Sections:
    """The current heading path; a heading of level n replaces everything at level ≥ n."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    def enter(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        if title:
            self._stack.append((level, title))

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(t for _, t in self._stack)
