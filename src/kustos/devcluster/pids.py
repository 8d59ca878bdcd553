"""Pid files of the dev cluster's background processes (control plane, agent, real nodes)."""

from __future__ import annotations

import os
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    """The pid a pid file holds, or None when it is missing or unreadable."""
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """True while ``pid`` runs: a zombie answers kill(pid, 0) too, but is not alive for us."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3]
    except (FileNotFoundError, ProcessLookupError):
        # Reaped between the kill and the read: the open or the read itself says so (ESRCH).
        return False
