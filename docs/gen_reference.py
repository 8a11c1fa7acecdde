"""Generate the reference pages that are derived from code: the CLI (from the typer app), the
HTTP routes (from the gateway's OpenAPI document) and the settings (from `cdr.settings`).

Run `python docs/gen_reference.py` after changing a command, an option or a route; `make docs`
runs it, and `tests/test_docs_reference.py` fails when a committed page differs from what this
script writes, so the reference cannot drift from the code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
PAGES = {"cli": DOCS / "reference" / "cli.md", "http": DOCS / "reference" / "http.md",
         "settings": DOCS / "reference" / "settings.md",
         "rules": DOCS / "reference" / "rules.md"}

SETTINGS_INTRO = """\
# Settings

Every `CDR_*` environment variable cdr reads. The gateway's settings (`cdr serve`, or
`uvicorn --factory cdr.gateway.app:create_app`) are one pydantic-settings class,
`cdr.gateway.settings.GatewaySettings`: each of its fields is the variable `CDR_<FIELD>`, and
they can also come from an env file named by `CDR_CONFIG` (else `./.env` when present);
keyword arguments beat the environment, which beats the file, which beats the defaults. A bad
value stops `cdr serve` with one `error:` line naming the variable and exit status 2; values
that may hold a credential are never echoed. The other variables are read where they are used,
by the library, the CLI and the writers.

Generated from `cdr.settings` by `docs/gen_reference.py`; do not edit by hand.
`tests/test_docs_pages.py` keeps it complete: every `CDR_*` name in the code must have an entry
there, and every gateway setting's default must match the one in the code.
"""


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
                meaning = prop.get("description", "")
                if prop.get("default") not in (None, False, [], {}, ""):  # omitted = this
                    meaning += f" Default: `{json.dumps(prop['default'])}`."
                lines.append(f"| `{field}` | {_cell(kind)} | "
                             f"{'yes' if field in required else ''} | "
                             f"{_cell(meaning.strip())} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def settings_page() -> str:
    """`cdr.settings.SETTINGS` as one table per group, in the order the module lists them."""
    from cdr.settings import GROUPS, SETTINGS

    lines = [SETTINGS_INTRO.rstrip()]
    for group, title in GROUPS.items():
        lines += ["", f"## {title}", "", "| variable | type | default | meaning |",
                  "|---|---|---|---|"]
        lines += [f"| `{s.name}` | {_cell(s.type)} | {_cell(s.default)} | {_cell(s.meaning)} |"
                  for s in SETTINGS if s.group == group]
    return "\n".join(lines) + "\n"


def rules_page() -> str:
    """The rules beyond the spec, one row each, from their registry (`cdr.rules`)."""
    from cdr.rules import RULES

    out = ["# Rules beyond the spec", "",
           "Every opt-in rule of a session, from its module in `cdr.rules` (one module a rule). "
           "The first choice is the spec's; each rule is set by `--NAME` on `cdr generate`, the "
           "field `NAME` of a request to the gateway, or `GenerationConfig(NAME=...)`, and the "
           "profiles set several at once. *Shards rank* lists the choices under which a "
           "sharded knowledge base ranks a window on its shards (under any other, the window is "
           "ranked where the loop runs, with the same result).", "",
           "Generated from `cdr.rules` by `docs/gen_reference.py`; do not edit by hand.", "",
           "| rule | choices | the opt-in | module | profiles | shards rank | why |",
           "|---|---|---|---|---|---|---|"]
    for r in RULES:
        profiles = ", ".join(f"{p}: `{c}`" for p, c in r.profiles.items()) or "—"
        shards = ", ".join(f"`{c}`" for c in r.choices if c in r.ranked_on_shards)
        out.append(f"| `{r.name}` | {', '.join(f'`{c}`' for c in r.choices)} | "
                   f"{_cell(r.meaning)} | `{r.module}` | {profiles} | {shards} | "
                   f"{_cell(r.why)} |")
    return "\n".join(out) + "\n"


def render() -> dict[Path, str]:
    return {PAGES["cli"]: cli_page(), PAGES["http"]: http_page(),
            PAGES["settings"]: settings_page(), PAGES["rules"]: rules_page()}


def main() -> int:
    for path, text in render().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
