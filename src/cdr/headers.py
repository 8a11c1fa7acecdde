"""CRP response headers (SPEC-024 §8, DESIGN.md §3.10): plain decimals with two places.

`CRP-Context-Mode` is `full` while windows are grounded in novel material, `ckf-exhausted`
when Exit 3 fired (with the onboarding hint), and `safety-only` for an empty CKF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdr.envelope import Envelope
    from cdr.loop import PreparedWindow
    from cdr.session import Session

EXHAUSTED_HINT = "ingest-more-documents-for-continued-quality"
EMPTY_HINT = "ingest-documents-for-context-grounding"


def decimal2(x: float) -> str:
    return f"{x:.2f}"


def window_headers(
    session: Session, prepared: PreparedWindow, envelope: Envelope
) -> dict[str, str]:
    """Headers describing one finished window and the session after it."""
    min_ratio = envelope.min_novelty_ratio
    headers = {
        "CRP-Context-Coverage-Score": decimal2(min_ratio if min_ratio is not None else 0.0),
        "CRP-Context-Coverage-Depth": str(prepared.coverage_depth),
        "CRP-Context-NGram-Guard-Activations": str(envelope.ranking.ngram_activations),
        "CRP-Context-Continuation-Status": session.status,
        "CRP-Context-Mode": "ckf-exhausted" if session.status == "ckf-exhausted" else "full",
        "CRP-Quality-Completeness": decimal2(session.completeness()),
        "CRP-Context-Window": f"{prepared.number}/{session.max_windows}",
        "CRP-Envelope-ETag": envelope.etag,
        "CRP-Envelope-Facts": str(len(envelope)),
        "CRP-Envelope-Saturation": decimal2(envelope.saturation),
    }
    if session.status == "ckf-exhausted":
        headers["CRP-Onboarding-Hint"] = EXHAUSTED_HINT
    return headers
