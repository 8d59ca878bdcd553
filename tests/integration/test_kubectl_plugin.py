"""`kubectl kustos ...` as a user runs it: kubectl finds the kubectl-kustos console script on
PATH (the venv's bin), against the session's dev cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
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


def test_status_of_one_cluster_shows_quorum_leader_backup_and_members(crds: None, kubectl: Kubectl) -> None:
    kubectl.apply(etcd_cluster("oncall", 3, backup={"interval": "30m"}))
    since = (datetime.now(UTC) - timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    members = [
        {"name": "oncall-0", "healthy": True},
        {"name": "oncall-1", "healthy": True, "leader": True},
        {"name": "oncall-2", "healthy": False, "unhealthySince": since},
    ]
    status = {"phase": "Running", "currentVersion": "3.6.16", "members": members}
    kubectl("patch", "etcdcluster", "oncall", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))  # fmt: skip
    backup = {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": "oncall-b1"}}
    kubectl.apply({**backup, "spec": {"clusterName": "oncall"}})
    done = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    succeeded = {"phase": "Succeeded", "completionTime": done, "size": 2048}
    kubectl("patch", "etcdbackup", "oncall-b1", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": succeeded}))  # fmt: skip

    result = kubectl_kustos(kubectl, "status", "oncall", "-n", kubectl.namespace)

    assert result.returncode == 0, result.stderr
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") >= 3}
    assert "AT RISK" in lines["quorum margin"], result.stdout
    assert "oncall-1 (index 1)" in lines["leader"], result.stdout
    assert "2h ago, 2.0 KiB (OVERDUE)" in lines["last backup"], result.stdout
    assert "NO, for 3m (past its failure timeout)" in lines["oncall-2"], result.stdout
    absent = kubectl_kustos(kubectl, "status", "nosuch", "-n", kubectl.namespace)
    assert absent.returncode != 0 and "EtcdCluster nosuch not found" in absent.stderr
