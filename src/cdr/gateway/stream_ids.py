"""SSE event ids of a streamed chat completion, and reading one back from `Last-Event-ID`.

A browser's `EventSource`, and most SSE clients, reconnect by themselves after a dropped
connection, sending the `id:` of the last event they received as `Last-Event-ID`. For that
to resume a run, the id must say where in the run the client was, without the gateway having
to remember each connection: it names the session, the window events the client has seen,
the characters of the document it has been sent, and whether the final chunk (and the usage
chunk after it) were among them.
Those are positions in what the session stores (the windows' texts, joined as
`relay.assemble` joins them), so any gateway on the same session store can continue from one.

The id is signed with the session's token key (HKDF of the signing secret and the session
id, as its tokens are): a client cannot move its position to skip or repeat text, and an id
is as hard to forge as a session token. It holds no secret (ids and counters), only a MAC.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

from cdr.gateway.errors import ApiError
from cdr.gateway.session_token import TokenSigner

HEADER = "Last-Event-ID"
# Upper bound on the header's length: a session id, three counters, a key id and a MAC.
MAX_CHARS = 256
_ID_RE = re.compile(r"^([A-Za-z0-9_-]{1,64}):(\d{1,9}):(\d{1,12}):([012]):"
                    r"([A-Za-z0-9_.-]{1,64}):([A-Za-z0-9_-]{22})$")


RUNNING, FINAL_SENT, USAGE_SENT = 0, 1, 2


@dataclass(frozen=True)
class StreamPosition:
    """How far a client got: `windows` window events received, `chars` characters of the
    assembled document received, and `phase`: RUNNING, FINAL_SENT (the chunk with
    `finish_reason` was received) or USAGE_SENT (the usage chunk after it too)."""

    session_id: str
    windows: int
    chars: int
    phase: int = RUNNING


def _mac(signer: TokenSigner, kid: str, pos: StreamPosition) -> str:
    key = signer.session_key(kid, pos.session_id)
    msg = f"sse:{pos.windows}:{pos.chars}:{pos.phase}".encode()
    digest = hmac.new(key, msg, hashlib.sha256).digest()[:16]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def event_id(signer: TokenSigner, pos: StreamPosition) -> str:
    """The `id:` of the event after which the client is at `pos`."""
    kid = signer.active_kid
    return (f"{pos.session_id}:{pos.windows}:{pos.chars}:{pos.phase}:{kid}:"
            f"{_mac(signer, kid, pos)}")


def invalid_last_event_id() -> ApiError:
    """One answer for every id that is not one of ours (malformed, tampered, signed with a
    retired key), so that the answer says nothing about which check failed."""
    return ApiError(400, f"{HEADER} is not an event id this gateway's streams send: resume "
                    "with the id of the last event received, unchanged, or start a new "
                    "completion without the header", param=HEADER, code="invalid_last_event_id")


def read_position(signer: TokenSigner, value: str) -> StreamPosition:
    """The position a `Last-Event-ID` names, its MAC checked (400 otherwise)."""
    value = value.strip()
    m = _ID_RE.match(value) if len(value) <= MAX_CHARS else None
    if m is None:
        raise invalid_last_event_id()
    sid, windows, chars, phase, kid, mac = m.groups()
    pos = StreamPosition(sid, int(windows), int(chars), int(phase))
    if kid not in signer.kids or not hmac.compare_digest(_mac(signer, kid, pos), mac):
        raise invalid_last_event_id()
    return pos
