"""How a fact's text is turned into the text its embedding is computed from (its *recipe*).

On a knowledge base of many documents of one kind, a fact rarely names its document's subject
("The match drew 100,000 spectators"), so embedded alone it sits far from any task about that
subject and the relevance gate drops it while other documents' facts pass (docs/retrieval.md,
"Relevance means the task's own material"). The `title-section` recipe embeds each fact as

    <document title> — <section path>: <fact>

with the title and path cleaned and bounded, so the extra tokens per fact stay small. Two
bounds exist, each its own recipe because vectors made with one are not those of the other:

- `title-section-short` (the default for new CKFs): the title's leading words and the deepest
  heading, at most `CONTEXT_TOKENS` tokens of prefix in all. Embedding time grows with the
  tokens a text holds, and this bound keeps ingest at 80% or more of the plain recipe's speed
  (docs/retrieval.md, "Relevance means the task's own material");
- `title-section`: the title (`TITLE_WORDS`) and as much of the section path as fits in
  `CONTEXT_WORDS` words — what CKFs built before the short recipe hold.

The fact's stored text, its id and its 6-grams stay the fact alone: only the vector changes.

A recipe is part of the embedding identity of SPEC-024 §2.5: vectors made one way are not
comparable with vectors made the other way, so the identity recorded in a CKF (and in every
session started on it) is the model id plus the recipe, `"<model id>#<recipe>"`. The `plain`
recipe (a fact embedded alone, what every CKF built before recipes holds) keeps the bare model
id, so old CKFs and sessions read exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from cdr.errors import EmbeddingModelMismatchError, InvalidInputError

PLAIN = "plain"
TITLE_SECTION = "title-section"
TITLE_SECTION_SHORT = "title-section-short"
RECIPES: tuple[str, ...] = (PLAIN, TITLE_SECTION, TITLE_SECTION_SHORT)
# New CKFs: the context lifts the task's own material on the retrieval benchmark, and the short
# bound keeps ingest within 80% of the plain recipe's speed (docs/results/retrieval.md).
DEFAULT_RECIPE = TITLE_SECTION_SHORT
SEPARATOR = "#"
# `title-section`: words of context (title + section path) at most.
CONTEXT_WORDS = 16
TITLE_WORDS = 10
# `title-section-short`: tokens (cl100k, `cdr.text.tokens`) of the whole prefix at most, separators
# included — about a fifth of a typical fact's tokens, so embedding a fact with its context
# costs about 1.2 times embedding it alone; the title keeps at least `SHORT_TITLE_MIN_WORDS`
# words (a page's name comes first in its title) before the heading gives up any.
CONTEXT_TOKENS = 10
SHORT_TITLE_MIN_WORDS = 2
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_SPACE = re.compile(r"\s+")


def check_recipe(recipe: str) -> str:
    """`recipe` if it is known; a clear error naming the choices otherwise."""
    if recipe not in RECIPES:
        raise InvalidInputError(f"unknown fact recipe {recipe!r}; choose one of {RECIPES}")
    return recipe


def identity(model_id: str, recipe: str) -> str:
    """The embedding identity of facts made by `recipe` with `model_id` (plain: the id)."""
    check_recipe(recipe)
    return model_id if recipe == PLAIN else f"{model_id}{SEPARATOR}{recipe}"


def split_identity(ident: str) -> tuple[str, str]:
    """(model id, recipe) of an identity; an id without a known recipe suffix is plain."""
    model, sep, recipe = ident.rpartition(SEPARATOR)
    if sep and model and recipe in RECIPES:
        return model, recipe
    return ident, PLAIN


def clean_context(text: str | None, max_words: int) -> str:
    """Control characters out, whitespace collapsed, at most `max_words` words."""
    if not text:
        return ""
    words = _SPACE.sub(" ", _CONTROL.sub(" ", text)).strip().split(" ")
    return " ".join(w for w in words[:max_words] if w)


def context_of(title: str | None, section: str | None) -> str:
    """The bounded context prefix: the title and the section path, the path's first part left
    out when it repeats the title (a page's top heading usually is its title)."""
    t = clean_context(title, TITLE_WORDS)
    parts = [p.strip() for p in (section or "").split(">")]
    parts = [p for p in parts if p]
    if t and parts and clean_context(parts[0], TITLE_WORDS).casefold() == t.casefold():
        parts = parts[1:]
    room = CONTEXT_WORDS - len(t.split())
    # Keep the deepest headings whole while they fit: they say most about the fact.
    kept: list[str] = []
    for part in reversed(parts):
        words = clean_context(part, CONTEXT_WORDS).split()
        if not words:
            continue
        if len(words) > room:
            if not kept and room > 0:
                kept.append(" ".join(words[:room]))
            break
        kept.insert(0, " ".join(words))
        room -= len(words)
    path_text = " > ".join(kept)
    if t and path_text:
        return f"{t} — {path_text}"
    return t or path_text


def _join(title_words: Sequence[str], heading_words: Sequence[str]) -> str:
    t, h = " ".join(title_words), " ".join(heading_words)
    return f"{t} — {h}" if t and h else t or h


@lru_cache(maxsize=8192)
def short_context_of(title: str | None, section: str | None,
                     max_tokens: int = CONTEXT_TOKENS) -> str:
    """The `title-section-short` prefix (without its ": "): the title's leading words and the
    deepest heading, cut word by word until the prefix and its separators are at most
    `max_tokens` tokens. Cut first from the end of whichever part is longer, the title keeping
    its first `SHORT_TITLE_MIN_WORDS` words longest: its name says whose fact it is, the
    deepest heading what the fact is about. Cached: the facts of one section share it."""
    from cdr.text.tokens import count_tokens

    tw = clean_context(title, TITLE_WORDS).split()
    parts = [p.strip() for p in (section or "").split(">")]
    parts = [p for p in parts if clean_context(p, 1)]
    if tw and parts and clean_context(parts[0], TITLE_WORDS).casefold() == " ".join(tw).casefold():
        parts = parts[1:]
    hw = clean_context(parts[-1], CONTEXT_WORDS).split() if parts else []
    while (tw or hw) and count_tokens(_join(tw, hw) + ": ") > max_tokens:
        t_cost = count_tokens(" ".join(tw)) if tw else 0
        h_cost = count_tokens(" ".join(hw)) if hw else 0
        if hw and (len(tw) <= SHORT_TITLE_MIN_WORDS or h_cost > t_cost):
            hw.pop()
        else:
            tw.pop()
    return _join(tw, hw)


def fact_text(recipe: str, content: str, title: str | None, section: str | None) -> str:
    """What the embedding model reads for one fact under `recipe`."""
    if recipe == PLAIN:
        return content
    check_recipe(recipe)
    ctx = short_context_of(title, section) if recipe == TITLE_SECTION_SHORT \
        else context_of(title, section)
    return f"{ctx}: {content}" if ctx else content


def fact_texts(recipe: str, contents: Sequence[str], titles: Sequence[str | None],
               sections: Sequence[str | None]) -> list[str]:
    return [fact_text(recipe, c, t, s) for c, t, s in zip(contents, titles, sections,
                                                          strict=True)]


class RecipeEmbedder:
    """A model embedder bound to a recipe: its `model_id` is the identity, so every check that
    compares model ids (CKF, session, token, shards) compares identities. Queries, sub-queries
    and window text are embedded as they are (`encode`); facts go through `fact_text` at ingest
    and re-embedding."""

    def __init__(self, base: Any, recipe: str) -> None:
        self.base = base
        self.recipe = check_recipe(recipe)
        self.model_id = identity(base.model_id, recipe)
        self.dim = int(base.dim)

    def __repr__(self) -> str:
        return f"RecipeEmbedder({self.base!r}, {self.recipe!r})"

    def encode(self, texts: Sequence[str], *, batch_size: int = 32,
               progress: Any = None) -> np.ndarray:
        out: np.ndarray = self.base.encode(texts, batch_size=batch_size, progress=progress)
        return out

    def __getattr__(self, name: str) -> Any:  # prefetch, close, token_ids… of the model
        return getattr(self.base, name)


def base_model_id(embedder: Any) -> str:
    return str(getattr(embedder, "base", embedder).model_id)


def bind(embedder: Any, ident: str) -> Any:
    """`embedder` made to produce vectors of identity `ident`: as it is when its identity is
    already that, wrapped with the recipe when it is the bare model; refused otherwise."""
    if embedder.model_id == ident:
        return embedder
    model, recipe = split_identity(ident)
    if not isinstance(embedder, RecipeEmbedder) and embedder.model_id == model:
        return RecipeEmbedder(embedder, recipe)
    raise EmbeddingModelMismatchError(ident, embedder.model_id)


def describe(ident: str) -> str:
    """"<model> (facts embedded <how>)" for messages and stats."""
    model, recipe = split_identity(ident)
    how = "alone" if recipe == PLAIN else "with their document title and section"
    return f"{model} (facts embedded {how}: recipe {recipe!r})"
