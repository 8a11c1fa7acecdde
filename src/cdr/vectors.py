"""Validation and normalisation of embedding arrays, done once at the edges.

Every vector the ranking core sees is a finite float32 unit vector; checking that here means the
hot path can treat `a · b` as cosine similarity and never re-check.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np

from cdr.errors import InvalidInputError

_ZERO_NORM = 1e-12
_UNIT_TOLERANCE = 1e-6


def to_b64(arr: np.ndarray) -> str:
    """An array's raw bytes as base64 (a compact, exact JSON form for stored vectors)."""
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")


def from_b64(text: str, dtype: type, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The array `to_b64` saw, given its dtype (and shape; flat when None)."""
    arr: np.ndarray = np.frombuffer(base64.b64decode(text), dtype=dtype)
    return (arr if shape is None else arr.reshape(shape)).copy()


def as_matrix(
    x: object, name: str, dim: int | None = None, *, allow_empty: bool = True
) -> np.ndarray:
    """`x` as a C-contiguous float32 (n, d) array, with finite values and the expected width."""
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name}: not a numeric array ({exc})") from None
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, dim or 0)
    if arr.ndim != 2:
        raise InvalidInputError(f"{name}: expected a 2-D array (n, d), got shape {arr.shape}")
    if not allow_empty and arr.shape[0] == 0:
        raise InvalidInputError(f"{name}: is empty")
    if dim is not None and arr.shape[0] and arr.shape[1] != dim:
        raise InvalidInputError(f"{name}: dimension {arr.shape[1]} does not match {dim}")
    if arr.size and not np.isfinite(arr).all():
        raise InvalidInputError(f"{name}: contains NaN or infinite values")
    return np.ascontiguousarray(arr)


def as_vector(x: object, name: str, dim: int | None = None) -> np.ndarray:
    """`x` as a finite float32 (d,) array of the expected width."""
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name}: not a numeric vector ({exc})") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidInputError(f"{name}: expected a non-empty 1-D vector, got shape {arr.shape}")
    if dim is not None and arr.shape[0] != dim:
        raise InvalidInputError(f"{name}: dimension {arr.shape[0]} does not match {dim}")
    if not np.isfinite(arr).all():
        raise InvalidInputError(f"{name}: contains NaN or infinite values")
    return arr


def unit_rows(
    x: np.ndarray,
    refuse: Callable[[int, int], Exception],
    *,
    keep_unit: bool = False,
) -> np.ndarray:
    """`x`'s rows divided by their L2 norms, in `x`'s dtype: the one place a row is unit-
    normalised. A zero or non-finite row has no direction: `refuse(first_bad_row, n_bad)`
    is raised, so each caller names the input in its own terms. With `keep_unit`, rows already
    of unit length keep their bits (stored vectors then round-trip exactly)."""
    norms = np.linalg.norm(x, axis=1)
    bad = np.flatnonzero(~np.isfinite(norms) | (norms <= _ZERO_NORM))
    if bad.size:
        raise refuse(int(bad[0]), int(bad.size))
    if keep_unit:
        norms = np.where(np.abs(norms - 1.0) <= _UNIT_TOLERANCE, 1.0, norms)
    out: np.ndarray = x / norms[:, None].astype(x.dtype)
    return out


def normalize_rows(x: np.ndarray, name: str) -> np.ndarray:
    """Rows scaled to unit length (float32); a zero row is an error (cosine undefined)."""
    def refuse(row: int, _n: int) -> Exception:
        return InvalidInputError(f"{name}: row {row} is a zero vector (cosine undefined)")

    return unit_rows(x, refuse, keep_unit=True).astype(np.float32, copy=False)


def normalize(x: np.ndarray, name: str) -> np.ndarray:
    """A unit-length copy of a vector; a zero vector is an error."""
    n = float(np.linalg.norm(x))
    if n <= _ZERO_NORM:
        raise InvalidInputError(f"{name}: is a zero vector (cosine undefined)")
    if abs(n - 1.0) <= _UNIT_TOLERANCE:
        # Already unit: leave the bits alone, so stored vectors round-trip exactly.
        return x.astype(np.float32, copy=False)
    return (x / np.float32(n)).astype(np.float32, copy=False)


def unit_matrix(x: object, name: str, dim: int | None = None) -> np.ndarray:
    """Validated, row-normalised float32 matrix."""
    m = as_matrix(x, name, dim)
    return normalize_rows(m, name) if m.shape[0] else m


def unit_vector(x: object, name: str, dim: int | None = None) -> np.ndarray:
    """Validated, normalised float32 vector."""
    return normalize(as_vector(x, name, dim), name)


# -- validation at scan speed ------------------------------------------------------------------
#
# A fact matrix is scanned once anyway (relevance = F @ q). Checking it separately with
# `isfinite` reads every byte a second time (for 1M × 384 float32 that doubled the cost), so
# the array face validates through the product instead:
# - a NaN or ±inf anywhere in a row makes that row's product with a finite query NaN or ±inf
#   (IEEE: NaN·x = NaN, inf·0 = NaN, inf·x = ±inf), so `isfinite(relevance)` (N floats, not
#   N × d) finds every non-finite row, wherever it is, gated or not;
# - the norm (zero, not unit) is checked only for rows that pass the gate, the only rows
#   whose vectors are used further. A zero row has relevance 0, so it can pass only a gate
#   ≤ 0; below the gate it is simply gated out (score NaN), not refused — it is finite, and
#   its relevance (0) is exact. A zero or non-unit row that passes the gate is refused.

UNIT_NORM_TOLERANCE = 1e-3  # the store's own check on appended rows (CKF.append_raw)


def as_fact_matrix(x: object, name: str, *, allow_empty: bool = True) -> np.ndarray:
    """`x` as a 2-D float32 array, without a copy when it already is one (a memory map too).

    Values are not checked here: `check_relevance` and `check_gated_rows` do that on the
    product the caller computes anyway. Ragged and non-numeric input is refused by name."""
    if isinstance(x, np.ndarray) and x.dtype == np.float32:
        arr = x
    else:
        try:
            arr = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{name}: not a numeric array ({exc})") from None
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 0)
    if arr.ndim != 2:
        raise InvalidInputError(f"{name}: expected a 2-D array (n, d), got shape {arr.shape}")
    if not allow_empty and arr.shape[0] == 0:
        raise InvalidInputError(f"{name}: is empty")
    return arr


def check_query(x: object, dim: int, *, name: str = "query", model_id: str | None = None,
                unit: bool = False) -> np.ndarray:
    """A finite, non-zero float32 query of width `dim` (a zero query has no cosine): the one
    query check of every face.

    The array face (`cdr.ranking`) takes the query as given (`unit=False`): its contract is
    unit rows, and scaling a caller's query would change the scores it asked for. A fact
    index's `select` takes a query from any embedder (`unit=True`): it is scaled to unit
    length there, and a single-row matrix is read as its row. `model_id` names the index's
    model when the width is wrong, since that is what the query has to match."""
    if model_id is None:
        q = as_vector(x, name, dim)
    else:
        q = np.asarray(x, dtype=np.float32)
        given = q.shape
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1 or q.shape[0] != dim:
            raise InvalidInputError(
                f"{name} vector has shape {given}; the index's model "
                f"{model_id!r} has dimension {dim}")
        if not np.isfinite(q).all():
            raise InvalidInputError(f"{name}: contains NaN or infinite values")
    norm = float(np.linalg.norm(q)) if unit else float(np.any(q))
    if norm <= _ZERO_NORM:
        raise InvalidInputError(f"{name}: is a zero vector (cosine undefined)")
    return q * np.float32(1.0 / norm) if unit else q


def check_relevance(relevance: np.ndarray, facts: np.ndarray, query: np.ndarray,
                    name: str) -> None:
    """Refuse a matrix with a NaN/inf row, seen through its product with a finite query.

    Costs one pass over N floats. IEEE makes NaN·0 and inf·0 NaN, but a BLAS may skip a zero
    query component altogether (the reference gemv does), so the columns where the query is
    exactly 0 — none for real embeddings — are checked directly. A finite row whose product
    still overflows float32 is not a unit row either; it is refused with that reason."""
    bad_rows = np.flatnonzero(~np.isfinite(relevance))
    zero_cols = np.flatnonzero(query == 0)
    if zero_cols.size and facts.shape[0]:
        bad_cols = ~np.isfinite(facts[:, zero_cols]).all(axis=1)
        bad_rows = np.union1d(bad_rows, np.flatnonzero(bad_cols))
    if not bad_rows.size:
        return
    i = int(bad_rows[0])
    if not np.isfinite(facts[i]).all():
        raise InvalidInputError(f"{name}: row {i} contains NaN or infinite values")
    raise InvalidInputError(f"{name}: row {i} is not a unit vector (its cosine overflows)")


def check_gated_rows(block: np.ndarray, rows: np.ndarray, name: str) -> None:
    """Refuse zero or non-unit rows among those that passed the gate (`block` = facts[rows])."""
    if not block.shape[0]:
        return
    sq = np.einsum("ij,ij->i", block, block)
    bad = np.flatnonzero(np.abs(sq - 1.0) > 2 * UNIT_NORM_TOLERANCE)
    if bad.size:
        i = int(rows[bad[0]])
        if sq[bad[0]] <= _ZERO_NORM**2:
            raise InvalidInputError(f"{name}: row {i} is a zero vector (cosine undefined)")
        raise InvalidInputError(
            f"{name}: row {i} is not a unit vector (norm {float(np.sqrt(sq[bad[0]])):.4g})"
        )
