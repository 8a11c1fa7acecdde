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
    arr = np.frombuffer(base64.b64decode(text), dtype=dtype)
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
    return x / norms[:, None].astype(x.dtype)


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
