"""Semantic repetition for long documents: a threshold calibrated where the measure decides.

`bench/long_llm.py` first read semantic repetition at the quality benchmark's 0.607 — a
threshold calibrated on *pairs* of sentences (a paraphrase pair against a pair of different
statements about the same task). The long-document measure does not decide on one pair: a
sentence of Window k counts as repetition when its **best** cosine to *every* sentence of
Windows 1..k−1 reaches the threshold. A pair threshold with a 4% false-positive rate per pair
is crossed by chance once a window has a hundred earlier sentences to be compared with, so
the measure rose with the window number on text that repeats nothing: the task pages' own
text, cut into windows, scored 58–79% at 0.607 (bench/results/long.md).

So the threshold is calibrated again at the measure's own decision, on **TUNING tasks only**
(the retrieval benchmark's TUNE split, fixed by sha1 before any tuning; the long benchmark's
tasks are all REPORT tasks):

- **Not restating** (negatives): every sentence of Windows 2+ of a tuning page's own text,
  cut into windows of `WINDOW_WORDS` words (the long runs' window size, at most 20 windows),
  scored by its best cosine to the sentences of the earlier windows. The page says each thing
  once (verbatim duplicates left out), so these are same-topic, different statements with as
  many earlier sentences to match as a long run's window has.
- **Restating** (positives): pairs of sentences the reference model wrote for a tuning task
  (the quality benchmark's checkpoints: `library/dataclasses.html` is the only tuning page it
  wrote on), in different windows or runs, sharing ≥ 50% of their content words and not
  identical — bench-llm's paraphrase rule — scored by their cosine (a restating sentence's best
  cosine to the earlier text is at least that).
- The threshold is the best Youden's J (TPR − FPR) over those two sets
  (`quality_llm_metrics.calibrate`), written to `CALIBRATION` and applied unchanged to the
  report tasks.

Usage: `python bench/long_llm_semrep.py` (minutes: it embeds the tuning pages).
"""

from __future__ import annotations

import glob
import itertools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from _paths import BENCH
from cdr.report import quality
from quality_llm_metrics import calibrate, content_words, jaccard

RESULTS = BENCH / "results"
CALIBRATION = RESULTS / "long-semrep-calibration.json"
WINDOW_WORDS = 500  # the long runs' windows: 245–700 words, ~450 on average (long.md)
MAX_WINDOWS = 20
PARAPHRASE_JACCARD = 0.5
QUALITY_CHECKPOINTS = ("quality-llm-runs", "quality-llm-runs-v1", "quality-llm-runs-v2")
OLD_THRESHOLD = 0.607

Encode = Callable[[Sequence[str]], np.ndarray]


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n == 0, 1, n)


def page_windows(text: str, n_windows: int) -> list[list[str]]:
    """A page's text cut into `n_windows` windows of equal words, as sentences (the cut
    `long_llm.page_floor` makes)."""
    words = text.split()
    size = max(1, math.ceil(len(words) / max(1, n_windows)))
    return [quality.sentences(" ".join(words[i * size:(i + 1) * size]))
            for i in range(n_windows)]


def leading_windows(text: str, n_windows: int, size: int = WINDOW_WORDS) -> list[list[str]]:
    """The first `n_windows` windows of `size` words of a page's text, as sentences: the page
    read the way a long run writes, window k with (k − 1) · size words before it."""
    words = text.split()
    return [quality.sentences(" ".join(words[i * size:(i + 1) * size]))
            for i in range(n_windows) if words[i * size:(i + 1) * size]]


def best_earlier(windows: Sequence[Sequence[str]], encode: Encode,
                 skip_verbatim: bool = False) -> list[list[float]]:
    """Per window, each sentence's best cosine to a sentence of an earlier window (Window 1:
    none, an empty list). With `skip_verbatim`, an identical earlier sentence is not compared
    (a page's repeated boilerplate line is not a statement made twice in other words)."""
    out: list[list[float]] = []
    earlier: list[str] = []
    ev = np.zeros((0, 0))
    for sents in windows:
        if not earlier or not sents:
            out.append([])
        else:
            v = _unit(encode(list(sents)))
            sims = v @ ev.T
            if skip_verbatim:
                for i, s in enumerate(sents):
                    for j, e in enumerate(earlier):
                        if s == e:
                            sims[i, j] = -1.0
            out.append([float(x) for x in sims.max(axis=1)])
        if sents:
            new = _unit(encode(list(sents)))
            ev = new if not earlier else np.concatenate([ev, new])
            earlier.extend(sents)
    return out


def repetition(windows: Sequence[Sequence[str]], encode: Encode, threshold: float
               ) -> list[float]:
    """The long benchmark's semantic repetition at `threshold`: per window the share of its
    sentences whose best cosine to an earlier window's sentence reaches it (0 at Window 1, NaN
    for a window without sentences)."""
    best = best_earlier(windows, encode)
    out = []
    for i, (sents, b) in enumerate(zip(windows, best, strict=True)):
        if not sents:
            out.append(math.nan)
        elif i == 0 or not b:
            out.append(0.0)
        else:
            out.append(float(np.mean(np.asarray(b) >= threshold)))
    return out


def n_windows_for(text: str) -> int:
    """Windows of `WINDOW_WORDS` words a page's text fills (2 to `MAX_WINDOWS`)."""
    return min(MAX_WINDOWS, max(2, round(len(text.split()) / WINDOW_WORDS)))


def tuning_pages() -> list[tuple[str, str, str]]:
    """(corpus, name, own text in document order) of every TUNE-split document of both
    retrieval corpora, from the built CKFs with the default recipe."""
    import corpus_man
    from cdr.ckf import CKF
    from cdr.retrieval.fact_recipe import DEFAULT_RECIPE
    from retrieval import CKF_DIR, PYDOCS_TUNE, own_rows

    out = []
    tune_man = set(corpus_man.split_names("tune"))
    for corpus in ("pydocs", "man"):
        ckf = CKF.open_or_create(CKF_DIR / f"{corpus}-{DEFAULT_RECIPE}.ckf")
        for source, rows in sorted(own_rows(ckf).items()):
            if corpus == "pydocs":
                name = next((p for p in PYDOCS_TUNE if source.endswith("/" + p)), None)
            else:
                stem = source.rsplit("/", 1)[-1].removesuffix(".md")
                name = stem if stem in tune_man else None
            if name is None:
                continue
            facts = ckf.facts(np.asarray(sorted(rows), dtype=np.int64))
            out.append((corpus, name, " ".join(f.content for f in facts)))
    return out


def model_sentences(page: str) -> list[tuple[str, str]]:
    """(run-window id, sentence) of every window the reference model wrote for `page` in the
    quality benchmark's checkpoints."""
    out = []
    safe = page.replace("/", "_")
    for d in QUALITY_CHECKPOINTS:
        for path in sorted(glob.glob(str(RESULTS / d / f"{safe}__*.json"))):
            run = json.loads(Path(path).read_text(encoding="utf-8"))
            for j, w in enumerate(run["windows"]):
                out += [(f"{d}/{run['arm']}/{j}", s) for s in quality.sentences(w["text"])]
    return out


def paraphrase_pairs(sents: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """bench-llm's paraphrase rule: two sentences of different windows (or runs) sharing ≥ 50%
    of their content words, not identical."""
    cw = [content_words(s) for _, s in sents]
    return [(a[1], b[1]) for (i, a), (j, b) in itertools.combinations(enumerate(sents), 2)
            if a[0] != b[0] and a[1] != b[1] and jaccard(cw[i], cw[j]) >= PARAPHRASE_JACCARD]


def calibrate_on_tuning(encode: Encode) -> dict[str, Any]:
    """The threshold and the sets it was chosen on (see the module docstring)."""
    from retrieval import PYDOCS_TUNE

    cache: dict[str, np.ndarray] = {}

    def enc(texts: Sequence[str]) -> np.ndarray:
        new = list(dict.fromkeys(t for t in texts if t not in cache))
        for i in range(0, len(new), 256):
            for t, v in zip(new[i:i + 256], np.asarray(encode(new[i:i + 256])), strict=True):
                cache[t] = v
        return np.stack([cache[t] for t in texts])

    neg: list[float] = []
    pages = []
    for corpus, name, text in tuning_pages():
        n = n_windows_for(text)
        best = best_earlier(page_windows(text, n), enc, skip_verbatim=True)
        vals = [x for w in best for x in w if x > -1.0]
        neg += vals
        pages.append({"corpus": corpus, "page": name, "windows": n, "sentences": len(vals),
                      "best": vals})
    pos: list[float] = []
    sources = []
    for page in PYDOCS_TUNE:
        pairs = paraphrase_pairs(model_sentences(page))
        if pairs:
            a, b = _unit(enc([p[0] for p in pairs])), _unit(enc([p[1] for p in pairs]))
            pos += [float(x) for x in np.einsum("ij,ij->i", a, b)]
            sources.append({"page": page, "pairs": len(pairs)})
    cal = calibrate(pos, neg)
    for p in pages:  # each page's own rate, at the old threshold and the new one
        vals = np.asarray(p.pop("best"))
        p["rate_at_old"] = round(float(np.mean(vals >= OLD_THRESHOLD)), 4) if vals.size else None
        p["rate_at_new"] = round(float(np.mean(vals >= cal.threshold)), 4) if vals.size else None
    return {"threshold": round(cal.threshold, 4), "old_threshold": OLD_THRESHOLD,
            "window_words": WINDOW_WORDS, "positives": cal.positives,
            "negatives": cal.negatives, "tpr": round(cal.true_positive_rate, 4),
            "fpr": round(cal.false_positive_rate, 4),
            "positive_median": round(cal.positive_median, 4),
            "negative_median": round(cal.negative_median, 4),
            "negative_p99": round(cal.negative_p99, 4),
            "tpr_at_old": round(float(np.mean(np.asarray(pos) >= OLD_THRESHOLD)), 4),
            "fpr_at_old": round(float(np.mean(np.asarray(neg) >= OLD_THRESHOLD)), 4),
            "negative_pages": pages, "positive_sources": sources}


def load_calibration() -> dict[str, Any] | None:
    """The calibration written by `main`, or None before it ran."""
    try:
        return json.loads(CALIBRATION.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main() -> int:
    from cdr.retrieval.embed import default_embedder

    emb = default_embedder()
    result = calibrate_on_tuning(emb.encode)
    CALIBRATION.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "negative_pages"}, indent=1))
    print(f"wrote {CALIBRATION.relative_to(BENCH.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
