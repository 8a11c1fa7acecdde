"""The package's shape, checked: no import cycle among cdr's modules (top-level imports; a
function-level import is how a module defers an optional dependency, not a cycle of design),
and no module importing another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import cdr

SRC = Path(cdr.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _top_level_imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    """Imports that run when the module is imported (not those under `if TYPE_CHECKING`)."""
    out: list[ast.ImportFrom | ast.Import] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.Try):
            out.extend(n for n in node.body if isinstance(n, ast.Import | ast.ImportFrom))
    return out


def _targets(module: str, node: ast.ImportFrom | ast.Import) -> set[str]:
    if isinstance(node, ast.Import):
        names = {a.name for a in node.names}
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".")
            if MODULES[module].name != "__init__.py":
                pkg = pkg[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        names = {base} | {f"{base}.{a.name}" for a in node.names}
    return {n for n in names if n in MODULES and n != module}


def test_no_import_cycle_in_the_package() -> None:
    graph = {m: set().union(*(_targets(m, n) for n in _top_level_imports(p)), set())
             for m, p in MODULES.items()}
    # A package's __init__ importing its own submodules is how it exports them, not a cycle.
    for m in graph:
        if MODULES[m].name == "__init__.py":
            graph[m] = {n for n in graph[m] if not n.startswith(m + ".")}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                start = trail[trail.index(n):] if n in trail else [n]
                cycles.append(" -> ".join([*start, m, n]))
            elif n not in state:
                visit(n, [*trail, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, cycles


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
