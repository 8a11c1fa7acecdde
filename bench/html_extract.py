"""Main-content extraction for HTML, measured on two real documentation sites (issue 25 §7).

    python bench/html_extract.py [--pages 20] [--phase 0.5] [--seed 25] [--parse-only]
                                 [--out bench/results/html_extract.md]

The sites are Debian's documentation packages, fetched once with `apt-get download` and
unpacked into the cache (`~/.cache/cdr/<package>`): SQLite's (`sqlite3-doc`, the site whose
menu turned into facts) and Python's (`python3.11-doc`, Sphinx). A deterministic sample of
pages per site (every k-th page of the sorted list, starting `phase`·k into it: phases 0 and
0.5 give two disjoint page sets, one to tune rules on and one to report on) is parsed and
ingested twice, with `CDR_HTML_EXTRACTOR=off` (the streaming parser alone) and on (trafilatura
decides which blocks are content). Reported per site and mode: pages, facts, facts per page,
facts made of navigation terms (the word list below), facts starting with "Purchase", parse
time; search recall@5 with each page's title as the query (a hit is a fact from that page in
the top 5) and chrome facts among the top 5; the blocks the extractor dropped that are not
chrome by the word list (what it may have lost); and a random sample of 50 facts from the
extractor's CKFs for judging by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _paths  # noqa: F401  (cdr importable from a checkout)
from cdr.ckf.chunk import DEFAULT_CHUNKING, chunk_blocks
from cdr.ckf.handle import CKF
from cdr.ckf.ingest import ingest
from cdr.ckf.sources import SkipDocument, parse_bytes
from cdr.cli.samples import cache_dir

SITES = {
    "sqlite": ("sqlite3-doc", "usr/share/doc/sqlite3", "*.html"),
    "python": ("python3.11-doc", "usr/share/doc/python3.11/html", "library/*.html"),
}
# Words of site menus, navigation bars and footers on these two sites (and most others).
_NAV_WORDS = (
    "home menu about documentation docs download downloads license support purchase search "
    "news sitemap index modules next previous prev navigation contents table of toc go quick "
    "theme auto light dark python report a bug show source copyright privacy contact forum "
    "blog faq help login logout sign in up top back page last modified this on")
NAV_TERMS = frozenset(_NAV_WORDS.split())
QUERY_LIMIT = 5


def site_dir(package: str, subdir: str) -> Path:
    """The unpacked package's HTML directory, fetched with `apt-get download` if needed."""
    root = cache_dir() / package
    html = root / subdir
    if html.is_dir():
        return html
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", package], cwd=tmp, check=True,
                       capture_output=True, timeout=600)
        deb = sorted(Path(tmp).glob(f"{package}_*.deb"))[-1]
        staging = root.with_name(root.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(["dpkg", "-x", str(deb), str(staging)], check=True, timeout=600)
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    return html


def sample_pages(html: Path, pattern: str, n: int, phase: float = 0.0) -> list[Path]:
    """Every k-th page of the sorted list (k = pages // n), from `phase`·k on."""
    pages = sorted(p for p in html.glob(pattern) if p.is_file())
    step = max(len(pages) // n, 1)
    return pages[int(step * phase)::step][:n]


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def is_chrome(text: str) -> bool:
    """A fact or block made of navigation terms: at least 60% of its words are in NAV_TERMS
    (and it has a word), or it starts with "Purchase" (the issue's SQLite menu)."""
    w = words(text)
    if not w:
        return False
    return sum(x in NAV_TERMS for x in w) >= 0.6 * len(w) or text.lstrip().startswith(
        "Purchase")


@dataclass
class ModeResult:
    pages: int = 0
    facts: int = 0
    chrome_facts: int = 0
    purchase_facts: int = 0
    parse_seconds: float = 0.0
    recall_hits: int = 0
    queries: int = 0
    chrome_in_top: int = 0
    chrome_examples: list[str] = field(default_factory=list)


def parse_site(pages: list[Path], mode: str) -> tuple[ModeResult, dict[Path, list[str]],
                                                      dict[Path, str]]:
    """Facts per page (as the ingest cuts them) and titles, with the extractor on or off."""
    os.environ["CDR_HTML_EXTRACTOR"] = mode
    res = ModeResult()
    facts: dict[Path, list[str]] = {}
    titles: dict[Path, str] = {}
    for page in pages:
        t0 = time.perf_counter()
        try:
            doc = parse_bytes(page.read_bytes(), "html")
        except SkipDocument:
            continue
        res.parse_seconds += time.perf_counter() - t0
        texts = [d.content for d in chunk_blocks(doc.blocks, DEFAULT_CHUNKING)]
        facts[page] = texts
        titles[page] = doc.title or page.stem
        res.pages += 1
        res.facts += len(texts)
        for t in texts:
            if is_chrome(t):
                res.chrome_facts += 1
                if len(res.chrome_examples) < 8:
                    res.chrome_examples.append(" ".join(t.split())[:100])
            res.purchase_facts += t.lstrip().startswith("Purchase")
    return res, facts, titles


def search_recall(pages: list[Path], titles: dict[Path, str], mode: str, root: Path,
                  res: ModeResult) -> list[tuple[str, str]]:
    """Ingest the pages into a CKF and query each page's title; the top hits of the first."""
    os.environ["CDR_HTML_EXTRACTOR"] = mode
    path = root / f"{mode}.ckf"
    with CKF.create(path) as ckf:
        ingest(ckf, pages)
    ckf = CKF.open(path)
    first: list[tuple[str, str]] = []
    try:
        for page in pages:
            if page not in titles:
                continue
            hits = ckf.search(titles[page], limit=QUERY_LIMIT)
            res.queries += 1
            res.recall_hits += any(Path(f.source).name == page.name for f, _ in hits)
            res.chrome_in_top += sum(is_chrome(f.content) for f, _ in hits)
            if not first:
                first = [(Path(f.source).name, " ".join(f.content.split())[:90])
                         for f, _ in hits]
    finally:
        ckf.close()
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=20, help="pages per site")
    ap.add_argument("--phase", type=float, default=0.0,
                    help="where in each step of k pages the sample starts (0 <= phase < 1)")
    ap.add_argument("--seed", type=int, default=25, help="seed of the 50-fact sample")
    ap.add_argument("--parse-only", action="store_true",
                    help="facts and chrome only: no ingest, so no search figures")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                    "html_extract.md")
    ap.add_argument("--reuse-off", action="store_true",
                    help="take the extractor-off search figures from the previous run's JSON "
                         "(the streaming parser did not change; only 'on' is re-ingested)")
    args = ap.parse_args()
    if not 0.0 <= args.phase < 1.0:
        ap.error("--phase must be in [0, 1)")
    previous = (json.loads(args.out.with_suffix(".json").read_text(encoding="utf-8"))
                if args.reuse_off else {})
    results: dict[str, dict[str, ModeResult]] = {}
    first_hits: dict[str, dict[str, list[tuple[str, str]]]] = {}
    lost: dict[str, list[str]] = {}
    sample_pool: list[tuple[str, str]] = []
    sampled: dict[str, list[Path]] = {}
    with tempfile.TemporaryDirectory(prefix="cdr-html-extract-") as tmp:
        for site, (package, subdir, pattern) in SITES.items():
            pages = sample_pages(site_dir(package, subdir), pattern, args.pages, args.phase)
            sampled[site] = pages
            results[site], first_hits[site] = {}, {}
            per_mode = {}
            for mode in ("off", "on"):
                res, facts, titles = parse_site(pages, mode)
                per_mode[mode] = facts
                work = Path(tmp) / site
                work.mkdir(exist_ok=True)
                if args.parse_only:
                    first_hits[site][mode] = []
                elif mode == "off" and site in previous:
                    old = previous[site]["off"]
                    assert (old["pages"], old["facts"]) == (res.pages, res.facts), old
                    res.recall_hits, res.queries = old["recall_hits"], old["queries"]
                    res.chrome_in_top = old["chrome_in_top"]
                    first_hits[site][mode] = [tuple(h) for h in old.get("first_hits", [])]
                else:
                    first_hits[site][mode] = search_recall(pages, titles, mode, work, res)
                results[site][mode] = res
                print(site, mode, res)
            on_texts = {t for ts in per_mode["on"].values() for t in ts}
            lost[site] = [" ".join(t.split())[:140] for ts in per_mode["off"].values()
                          for t in ts if t not in on_texts and not is_chrome(t)]
            sample_pool += [(f"{site}:{p.name}", t) for p, ts in per_mode["on"].items()
                            for t in ts]
    os.environ.pop("CDR_HTML_EXTRACTOR", None)
    sample = random.Random(args.seed).sample(sample_pool, min(50, len(sample_pool)))
    write_report(args.out, args, results, first_hits, lost, sample,
                 {site: [p.name for p in pages] for site, pages in sampled.items()})
    args.out.with_suffix(".json").write_text(json.dumps(
        {s: {m: {**r.__dict__, "first_hits": first_hits[s][m]} for m, r in modes.items()}
         for s, modes in results.items()}, indent=2), encoding="utf-8")


def write_report(out: Path, args: argparse.Namespace,
                 results: dict[str, dict[str, ModeResult]],
                 first_hits: dict[str, dict[str, list[tuple[str, str]]]],
                 lost: dict[str, list[str]], sample: list[tuple[str, str]],
                 pages: dict[str, list[str]]) -> None:
    from importlib.metadata import version

    n = args.pages

    lines = [
        "# HTML main-content extraction: before (streaming parser) and after (trafilatura)",
        "",
        f"`python bench/html_extract.py --pages {n} --phase {args.phase:g} --seed {args.seed}"
        f"{' --parse-only' if args.parse_only else ''}` "
        f"on {time.strftime('%Y-%m-%d')}; trafilatura {version('trafilatura')}. "
        f"Pages: every k-th of the sorted list from {args.phase:g}·k on "
        f"(SQLite: top-level `*.html` of `sqlite3-doc`; Python: `library/*.html` of "
        f"`python3.11-doc`), {n} per site. A fact is *chrome* when 60% or more of its words "
        "are navigation terms (`NAV_TERMS` in the script) or it starts with \"Purchase\".",
        "",
        "| site | extractor | pages | facts | facts/page | chrome facts | \"Purchase…\" facts "
        "| title recall@5 | chrome in top 5 (all queries) | parse s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for site, modes in results.items():
        for mode, r in modes.items():
            lines.append(
                f"| {site} | {mode} | {r.pages} | {r.facts} | {r.facts / max(r.pages, 1):.1f} "
                f"| {r.chrome_facts} | {r.purchase_facts} "
                f"| {f'{r.recall_hits}/{r.queries}' if r.queries else '–'} "
                f"| {r.chrome_in_top if r.queries else '–'} | {r.parse_seconds:.1f} |")
    lines += ["", "Pages: " + "; ".join(f"{site}: {', '.join(names)}"
                                        for site, names in pages.items()) + ".", "",
              "## Chrome facts left (examples)", ""]
    for site, modes in results.items():
        for mode, r in modes.items():
            ex = "; ".join(f"`{e}`" for e in r.chrome_examples) or "none"
            lines.append(f"- {site}, {mode}: {ex}")
    lines += ["", "## Top hits of the first title query", ""]
    for site, modes in first_hits.items():
        for mode, hits in modes.items():
            lines.append(f"- {site}, {mode}:")
            lines += [f"  {i}. {src}: {text}" for i, (src, text) in enumerate(hits, 1)]
    lines += ["", "## Facts the extractor dropped that the word list does not call chrome", "",
              "What the extractor may have lost (or chrome the word list misses).", ""]
    for site, texts in lost.items():
        lines.append(f"- {site}: {len(texts)} facts")
        lines += [f"  - `{t}`" for t in texts[:30]]
        if len(texts) > 30:
            lines.append(f"  - … {len(texts) - 30} more")
    lines += ["", f"## 50 facts sampled from the extractor's CKFs (seed {args.seed}), for judging "
              "by hand", ""]
    lines += [f"{i}. {src}: {' '.join(t.split())[:160]}" for i, (src, t) in
              enumerate(sample, 1)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"report: {out}")


if __name__ == "__main__":
    main()
