"""Generate the reference pages that are derived from code: the CLI (from the typer app) and
the HTTP routes (from the gateway's OpenAPI document).

Run `python docs/gen_reference.py` after changing a command, an option or a route; `make docs`
runs it, and `tests/test_docs_reference.py` fails when a committed page differs from what this
script writes, so the reference cannot drift from the code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
PAGES = {"cli": DOCS / "reference" / "cli.md", "http": DOCS / "reference" / "http.md"}


def _cell(text: str | None) -> str:
    """One Markdown table cell: one line, pipes escaped."""
    return " ".join((text or "").split()).replace("|", "\\|")


def cli_page() -> str:
    """The `cdr` command tree as typer's own documentation generator writes it (one section
    per command, every argument and option with its type, default and environment
    variable), under a title and a note on where it comes from."""
    out = subprocess.run(
        [sys.executable, "-m", "typer", "cdr.cli", "utils", "docs", "--name", "cdr"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "100"})
    body = out.stdout.strip()
    head = ["# Command line reference", "",
            "Generated from the `cdr` typer app (`typer cdr.cli utils docs`) by",
            "`docs/gen_reference.py`; do not edit by hand. `cdr COMMAND --help` shows the same.",
            ""]
    # typer's page starts at `# cdr`; one level down so the page has one title.
    body = "\n".join("#" + line if line.startswith("#") else line for line in body.splitlines())
    return "\n".join(head) + "\n" + body + "\n"


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    ref = schema.get("$ref") or next(
        (s.get("$ref") for s in schema.get("anyOf", []) + schema.get("oneOf", []) if "$ref" in s),
        None)
    return f"`{ref.rsplit('/', 1)[-1]}`" if ref else f"`{schema.get('type', 'object')}`"


def http_page() -> str:
    """Every route of the gateway's OpenAPI document: method, path, summary, request body,
    success and error statuses, and the scope it needs where the document says."""
    from cdr.gateway.app import create_app
    from cdr.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(dev=True, _env_file=None))
    spec = app.openapi()
    lines = ["# HTTP reference", "",
             "Generated from the gateway's OpenAPI document (`GET /openapi.json` on a running",
             "`cdr serve`) by `docs/gen_reference.py`; do not edit by hand. The guide to the",
             "gateway is [the gateway page](../gateway.md).", "",
             f"OpenAPI {spec.get('openapi', '')}, API version {spec['info'].get('version', '')}.",
             "", "| method | path | what it does | request body | responses |",
             "|---|---|---|---|---|"]
    for path in sorted(spec["paths"]):
        for method, op in sorted(spec["paths"][path].items()):
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            body = op.get("requestBody", {}).get("content", {})
            kinds = ", ".join(f"{_schema_name(v.get('schema'))} ({k})" for k, v in body.items())
            statuses = ", ".join(sorted(op.get("responses", {})))
            summary = op.get("summary") or op.get("description", "").split("\n")[0]
            lines.append(f"| {method.upper()} | `{path}` | {_cell(summary)} | {_cell(kinds)} "
                         f"| {statuses} |")
    lines += ["", "## Schemas", ""]
    for name, schema in sorted(spec.get("components", {}).get("schemas", {}).items()):
        lines += [f"### `{name}`", ""]
        if schema.get("description"):
            lines += [" ".join(schema["description"].split()), ""]
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
            for field, prop in props.items():
                kind = prop.get("type") or _schema_name(prop).strip("`") or "any"
                if "anyOf" in prop:
                    kind = " or ".join(s.get("type") or s.get("$ref", "").rsplit("/", 1)[-1]
                                       for s in prop["anyOf"])
                lines.append(f"| `{field}` | {_cell(kind)} | "
                             f"{'yes' if field in required else ''} | "
                             f"{_cell(prop.get('description', ''))} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render() -> dict[Path, str]:
    return {PAGES["cli"]: cli_page(), PAGES["http"]: http_page()}


def main() -> int:
    for path, text in render().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
