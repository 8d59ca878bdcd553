"""A Secret's keys as files, laid out as the kubelet mounts a Secret volume.

Each key is a symlink ``<key> -> ..data/<key>``; ``..data`` points at a directory of one
version, and a new version is written beside it and ``..data`` swapped to it in one rename,
so every file changes at once (the kubelet's atomic writer). Tests of clients that must take
a renewed certificate from such files (the proof recorder) write them this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def write_mounted(directory: Path, version: str, files: Mapping[str, bytes]) -> None:
    """Write ``files`` as version ``version`` under ``directory`` and make it the current one."""
    target = directory / f"..{version}"
    target.mkdir(parents=True)
    for name, content in files.items():
        (target / name).write_bytes(content)
    link = directory / "..data-new"
    link.symlink_to(target.name)
    link.replace(directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
