"""`cdr models list|install`: what models are on this machine, and one command to add them."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cdr.errors import CdrError

models_app = typer.Typer(no_args_is_help=True, help="List and install the models cdr runs on.")
_err = Console(stderr=True)
_out = Console()


def _say(message: str) -> None:
    _err.print(escape(message), highlight=False)


@models_app.command("list")
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Installed models: where they are, their sizes and checksums."""
    from cdr.retrieval.models import model_statuses

    statuses = model_statuses()
    if as_json:
        _out.print_json(json.dumps([s.as_dict() for s in statuses]))
        return
    table = Table(title="cdr models")
    for col in ("model", "installed", "location", "size", "sha256", "note"):
        table.add_column(col, overflow="fold")
    for s in statuses:
        table.add_row(s.name, "yes" if s.installed else "no", escape(s.location or "-"),
                      f"{s.size / 1e6:,.1f} MB" if s.size else "-",
                      s.sha256 or "-", escape(s.note))
    _out.print(table)


@models_app.command("install")
def install_model(
    name: Annotated[str, typer.Argument(help="embedder | llm")],
) -> None:
    """Install a model (idempotent: a second run only checks)."""
    from cdr.retrieval.models import MODEL_NAMES, install_embedder, install_llm

    if name not in MODEL_NAMES:
        _err.print(f"[bold red]error:[/] unknown model {name!r}; choose one of "
                   f"{', '.join(MODEL_NAMES)}")
        raise typer.Exit(2)
    try:
        if name == "embedder":
            install_embedder(_say)
        else:
            install_llm(_say)
    except CdrError as exc:
        _err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
