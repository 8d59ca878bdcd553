"""Which pod and claim updates wake node maintenance (issue 28: an etcd member's pod on its
way to Ready woke it four times, for nothing a pass reads)."""

from __future__ import annotations

import copy
from typing import Any

from kustos.maintenance.certrotation import TASK, TASK_LABEL
from kustos.maintenance.controller import read_whole_in


def pod(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": namespace, "resourceVersion": "1", "labels": labels or {}},
        "spec": {"nodeName": "n1", "volumes": []},
        "status": {"phase": "Pending"},
    }


def readied(old: dict[str, Any]) -> dict[str, Any]:
    """What the kubelet writes as the pod turns Ready: the status, and a new resourceVersion."""
    new = copy.deepcopy(old)
    new["metadata"]["resourceVersion"] = "2"
    new["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.5",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return new


def test_a_status_update_of_a_workloads_pod_wakes_no_pass() -> None:
    matters = read_whole_in(lambda: [])
    member = pod("etcd-team")
    assert not matters(member, readied(member))


def test_a_pod_deleted_moved_or_relabelled_wakes_a_pass() -> None:
    matters = read_whole_in(lambda: [])
    member = pod("etcd-team")
    deleting = copy.deepcopy(member)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    moved = copy.deepcopy(member)
    moved["spec"]["nodeName"] = "n2"
    relabelled = copy.deepcopy(member)
    relabelled["metadata"]["labels"] = {"app": "x"}
    assert matters(member, deleting) and matters(member, moved) and matters(member, relabelled)


def test_status_updates_wake_where_a_pass_reads_them() -> None:
    """MinIO's replicas (the default namespace, or the one a policy names), Rook's toolbox,
    kubeadm's static pods and the certificate renewal pods: their readiness is decided on."""
    matters = read_whole_in(lambda: [{"spec": {"minioNamespace": "object-store"}}])
    for woken in (
        pod("object-store"),
        pod("rook-ceph"),
        pod("kube-system"),
        pod("etcd-team", {TASK_LABEL: TASK}),
    ):
        assert matters(woken, readied(woken)), woken["metadata"]
    default = read_whole_in(lambda: [{"spec": {}}])
    minio = pod("minio")
    assert default(minio, readied(minio))
    assert not matters(minio, readied(minio))  # the policy moved MinIO elsewhere
