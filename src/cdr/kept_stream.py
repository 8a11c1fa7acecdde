"""Stream only what the window will keep.

A window cut off by the token limit keeps its text up to the last complete block
(`cdr.markdown.keep_complete`); the unfinished tail is dropped and earns nothing. A stream that
forwarded every piece as it arrived would already have shown the client that tail, so the
streamed document and the stored one would differ. `KeptStream` holds the current block back
until the next block begins, and at the end releases exactly the rest of the text the window
kept, so the concatenated deltas always equal the window's kept text. The price is latency of
one block (a paragraph, a list, a code block), not of the window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdr.markdown import complete_blocks_end

log = logging.getLogger(__name__)


class KeptStream:
    """Wraps a delta sink; `feed` pieces as the writer streams them, then `finish` with the
    text the window kept."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self._sink = sink
        self._text = ""
        self._sent = 0

    @property
    def sent(self) -> str:
        """What has reached the sink so far."""
        return self._text[: self._sent]

    def feed(self, piece: str) -> None:
        self._text += piece
        if "\n" not in piece:  # a block can only begin on a new line
            return
        released = self._text[: complete_blocks_end(self._text)].rstrip()
        if len(released) > self._sent:
            self._emit(released[self._sent:])

    def finish(self, kept: str) -> None:
        """Release the rest of `kept` (the window's final text). `kept` always starts with what
        was released, because only complete blocks are released and a kept text never ends
        inside one; should a writer's text ever break that, nothing more is sent and the
        stored window (not the stream) is the record."""
        sent = self.sent
        if not kept.startswith(sent):
            log.warning("streamed text is not a prefix of the kept window text; "
                        "the stream stops at %d characters", len(sent))
            return
        self._text, self._sent = kept, len(sent)
        if len(kept) > self._sent:
            self._emit(kept[self._sent:])

    def _emit(self, piece: str) -> None:
        self._sent += len(piece)
        self._sink(piece)
