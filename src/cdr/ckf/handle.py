"""The CKF handle people use (`cdr.CKF`, the CLI, ingest): the read side plus administration.

`CKF` is a `CKFSnapshot` (`cdr.ckf.snapshot`, the local `FactIndex`) that can `refresh()` to
the latest commit, and forwards every change to its `CKFCommitter` (`cdr.ckf.committer`: file
lifecycle, locking, all SQL that writes) or to `cdr.ckf.maintenance` (check, compaction),
catching up after each so that its reads always include its own writes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cdr.ckf import maintenance
from cdr.ckf.committer import CKFBusyError, CKFCommitter, create_ckf
from cdr.ckf.records import FactStatus, check_importance
from cdr.ckf.schema import DB_NAME
from cdr.ckf.snapshot import CKFSnapshot
from cdr.ckf.txn import WriteTxn
from cdr.errors import InvalidInputError, NotFoundError
from cdr.retrieval.fact_recipe import DEFAULT_RECIPE, base_model_id, check_recipe, identity

if TYPE_CHECKING:
    from cdr.retrieval.embed import Embedder

__all__ = ["CKF", "CKFBusyError", "CKFSnapshot"]


class CKF(CKFSnapshot):
    """A CKF handle: the latest snapshot (`refresh()`), plus administration through the
    committer. Readers see the state as of `open` (or the last `refresh()`/own write)."""

    def __init__(self, path: Path, embedder: Embedder | None = None) -> None:
        super().__init__(path, embedder)
        self._admin_lock = threading.RLock()  # one change (and the catch-up after it) at a time
        self._committer: CKFCommitter | None = None

    @classmethod
    def create(cls, path: str | os.PathLike[str], embedder: Embedder | None = None, *,
               dtype: str = "float32", recipe: str = DEFAULT_RECIPE) -> CKF:
        """A new, empty CKF bound to `embedder`'s model (default: the offline default), its
        facts embedded by `recipe` (`cdr.retrieval.fact_recipe`: with their title and section by
        default, `"plain"` for the fact alone)."""
        if embedder is None:
            from cdr.retrieval.embed import default_embedder

            embedder = default_embedder()
        ident = identity(base_model_id(embedder), recipe)
        root = create_ckf(Path(path), ident, int(embedder.dim), dtype)
        return cls(root, embedder)

    @classmethod
    def open_or_create(cls, path: str | os.PathLike[str], embedder: Embedder | None = None,
                       *, dtype: str = "float32", recipe: str | None = None) -> CKF:
        """Open the CKF at `path`, or create it. `recipe` applies to a new CKF; an existing
        one built with another recipe is refused (re-embed it instead)."""
        root = Path(path).expanduser()
        if (root / DB_NAME).is_file():
            store = cls.open(root, embedder)
            if recipe is not None and store.recipe != check_recipe(recipe):
                have = store.recipe
                store.close()
                raise InvalidInputError(
                    f"{root} embeds facts with recipe {have!r}, not {recipe!r}; migrate it "
                    f"with `cdr ckf reembed --recipe {recipe}` or leave --recipe out")
            return store
        return cls.create(root, embedder, dtype=dtype, recipe=recipe or DEFAULT_RECIPE)

    def close(self) -> None:
        with self._admin_lock:
            if self._committer is not None:
                self._committer.close()
                self._committer = None
            super().close()

    @property
    def committer(self) -> CKFCommitter:
        """The committer: the admin side that writes (opened on first use)."""
        with self._admin_lock:
            if self._committer is None:
                self._committer = CKFCommitter(self.path)
            return self._committer

    # The committer's old name (`cdr.writers` are the language-model backends).

    def refresh(self) -> bool:
        """Pick up commits made by other processes; True if anything changed."""
        with self._admin_lock:
            if self.latest_generation() == self.generation:
                return False
            self._catch_up()
            return True

    @contextlib.contextmanager
    def _then_reload(self) -> Iterator[None]:
        with self._admin_lock:
            try:
                yield
            finally:
                self._catch_up()

    # ------------------------------------------------------------------ administration

    @contextlib.contextmanager
    def writing(self, lock_timeout: float = 60.0) -> Iterator[WriteTxn]:
        """One atomic change (see `CKFCommitter.writing`); this handle sees it afterwards."""
        with self._then_reload(), self.committer.writing(lock_timeout) as txn:
            yield txn

    def delete_document(self, doc_id_or_source: str) -> int:
        """Remove a document; returns how many facts left the selectable set (facts that
        another document also holds stay). Rows stay, inactive, until `compact()`."""
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self._then_reload():
            return self.committer.delete_document(doc_id)

    def set_document_importance(self, doc_id_or_source: str, importance: float) -> None:
        imp = check_importance(importance)
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self._then_reload():
            self.committer.set_document_importance(doc_id, imp)

    def set_document_status(self, doc_id_or_source: str, status: str | FactStatus) -> None:
        """Mark a document STALE (its facts stay selectable but flagged) or ACTIVE again."""
        st = FactStatus.parse(status)
        if st not in (FactStatus.ACTIVE, FactStatus.STALE):
            raise InvalidInputError("a document is ACTIVE or STALE; delete it to remove it")
        doc_id = self.document(doc_id_or_source)["doc_id"]
        with self._then_reload():
            self.committer.set_document_status(doc_id, st.name)

    def _rows_of(self, facts: Iterable[int | str]) -> list[int]:
        items = list(facts)
        ids = [f for f in items if isinstance(f, str)]
        rows = [int(f) for f in items if not isinstance(f, str)]
        if ids:
            found = self.rows_for_ids(ids)
            if (found < 0).any():
                raise NotFoundError(f"no fact with id {ids[int(np.argmin(found))]!r}")
            rows.extend(found.tolist())
        return self.check_rows(rows)

    def quarantine(self, facts: Iterable[int | str]) -> None:
        """Withdraw facts (by row or id) from selection until `unquarantine`; the flag
        survives re-ingesting their documents."""
        rows = self._rows_of(facts)
        with self._then_reload():
            self.committer.set_quarantine(rows, True)

    def unquarantine(self, facts: Iterable[int | str]) -> None:
        rows = self._rows_of(facts)
        with self._then_reload():
            self.committer.set_quarantine(rows, False)

    def append_raw(self, contents: Sequence[str], vectors: np.ndarray, *,
                   tokens: np.ndarray | None = None,
                   ngram_lists: Sequence[np.ndarray] | None = None,
                   source: str = "synthetic", importance: float = 0.6) -> None:
        """Append rows with precomputed vectors as one document (see `CKFCommitter.append_raw`)."""
        with self._then_reload():
            self.committer.append_raw(contents, vectors, tokens=tokens, ngram_lists=ngram_lists,
                                   source=source, importance=importance)

    def check(self, *, deep: bool = True) -> list[str]:
        """Integrity problems found (empty list: consistent)."""
        with self._then_reload():
            return maintenance.check(self.committer, deep=deep)

    def compact(self) -> dict[str, int]:
        """Drop DELETED rows and renumber the rest (rows change!); returns before/after."""
        with self._then_reload():
            return maintenance.compact(self.committer)
