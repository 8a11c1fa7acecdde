"""Shared fixtures: a real CKF of Python's own documentation, built once per test session.

The corpus is the standard library's `pydoc_data.topics` (the language reference), so it needs
no download; the embeddings come from the real default model.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

# The built-in types chapter plus unrelated reference topics as distractors.
BUILTIN_TYPES_TOPICS = (
    "truth", "types", "typesseq", "typesseq-mutable", "typesmapping", "typesmethods",
    "typesfunctions", "typesmodules", "string-methods", "integers", "floating", "dict", "lists",
    "strings",
)
DISTRACTOR_TOPICS = ("import", "lambda", "assert", "pass", "global", "del", "raise", "return")
BUILTIN_TYPES_TASK = "Write a guide to Python's built-in types"
BUILTIN_TYPES_OUTLINE = (
    "Truth value testing\nNumeric types\nSequence types\nText sequence type str\n"
    "Mapping types dict\nMethods and code objects\n"
)


def write_docs(folder: Path, docs: dict[str, str]) -> Path:
    """A folder of documents to ingest, {file name: text}."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def build_topics_ckf(root: Path, topics: tuple[str, ...], recipe: str | None = None) -> Path:
    """A CKF of pydoc topics; `recipe` None = the default fact recipe
    (`cdr.retrieval.fact_recipe`)."""
    from cdr.ckf import CKF, ingest
    from cdr.cli.samples import pydoc_topics_dir

    docs = pydoc_topics_dir(root / "docs", topics=list(topics))
    with CKF.create(root / "ckf", **({} if recipe is None else {"recipe": recipe})) as ckf:
        report = ingest(ckf, [str(docs)], source_type="official")
        assert report.facts_added > 0 and not report.skipped, report
    return root / "ckf"


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Path]) -> Path:
    """`build(root)` (which returns a path inside `root`) run once per test run, however many
    xdist workers need it, and copied into each worker's own temporary directory.

    Ingesting a CKF embeds every fact, which costs more than most modules' tests; under
    `make test` every worker used to build each session CKF it needed. The first worker
    builds it under a lock in the run's shared temporary directory, the others wait and copy
    it. Each worker still gets its own copy, so a server that writes beside a CKF (its session
    file) never shares it with another worker's tests, as before."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"built-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        marker = shared / ".built"
        if not marker.exists():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            marker.write_text(build(shared).relative_to(shared).as_posix())
        inside = marker.read_text()
    mine = tmp_path_factory.mktemp(name)
    shutil.copytree(shared, mine, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".built"))
    return mine / inside


@pytest.fixture(scope="session")
def types_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~450 facts: the built-in types topics and a few unrelated ones."""
    return built_once(tmp_path_factory, "types-ckf", lambda root: build_topics_ckf(
        root, BUILTIN_TYPES_TOPICS + DISTRACTOR_TOPICS))


@pytest.fixture(scope="session")
def tiny_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A handful of facts: a CKF that a long task exhausts."""
    return built_once(tmp_path_factory, "tiny-ckf",
                      lambda root: build_topics_ckf(root, ("pass", "truth")))


@pytest.fixture(scope="session")
def tiny_plain_ckf_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny CKF as every CKF was built before fact recipes (facts embedded alone): what
    sessions stored by earlier versions were started on."""
    return built_once(tmp_path_factory, "tiny-plain-ckf", lambda root: build_topics_ckf(
        root, ("pass", "truth"), recipe="plain"))


# `make test` spreads whole modules over the cores (pytest-xdist, `--dist loadfile`: many
# modules share a module-scoped server whose state their tests build on in file order). The
# modules marked `serial` run afterwards, one at a time: they share the Ray head `.ci/run`
# starts (2 CPUs), and the shard actors of two modules at once would wait for each other.
SERIAL_MODULES = frozenset({"test_ray_index.py", "test_gateway_ray.py",
                            "test_gateway_ray_writes.py"})


# The integration tier: modules that start servers or subprocesses, build knowledge bases from
# real documents, or drive a browser. `make test-fast` leaves them out (the unit tier, under a
# minute); `make test` runs everything. A module not named here is in the unit tier: keep it
# fast, or name it here.
INTEGRATION_PREFIXES = ("test_gateway_", "test_integrations_", "test_ray_", "test_llm_",
                        "test_session_store", "test_ckf_")
INTEGRATION_MODULES = frozenset({
    "test_examples.py", "test_cli_generate.py", "test_loop.py", "test_subject_stale.py",
    "test_window_step.py", "test_factindex.py", "test_repeat_guard.py", "test_options.py",
    "test_kept_stream.py", "test_writers_llm.py", "test_job_leases.py", "test_keys_scoped.py",
    "test_public_api.py", "test_packaging.py", "test_report_browser.py", "test_shardset.py",
    "test_continued_sections.py", "test_cli.py", "test_demo.py", "test_docs_pages.py",
    "test_lexical.py", "test_report.py", "test_embed.py", "test_embed_cache.py",
    "test_ranking_sections.py", "test_shard_merge.py", "test_bench_retrieval.py",
    "test_prompt_budget.py", "test_typing.py", "test_default_profile.py",
})


def is_integration(path: Path) -> bool:
    return path.name.startswith(INTEGRATION_PREFIXES) or path.name in INTEGRATION_MODULES


# Modules that share a session-scoped server with others (`pytest_xdist_make_scheduler`), by
# the fixture they share: `gateway` (tests/gateway_server.py) and the report views'
# `ui_gateway`, `ui_dev_gateway` with the hostile CKF and traces they serve
# (tests/ui_fixtures.py).
SHARED_SERVER_GROUPS = {
    "session-gateway": ("test_examples.py", "test_gateway_concurrency.py",
                        "test_gateway_openai.py", "test_gateway_sidecar.py", "test_options.py"),
    "ui-gateways": ("test_gateway_ui.py", "test_report.py", "test_report_browser.py"),
}
_GROUP_OF = {module: group for group, modules in SHARED_SERVER_GROUPS.items()
             for module in modules}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadfile` (`make test`), the modules of each `SHARED_SERVER_GROUPS` entry
    run on one worker, one after the other, as one unit of work; every other module is its
    own unit, as before.

    Each worker that ran one of them started the session-scoped server again (and built what
    it serves): a gateway process for each, about 1.3 s of CPU to start and then its own
    embeddings, and for the report views two gateways, a CKF ingested and two traces
    generated. xdist's own grouping (`--dist loadgroup`, the `xdist_group` mark) does nothing
    on this pytest: it renames the tests' node ids, which pytest 9 no longer lets a plugin do."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedServerScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return _GROUP_OF.get(module.rpartition("/")[2], module)

    return SharedServerScheduling(config, log)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test by its module as it is collected (before `-m` selects)."""
    if item.path.name in SERIAL_MODULES:
        item.add_marker(pytest.mark.serial)
    if is_integration(item.path):
        item.add_marker(pytest.mark.integration)


# The integration modules that take longest (CPU or waiting), longest first, as measured by
# `--cpu-log` in whole runs and alone (docs/development.md): the parallel run starts them
# before every other module. In file order, `test_typing` (one cold `mypy --strict` of the
# package and the examples, about 35 s of CPU in a clean clone) and `test_ray_connect` (a
# 30 s connection probe) started among the last integration modules, when the unit modules
# left could no longer fill the other workers while they ran.
HEAVY_FIRST = (
    "test_typing.py", "test_ray_connect.py", "test_gateway_fuzz.py", "test_gateway_hostile.py",
    "test_examples.py", "test_cli_generate.py", "test_ckf_ingest_hostile.py",
    "test_gateway_job_crash.py", "test_gateway_resume.py", "test_gateway_replicas.py",
    "test_gateway_isolation.py", "test_gateway_ops.py", "test_embed.py", "test_gateway_kbs.py",
    "test_gateway_owner_hostile.py", "test_writers_llm.py", "test_gateway_owner_postgres.py",
    "test_gateway_upstream.py", "test_gateway_sse_resume.py",
)


def run_order(path: Path) -> tuple[int, int]:
    """Where the module at `path` starts in the parallel run: the heavy integration modules
    (`HEAVY_FIRST`, in its order), the other integration modules, the unit modules."""
    if path.name in HEAVY_FIRST:
        return 0, HEAVY_FIRST.index(path.name)
    return (1 if is_integration(path) else 2), 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heavy integration modules first (`HEAVY_FIRST`), the other integration modules
    next, the unit modules last; file order, and the order of tests inside a file, kept
    otherwise (a stable sort).

    Under `make test` (`--dist loadfile --no-loadscope-reorder`; `SHARED_SERVER_GROUPS` as one
    unit each) a worker takes the next whole module when it finishes one, so the
    run ends when the last module started ends. Heavy modules (servers, corpora) started last
    made that tail: xdist's own order, by number of tests, put the heaviest few-test modules
    (a killed replica, fifty concurrent sessions, the schema fuzzer) at the very end. Started
    first, they run beside each other, and the many short unit modules fill the cores to the
    end. xdist hands a worker its next module when two or fewer of its tests are left, so a
    one-test module that runs half a minute takes the module after it along (a group starts
    where its first module would): among the heavy ones at the start, that costs nothing."""
    items.sort(key=lambda item: run_order(item.path))


def module_marks(path: Path) -> dict[str, bool]:
    """The marks every test of the module at `path` gets from its name (above): `serial`
    always decided, `integration` only when the module is in the tier (a unit module may
    still mark single tests `integration` itself)."""
    marks = {"serial": path.name in SERIAL_MODULES}
    if is_integration(path):
        marks["integration"] = True
    return marks


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Does not import a test module none of whose tests `-m` could select, judging by the
    marks its name gives (`module_marks`) whatever marks its tests carry otherwise.

    Collecting a module imports it and what it imports (servers' clients, the schema fuzzer,
    SDKs): the serial run of `make test` (`-m "serial ..."`, three modules) collected all
    115 modules to deselect all but those, and `make test-fast` (`-m "... not
    integration ..."`) collected every integration module in each worker. The tests that
    run are the same; pytest's own `-m` selection still decides for each test."""
    if not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    markexpr = config.option.markexpr
    if not markexpr:
        return None
    expr = Expression.compile(markexpr)
    fixed = module_marks(collection_path)
    free = sorted(expr.idents() - fixed.keys())
    for values in itertools.product((False, True), repeat=len(free)):
        marks = {**fixed, **dict(zip(free, values, strict=True))}
        if expr.evaluate(lambda name, /, marks=marks, **kw: marks.get(name, False)):
            return None  # some test of this module could be selected
    return True


# ------------------------------------------------------------------ one embedding cache per run

# The settings the test run sets for every process it starts: helpers that give a child a
# clean environment (no inherited `CDR_*`) pass these on.
RUN_SETTINGS = ("CDR_EMBED_CACHE",)


def run_settings() -> dict[str, str]:
    """`RUN_SETTINGS` as this process has them, for a child's environment."""
    return {name: os.environ[name] for name in RUN_SETTINGS if name in os.environ}


def pytest_configure(config: pytest.Config) -> None:
    """One embedding cache (`CDR_EMBED_CACHE`, `cdr.retrieval.embed_cache`) for the whole run:
    the controller makes it before xdist starts its workers, so the workers, the test servers
    and the `cdr` commands they start all share it. Tests embed the same texts again and again
    (the same documents ingested, the same tasks and windows in many servers' sessions), and
    the model's forward pass was most of the suite's CPU. Each run starts empty, so a run
    computes every vector it uses once (`tests/test_embed.py` and `tests/test_embed_int8.py`,
    which test the forward pass itself, turn it off). A cache the caller named is used instead,
    and `CDR_EMBED_CACHE=` (set, empty) runs without one. Every test process, workers
    included, first shares its TLS context (`_share_the_default_tls_context`)."""
    _share_the_default_tls_context()
    if hasattr(config, "workerinput") or "CDR_EMBED_CACHE" in os.environ:
        return
    directory = tempfile.mkdtemp(prefix="cdr-test-embeddings-")
    config.stash[_EMBED_CACHE_DIR] = directory
    os.environ["CDR_EMBED_CACHE"] = directory


def pytest_unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_EMBED_CACHE_DIR, None)
    if directory is not None:
        os.environ.pop("CDR_EMBED_CACHE", None)
        shutil.rmtree(directory, ignore_errors=True)


_EMBED_CACHE_DIR = pytest.StashKey[str]()


# ------------------------------------------------------------------ one TLS context per process

def _share_the_default_tls_context() -> None:
    """Every httpx client a test process makes with the default TLS settings gets one
    `ssl.SSLContext`, made on first use, instead of a new one each.

    httpx builds a context for every `Client` (and every `httpx.get`, which makes a client),
    TLS or not, and loading certifi's CA bundle into it costs about 37 ms of CPU. The tests
    make thousands: each test server's readiness poll (`tests.gateway_server`, one
    `httpx.get` every 50 ms while the server starts), a client per request in many tests, the
    OpenAI SDK's clients. Loopback servers speak plain HTTP, so no test verifies a
    certificate; a context made with other settings (`verify=False`, a CA file, a cert) is
    made as before. Only the test processes: the servers and commands they start are left
    alone."""
    import httpx._transports.default as transport

    make = transport.create_ssl_context
    made: list[object] = []

    def create_ssl_context(verify: object = True, cert: object = None,
                           trust_env: bool = True) -> object:
        if verify is not True or cert is not None or not trust_env:
            return make(verify=verify, cert=cert, trust_env=trust_env)  # type: ignore[arg-type]
        if not made:
            made.append(make(verify=True, cert=None, trust_env=True))
        return made[0]

    transport.create_ssl_context = create_ssl_context  # type: ignore[assignment]


# ------------------------------------------------------------------ CPU by module

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--screenshots", metavar="DIR", default=None,
        help="write the browser tests' screenshots to DIR (the docs' pictures come from "
             "`--screenshots bench/results`); without it they go to each test's tmp_path, "
             "so a test run leaves the checkout as it found it")
    parser.addoption(
        "--cpu-log", metavar="FILE", default=None,
        help="append one line per test module to FILE: worker, module, CPU seconds of this "
             "process (user, system) and of the child processes it reaped (user, system), "
             "the wall clock when the module started and ended (Unix seconds)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """With `--cpu-log`: the CPU each module costs, its fixtures' setup and teardown included
    (a module-scoped server is stopped in its last test's teardown). Children count once
    reaped, so a server's CPU goes to the module whose fixture stopped it; a session-scoped
    server's to the last module of the worker. The start and end times give each worker's
    timeline: which module ended the run, and what ran beside it."""
    path = item.config.getoption("--cpu-log")
    if path is None:
        return (yield)
    state = item.config.stash.setdefault(_CPU_STATE, {})
    if state.get("module") != item.path.name:
        state["module"], state["start"], state["wall"] = item.path.name, _cpu_now(), time.time()
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path:
            used = [b - a for a, b in zip(state["start"], _cpu_now(), strict=True)]
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            with open(path, "a", encoding="utf-8") as log:
                log.write(f"{worker}\t{item.path.name}\t" + "\t".join(
                    f"{x:.2f}" for x in used) + f"\t{state['wall']:.2f}\t{time.time():.2f}\n")


_CPU_STATE = pytest.StashKey[dict[str, object]]()


def _cpu_now() -> tuple[float, float, float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime, me.ru_stime, kids.ru_utime, kids.ru_stime
