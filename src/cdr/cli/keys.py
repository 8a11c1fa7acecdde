"""`cdr keygen`: a new gateway API key and the `CDR_API_KEYS` entry that admits it.

The key is shown once; the entry holds only its SHA-256, so the configuration (an env file,
a secret store, a process listing) never holds a usable key.
"""

from __future__ import annotations

from typing import Annotated

import typer


def keygen_command(
    scope: Annotated[str, typer.Option(help="generate (chat, sessions, CKF reads) or admin "
                                       "(everything, including CKF writes and deletes).")
                     ] = "generate",
    kb: Annotated[list[str] | None, typer.Option(
        "--kb", help="A knowledge base the key reaches (repeat for several; '*' for all). "
                     "Without it the key reaches every knowledge base.")] = None,
) -> None:
    """Print a new API key (`key=`) and its hashed `CDR_API_KEYS` entry."""
    from cdr.gateway.auth import (
        SCOPES,
        KeyConfigError,
        format_key_entry,
        hash_key,
        new_key,
        parse_kb_list,
    )

    if scope not in SCOPES:
        typer.echo(f"error: --scope must be one of {', '.join(SCOPES)}, got {scope!r}",
                   err=True)
        raise typer.Exit(2)
    kbs = None
    if kb:
        try:
            kbs = parse_kb_list("+".join(dict.fromkeys(kb)), "--kb")
        except KeyConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    key = new_key()
    typer.echo(f"key={key}")
    entry = format_key_entry(scope, hash_key(key), kbs)
    if kb and kbs is None:
        entry = entry.replace(":", "@*:", 1)  # said explicitly, as asked
    typer.echo(f"CDR_API_KEYS={entry}")
