"""Pid files of the dev cluster's background processes (control plane, agent, real nodes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    """The pid a pid file holds, or None when it is missing or unreadable."""
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


# Directories of pods' own files: their volumes, hostPath trees, a real node's images and
# container state. A pid file there is a workload's (from its own pid namespace, or stale), and
# a process group killed by it could be any on this machine.
POD_DATA_DIRS = frozenset({"volumes", "hostpath", "containerd"})


def pid_files(root: Path) -> Iterator[Path]:
    """Every ``*.pid`` file the dev cluster wrote under ``root`` (none of ``POD_DATA_DIRS``).
    The walk goes on past directories that vanish under it: an abandoned cluster's pods run until
    they are killed, and ``Path.glob`` stopped at the first that did (stop 46's CI)."""
    for directory, subdirectories, files in os.walk(root):  # it skips what it can no longer list
        subdirectories[:] = [d for d in subdirectories if d not in POD_DATA_DIRS]
        yield from (Path(directory) / f for f in files if f.endswith(".pid"))


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
