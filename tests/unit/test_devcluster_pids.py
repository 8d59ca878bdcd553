"""Finding the pid files of a dev cluster being removed, whose abandoned pods may still run."""

from __future__ import annotations

import shutil
from pathlib import Path

from kustos.devcluster.pids import pid_files


def test_pid_files_are_found_past_directories_removed_while_the_walk_runs(tmp_path: Path) -> None:
    (tmp_path / "agent.pid").write_text("1")
    sandboxes = [tmp_path / "pods" / f"ns_pod-{i}_uid" for i in range(5)]
    for sandbox in sandboxes:
        (sandbox / "logs").mkdir(parents=True)
        (sandbox / "server.pid").write_text("2")

    found = []
    for path in pid_files(tmp_path):
        found.append(path)
        if path.parent in sandboxes:  # the other sandboxes go while the walk is under way
            for other in sandboxes:
                if other != path.parent:
                    shutil.rmtree(other, ignore_errors=True)

    assert tmp_path / "agent.pid" in found
    assert len([p for p in found if p.name == "server.pid"]) == 1


def test_a_workloads_own_pid_files_are_not_the_clusters(tmp_path: Path) -> None:
    """A database keeps its pid file in its data directory; the pid in it is not a process of
    the cluster's to kill."""
    ours = [tmp_path / "agent.pid", tmp_path / "pods" / "ns_db_uid" / "postgres.pid",
            tmp_path / "real" / "1" / "kubelet.pid"]  # fmt: skip
    theirs = [
        tmp_path / "volumes" / "pvc-1" / "postmaster.pid",
        tmp_path / "pods" / "ns_db_uid" / "volumes" / "data" / "postmaster.pid",
        tmp_path / "nodes" / "worker-1" / "hostpath" / "run" / "nginx.pid",
        tmp_path / "real" / "1" / "containerd" / "rootfs" / "run" / "sshd.pid",
    ]
    for path in ours + theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("1")

    assert sorted(pid_files(tmp_path)) == sorted(ours)
