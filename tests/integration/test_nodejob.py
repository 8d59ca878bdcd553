"""NodeJob on the real control plane: real shell processes on the selected nodes (F-JOB-1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kustos.images import KUSTOS_IMAGE_REPOSITORY
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import assert_rejected
from tests.integration.kube import condition, wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "jobs on many kwok nodes at once; the script needs nothing a kubelet enforces"
)

IMAGE = f"{KUSTOS_IMAGE_REPOSITORY}:dev"


def node_job(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "NodeJob",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, "completionWord": "done", **spec},
    }


def workers(kubectl: Kubectl) -> list[str]:
    nodes = kubectl.get("nodes")["items"]
    return sorted(n["metadata"]["name"] for n in nodes if "-worker-" in n["metadata"]["name"])


@pytest.fixture
def node_label(kubectl: Kubectl) -> Iterator[str]:
    """A label key of this test's own, removed from every node afterwards."""
    key = f"nodejob.test/{kubectl.namespace}"
    yield key
    kubectl("label", "nodes", "--all", f"{key}-", check=False)


def job_pods(kubectl: Kubectl, name: str) -> list[dict[str, Any]]:
    items = kubectl.get("pods", None, "-l", f"kustos.dev/nodejob={name}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def test_runs_on_matching_nodes_includes_a_late_node_completes_and_cleans_up(
    kubectl: Kubectl, operator: OperatorProcess, node_label: str
) -> None:
    w1, w2, w3, w4 = workers(kubectl)
    kubectl("label", "node", w1, w2, f"{node_label}=yes")
    terms = [{"matchExpressions": [{"key": node_label, "operator": "In", "values": ["yes"]}]}]
    script = "echo working; sleep 8; echo done; sleep 3600"
    kubectl.apply(node_job("clean", command=["sh", "-c", script], nodeSelectorTerms=terms))

    async def both_running() -> dict[str, Any] | None:
        status = kubectl.get("nodejob", "clean").get("status") or {}
        states = {n["name"]: n["state"] for n in status.get("nodes") or []}
        return status if states == {w1: "Running", w2: "Running"} else None

    status = await wait_until(both_running, "the job running on the two labelled nodes", timeout=90,
                              cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert status["completed"] is False and status["progress"] == "0/2"

    # A third node joins the selection while the first two are still working.
    kubectl("label", "node", w3, f"{node_label}=yes")
    assert kubectl.get("nodejob", "clean")["status"]["completed"] is False, "completed before the label"

    async def completed() -> dict[str, Any] | None:
        job = kubectl.get("nodejob", "clean")
        return job if (job.get("status") or {}).get("completed") else None

    job = await wait_until(completed, "the job to complete", timeout=120,
                           cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    status = job["status"]
    assert status["phase"] == "Completed" and status["progress"] == "3/3"
    assert {n["name"]: n["state"] for n in status["nodes"]} == {w1: "Done", w2: "Done", w3: "Done"}
    assert condition(job, "Completed") == "True"

    pods = job_pods(kubectl, "clean")
    assert sorted(p["spec"]["nodeName"] for p in pods) == [w1, w2, w3], "one pod per selected node"
    assert w4 not in {p["spec"]["nodeName"] for p in pods}
    for pod in pods:
        assert pod["metadata"]["labels"]["daemonset-job"] == "true"
        text = kubectl("logs", pod["metadata"]["name"])
        assert text.splitlines()[:2] == ["working", "done"], text
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=clean,reason=JobCompleted")
    assert "Safe to delete" in events
    columns = kubectl("get", "nodejob", "clean")
    assert "3/3" in columns and "true" in columns

    kubectl("delete", "nodejob", "clean")

    async def pods_gone() -> bool:
        left = kubectl("get", "pods,daemonsets", "-l", "kustos.dev/nodejob=clean", "-o", "name")
        return not left.strip()

    await wait_until(pods_gone, "the job's DaemonSet and pods removed", timeout=60,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


async def test_invalid_terms_give_a_condition_and_an_event_and_run_nothing(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    terms = [{"matchExpressions": [{"key": "disk", "operator": "In", "values": []}]}]
    kubectl.apply(node_job("broken", args=["x"], nodeSelectorTerms=terms))

    async def degraded() -> dict[str, Any] | None:
        job = kubectl.get("nodejob", "broken")
        return job if condition(job, "Degraded") == "True" else None

    job = await wait_until(degraded, "the Degraded condition", timeout=60)
    assert job["status"]["phase"] == "Failed"
    assert "spec.nodeSelectorTerms[0].matchExpressions[0]" in job["status"]["message"]
    assert "needs at least one value" in job["status"]["message"]
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=broken,reason=InvalidSpec")
    assert "needs at least one value" in events
    assert not kubectl("get", "daemonsets,pods", "-o", "name").strip()


def test_bad_specs_are_rejected_naming_the_field(crds: None, kubectl: Kubectl) -> None:
    assert_rejected(kubectl, node_job("bad", hostPath="/var/lib"), "set hostPath and mountPath together")
    assert_rejected(kubectl, node_job("bad", labelSelector="not a selector"), "spec.labelSelector")
    assert_rejected(kubectl, node_job("bad", completionWord=""), "spec.completionWord")
    missing = node_job("bad")
    del missing["spec"]["completionWord"]
    assert_rejected(kubectl, missing, "completionWord")
    kubectl.apply(node_job("fixed", args=["a"]))
    assert_rejected(kubectl, node_job("fixed", args=["b"]), "a NodeJob's spec cannot change")
