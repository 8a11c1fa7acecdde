"""Our numpy MiniLM vs sentence-transformers on the same weights and the same texts.

Each side runs in a fresh process so load times are cold (imports included) and peak memory is
its own: ours with this interpreter, sentence-transformers + PyTorch in the separate venv that
`make_minilm_reference.py` builds (bench/.venv-st). Texts are real: paragraphs of the Python
language reference (`pydoc_data.topics`, in the standard library).

Usage: `python bench/embedders.py [--n 2000] [--batch-size 32] [--repeats 2] [--json OUT]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"


def _reference_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_minilm_reference", BENCH / "make_minilm_reference.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_texts(n: int = 2000) -> list[str]:
    """Distinct paragraphs (≥ 20 characters) of the language reference, then of stdlib
    docstrings if the reference runs out, in a fixed order."""
    import pydoc_data.topics

    out: list[str] = []
    seen: set[str] = set()

    def add(doc: str | None) -> None:
        for para in re.split(r"\n\s*\n", doc or ""):
            para = " ".join(para.split())
            if len(para) >= 20 and para not in seen:
                seen.add(para)
                out.append(para)

    for key in sorted(pydoc_data.topics.topics):
        add(pydoc_data.topics.topics[key])
    for mod_name in ("builtins", "os", "re", "json", "collections", "itertools", "functools",
                     "pathlib", "typing", "string", "textwrap", "argparse", "subprocess"):
        if len(out) >= n:
            break
        mod = __import__(mod_name)
        add(mod.__doc__)
        for name in sorted(dir(mod)):
            add(getattr(getattr(mod, name, None), "__doc__", None))
    return out[:n]


def _ours_inside(texts_json: Path, out_npy: Path, batch_size: int, repeats: int) -> None:
    """Runs in a fresh interpreter: the same protocol as the sentence-transformers side."""
    import resource
    import time

    t0 = time.perf_counter()
    import numpy as np  # timed too: this module imports it only inside functions

    import cdr.retrieval.embed

    t1 = time.perf_counter()
    model = cdr.retrieval.embed.MiniLMEmbedder()
    t2 = time.perf_counter()
    texts = json.loads(texts_json.read_text(encoding="utf-8"))
    model.encode(texts[:8], batch_size=batch_size)  # warm-up
    times, cpu = [], []
    for _ in range(repeats):
        c3 = time.process_time()
        t3 = time.perf_counter()
        vecs = model.encode(texts, batch_size=batch_size)
        times.append(time.perf_counter() - t3)
        cpu.append(time.process_time() - c3)
    np.save(out_npy, vecs)
    print(json.dumps({
        "import_s": t1 - t0,
        "load_s": t2 - t1,
        "encode_s": min(times),
        "encode_s_all": times,
        "encode_cpu_s": min(cpu),  # all threads; less sensitive to a busy machine than wall
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "max_seq_length": model.max_seq_length,
        "threads": model.threads,
    }))


def ours_encode(texts: list[str], batch_size: int = 32, repeats: int = 1) -> tuple[Any, dict]:
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        tj, tv = Path(tmp) / "texts.json", Path(tmp) / "vecs.npy"
        tj.write_text(json.dumps(texts), encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inside-ours", str(tj), str(tv),
               str(batch_size), str(repeats)]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        return np.load(tv), json.loads(res.stdout.strip().splitlines()[-1])


def run_embedder_comparison(
    texts: list[str], batch_size: int = 32, repeats: int = 1
) -> dict[str, Any]:
    """Load time, sentences/s and vector agreement of ours vs sentence-transformers."""
    import numpy as np

    ours_vecs, ours = ours_encode(texts, batch_size, repeats)
    st_vecs, st = _reference_module().st_encode(texts, batch_size, repeats)
    cos = np.sum(ours_vecs * st_vecs, axis=1)
    # Does retrieval see the same neighbours? Top-1 neighbour (excluding self) per text.
    def top1(v: Any) -> Any:
        sims = v @ v.T
        np.fill_diagonal(sims, -np.inf)
        return sims.argmax(axis=1)

    n = len(texts)
    for side in (ours, st):
        side["sentences_per_s"] = n / side["encode_s"]
        side["cold_load_s"] = side["import_s"] + side["load_s"]
    return {
        "n_texts": n,
        "batch_size": batch_size,
        "mean_chars": float(np.mean([len(t) for t in texts])),
        "ours": ours,
        "sentence_transformers": st,
        "agreement": {
            "min_cosine": float(cos.min()),
            "mean_cosine": float(cos.mean()),
            "top1_neighbour_agreement": float(np.mean(top1(ours_vecs) == top1(st_vecs))),
            "max_abs_diff": float(np.abs(ours_vecs - st_vecs).max()),
        },
        "speedup": st["encode_s"] / ours["encode_s"],
        "cpu_ratio": st["encode_cpu_s"] / ours["encode_cpu_s"],
        "load_avg_1m": os.getloadavg()[0],
    }


def _table(r: dict[str, Any]) -> str:
    o, s = r["ours"], r["sentence_transformers"]
    rows = [
        ("", "numpy (cdr.retrieval.embed)", f"sentence-transformers {s['sentence_transformers']}"),
        ("imports (s)", f"{o['import_s']:.2f}", f"{s['import_s']:.2f}"),
        ("model load (s)", f"{o['load_s']:.2f}", f"{s['load_s']:.2f}"),
        ("cold load total (s)", f"{o['cold_load_s']:.2f}", f"{s['cold_load_s']:.2f}"),
        ("sentences/s", f"{o['sentences_per_s']:.1f}", f"{s['sentences_per_s']:.1f}"),
        ("encode runs (s)", " ".join(f"{t:.1f}" for t in o["encode_s_all"]),
         " ".join(f"{t:.1f}" for t in s["encode_s_all"])),
        ("CPU s per run (all threads)", f"{o['encode_cpu_s']:.1f}", f"{s['encode_cpu_s']:.1f}"),
        ("peak RSS (MB)", f"{o['max_rss_mb']:.0f}", f"{s['max_rss_mb']:.0f}"),
        ("threads", str(o["threads"]), f"{s['threads']} (torch {s['torch']})"),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    lines = [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    a = r["agreement"]
    lines += [
        "",
        f"{r['n_texts']} texts (mean {r['mean_chars']:.0f} chars), batch {r['batch_size']}, "
        f"load avg {r['load_avg_1m']:.2f}",
        f"agreement: min cosine {a['min_cosine']:.7f}, mean {a['mean_cosine']:.7f}, "
        f"max |diff| {a['max_abs_diff']:.2e}, top-1 neighbour agreement "
        f"{a['top1_neighbour_agreement']:.4f}",
        f"speed ratio (ST time / ours): wall {r['speedup']:.2f}x, CPU {r['cpu_ratio']:.2f}x",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    from cdr import settings

    settings.export({"CDR_EMBED_CACHE": ""})  # time the model, never vectors kept by a run
    texts = load_texts(args.n)
    result = run_embedder_comparison(texts, args.batch_size, args.repeats)
    print(_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--inside-ours":
        _ours_inside(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
