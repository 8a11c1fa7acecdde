"""Errors users see. Each names the problem, so a CLI message or an HTTP 4xx body can be
built from `str(error)` alone."""

from __future__ import annotations

import json
from typing import Any


class CdrError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidInputError(CdrError, ValueError):
    """Input that cannot be used as given (shape, range, NaN, empty...)."""


class EmbeddingModelMismatchError(CdrError, ValueError):
    """Vectors from one embedding model offered to state built with another (SPEC-024 §2.5)."""

    def __init__(self, expected: str, got: str, what: str = "embedding") -> None:
        self.expected = expected
        self.got = got
        model_e, _, recipe_e = expected.partition("#")
        model_g, _, recipe_g = got.partition("#")
        if model_e == model_g and recipe_e != recipe_g:  # same model, facts embedded otherwise
            super().__init__(
                f"{what} recipe mismatch: this state's facts were embedded with recipe "
                f"{recipe_e or 'plain'!r} of {model_e!r}, but the {what} uses recipe "
                f"{recipe_g or 'plain'!r}; vectors made the two ways are not comparable "
                f"(migrate a CKF with `cdr ckf reembed --recipe {recipe_g or 'plain'}`)"
            )
            return
        if model_e != model_g and model_e.split("+")[0] == model_g.split("+")[0]:
            # One model run two ways (float32 and int8, cdr.retrieval.embed_int8).
            path_e, path_g = (m.partition("+")[2] or "float32" for m in (model_e, model_g))
            super().__init__(
                f"{what} path mismatch: this state's vectors were made by the {path_e} path "
                f"of {model_e.split('+')[0]!r} ({expected!r}), but the {what} comes from its "
                f"{path_g} path ({got!r}); the two paths give different vectors, so they are "
                "not mixed (use the same embedder, or migrate a CKF with "
                "`cdr ckf reembed --embedder ...`)"
            )
            return
        super().__init__(
            f"{what} model mismatch: this state was built with {expected!r}, "
            f"but the {what} comes from {got!r}; CDR scores across models are meaningless"
        )


class NotFoundError(CdrError, LookupError):
    """A session, document, job or CKF that does not exist."""


class UpstreamError(CdrError):
    """An LLM or embedding server failed after retries."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """`text` as a JSON object, or an `InvalidInputError` naming `what` and the problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{what} is malformed: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"{what} is malformed: not a JSON object")
    return data
