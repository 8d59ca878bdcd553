"""The ``kustos`` command."""

from __future__ import annotations

import typer

app = typer.Typer(help="kustos: operators for clustered data stores and their nodes.", no_args_is_help=True)


def main() -> None:
    app()
