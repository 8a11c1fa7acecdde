"""`cdr.cluster.shard_view` against one CKF's rules, over random shard sets: every fact is
read once, from the holder one CKF names (a live one first, then the smallest source), at the
best importance of all its holders; no other row is touched."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cdr.ckf.records import FactStatus
from cdr.cluster.shard_view import ShardView, shared_fact_views

docs_strategy = st.lists(
    st.tuples(st.sets(st.integers(0, 12), min_size=1, max_size=6),  # the facts it holds
              st.sampled_from([0.5, 0.6, 0.8, 1.0]),  # its importance
              st.booleans(),  # stale
              st.integers(0, 3)),  # its shard
    min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(docs_strategy)
def test_each_fact_is_read_once_as_one_ckf_reads_it(docs) -> None:
    n_shards = 4
    sources = [f"docs/{i:02d}.md" for i in range(len(docs))]
    # each shard, as its CKF stores it: one row per fact id, its primary and importance
    shards: list[list[tuple[str, str, float, int]]] = [[] for _ in range(n_shards)]
    for s in range(n_shards):
        holders: dict[int, list[int]] = {}
        for d, (facts, _, _, shard) in enumerate(docs):
            if shard == s:
                for f in facts:
                    holders.setdefault(f, []).append(d)
        for f, ds in sorted(holders.items()):
            live = [d for d in ds if not docs[d][2]] or ds
            status = FactStatus.ACTIVE if any(not docs[d][2] for d in ds) else FactStatus.STALE
            shards[s].append((f"{f:032d}", sources[min(live)], max(docs[d][1] for d in ds),
                              int(status)))
    active_ids = [(np.arange(len(rows), dtype=np.int64),
                   np.array([r[0] for r in rows], dtype="S32")) for rows in shards]
    importance = [np.array([r[2] for r in rows], np.float32) for rows in shards]

    def holders_of(s: int, local: np.ndarray) -> list[tuple[int, str]]:
        return [(shards[s][i][3], shards[s][i][1]) for i in local.tolist()]

    views = shared_fact_views(active_ids, importance, holders_of)
    seen: dict[str, tuple[str, float]] = {}
    for s, (rows, view) in enumerate(zip(shards, views, strict=True)):
        active = view.active(np.ones(len(rows), bool))
        imp = view.raise_importance(importance[s])
        for i in np.flatnonzero(active).tolist():
            assert rows[i][0] not in seen  # read once
            seen[rows[i][0]] = (rows[i][1], float(imp[i]))
    # one CKF: every fact once, primary the smallest live holder, importance the best
    want: dict[str, tuple[str, float]] = {}
    for f in {f for facts, *_ in docs for f in facts}:
        ds = [d for d, doc in enumerate(docs) if f in doc[0]]
        live = [d for d in ds if not docs[d][2]] or ds
        want[f"{f:032d}"] = (sources[min(live)], float(np.float32(max(docs[d][1] for d in ds))))
    assert seen == want


def test_one_shard_or_no_shared_fact_changes_nothing() -> None:
    ids = (np.arange(3, dtype=np.int64), np.array([b"a", b"b", b"c"], dtype="S32"))
    imp = np.ones(3, np.float32)
    assert all(v.empty for v in shared_fact_views([ids], [imp], lambda s, r: []))
    other = (np.arange(2, dtype=np.int64), np.array([b"d", b"e"], dtype="S32"))
    views = shared_fact_views([ids, other], [imp, imp[:2]], lambda s, r: [])
    assert all(v.empty for v in views)
    assert ShardView().active(np.ones(2, bool)).all()
