"""Time the published reference implementation (`crprotocol`) on data written by `ranking.py`.

Run only by `bench/ranking.py`, with the Python of the separate venv that holds `crprotocol`
(Elastic License 2.0): its code is imported there and never enters our process or repository.
Standard library only, so that venv needs nothing but `crprotocol` itself: the `.npy` files are
read by a tiny parser of their (simple, documented) header instead of numpy.

Usage: `<venv>/bin/python _crp_reference.py DATA_DIR OUT.json REPS [wall|cpu]`
"""

from __future__ import annotations

import ast
import json
import sys
import time
from array import array
from importlib.metadata import version
from pathlib import Path


def read_npy(path: Path) -> tuple[list[list[float]] | list[float], tuple[int, ...]]:
    """A little-endian float32 C-order `.npy` file as nested lists (rows) or a flat list."""
    raw = path.read_bytes()
    if raw[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    header = ast.literal_eval(raw[start : start + hlen].decode("latin1"))
    if header["descr"] != "<f4" or header["fortran_order"]:
        raise ValueError(f"{path}: expected little-endian float32 in C order, got {header}")
    values = array("f")
    values.frombytes(raw[start + hlen :])
    shape = tuple(header["shape"])
    flat = values.tolist()
    if len(shape) == 1:
        return flat, shape
    n, d = shape
    return [flat[i * d : (i + 1) * d] for i in range(n)], shape


class Fact:
    """The fact shape `cdr_rank` reads: an id and a list-of-floats embedding."""

    __slots__ = ("embedding", "id", "importance")

    def __init__(self, idx: int, embedding: list[float], importance: float) -> None:
        self.id = str(idx)
        self.embedding = embedding
        self.importance = importance


def main() -> None:
    data, out, reps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    clock = time.thread_time if sys.argv[4:5] == ["cpu"] else time.perf_counter
    from crp.envelope.cdr import cdr_rank
    from crp.state.coverage_set import CoverageSet

    facts_emb, _ = read_npy(data / "facts.npy")
    query, _ = read_npy(data / "query.npy")
    cov, _ = read_npy(data / "coverage.npy")
    cov_w, _ = read_npy(data / "coverage_weights.npy")
    res, _ = read_npy(data / "residual.npy")
    importance, _ = read_npy(data / "importance.npy")
    facts = [Fact(i, e, w) for i, (e, w) in enumerate(zip(facts_emb, importance, strict=True))]

    model = "bench-random-384"
    addressed = [
        {"text": f"covered {j}", "embedding": e, "depth_weight": w, "id": f"cov-{j}"}
        for j, (e, w) in enumerate(zip(cov, cov_w, strict=True))
    ]
    residual = [
        {"text": f"residual {j}", "embedding": e, "id": f"res-{j}"} for j, e in enumerate(res)
    ]
    coverage_set = CoverageSet(model)
    coverage_set.update(
        addressed_sub_queries=addressed,
        all_sub_queries=addressed + residual,
        window_number=1,
        embedding_model_id=model,
    )
    assert coverage_set.entry_count() == len(cov)
    assert coverage_set.residual_count() == len(res)

    times = []
    result = None
    for _ in range(reps):
        t0 = clock()
        result = cdr_rank(facts, query, coverage_set, importance_fn=lambda f: f.importance)
        times.append(clock() - t0)
    assert result is not None
    ranked = [
        [int(s.fact.id), s.relevance, s.novelty, s.residual_pull, s.cdr_score]
        for s in result.ranked
    ]
    out.write_text(
        json.dumps(
            {
                "version": version("crprotocol"),
                "python": sys.version.split()[0],
                "times": times,
                "excluded": result.excluded_count,
                "ranked": ranked,
            }
        )
    )


if __name__ == "__main__":
    main()
