"""Task decomposition and DPE Stage 8 (completeness verification).

Decomposition turns a task into sub-queries (id, text, expected words): from an outline file,
from the CKF itself (clusters of the task's relevant facts, each named by its most central
section heading), or from an LLM. Stage 8 reads a window's text back: paragraphs are embedded
with the CKF's model and attributed to the closest sub-query above a threshold, and words per
sub-query become depths (§3.2).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cdr.coverage import SubQuery
from cdr.errors import InvalidInputError
from cdr.options import DEFAULTS
from cdr.session import depth_from_words
from cdr.text.sentences import ends_sentence

# Attribution threshold for the default model (all-MiniLM-L6-v2), measured on the Python docs:
# see docs/results/index.md, "Calibration". A paragraph less similar than this to every
# sub-query counts for none.
DEFAULT_ATTRIBUTION_THRESHOLD = 0.30
DEFAULT_TOTAL_WORDS = DEFAULTS.words  # the user's option (cdr.options.RunOptions)

_LIST_MARK = re.compile(r"^\s*(?:[-*+#>]+|\(?\d+[.):]|[ivxIVX]+[.)]|[a-zA-Z][.)])\s*")
_WORD = re.compile(r"\w+")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def split_words(total_words: int, n: int) -> list[int]:
    """Split a target length across n sub-queries, as evenly as integers allow."""
    if n < 1:
        raise InvalidInputError("cannot split words across zero sub-queries")
    if total_words < n:
        raise InvalidInputError(f"--words {total_words} is fewer than one per sub-query ({n})")
    base, extra = divmod(total_words, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def parse_outline(text: str, total_words: int = DEFAULT_TOTAL_WORDS) -> list[SubQuery]:
    """One sub-query per non-empty line; leading '-', '*', '#' or numbering is ignored."""
    lines = [_LIST_MARK.sub("", line, count=1).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise InvalidInputError("the outline has no lines (expected one sub-query per line)")
    words = split_words(total_words, len(lines))
    return [SubQuery(f"sq-{i + 1}", t, w) for i, (t, w) in enumerate(zip(lines, words,
                                                                              strict=True))]


def _kmeans(x: np.ndarray, k: int, seed: int = 0, iters: int = 25) -> np.ndarray:
    """Spherical k-means with k-means++ seeding; deterministic for a seed. Returns labels."""
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    centers = [x[int(rng.integers(n))]]
    for _ in range(1, k):
        d = 1.0 - np.max(x @ np.stack(centers).T, axis=1)
        d = np.clip(d, 0, None) ** 2
        p = d / d.sum() if d.sum() > 0 else np.full(n, 1.0 / n)
        centers.append(x[int(rng.choice(n, p=p))])
    c = np.stack(centers)
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        new = np.argmax(x @ c.T, axis=1)
        if _ > 0 and np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            members = x[labels == j]
            if len(members):
                v = members.sum(axis=0)
                c[j] = v / max(float(np.linalg.norm(v)), 1e-12)
    return labels


def decompose_from_facts(
    embeddings: np.ndarray,
    sections: Sequence[str],
    n_sub_queries: int,
    total_words: int = DEFAULT_TOTAL_WORDS,
) -> list[SubQuery]:
    """Automatic decomposition: cluster the task's relevant facts (unit rows) and name each
    cluster by the section heading of the facts nearest its centre.

    Clusters are ordered by their best-ranked member (facts arrive in relevance order), so the
    outline starts with what is most central to the task. Duplicate names are merged.
    """
    n = embeddings.shape[0]
    if n == 0:
        raise InvalidInputError("no relevant facts to decompose the task from")
    k = max(1, min(n_sub_queries, n))
    labels = _kmeans(embeddings, k)
    names: list[str] = []
    for j in sorted(set(labels.tolist()), key=lambda j: int(np.flatnonzero(labels == j)[0])):
        members = np.flatnonzero(labels == j)
        centre = embeddings[members].mean(axis=0)
        near = members[np.argsort(-(embeddings[members] @ centre))[:5]]
        votes: dict[str, float] = {}
        for rank_i, m in enumerate(near):
            label = sections[m].split(" > ")[-1].strip() or sections[m]
            votes[label] = votes.get(label, 0.0) + 1.0 / (1 + rank_i)
        best = max(votes, key=lambda s: votes[s])
        if best and best not in names:
            names.append(best)
    words = split_words(total_words, len(names))
    return [SubQuery(f"sq-{i + 1}", t, w) for i, (t, w) in enumerate(zip(names, words,
                                                                              strict=True))]


def llm_outline_prompt(task: str, n_sub_queries: int) -> list[dict[str, str]]:
    """Messages asking an LLM for an outline, one section title per line."""
    return [
        {"role": "system", "content": "You plan long documents. Answer with section titles "
                                      "only, one per line, no numbering, no commentary."},
        {"role": "user", "content": f"Task: {task}\nGive {n_sub_queries} section titles that "
                                    "together complete the task, in reading order."},
    ]


# -- Stage 8 -------------------------------------------------------------------------------------

@dataclass
class DpeReport:
    """What Stage 8 found in one window's text."""

    addressed: dict[str, float]  # sub-query id -> depth in this window
    words: dict[str, int]  # sub-query id -> words attributed
    paragraphs: int
    unattributed_words: int
    attribution: list[str | None] = field(default_factory=list)  # per paragraph
    bodies: list[str] = field(default_factory=list)  # per paragraph, as attributed

    def section_ends(self, max_words: int) -> dict[str, str]:
        """Sub-query id → the last `max_words` words this window wrote for it (from its last
        attributed paragraph, starting at a sentence where one fits): what the next window
        that continues the section is shown, so it goes on rather than begins again."""
        ends: dict[str, str] = {}
        for sq_id, body in zip(self.attribution, self.bodies, strict=False):
            if sq_id is not None:
                ends[sq_id] = tail_words(body, max_words)
        return ends

    @property
    def addressed_sub_queries(self) -> list[dict[str, float | str]]:
        return [{"id": i, "depth": round(d, 4)} for i, d in self.addressed.items()]


# Chatter: the model talking to the reader about the text rather than writing it ("Sure! Here
# is the next part…", "I hope this helps"). It earns no depth wherever it sits.
_CHATTER = re.compile(
    r"^\W*(?:sure|certainly|of course|absolutely|okay|ok|great|alright)\b"
    r"|^\W*(?:here(?:'s| is| are)|below (?:is|are|you'll find))\s+(?:the|your|a|an)\s+"
    r"(?:\w+\s+){0,2}(?:part|section|sections|guide|document|article|text|content|draft"
    r"|continuation|rest|overview of the)\b"
    r"|^\W*(?:i hope|hope this|let me know|feel free|happy coding|i have (?:written|covered))\b"
    r"|^\W*(?:in this (?:part|window|section|continuation)),? (?:i|we) (?:will|'ll)\b",
    re.IGNORECASE,
)
# A heading counts as naming a sub-query when its embedding is this close to the sub-query's
# text and clearly closer than to any other (all-MiniLM-L6-v2; docs/llm.md, "Stage 8 on model
# output").
HEADING_MATCH_THRESHOLD = 0.55
HEADING_MATCH_MARGIN = 0.05
# Numbering and fact labels the model copies into headings: "2.", "Section 3:", "F5:".
_NUMBERING = re.compile(r"^\s*(?:(?:part|section|chapter|step)\s+)?(?:\d+(?:\.\d+)*|[ivx]+|f\d+)"
                        r"[.):]?\s+", re.IGNORECASE)


def tail_words(text: str, max_words: int) -> str:
    """The end of `text` in at most `max_words` words, from a sentence start when a sentence
    boundary (`cdr.text.sentences`) falls inside that span (a quote that begins mid-sentence
    reads as a fragment; "…" marks one that has to)."""
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    tail = words[-max_words:]
    if ends_sentence(words[-max_words - 1]):
        return " ".join(tail)
    for i, word in enumerate(tail[:-1]):
        if ends_sentence(word):
            return " ".join(tail[i + 1:])
    return "… " + " ".join(tail)


def is_chatter(paragraph: str) -> bool:
    """Text about the text ("Sure! Here is…", "I hope this helps"), not content."""
    return bool(_CHATTER.match(paragraph.strip()))


def normalise_heading(heading: str) -> str:
    """Lower case without numbering or punctuation: "2. Creating Indexes:" → "creating indexes"."""
    h = _NUMBERING.sub("", heading.strip())
    return " ".join(_WORD.findall(h.lower()))


def split_paragraphs(
    text: str, titles: Sequence[str] = ()
) -> list[tuple[str | None, str]]:
    """(owning heading, prose block) pairs, in order.

    Prose is paragraphs, lists and quotes (`cdr.text.markdown`); headings are context, and code
    blocks are not prose — a fact-grounded window is written in words, and code the model adds
    on its own earns no depth. The owning heading is the nearest one above the block, unless an
    outer heading names one of `titles` (the sub-queries): "### Integers" under "## Numeric
    types" still belongs to Numeric types.
    """
    from cdr.text.markdown import parse_blocks

    wanted = {normalise_heading(t) for t in titles}
    out: list[tuple[str | None, str]] = []
    for b in parse_blocks(text):
        if b.kind not in ("paragraph", "list", "quote", "table") or not word_count(b.text):
            continue
        owner = next((h for h in reversed(b.section) if normalise_heading(h) in wanted),
                     b.heading)
        out.append((owner, b.text))
    return out


def verify_text(
    text: str,
    sub_queries: Sequence[SubQuery],
    sub_query_embeddings: np.ndarray,
    encode: Callable[[list[str]], np.ndarray],
    threshold: float = DEFAULT_ATTRIBUTION_THRESHOLD,
    fresh_share: Callable[[str], float] | None = None,
) -> DpeReport:
    """Stage 8 on a window's text, end to end: parse, embed paragraphs and headings, attribute.

    One `encode` call embeds every paragraph and every distinct heading, so a heading the model
    renamed ("Making indexes" for "Creating indexes") still names its sub-query.
    """
    paragraphs = split_paragraphs(text, [sq.text for sq in sub_queries])
    headings = sorted({h for h, _ in paragraphs if h})
    dim = sub_query_embeddings.shape[1] if sub_query_embeddings.ndim == 2 else 0
    texts = [p for _, p in paragraphs] + headings
    emb = encode(texts) if texts else np.zeros((0, dim), np.float32)
    p_emb, h_emb = emb[: len(paragraphs)], emb[len(paragraphs):]
    heading_sims = {h: h_emb[i] @ sub_query_embeddings.T for i, h in enumerate(headings)}
    fresh = [fresh_share(p) for _, p in paragraphs] if fresh_share is not None else None
    return verify_window(sub_queries, sub_query_embeddings, p_emb, paragraphs, threshold,
                         fresh, heading_sims)


def _heading_owner(heading: str, by_title: dict[str, int],
                   heading_sims: dict[str, np.ndarray] | None) -> int | None:
    idx = by_title.get(normalise_heading(heading))
    if idx is not None or not heading_sims or heading not in heading_sims:
        return idx
    sims = heading_sims[heading]
    if not len(sims):
        return None
    order = np.argsort(-sims)
    best = int(order[0])
    second = float(sims[order[1]]) if len(order) > 1 else -1.0
    if sims[best] >= HEADING_MATCH_THRESHOLD and sims[best] - second >= HEADING_MATCH_MARGIN:
        return best
    return None


def verify_window(
    sub_queries: Sequence[SubQuery],
    sub_query_embeddings: np.ndarray,
    paragraph_embeddings: np.ndarray,
    paragraphs: Sequence[tuple[str | None, str]],
    threshold: float = DEFAULT_ATTRIBUTION_THRESHOLD,
    fresh_share: Sequence[float] | None = None,
    heading_sims: dict[str, np.ndarray] | None = None,
) -> DpeReport:
    """Attribute each paragraph to one sub-query and turn words into depths.

    In order: chatter ("Sure! Here is…") belongs to none; a paragraph under a heading that
    names a sub-query — exactly up to case and numbering, or (with `heading_sims`, the
    heading's cosines to the sub-queries) by a clear embedding match — belongs to it: the
    writer said so. Otherwise (invented, merged or generic headings such as "Introduction")
    it goes to the most similar sub-query if the cosine reaches `threshold`, else to none.
    `fresh_share[p]` (share of the paragraph's 6-grams not written before) scales its words:
    depth measures content *produced* (§3.2), and text repeated from earlier windows produces
    none.
    """
    by_title = {normalise_heading(sq.text): i for i, sq in enumerate(sub_queries)}
    words = dict.fromkeys((sq.id for sq in sub_queries), 0)
    attribution: list[str | None] = []
    unattributed = 0
    sims = (
        paragraph_embeddings @ sub_query_embeddings.T
        if len(paragraphs)
        else np.zeros((0, len(sub_queries)), np.float32)
    )
    for p, (heading, body) in enumerate(paragraphs):
        n_words = word_count(body)
        if fresh_share is not None:
            n_words = round(n_words * fresh_share[p])
        if is_chatter(body):
            unattributed += n_words
            attribution.append(None)
            continue
        idx = _heading_owner(heading, by_title, heading_sims) if heading else None
        if idx is None:
            best = int(np.argmax(sims[p])) if sims.shape[1] else -1
            idx = best if best >= 0 and sims[p, best] >= threshold else None
        if idx is None:
            unattributed += n_words
            attribution.append(None)
            continue
        sq = sub_queries[idx]
        words[sq.id] += n_words
        attribution.append(sq.id)
    addressed = {
        sq.id: depth_from_words(words[sq.id], sq.expected_words)
        for sq in sub_queries
        if words[sq.id] > 0
    }
    return DpeReport(addressed, {k: v for k, v in words.items() if v}, len(paragraphs),
                     unattributed, attribution, [body for _, body in paragraphs])
