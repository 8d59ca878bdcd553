"""The ``kustos`` command's entry: ``kustos run`` (the operator) starts without typer.

Every other command is the typer application in ``kustos.cli``; the operator is the one
process that stays up, so it does not load or build that application (``kustos.run``).
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["run"]:
        from kustos.run import main as run_operator

        sys.exit(run_operator(sys.argv[2:]))
    from kustos.cli import main as command_line

    command_line()
