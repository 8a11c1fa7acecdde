"""Stream only what the window will keep.

A window cut off by the token limit keeps its text up to the last complete block
(`cdr.text.markdown.keep_complete`); the unfinished tail is dropped and earns nothing. A stream that
forwarded every piece as it arrived would already have shown the client that tail, so the
streamed document and the stored one would differ. `KeptStream` holds the current block back
until the next block begins, and at the end releases exactly the rest of the text the window
kept, so the concatenated deltas always equal the window's kept text. The price is latency of
one block (a paragraph, a list, a code block), not of the window.

A `shape` (the session's repeat guard, `cdr.window.repeat_guard`) maps the complete blocks to what
the window keeps of them; it must keep a prefix's blocks as it keeps them in the longer text, so
what was released stays a prefix of the final text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cdr.text.markdown import complete_blocks_end

log = logging.getLogger(__name__)


class KeptStream:
    """Wraps a delta sink; `feed` pieces as the writer streams them, then `finish` with the
    text the window kept."""

    def __init__(self, sink: Callable[[str], None],
                 shape: Callable[[str], str] | None = None) -> None:
        self._sink = sink
        self._shape = shape
        self._shaped = ""  # shape(complete blocks so far): what `sent` is a prefix of
        self._text = ""
        self._complete = ""  # the complete blocks `_shaped` was made from, as written
        self._sent = 0

    @property
    def sent(self) -> str:
        """What has reached the sink so far."""
        return self._shaped[: self._sent]

    def feed(self, piece: str) -> None:
        self._text += piece
        if "\n" not in piece:  # a block can only begin on a new line
            return
        complete = self._text[: complete_blocks_end(self._text)]
        released = (self._shape(complete) if self._shape else complete).rstrip()
        if len(released) > self._sent:
            if not released.startswith(self.sent):  # a shape that broke its promise
                log.warning("shaped stream is no longer a prefix; holding the rest back")
                return
            self._shaped, self._complete = released, complete
            self._emit(released[self._sent:])

    def released_at_least(self, kept: str) -> str:
        """`kept`, or the written blocks already released when they reach past it.

        A text cut where the model began to repeat itself (`cdr.text.self_repeat`) can end
        before blocks the stream already released: a loop of two paragraphs is seen at the
        end of its second copy of the second, when the second copy of the first is out. The
        window then keeps what the client has (a part of the loop), so that the stream and the
        stored text stay one. Any other kept text holds every released block already (a
        finished text, or one cut back to its complete blocks at the token limit), and comes
        back as it is: callers pass every window's text through here."""
        done = self._complete.rstrip()
        if len(done) > len(kept.rstrip()) and done.startswith(kept.rstrip()):
            return done + "\n"
        return kept

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
        self._shaped, self._sent = kept, len(sent)
        if len(kept) > self._sent:
            self._emit(kept[self._sent:])

    def _emit(self, piece: str) -> None:
        self._sent += len(piece)
        self._sink(piece)
