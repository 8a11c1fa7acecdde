"""The package's shape, checked: no import circle among cdr's modules, imports inside functions
included, no module importing another's private names, and a small top level.

An import inside a function still ties two modules together: it is how a circle is hidden, not
broken. So the graph counts every import that can run (module level and inside functions), and
leaves out only those under `if TYPE_CHECKING:`, which never run. Importing `a.b.c` runs the
package `a.b`'s `__init__` too, so an import of a package's submodule is also an edge to the
package (unless the importer is inside that package, which is already being imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import cdr

SRC = Path(cdr.__file__).parent
TOP_LEVEL_LIMIT = 15


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runnable_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level, in functions, classes, `try` and `if`
    bodies alike; not the body of an `if TYPE_CHECKING:` (its `else`, if any, runs)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    walk_one(other)
            else:
                walk_one(child)

    def walk_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        else:
            walk(node)

    walk(tree)
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _edges(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The modules of cdr whose code this import runs, beyond the importer's own packages."""
    own = set(_ancestors(module)) | ({module} if MODULES[module].name == "__init__.py" else set())
    explicit: set[str] = set()
    if isinstance(node, ast.Import):
        explicit = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".")
            if MODULES[module].name != "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            # `from pkg import submodule` runs the submodule; `from pkg import name` runs pkg,
            # and reaching back into one's own package for a name counts like any other edge.
            explicit.add(sub if sub in MODULES else base)
    implicit = {a for n in explicit for a in _ancestors(n)} - own
    return {n for n in explicit | implicit if n in MODULES and n != module}


def import_graph() -> dict[str, set[str]]:
    return {m: set().union(*(_edges(m, n) for n in
                             _runnable_imports(ast.parse(p.read_text(encoding="utf-8")))))
            for m, p in MODULES.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return circles


def test_no_import_circle_in_the_package_counting_imports_inside_functions() -> None:
    graph = import_graph()
    circles = import_circles(graph)
    assert not circles, [{m: sorted(graph[m] & set(c)) for m in c} for c in circles]


def test_the_graph_sees_function_level_and_package_edges_but_not_type_checking() -> None:
    """The checker itself: it must see what it claims to, or the test above cannot fail."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from cdr.window.loop import Generator\n"
        "def f():\n    from cdr.ckf.records import Fact\n"
        "class C:\n    def g(self):\n        import cdr.retrieval.embed\n")
    found = {m for n in _runnable_imports(tree) for m in _edges("cdr.spec", n)}
    assert found == {"cdr.ckf.records", "cdr.ckf", "cdr.retrieval.embed", "cdr.retrieval"}
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # A module reaching back into its own package's __init__ for a name is an edge to it.
    assert _edges("cdr.ckf.committer", ast.parse("from cdr.ckf import CKF").body[0]) == {"cdr.ckf"}
    assert _edges("cdr.ckf.handle",
                  ast.parse("from cdr.ckf import maintenance").body[0]) == {"cdr.ckf.maintenance"}


def test_top_level_of_the_package_holds_at_most_15_modules() -> None:
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


def test_no_module_imports_another_modules_privates() -> None:
    found = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cdr"):
                private = [a.name for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    found.append(f"{module} imports {private} from {node.module}")
    assert not found, found


FACES = ("cdr.gateway", "cdr.cli", "cdr.integrations")
BACKENDS = ("cdr.ckf", "cdr.cluster")


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_layers_import_downwards() -> None:
    """The faces (gateway, CLI, integrations) import the layers below them and no layer imports
    a face (`python -m cdr` is itself the CLI face); the window step, the spec's core and the
    fact-index interface import no backend: a backend is handed to them as a `FactIndex`."""
    graph = import_graph()
    upward = {m: sorted(n for n in graph[m] if _inside(n, FACES)) for m in graph
              if not _inside(m, FACES) and m != "cdr.__main__"}
    assert not {m: n for m, n in upward.items() if n}
    core = [m for m in graph if _inside(m, ("cdr.window",)) or m in (
        "cdr.ranking", "cdr.session", "cdr.spec", "cdr.coverage", "cdr.ngrams", "cdr.vectors",
        "cdr.trace", "cdr.options", "cdr.retrieval.factindex")]
    assert len(core) > 15
    on_backend = {m: sorted(n for n in graph[m] if _inside(n, BACKENDS)) for m in core}
    assert not {m: n for m, n in on_backend.items() if n}
