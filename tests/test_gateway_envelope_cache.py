"""The envelope fast path (issue 15) changes no answer: for one stored session state, a real
gateway returns the envelope the library computes from that state — same etag, facts, plan,
anchor and prompt — whether its caches are warm (the same window asked again), cold (a
restarted process) or filled by `/windows`. And the Phase 1 selection cache on its own returns
exactly what the CKF returns, read-only, and forgets a replaced snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdr.ckf.handle import CKF
from cdr.gateway.paths import public_sources
from cdr.gateway.selections import CachingIndex, SelectionCache
from cdr.gateway.session_record import SessionRecord
from cdr.gateway.session_store import SQLiteSessionStore
from cdr.trace import packed_facts
from cdr.window.loop import GenerationConfig, Generator
from cdr.writers import get_writer
from tests.gateway_server import CRP, TASK, GatewayServer, base_env

pytest_plugins = ["tests.gateway_server"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def library_envelope(ckf_path: Path, db: Path, sid: str) -> dict[str, Any]:
    """The envelope the library computes from the stored session state, shaped as the
    gateway's response shows it (no token, no headers)."""
    store = SQLiteSessionStore(db)
    try:
        stored = store.get(sid)
    finally:
        store.close()
    assert stored is not None
    with CKF.open(ckf_path) as ckf:
        rec = SessionRecord.from_json(stored.data, ckf.ngram_index)
        gen = Generator(ckf, get_writer("extractive"), GenerationConfig(**rec.options))
        prepared = gen.prepare(rec.session)
        facts = [{"ref": f"F{i + 1}", **public_sources(item), "content": fact.content}
                 for i, (item, fact) in enumerate(zip(packed_facts(prepared), prepared.facts,
                                                      strict=True))]
        env = prepared.envelope
        return {
            "window": prepared.number, "etag": env.etag, "anchor": env.anchor, "facts": facts,
            "plan": [{"title": p.title, "target_words": p.target_words,
                      "fact_refs": list(p.fact_refs)} for p in prepared.plan],
            "messages": prepared.messages, "max_tokens": prepared.max_tokens,
            "saturation": round(env.saturation, 4),
            "residual": list(rec.session.residual_ids),
        }


def shown(body: dict[str, Any]) -> dict[str, Any]:
    """The parts of an envelope response the library reference computes."""
    keys = ("window", "etag", "anchor", "facts", "plan", "messages", "max_tokens",
            "saturation", "residual")
    return {k: body[k] for k in keys}


def test_same_session_state_gives_the_library_envelope_warm_cold_and_after_windows(
        gateway_ckf: Path, tmp_path: Path) -> None:
    db = tmp_path / "sessions.sqlite3"
    env = base_env(tmp_path, CDR_SESSION_DB=str(db))
    server = GatewayServer(env, ckf=gateway_ckf, workdir=tmp_path)
    with server:
        with server.client() as c:
            r = c.post("/v1/sessions", json={"task": TASK, **CRP})
            assert r.status_code == 201, r.text
            sid, token = r.json()["session_id"], r.json()["token"]
            first = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
            assert shown(first) == library_envelope(gateway_ckf, db, sid)
            text = get_writer("extractive").generate(first["messages"],
                                                     first["max_tokens"]).text
            w = c.post(f"/v1/sessions/{sid}/windows", headers=bearer(first["token"]),
                       json={"text": text, "etag": first["etag"]})
            assert w.status_code == 200 and w.json()["status"] == "in-progress", w.text
            token = w.json()["token"]
            # Window 2: the session cache was filled by /windows, the selection by window 1.
            second = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token)).json()
            reference = library_envelope(gateway_ckf, db, sid)
            assert second["window"] == 2
            assert shown(second) == reference
            # Asked again (every cache warm): the same envelope, byte for byte but the token.
            again = c.post(f"/v1/sessions/{sid}/envelope",
                           headers=bearer(second["token"])).json()
            assert shown(again) == reference
            token = again["token"]
        server.restart()  # cold caches, same stored state
        with server.client() as c:
            cold = c.post(f"/v1/sessions/{sid}/envelope", headers=bearer(token))
            assert cold.status_code == 200, cold.text
            assert shown(cold.json()) == reference
            assert cold.headers["CRP-Envelope-ETag"] == reference["etag"]


def test_selection_cache_returns_the_ckf_selection(tiny_ckf_path: Path) -> None:
    cache = SelectionCache()
    with CKF.open(tiny_ckf_path) as ckf:
        q = ckf.encode_query("What does the pass statement do?")
        direct = ckf.select(q, 0.1, 20)
        index = CachingIndex(ckf, cache)
        first, second = index.select(q, 0.1, 20), index.select(q, 0.1, 20)
        assert second is first  # the second is a lookup
        assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
        for got in (first, second):
            np.testing.assert_array_equal(got.indices, direct.indices)
            np.testing.assert_array_equal(got.relevances, direct.relevances)
            np.testing.assert_array_equal(got.embeddings, direct.embeddings)
        with pytest.raises(ValueError, match="read-only"):
            first.embeddings[0, 0] = 0.0
        # Another gate or limit is another selection; everything else is the CKF's own.
        assert len(index.select(q, 0.1, 3)) == 3 and len(cache) == 2
        assert index.n_rows == ckf.n_rows and index.index is ckf
        # The old name of `index` is gone, and is not forwarded to the CKF either.
        assert not hasattr(index, "snapshot")
    with CKF.open(tiny_ckf_path) as again:  # a new snapshot: the old entries are dropped
        got = CachingIndex(again, cache).select(q, 0.1, 20)
        np.testing.assert_array_equal(got.indices, direct.indices)
        assert len(cache) == 1 and cache.misses == 3


def test_selection_cache_stays_within_its_byte_bound(tiny_ckf_path: Path) -> None:
    with CKF.open(tiny_ckf_path) as ckf:
        q = ckf.encode_query("truth value testing")
        one = ckf.select(q, -1.0, 5)
        size = SelectionCache._size(one)
        cache = SelectionCache(max_bytes=2 * size)
        for gate in (-1.0, -0.9, -0.8):  # three selections of 5 rows each, room for two
            cache.select(ckf, q, gate, 5)
        assert len(cache) == 2
        cache.select(ckf, q, -1.0, 5)  # the oldest was dropped: a miss again
        assert cache.misses == 4


def test_selection_cache_passes_bad_queries_to_the_ckf_to_refuse(tiny_ckf_path: Path) -> None:
    from cdr.errors import CdrError

    cache = SelectionCache()
    with CKF.open(tiny_ckf_path) as ckf:
        with pytest.raises(CdrError):
            cache.select(ckf, [0.0] * 3, 0.1, 5)
        with pytest.raises(CdrError):
            cache.select(ckf, np.full(ckf.dim, np.nan, dtype=np.float32), 0.1, 5)
    assert len(cache) == 0
