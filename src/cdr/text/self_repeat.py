"""Stop a model that has begun to repeat itself, and keep what it wrote before the loop.

A small model sometimes falls into a loop: the same list item, sentence or paragraph again
and again until the token limit. On the long benchmark's report runs (docs/length.md), 7 of
the recommended profile's 65 windows were such loops, holding 17.2% of its words and 12.5% of
its seconds. That text is not content: counted as delivered words it flatters the length
score, it costs the seconds of a whole window, and the window's section is marked written.

`RepeatWatch` reads the text as it streams and says when its last words are one run of words
written twice back to back: a unit of at least `MIN_UNIT_WORDS` words (a shorter one, such as
"- `tuple` again", shows once it has repeated often enough to make that many), at most
`MAX_UNIT_WORDS`, and `MIN_UNIT_DISTINCT` different words among them. The writer then stops
generating (`cdr.writers.base.Pieces`), and `kept_before_repeat` keeps the text up to the end
of the first copy, cut back to a finished sentence when the loop began inside one, and to what
came before a code block it began in. The finish reason is `REPETITION`: the window
was cut like one that ran out of tokens, so its section is continued, not marked written.

Why words written twice back to back, and not a share of distinct words: it is exact (prose
does not say the same eight words twice in a row; the Python documentation's own pages never
do, `tests/test_self_repeat.py`), it is decided at the first moment it holds (the end of the
second copy), and a prefix that held it never stops holding it, so a stream can act on it.
On the benchmark's 384 recorded windows it finds 57 of the 66 that the distinct-words measure
calls loops (the others vary a word each time round, or repeat two words) and 13 more that
repeat a paragraph or a list item verbatim, which no reader wants either.
"""

from __future__ import annotations

import re

from cdr.text.sentences import ends_sentence, finished_end

# The finish reason of a window stopped here (OpenAI's vocabulary has no word for it).
REPETITION = "repetition"
# Eight words said twice in a row: longer than any phrase prose repeats for emphasis.
MIN_UNIT_WORDS = 8
# The longest unit looked for: a paragraph or a few list items (the longest loop on the
# benchmark's windows was 126 words round).
MAX_UNIT_WORDS = 400
# Different words a unit must hold: Markdown and data repeat one or two tokens by nature (a
# wide table's delimiter row "| --- | --- |", a buffer of zeros, a hexdump line). It costs one
# of the 71 repeats found on the recorded windows (a list item of two words, repeated).
MIN_UNIT_DISTINCT = 3

_WORD = re.compile(r"\S+(?=\s)")  # a word is complete once white space follows it


class RepeatWatch:
    """Fed the pieces of one text in order; `cut` is set (and `feed` returns True) once the
    text's last complete words are a unit written twice back to back."""

    def __init__(self) -> None:
        self._text = ""
        self._scanned = 0  # the end of the last complete word
        self._words: list[str] = []
        self._ends: list[int] = []  # each word's end offset in the text
        self._seen: dict[str, list[int]] = {}  # word → the indexes it stands at
        self.cut: int | None = None  # where the first copy ends, once the loop is seen

    def feed(self, piece: str) -> bool:
        """Take the next piece; True once the text repeats itself (and from then on)."""
        if self.cut is not None:
            return True
        self._text += piece
        for m in _WORD.finditer(self._text, self._scanned):
            self._scanned = m.end()
            if self._add(m.group(), m.end()):
                return True
        return False

    def _add(self, word: str, end: int) -> bool:
        i = len(self._words)
        self._words.append(word)
        self._ends.append(end)
        earlier = self._seen.setdefault(word, [])
        words = self._words
        for p in reversed(earlier):  # a unit of k words ends here only if word i-k is this one
            k = i - p
            if k > MAX_UNIT_WORDS:
                break
            if k >= MIN_UNIT_WORDS and i + 1 >= 2 * k and \
                    words[i + 1 - 2 * k:i + 1 - k] == words[i + 1 - k:i + 1] and \
                    len(set(words[i + 1 - k:i + 1])) >= MIN_UNIT_DISTINCT:
                self.cut = self._ends[i - k]
                return True
        earlier.append(i)
        return False


def find_repeat(text: str) -> int | None:
    """Where the first copy of `text`'s first back-to-back repeat ends; None without one."""
    watch = RepeatWatch()
    watch.feed(text + " ")  # its last word is complete too
    return watch.cut


def kept_before_repeat(text: str, cut: int) -> tuple[str, str]:
    """(what the window keeps, what it drops) of `text` whose repeat begins at `cut`.

    The first copy is kept where it ends a line or a sentence; a loop that began inside a
    sentence keeps the sentences finished before it, and one inside a code block what came
    before the block (code has no sentences to cut back to, and an unclosed fence would turn
    the rest of the document into code)."""
    head, rest = text[:cut], text[cut:]
    ends_line = "\n" in rest[: len(rest) - len(rest.lstrip())]
    fence = _open_fence_start(head)
    if fence is not None:
        kept = head[:fence].rstrip()
        return (kept + "\n" if kept else ""), text[len(kept):].lstrip()
    if not (ends_line or ends_sentence(head)):
        end = finished_end(head)
        head = head[:end] if end else head
    return head.rstrip() + "\n", text[len(head.rstrip()):].lstrip()


_FENCE = re.compile(r"^ {0,3}(```|~~~)", re.MULTILINE)


def _open_fence_start(text: str) -> int | None:
    """Where the code block that `text` ends inside begins; None when every fence is closed."""
    opened: tuple[int, str] | None = None
    for m in _FENCE.finditer(text):
        if opened is None:
            opened = (m.start(), m.group(1))
        elif m.group(1) == opened[1]:
            opened = None
    return None if opened is None else opened[0]
