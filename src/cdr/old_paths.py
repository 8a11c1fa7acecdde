"""Old module paths, kept working for one release: `import cdr.loop` is `cdr.window.loop`.

The top-level modules of `cdr` were grouped into sub-packages by layer (`cdr.cli`,
`cdr.cluster`, `cdr.retrieval`, `cdr.window`, `cdr.text`). Code written against the old paths
keeps working: a finder on `sys.meta_path` (installed when `cdr` is imported) answers each old
dotted name with the module object of its new home, so `cdr.loop is cdr.window.loop`,
`isinstance` checks and pickles agree (classes keep their new `__module__`), and importing the
old name emits one `DeprecationWarning` naming the new one. One table, no shim file per module.

Names inside a module and keyword arguments that were renamed so that one thing has one name
(docs/design.md §7.4 "One name per thing") keep working the same way: `RENAMED` answers an
old attribute of a module with the new one (`renamed_getattr`, the module's `__getattr__`), and
`renamed_keywords` lets a function take an old keyword, and `RenamedAttribute` answers a
class's old method or property name, each with one warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

REMOVED_IN = "0.3.0"  # the release after the one that moved them (0.2.0)

# Old dotted name -> new dotted name.
MOVED: dict[str, str] = {
    "cdr.cli_ckf": "cdr.cli.ckf",
    "cdr.cli_keys": "cdr.cli.keys",
    "cdr.cli_models": "cdr.cli.models",
    "cdr.demo": "cdr.cli.demo",
    "cdr.demo_llm": "cdr.cli.demo_llm",
    "cdr.samples": "cdr.cli.samples",
    "cdr.tables": "cdr.cli.tables",
    "cdr.ray_index": "cdr.cluster.ray_index",
    "cdr.ray_ingest": "cdr.cluster.ray_ingest",
    "cdr.shard_merge": "cdr.cluster.shard_merge",
    "cdr.shard_server": "cdr.cluster.shard_server",
    "cdr.shardset": "cdr.cluster.shardset",
    "cdr.factindex": "cdr.retrieval.factindex",
    "cdr.index_open": "cdr.retrieval.index_open",
    "cdr.lexical": "cdr.retrieval.lexical",
    "cdr.fact_recipe": "cdr.retrieval.fact_recipe",
    "cdr.subject": "cdr.retrieval.subject",
    "cdr.gates": "cdr.retrieval.gates",
    "cdr.expansion": "cdr.retrieval.expansion",
    "cdr.row_products": "cdr.retrieval.row_products",
    "cdr.embed": "cdr.retrieval.embed",
    "cdr.models": "cdr.retrieval.models",
    "cdr.loop": "cdr.window.loop",
    "cdr.envelope": "cdr.window.envelope",
    "cdr.dpe": "cdr.window.dpe",
    "cdr.repeat_guard": "cdr.window.repeat_guard",
    "cdr.stale": "cdr.window.stale",
    "cdr.memory": "cdr.window.memory",
    "cdr.fit": "cdr.window.fit",
    "cdr.length": "cdr.window.length",
    "cdr.assemble": "cdr.window.assemble",
    "cdr.prompt": "cdr.window.prompt",
    "cdr.headers": "cdr.window.headers",
    "cdr.telemetry": "cdr.window.telemetry",
    "cdr.markdown": "cdr.text.markdown",
    "cdr.tokens": "cdr.text.tokens",
    "cdr.kept_stream": "cdr.text.kept_stream",
    "cdr.quality": "cdr.report.quality",
    "cdr.session_token": "cdr.gateway.session_token",
    "cdr.ckf.scan": "cdr.retrieval.scan",
    "cdr.ckf.writer": "cdr.ckf.committer",  # the CKF's storage side, apart from `cdr.writers`
}

# Module -> {old attribute name: new name}, for names renamed in place ("Name"), moved to
# another module ("cdr.module:Name") or become an attribute of a class there
# ("cdr.module:Class.attribute").
RENAMED: dict[str, dict[str, str]] = {
    "cdr.ckf": {"CKFWriter": "CKFCommitter"},
    "cdr.ckf.committer": {"CKFWriter": "CKFCommitter"},
    # the document kinds' table, now the registry of cdr.ckf.kinds
    "cdr.ckf.parse": {name: f"cdr.ckf.kinds:{name}" for name in (
        "KINDS", "KIND_BY_SUFFIX", "parse", "pdf_available")},
    # the local backend; the name is the protocol's (cdr.gateway.knowledge_base.KnowledgeBase)
    "cdr.gateway.ckf_snapshots": {"KnowledgeBase": "LocalKnowledgeBase"},
    # the job leases' protocol is the session store contract, leases included
    "cdr.gateway.job_store": {"JobLeases": "cdr.gateway.session_store:SessionStore"},
    # the OpenAI writer's own default, read by build_writer from the writer's class
    "cdr.writers": {"OPENAI_BASE_URL": "cdr.writers.openai_writer:OpenAIWriter.default_base_url"},
}


def _warn(old: str, new: str) -> None:
    """Warn at the importing line: `warnings` skips importlib's own frames, so level 3 is the
    line above `_warn` and the loader method that called it."""
    warnings.warn(f"{old} moved to {new}; the old path stops working in cdr {REMOVED_IN}",
                  DeprecationWarning, stacklevel=3)


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name by importing the new one and handing back that same module."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        _warn(spec.name, self.new)
        module = importlib.import_module(self.new)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system stamped the alias's spec onto the shared module; give it back its
        # own, so that its __spec__.name stays the new (real) name.
        module.__spec__ = self.real_spec

    def get_code(self, fullname: str) -> types.CodeType | None:
        """`python -m cdr.demo` (runpy) runs the new module's code."""
        _warn(fullname, self.new)
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(self.new)


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds old module names of `cdr` (and only those) on `sys.meta_path`."""

    def find_spec(self, fullname: str, path: object = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)  # its origin: what `python -m OLD` puts in argv[0]
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new),
                                               origin=real.origin if real else None)


def renamed_getattr(module: str, others: Callable[[str], Any] | None = None
                    ) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `module` that answers its old names (`RENAMED`) with
    the new objects, warning at the caller's line; any other name goes to `others` (a module
    that also has lazily imported names), else is an `AttributeError`."""
    names = RENAMED[module]

    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            if others is not None:
                return others(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, path = new.rpartition(":")
        home = home or module
        warnings.warn(f"{module}.{name} is now {home}.{path}; the old name stops working in "
                      f"cdr {REMOVED_IN}", DeprecationWarning, stacklevel=2)
        found: Any = importlib.import_module(home)
        for attr in path.split("."):
            found = getattr(found, attr)
        return found

    return __getattr__


F = TypeVar("F", bound=Callable[..., Any])


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Let a function take each old keyword (`old="new"`) as the new one, with a warning;
    both at once is a `TypeError`, as any repeated argument is."""
    def wrap(fn: F) -> F:
        @wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{fn.__qualname__}() got both {old}= and its new "
                                        f"name {new}=")
                    warnings.warn(f"{fn.__qualname__}({old}=...) is now {new}=; the old "
                                  f"keyword stops working in cdr {REMOVED_IN}",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


class RenamedAttribute:
    """A method or property of a class renamed in place, kept under its old name for one
    release: reading the old name on an instance warns at the caller's line and gives what the
    new name gives (a bound method for a method, the value for a property), so
    `gateway.snapshot(require_facts=False)` still calls `gateway.index`. Declared in the class
    body as `old = RenamedAttribute("new")`."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = new  # set from the class body by __set_name__
        self.owner = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.old, self.owner = name, owner.__name__

    def __get__(self, obj: object, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        warnings.warn(f"{self.owner}.{self.old} is now {self.owner}.{self.new}; the old name "
                      f"stops working in cdr {REMOVED_IN}", DeprecationWarning, stacklevel=2)
        return getattr(obj, self.new)


def install() -> None:
    """Put the finder on `sys.meta_path` once (idempotent across reloads of `cdr`)."""
    if not any(type(f).__name__ == MovedModuleFinder.__name__ for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())


install()
