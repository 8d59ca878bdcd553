"""Fault injection for recovery tests: exit the operator right after a named step.

``KUSTOS_FAULT_EXIT_AFTER=AddMember`` makes the process exit (as abruptly as a
SIGKILL: no cleanup, no lease release) just after it carried out the first step of
that name, once per ``KUSTOS_FAULT_MARKER`` file. Unset, it does nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

EXIT_CODE = 137


def exit_after(step: str) -> None:
    wanted = os.environ.get("KUSTOS_FAULT_EXIT_AFTER")
    if not wanted or wanted != step:
        return
    marker = Path(os.environ.get("KUSTOS_FAULT_MARKER", "/tmp/kustos-fault-marker"))
    if marker.exists():
        return
    marker.write_text(step)
    sys.stderr.write(f"fault injection: exiting after {step}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)
