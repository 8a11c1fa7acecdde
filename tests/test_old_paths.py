"""The module paths from before the package was grouped by layer keep working for one release:
each old name imports, warns once with its new home, and is the very same module object, so
`isinstance`, monkeypatching and pickles agree whichever name a caller used."""

from __future__ import annotations

import importlib
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cdr
from cdr.old_paths import MOVED, REMOVED_IN, RENAMED

SRC = Path(cdr.__file__).parent


def _import_fresh(name: str) -> tuple[object, list[warnings.WarningMessage]]:
    """Import `name` as if for the first time in this process, recording warnings."""
    sys.modules.pop(name, None)
    parent, _, attr = name.rpartition(".")
    vars(importlib.import_module(parent)).pop(attr, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    return module, caught


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_name_imports_warns_and_is_the_new_module(old: str) -> None:
    new = MOVED[old]
    module, caught = _import_fresh(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new
    moved = [w for w in caught if issubclass(w.category, DeprecationWarning)
             and f"{old} moved to {new}" in str(w.message)]
    assert len(moved) == 1, [str(w.message) for w in caught]
    assert REMOVED_IN in str(moved[0].message)
    assert moved[0].filename == __file__ or "importlib" in moved[0].filename, moved[0].filename


def test_from_old_module_import_name_gives_the_same_class() -> None:
    sys.modules.pop("cdr.factindex", None)
    with pytest.warns(DeprecationWarning, match="cdr.factindex moved to cdr.retrieval.factindex"):
        from cdr.factindex import FactIndex as OldFactIndex
    from cdr.retrieval.factindex import FactIndex
    assert OldFactIndex is FactIndex


def test_the_warning_points_at_the_importing_line() -> None:
    sys.modules.pop("cdr.loop", None)
    vars(sys.modules["cdr"]).pop("loop", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import cdr.loop  # noqa: F401 - the old path under test
    [w] = [w for w in caught if "cdr.loop moved" in str(w.message)]
    assert w.filename == __file__


def test_pickles_name_the_new_module_whatever_name_was_imported() -> None:
    """Pickle (and Ray, which pickles classes by reference too) resolves classes by
    `__module__`: an object made through an old path pickles under the new one."""
    old_length, _ = _import_fresh("cdr.length")
    report = old_length.LengthReport(asked=1000, delivered=900)
    data = pickle.dumps(report)
    assert b"cdr.window.length" in data and b"cdr.length\x94" not in data
    back = pickle.loads(data)
    from cdr.window.length import LengthReport
    assert type(back) is LengthReport and back == report
    assert pickle.loads(pickle.dumps(old_length.LengthReport)) is LengthReport


def test_no_shim_file_for_an_old_name_and_every_new_home_exists() -> None:
    for old, new in MOVED.items():
        assert not (SRC / (old.removeprefix("cdr.").replace(".", "/") + ".py")).exists(), old
        assert importlib.util.find_spec(new) is not None, new


def test_top_level_of_the_package_stays_small() -> None:
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= 15, top


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.integration
def test_the_package_itself_uses_no_old_path() -> None:
    """Every module imported by its new name, with the old-path warning turned into an error:
    nothing inside cdr still imports a moved module by its old name."""
    code = (
        "import importlib, pkgutil, warnings, cdr\n"
        "warnings.filterwarnings('error', message='.* moved to cdr', category=DeprecationWarning)\n"
        "n = 0\n"
        "for m in pkgutil.walk_packages(cdr.__path__, 'cdr.'):\n"
        "    if m.name.endswith('__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except ImportError as exc:  # an optional extra (ray, otel, psycopg) not installed\n"
        "        assert ' moved to ' not in str(exc), exc\n"
        "        continue\n"
        "    n += 1\n"
        "print(n)\n")
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 60


@pytest.mark.integration
def test_python_m_cdr_cli_does_not_warn_and_old_demo_path_runs() -> None:
    proc = _run("-W", "error::DeprecationWarning:cdr", "-m", "cdr.cli", "--help")
    assert proc.returncode == 0 and "moved to" not in proc.stderr, proc.stderr
    assert "Usage" in proc.stdout
    proc = _run("-W", "always::DeprecationWarning", "-m", "cdr.demo", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "cdr.demo moved to cdr.cli.demo" in proc.stderr
    assert "--windows" in proc.stdout


def test_renamed_names_and_keywords_keep_working_with_a_warning() -> None:
    """Names renamed in place so that one thing has one name (`RENAMED`): the CKF's storage
    side was `CKFWriter` in `cdr.ckf.writer` (apart from `cdr.writers`, the model backends)."""
    import cdr.ckf
    from cdr.ckf.committer import CKFCommitter
    from cdr.old_paths import renamed_keywords

    assert set(RENAMED["cdr.ckf"]) == {"CKFWriter"}
    with pytest.warns(DeprecationWarning, match="cdr.ckf.CKFWriter is now cdr.ckf.CKFCommitter"):
        assert cdr.ckf.CKFWriter is CKFCommitter  # type: ignore[attr-defined]
    old, _ = _import_fresh("cdr.ckf.writer")
    with pytest.warns(DeprecationWarning, match=REMOVED_IN):
        assert old.CKFWriter is CKFCommitter
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = cdr.ckf.Nope  # type: ignore[attr-defined]
    # moved to another module: the document kinds' table is the registry of cdr.ckf.kinds
    from cdr.ckf import kinds
    parse_module = importlib.import_module("cdr.ckf.parse")  # cdr.ckf.parse is also a function
    with pytest.warns(DeprecationWarning, match="cdr.ckf.parse.KIND_BY_SUFFIX is now "
                                                "cdr.ckf.kinds.KIND_BY_SUFFIX"):
        assert parse_module.KIND_BY_SUFFIX is kinds.KIND_BY_SUFFIX

    @renamed_keywords(ckf="index")
    def run(index: int, *, limit: int = 0) -> tuple[int, int]:
        return index, limit

    assert run(index=3) == (3, 0)
    with pytest.warns(DeprecationWarning, match=r"run\(ckf=...\) is now index="):
        assert run(ckf=4, limit=1) == (4, 1)
    with pytest.raises(TypeError, match="got both ckf= and its new name index="):
        run(ckf=1, index=2)


@pytest.mark.parametrize(("module", "old"), sorted(
    (module, old) for module, names in RENAMED.items() for old in names))
def test_every_renamed_name_warns_at_the_caller_with_its_release(module: str, old: str) -> None:
    """Each old name in `RENAMED` answers with the new object, with one warning that names the
    new home and the release it goes away in, pointing at the line that used it."""
    home, _, path = RENAMED[module][old].rpartition(":")
    new: object = importlib.import_module(home or module)
    for attr in path.split("."):
        new = getattr(new, attr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = getattr(importlib.import_module(module), old)
    assert got is new
    [w] = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert f"{module}.{old} is now {home or module}.{path}" in str(w.message)
    assert f"stops working in cdr {REMOVED_IN}" in str(w.message)
    assert w.filename == __file__


def test_renamed_keyword_and_properties_of_real_objects_warn_with_the_release() -> None:
    """`Generator(ckf=...)`, `Generator.ckf` and `CKF.writer`, on the classes themselves."""
    from types import SimpleNamespace

    from cdr.ckf.handle import CKF
    from cdr.window.loop import Generator
    from cdr.writers import get_writer

    index = SimpleNamespace(embedder=None)
    with pytest.warns(DeprecationWarning, match=rf"\(ckf=...\) is now index=.*{REMOVED_IN}"):
        gen = Generator(ckf=index, writer=get_writer("extractive"))  # type: ignore[call-arg]
    assert gen.index is index
    with pytest.warns(DeprecationWarning, match=rf"Generator.ckf is now Generator.index.*"
                                                rf"{REMOVED_IN}"):
        assert gen.ckf is index
    committer = object()
    with pytest.warns(DeprecationWarning, match=rf"CKF.writer is now CKF.committer.*{REMOVED_IN}"):
        assert CKF.writer.__get__(SimpleNamespace(committer=committer), CKF) is committer


def _changelog_section(heading: str) -> str:
    """The text of one `### heading` of the changelog's Unreleased part."""
    text = (SRC.parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    unreleased = text[text.index("## [Unreleased]"):]
    unreleased = unreleased[:unreleased.index("\n## [", 1)]
    start = unreleased.index(f"### {heading}\n")
    end = unreleased.find("\n### ", start + 1)
    return re.sub(r"\s+", " ", unreleased[start:end if end > 0 else None])


def test_the_changelog_lists_every_deprecated_name_and_when_it_goes() -> None:
    """What warns is under "Deprecated" with the release it is removed in; that release is
    after this one (`cdr.__version__` is the last released, the deprecations are unreleased)."""
    deprecated = _changelog_section("Deprecated")
    assert f"removed in {REMOVED_IN}" in deprecated
    assert "cdr.old_paths.MOVED" in deprecated  # the table of the old module paths
    for module, names in RENAMED.items():
        for old in names:
            assert f"{old}`" in deprecated, f"{module}.{old} is not under Deprecated"
    for old in ("Generator(ckf=...)", "Generator.ckf", "CKF.writer", "cdr.ckf.writer",
                "Gateway.snapshot()", "Gateway.generator(snapshot=...)"):
        assert f"`{old}`" in deprecated, old

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    assert version(REMOVED_IN) > version(cdr.__version__)
    assert f"## [{cdr.__version__}]" in (SRC.parents[1] / "CHANGELOG.md").read_text("utf-8")


def test_only_deprecation_notes_name_an_old_path() -> None:
    """A reader meets the old dotted names (`MOVED`, and `RENAMED` as `module.Name`) only
    where a paragraph says they are old: the source, the docs, the README, the changelog, the
    examples, the tests, the benchmarks and their committed reports otherwise use the current
    names."""
    root = SRC.parents[1]
    old = sorted({*MOVED, *(f"{m}.{a}" for m, names in RENAMED.items() for a in names)},
                 key=len, reverse=True)
    pattern = re.compile("|".join(rf"(?<![\w.]){re.escape(n)}(?!\w)" for n in old))
    says_old = re.compile(r"deprecat|old (name|path|module)|\bwas\b|moved|renamed|"
                          r"stops working", re.I)
    texts = [*(root / "src").rglob("*.py"), *(root / "docs").rglob("*.md"),
             root / "README.md", root / "CHANGELOG.md", *(root / "examples").iterdir(),
             *(root / "tests").glob("*.py"), *(root / "bench").glob("*.py"),
             *(root / "bench" / "results").glob("*.md")]
    skip = {SRC / "old_paths.py", Path(__file__).resolve(), *(root / "docs" / "spec").glob("*")}
    found = []
    for path in texts:
        if path in skip or not path.is_file():
            continue
        for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
            if not says_old.search(para):
                found += [f"{path.relative_to(root)}: {m.group(0)}" for m in pattern.finditer(para)]
    assert found == []
