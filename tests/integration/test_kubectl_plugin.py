"""`kubectl kustos ...` as a user runs it: kubectl finds the kubectl-kustos console script on
PATH (the venv's bin), against the session's dev cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster

VENV_BIN = Path(sys.executable).parent


def kubectl_kustos(kubectl: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubectl.cluster.kubeconfig),
        "COLUMNS": "200",  # rich wraps tables to the terminal; keep each row on one line
    }
    command = [str(kubectl.cluster.kubectl_path), "kustos", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=60)


def test_kubectl_lists_the_plugin(kubectl: Kubectl) -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [str(kubectl.cluster.kubectl_path), "plugin", "list"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert str(VENV_BIN / "kubectl-kustos") in result.stdout, result.stdout + result.stderr


def test_status_shows_every_kind(crds: None, kubectl: Kubectl) -> None:
    kubectl.apply(etcd_cluster("shown", 3, version="3.5.35"))
    kubectl(
        "patch", "etcdcluster", "shown", "--subresource=status", "--type=merge",
        "-p", '{"status":{"phase":"Running","ready":"3/3","currentVersion":"3.5.35"}}',
    )  # fmt: skip
    result = kubectl_kustos(kubectl, "status", "-n", kubectl.namespace)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "EtcdClusters (1)" in out and "StorageClusters (0)" in out and "NodeJobs (0)" in out, out
    row = next(line for line in out.splitlines() if "shown" in line)
    assert "3/3" in row and "3.5.35" in row and "Running" in row, out
    everywhere = kubectl_kustos(kubectl, "status")
    assert everywhere.returncode == 0 and kubectl.namespace in everywhere.stdout


def test_recover_asks_the_operator_to_rebuild(crds: None, kubectl: Kubectl) -> None:
    kubectl.apply(etcd_cluster("lost", 3))
    result = kubectl_kustos(kubectl, "recover", "lost", "-n", kubectl.namespace, "--from-backup", "nightly")
    assert result.returncode == 0, result.stderr
    assert "rebuild" in result.stdout
    annotations = kubectl.get("etcdcluster", "lost")["metadata"]["annotations"]
    assert annotations["kustos.dev/recover"] == "backup/nightly"
    missing = kubectl_kustos(kubectl, "recover", "absent", "-n", kubectl.namespace)
    assert missing.returncode == 1 and "not found" in missing.stderr
