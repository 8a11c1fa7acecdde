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
) -> None:
    """Print a new API key (`key=`) and its hashed `CDR_API_KEYS` entry."""
    from cdr.gateway.auth import SCOPES, hash_key, new_key

    if scope not in SCOPES:
        typer.echo(f"error: --scope must be one of {', '.join(SCOPES)}, got {scope!r}",
                   err=True)
        raise typer.Exit(2)
    key = new_key()
    typer.echo(f"key={key}")
    typer.echo(f"CDR_API_KEYS={scope}:{hash_key(key)}")
