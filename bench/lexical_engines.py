"""Three BM25 engines side by side (issue 21 §3, "SQLite's FTS5 … or `bm25s`. Measure both"):
the library's own numpy index (`cdr.retrieval.lexical.LexicalIndex`), SQLite FTS5 and `bm25s`, over
the same texts and the same tokenised queries.

- Texts: every fact's lexical text (`cdr.retrieval.lexical.lexical_text`) of the retrieval
  benchmark's cached CKFs (`bench/retrieval.py`: the `man` and `pydocs` corpora), and a scale
  set: the man texts replicated with one suffix token per copy (`copy17`) to about
  `--scale-rows` rows.
- Tokens: `cdr.retrieval.lexical.terms`. FTS5 gets the tokens joined by spaces (its `unicode61`
  tokeniser, diacritics kept, splits them back into the same words: the run checks that its
  vocabulary and token count equal the library's); `bm25s` gets the token lists themselves,
  k1 = 1.2, b = 0.75, `method="lucene"` (the library's constants and IDF).
- Queries: the TUNE split's tasks only, `session_terms(subject_of(task), outline)` — exactly
  the words the loop scores with `lexical: "bm25"`. FTS5's query is the OR of the quoted terms.

Measured per engine: build time (from the texts: the library's `build` tokenises itself, so
FTS5's and `bm25s`'s include the shared tokenising); index size; per-query time as the median
over queries × repetitions (engines interleaved query by query, so a change in the machine's
load hits all three alike), both for *every* matching row's score (what fused relevance needs:
`fused_select` reads the BM25 of every row holding a query word; each engine's answer made the
library's shape: rows ascending with the score over the best row's) and for the top 100 through
the engine's own API; agreement of the top-20 and top-100 with the library's (each engine's
full scores, ordered score-descending, ties by row); the largest difference of the normalised
score (score / best score, what `fuse` mixes) from the library's; and own-document
precision@20 (the share of the top 20 whose source is the task's own page).

Usage: `python bench/lexical_engines.py [--reps 5] [--scale-rows 100000] [--no-write]`
(needs `bm25s`, in the `dev` extra: `pip install -e '.[dev]'` or `pip install bm25s`) —
prints the table and writes `bench/results/lexical_engines.md`. About 2–4 minutes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import _paths  # noqa: F401  (cdr importable from a checkout)
from _machine import cpu_name
from cdr.retrieval.lexical import K1, B, LexicalIndex, lexical_text, session_terms, terms
from cdr.retrieval.subject import subject_of

OUT = Path(__file__).parent / "results" / "lexical_engines.md"
RECIPE = "title-section"  # the lexical text does not depend on the recipe: same facts
ENGINES = ("cdr.retrieval.lexical", "SQLite FTS5", "bm25s",
           "cdr.retrieval.lexical eager (bench prototype)")
EAGER = ENGINES[3]
TOP_K = (20, 100)
SCALE_REPS = 3  # FTS5 takes about a second a query there; the run stays under 10 minutes
READING = """\
## Reading (of the run recorded below)

- **Same ranking.** `bm25s` (Lucene IDF, k1 = 1.2, b = 0.75) gives the library's normalised
  scores to float32 rounding (max Δ ≈ 2e-7) and the same top 20 and top 100. FTS5 ranks
  nearly the same but not identically (top-20 overlap 0.98–1.00, top-100 0.96–0.99, Δ up to
  0.06): its IDF is log((N − df + 0.5) / (df + 0.5)) without the +1, floored near 0 for a
  word in more than half the rows, so it weighs common words down more. Own-page
  precision@20 is the same for all engines on both corpora: the difference does not change
  what is found.
- **Speed.** Fused relevance needs the BM25 of *every* row holding a query word, each window
  (`fused_select`). FTS5 returns them 30–45× slower than the library (11 ms at 1k rows,
  25 ms at 7k, 0.84 s at 100k, where a query's words are in most rows); `ORDER BY rank
  LIMIT 100` does not help, `bm25()` runs for every matching row. `bm25s` is faster than the
  library, 1.4–1.7× on the corpora and 20× at 100k rows (1.4 ms vs 28 ms): it computes each
  posting's BM25 term when it builds, and a query only adds them up per term into a dense
  array, where the library computes them per query and groups the rows with `np.unique`.
- **Shards.** Both candidates take their statistics (N, df, mean length) from the rows they
  hold. An FTS5 table in each shard's database, or a `bm25s` index per shard, merged by
  score, shares only 0.92–0.95 of one index's top 20. FTS5's `bm25()` cannot be given outside
  statistics from Python (a rank function of one's own needs its C API); `bm25s` computes the
  IDF inside `index()`. The library's index is built over the whole row space, so shards rank
  as one CKF by construction (the `focused` cases of `tests/test_ray_index.py`).
- **Build and size.** FTS5 builds in 1.1–1.8× the library's time, `bm25s` in 1.8–3.4×
  (16 s, 18 s and 28 s at 100k rows, tokenising about 15 s of each). FTS5's index is the
  smallest (14 MB on disk at 100k rows), then `bm25s`'s (19.5 MB in memory), then the
  library's (29.5 MB).
- **So:** keep `cdr.retrieval.lexical` (no new dependency; the sharded order stays exact), and take
  `bm25s`'s build-time scoring into it: the prototype row (`Eager`) answers all matching
  rows as fast as `bm25s` at 100k rows (1.4 ms) and faster on the corpora (0.11 and 0.19 ms),
  with the library's scores (Δ ≈ 2e-7), for one float32 per posting more (39 MB at 100k
  rows; the per-posting counts would no longer be needed at query time).
"""


@dataclass
class Dataset:
    name: str
    texts: list[str]
    queries: list[list[str]]
    own: list[set[int]]  # per query: the rows of the task's own document
    note: str


@dataclass
class EngineResult:
    build_s: float = 0.0
    size_bytes: int = 0
    all_ms: list[float] = field(default_factory=list)
    top_ms: list[float] = field(default_factory=list)
    overlap: dict[int, list[float]] = field(default_factory=dict)
    precision20: list[float] = field(default_factory=list)
    max_delta: float = 0.0
    shard_overlap: list[float] = field(default_factory=list)
    note: str = ""


# ------------------------------------------------------------------------------ data


def corpus_dataset(corpus) -> Dataset:
    from retrieval import own_rows

    ckf = corpus.ckfs[RECIPE]
    texts = [lexical_text(f.source, f.section, f.content)
             for f in ckf.facts(np.arange(ckf.n_rows))]
    owners = own_rows(ckf)
    tasks = corpus.tasks["tune"]
    queries = [session_terms(subject_of(t.text), list(t.outline)) for t in tasks]
    own = [owners.get(t.source, set()) for t in tasks]
    return Dataset(corpus.name, texts, queries, own,
                   f"{corpus.version}; {ckf.n_rows} facts; {len(tasks)} tune tasks")


def scaled(base: Dataset, rows: int) -> Dataset:
    """`base`'s texts copied until about `rows` rows, each copy's texts with its own suffix
    token, so the copies are distinct rows with the same words (and so the same BM25 order up
    to ties); a task's own rows are its page's rows in every copy."""
    n = len(base.texts)
    copies = max(1, round(rows / n))
    texts = [f"{t} copy{k}" for k in range(copies) for t in base.texts]
    own = [{r + k * n for k in range(copies) for r in o} for o in base.own]
    return Dataset(f"{base.name} ×{copies}", texts, base.queries, own,
                   f"the man texts ×{copies} with a suffix token per copy; {len(texts)} rows; "
                   f"the man tune queries. A row ties with its copies, so the top 20 is a few "
                   f"rows' copies and overlap and precision here say little: this set is for "
                   f"speed and size; timed repetitions at most {SCALE_REPS}")


# ------------------------------------------------------------------------------ engines


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best rows of a dense score array (rows with score 0 hold no query word and are
    left out), score-descending, ties by row."""
    hit = np.flatnonzero(scores > 0)
    order = np.lexsort((hit, -scores[hit]))
    return hit[order[:k]]


class Library:
    def __init__(self, texts: Sequence[str]) -> None:
        self.index = LexicalIndex.build(texts)
        self.n = len(texts)

    def size(self) -> int:
        ix = self.index
        arrays = ix.post_offsets.nbytes + ix.post_rows.nbytes + ix.post_tf.nbytes
        vocab = sys.getsizeof(ix.vocabulary) + sum(sys.getsizeof(w) for w in ix.vocabulary)
        return arrays + ix.doc_len.nbytes + vocab

    def all_scores(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.index.scores(q)

    def top(self, q: list[str], k: int) -> np.ndarray:
        rows, s = self.index.scores(q)
        return rows[np.lexsort((rows, -s))[:k]]

    def dense(self, q: list[str]) -> np.ndarray:
        out = np.zeros(self.n, np.float64)
        rows, s = self.index.scores(q)
        out[rows] = s
        return out


class Eager(Library):
    """What would make the library's own index as fast as `bm25s` at query time, keeping its
    statistics over the whole row space: `bm25s`'s two choices, a posting's BM25 term
    computed once at build (it depends only on N, df, tf and the row's length, all fixed for a
    committed state) and a query summed per term into a dense accumulator, not sorted with
    `np.unique`. A prototype measured here, not the library."""

    def __init__(self, texts: Sequence[str]) -> None:
        super().__init__(texts)
        ix = self.index
        df = np.diff(ix.post_offsets).astype(np.float64)
        idf = np.log1p((ix.n_rows - df + 0.5) / (df + 0.5))
        tf = ix.post_tf.astype(np.float64)
        norm = 1.0 - B + B * ix.doc_len[ix.post_rows] / max(ix.avg_len, 1e-9)
        self.part = (np.repeat(idf, np.diff(ix.post_offsets)) * tf * (K1 + 1.0)
                     / (tf + K1 * norm)).astype(np.float32)

    def size(self) -> int:
        return super().size() + self.part.nbytes

    def all_scores(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ix = self.index
        total = np.zeros(self.n, np.float32)
        for i in ix.query_ids(q):
            lo, hi = ix.post_offsets[i], ix.post_offsets[i + 1]
            total[ix.post_rows[lo:hi]] += self.part[lo:hi]  # a term's rows are distinct
        rows = np.flatnonzero(total)
        return rows, total[rows] / total[rows].max() if len(rows) else total[rows]

    def top(self, q: list[str], k: int) -> np.ndarray:
        rows, s = self.all_scores(q)
        if len(rows) > k:  # the k best, and every row tied with the k-th
            keep = s >= np.partition(s, len(s) - k)[len(s) - k]
            rows, s = rows[keep], s[keep]
        return rows[np.lexsort((rows, -s))[:k]]

    def dense(self, q: list[str]) -> np.ndarray:
        out = np.zeros(self.n, np.float64)
        rows, s = self.all_scores(q)
        out[rows] = s
        return out


class Fts5:
    """A contentless FTS5 table in an on-disk SQLite file (as it would live inside the CKF's
    database), rowid = row."""

    def __init__(self, tokens: Sequence[list[str]], path: Path, first_row: int = 0) -> None:
        self.n = first_row + len(tokens)
        self.path = path
        self.db = sqlite3.connect(path)
        self.db.execute("CREATE VIRTUAL TABLE lex USING fts5(body, content='', "
                        "tokenize='unicode61 remove_diacritics 0')")
        with self.db:
            self.db.executemany("INSERT INTO lex(rowid, body) VALUES (?, ?)",
                                ((r, " ".join(t)) for r, t in enumerate(tokens, first_row)))
            self.db.execute("INSERT INTO lex(lex) VALUES ('optimize')")

    def size(self) -> int:
        return self.path.stat().st_size

    def vocabulary(self) -> tuple[int, int]:
        """(distinct terms, token instances) as FTS5 tokenised them."""
        self.db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.v USING fts5vocab(main, lex, "
                        "'row')")
        n, total = self.db.execute("SELECT count(*), sum(cnt) FROM temp.v").fetchone()
        return int(n), int(total or 0)

    @staticmethod
    def match(q: list[str]) -> str:
        return " OR ".join(f'"{t}"' for t in q)

    def all_scores(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        got = self.db.execute("SELECT rowid, bm25(lex) FROM lex WHERE lex MATCH ?",
                              (self.match(q),)).fetchall()
        rows = np.fromiter((r for r, _ in got), np.int64, len(got))
        s = -np.fromiter((x for _, x in got), np.float64, len(got))  # bm25() is negated
        return rows, s / s.max() if len(s) else s

    def top(self, q: list[str], k: int) -> np.ndarray:
        got = self.db.execute("SELECT rowid FROM lex WHERE lex MATCH ? ORDER BY rank LIMIT ?",
                              (self.match(q), k)).fetchall()
        return np.asarray([r for (r,) in got], np.int64)

    def raw(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, BM25 as FTS5 computes it from this table's own statistics)."""
        got = self.db.execute("SELECT rowid, bm25(lex) FROM lex WHERE lex MATCH ?",
                              (self.match(q),)).fetchall()
        return (np.fromiter((r for r, _ in got), np.int64, len(got)),
                -np.fromiter((x for _, x in got), np.float64, len(got)))

    def dense(self, q: list[str]) -> np.ndarray:
        out = np.zeros(self.n, np.float64)
        rows, s = self.all_scores(q)
        out[rows] = s
        return out

    def close(self) -> None:
        self.db.close()


class Bm25s:
    def __init__(self, tokens: Sequence[list[str]], first_row: int = 0) -> None:
        import bm25s

        self.first_row = first_row
        self.n = len(tokens)
        self.index = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.index.index([list(t) for t in tokens], show_progress=False)

    def size(self) -> int:
        s = self.index.scores
        vocab = self.index.vocab_dict
        return (s["data"].nbytes + s["indices"].nbytes + s["indptr"].nbytes
                + sys.getsizeof(vocab) + sum(sys.getsizeof(w) for w in vocab))

    def all_scores(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        s = self.index.get_scores(q)  # dense over every row
        rows = np.flatnonzero(s)
        return rows, s[rows] / s[rows].max() if len(rows) else s[rows]

    def top(self, q: list[str], k: int) -> np.ndarray:
        docs, _ = self.index.retrieve([q], k=min(k, self.n), show_progress=False)
        return np.asarray(docs[0], np.int64)

    def dense(self, q: list[str]) -> np.ndarray:
        return np.asarray(self.index.get_scores(q), np.float64)

    def raw(self, q: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(rows, BM25 from this index's own statistics)."""
        s = np.asarray(self.index.get_scores(q), np.float64)
        rows = np.flatnonzero(s)
        return rows + self.first_row, s[rows]


# ------------------------------------------------------------------------------ measuring


def timed(fn: Callable[[list[str]], object], q: list[str]) -> float:
    t0 = time.perf_counter()
    fn(q)
    return (time.perf_counter() - t0) * 1000.0


def merged_top(parts: Sequence[tuple[np.ndarray, np.ndarray]], n: int, k: int) -> set[int]:
    dense = np.zeros(n, np.float64)
    for rows, s in parts:
        dense[rows] = s
    return set(top_rows(dense, k).tolist())


def shard_check(tokens: Sequence[list[str]], queries: Sequence[list[str]], tmp: Path,
                res: dict[str, EngineResult]) -> None:
    """Two shards (the first and second half of the rows), each an index with its own
    statistics, their raw BM25 merged by score: the top 20 against one index's. What an FTS5
    table inside each shard's database, or a `bm25s` index per shard, would rank."""
    n, half = len(tokens), len(tokens) // 2
    one = {"SQLite FTS5": [Fts5(tokens, tmp / "one.db")], "bm25s": [Bm25s(tokens)]}
    two = {"SQLite FTS5": [Fts5(tokens[:half], tmp / "a.db"),
                           Fts5(tokens[half:], tmp / "b.db", half)],
           "bm25s": [Bm25s(tokens[:half]), Bm25s(tokens[half:], half)]}
    for q in queries:
        if q:
            for name in one:
                ref = merged_top([e.raw(q) for e in one[name]], n, 20)
                got = merged_top([e.raw(q) for e in two[name]], n, 20)
                res[name].shard_overlap.append(len(ref & got) / max(1, len(ref)))
    for e in [*one["SQLite FTS5"], *two["SQLite FTS5"]]:
        e.close()


def measure(data: Dataset, reps: int,
            shards: bool = True) -> tuple[dict[str, EngineResult], str]:
    res = {e: EngineResult() for e in ENGINES}
    t0 = time.perf_counter()
    lib = Library(data.texts)
    res["cdr.retrieval.lexical"].build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = [terms(t) for t in data.texts]
    tokenise_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="cdr-lex-") as tmp:
        t0 = time.perf_counter()
        fts = Fts5(tokens, Path(tmp) / "lex.db")
        res["SQLite FTS5"].build_s = tokenise_s + time.perf_counter() - t0
        t0 = time.perf_counter()
        b25 = Bm25s(tokens)
        res["bm25s"].build_s = tokenise_s + time.perf_counter() - t0
        t0 = time.perf_counter()
        eager = Eager(data.texts)
        res[EAGER].build_s = time.perf_counter() - t0
        engines = {"cdr.retrieval.lexical": lib, "SQLite FTS5": fts, "bm25s": b25, EAGER: eager}
        for name, eng in engines.items():
            res[name].size_bytes = eng.size()
        vocab, total = fts.vocabulary()
        same = (vocab == len(lib.index.vocabulary)
                and total == int(lib.index.doc_len.sum()))
        res["SQLite FTS5"].note = ("same tokens" if same else
                                   f"tokens differ: {vocab} terms / {total} tokens vs "
                                   f"{len(lib.index.vocabulary)} / {int(lib.index.doc_len.sum())}")
        for q, own in zip(data.queries, data.own, strict=True):
            if not q:
                continue
            for eng in engines.values():  # warm-up (first-call caches, page cache)
                eng.all_scores(q)
                eng.top(q, 100)
            for _ in range(reps):
                for name, eng in engines.items():
                    res[name].all_ms.append(timed(eng.all_scores, q))
                    res[name].top_ms.append(timed(lambda x, e=eng: e.top(x, 100), q))
            ref = lib.dense(q)
            ref_top = {k: set(top_rows(ref, k).tolist()) for k in TOP_K}
            for name, eng in engines.items():
                d = eng.dense(q)
                r = res[name]
                for k in TOP_K:
                    mine = top_rows(d, k)
                    r.overlap.setdefault(k, []).append(
                        len(ref_top[k] & set(mine.tolist())) / max(1, len(ref_top[k])))
                    if k == 20:
                        r.precision20.append(sum(int(x) in own for x in mine) / max(1, len(mine)))
                if d.max() > 0:
                    r.max_delta = max(r.max_delta, float(np.abs(d / d.max() - ref).max()))
        fts.close()
        if shards:
            shard_check(tokens, data.queries, Path(tmp), res)
    return res, f"tokenising {tokenise_s:.2f} s (shared by FTS5 and bm25s, in their build)"


# ------------------------------------------------------------------------------ report


def table(data: Dataset, res: dict[str, EngineResult]) -> list[str]:
    lines = [f"### {data.name} — {len(data.texts):,} rows, {len(data.queries)} queries", "",
             "| engine | build (s) | index size (MB) | query, all matching rows (ms) "
             "| query, top 100 (ms) | top-20 overlap with cdr.retrieval.lexical "
             "| top-100 overlap | max Δ normalised score | own-page precision@20 "
             "| top-20, 2 shards vs 1 | note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in ENGINES:
        r = res[name]
        if r.shard_overlap:
            shard = f"{np.mean(r.shard_overlap):.3f}"
        else:
            shard = "1 by design" if name in ("cdr.retrieval.lexical", EAGER) and any(
                x.shard_overlap for x in res.values()) else "—"
        lines.append(
            f"| {name} | {r.build_s:.2f} | {r.size_bytes / 1e6:.1f} "
            f"| {statistics.median(r.all_ms):.2f} | {statistics.median(r.top_ms):.2f} "
            f"| {np.mean(r.overlap[20]):.3f} | {np.mean(r.overlap[100]):.3f} "
            f"| {r.max_delta:.2g} | {np.mean(r.precision20):.3f} | {shard} | {r.note} |")
    return lines


def machine() -> str:
    import bm25s

    return (f"{cpu_name()}, {os.cpu_count()} cores shared with other jobs "
            f"(load average {os.getloadavg()[0]:.1f} at the end of the run); "
            f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"numpy {np.__version__}, bm25s {bm25s.__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per query")
    ap.add_argument("--scale-rows", type=int, default=100_000,
                    help="rows of the replicated man set (0: skip it)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    con = sqlite3.connect(":memory:")
    try:
        con.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
    except sqlite3.OperationalError as e:
        print(f"this SQLite ({sqlite3.sqlite_version}) has no FTS5: {e}", file=sys.stderr)
        return 2
    finally:
        con.close()
    from retrieval import man_corpus, pydocs_corpus

    started = time.perf_counter()
    man = corpus_dataset(man_corpus())
    sets = [man, corpus_dataset(pydocs_corpus())]
    if args.scale_rows:
        sets.append(scaled(man, args.scale_rows))
    out = ["# Lexical engines: cdr.retrieval.lexical vs SQLite FTS5 vs bm25s", "",
           "Issue 21 §3 names two candidates for BM25 (FTS5 inside the CKF's database, "
           "`bm25s`); the library's own numpy index (`cdr.retrieval.lexical.LexicalIndex`) is "
           "measured beside them over the same texts and the same tokenised queries. How: "
           "`bench/lexical_engines.py`'s docstring.", "", READING]
    for i, data in enumerate(sets):
        print(f"{data.name}: {len(data.texts):,} rows, {len(data.queries)} queries …",
              flush=True)
        scale = i >= 2  # the replicated set: fewer repetitions, no shard check
        res, note = measure(data, min(args.reps, SCALE_REPS) if scale else args.reps,
                            shards=not scale)
        lines = [*table(data, res), "", f"Data: {data.note}; {note}.", ""]
        print("\n".join(lines), flush=True)
        out += lines
    took = time.perf_counter() - started
    cmd = "python bench/lexical_engines.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    out += [f"Command: `{cmd}` ({args.reps} timed repetitions per query, at most "
            f"{SCALE_REPS} on the replicated set; "
            f"whole run {took:.0f} s).", "", f"Machine: {machine()}.", ""]
    print(out[-3], out[-1], sep="\n")
    if not args.no_write:
        OUT.write_text("\n".join(out), encoding="utf-8")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
