"""Finding a dev cluster's pid files while its abandoned pods still write beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

from kustos.devcluster.pids import pid_files


def test_pid_files_are_found_past_directories_removed_while_the_walk_runs(tmp_path: Path) -> None:
    """An abandoned cluster's pods run until they are killed: a database's data directory
    holds its own pid file, and MinIO removes its scratch directories as it goes."""
    (tmp_path / "agent.pid").write_text("1")
    volumes = tmp_path / "volumes"
    scratch = [volumes / f"pvc-{i}" for i in range(5)]
    for directory in scratch:
        (directory / "tmp").mkdir(parents=True)
        (directory / "postmaster.pid").write_text("2")

    found = []
    for path in pid_files(tmp_path):
        found.append(path)
        if path.parent in scratch:  # the pod removes every other volume's scratch meanwhile
            for other in scratch:
                if other != path.parent:
                    shutil.rmtree(other, ignore_errors=True)

    assert tmp_path / "agent.pid" in found
    assert len([p for p in found if p.name == "postmaster.pid"]) == 1
