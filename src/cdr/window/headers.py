"""CRP response headers (SPEC-024 §8, docs/design.md §3.10 "Headers"): plain decimals with two
places.

`CRP-Context-Mode` is `full` while windows are grounded in novel material, `ckf-exhausted`
when Exit 3 fired (with the onboarding hint), and `safety-only` for an empty CKF.

One function, `crp_headers`, builds them from plain values, so the loop (a finished window),
the sidecar (an envelope handed out) and the gateway (a session as it stands) agree, and this
module depends on nothing above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdr.session import CKF_EXHAUSTED

if TYPE_CHECKING:
    from cdr.window.envelope import Envelope

EXHAUSTED_HINT = "ingest-more-documents-for-continued-quality"
EMPTY_HINT = "ingest-documents-for-context-grounding"
# An empty CKF: nothing grounds the answer (the relay's pass-through, the empty-CKF error).
SAFETY_ONLY_HEADERS: dict[str, str] = {
    "CRP-Context-Mode": "safety-only", "CRP-Onboarding-Hint": EMPTY_HINT,
}


def decimal2(x: float) -> str:
    return f"{x:.2f}"


def crp_headers(
    *,
    window: int,
    max_windows: int,
    status: str,
    completeness: float,
    envelope: Envelope | None = None,
    coverage_depth: int = 0,
) -> dict[str, str]:
    """The headers for window `window` of a session in `status`.

    With `envelope` (the window's packed facts) they also describe that window: coverage
    score and depth, n-gram guard activations, ETag, fact count, saturation. Without, they
    describe the session only (the gateway adds them to the last window's headers).
    """
    exhausted = status == CKF_EXHAUSTED
    headers: dict[str, str] = {}
    if envelope is not None:
        min_ratio = envelope.min_novelty_ratio
        headers["CRP-Context-Coverage-Score"] = decimal2(min_ratio if min_ratio is not None
                                                         else 0.0)
        headers["CRP-Context-Coverage-Depth"] = str(coverage_depth)
        headers["CRP-Context-NGram-Guard-Activations"] = str(envelope.ranking.ngram_activations)
    headers["CRP-Context-Continuation-Status"] = status
    headers["CRP-Context-Mode"] = CKF_EXHAUSTED if exhausted else "full"
    headers["CRP-Quality-Completeness"] = decimal2(completeness)
    headers["CRP-Context-Window"] = f"{window}/{max_windows}"
    if envelope is not None:
        headers["CRP-Envelope-ETag"] = envelope.etag
        headers["CRP-Envelope-Facts"] = str(len(envelope))
        headers["CRP-Envelope-Saturation"] = decimal2(envelope.saturation)
    if exhausted:
        headers["CRP-Onboarding-Hint"] = EXHAUSTED_HINT
    return headers
