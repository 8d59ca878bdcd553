"""runtime/drain.py against the real control plane: a real Deployment, PodDisruptionBudget,
DaemonSet and mirror pod (kwok runs the pods); the Eviction API decides."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kustos.devcluster.cluster import DevCluster
from kustos.runtime.api import Api
from kustos.runtime.drain import DrainOptions, DrainTimeout, drain, uncordon
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from tests.integration.conftest import Kubectl
from tests.integration.kube import is_ready, wait_until

LABEL = "drain-test"


@pytest.fixture
async def api(dev_cluster: DevCluster) -> AsyncIterator[Api]:
    clients = connect(load_config(dev_cluster.kubeconfig), Metrics())
    yield Api(clients.raw)
    await clients.close()


def _labels(kubectl: Kubectl, app: str) -> dict[str, str]:
    return {"app": app, LABEL: kubectl.namespace}


def _workload(kubectl: Kubectl, node: str) -> list[dict[str, Any]]:
    web = _labels(kubectl, "web")
    agent = _labels(kubectl, "agent")
    container = [{"name": "web", "image": "nginx:1.27"}]
    # Both replicas prefer the node to drain, so that it holds Deployment pods to evict.
    here = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    prefer = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": here}]
        }
    }
    mirror = {"kubernetes.io/config.mirror": "test", "kubernetes.io/config.source": "file"}
    template = {"metadata": {"labels": web}, "spec": {"containers": container, "affinity": prefer}}
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
         "spec": {"replicas": 2, "selector": {"matchLabels": web},
                  "template": template}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
         "spec": {"minAvailable": 2, "selector": {"matchLabels": web}}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
         "spec": {"selector": {"matchLabels": agent},
                  "template": {"metadata": {"labels": agent}, "spec": {"containers": container}}}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "static-web", "labels": _labels(kubectl, "static"),
                      "annotations": mirror},
         "spec": {"nodeName": node, "containers": container}},
    ]  # fmt: skip


async def test_drain_honours_the_budget_reports_the_blockers_then_completes(
    kubectl: Kubectl, dev_cluster: DevCluster, api: Api
) -> None:
    node = f"{dev_cluster.config.name}-worker-1"
    kubectl.apply(*_workload(kubectl, node))
    selector = f"{LABEL}={kubectl.namespace}"

    async def settled() -> list[dict[str, Any]] | None:
        pods = kubectl.get("pods", None, "-l", selector)["items"]
        web = [p for p in pods if p["metadata"]["labels"]["app"] == "web" and is_ready(p)]
        agent = [p for p in pods if p["metadata"]["labels"]["app"] == "agent" and is_ready(p)]
        on_node = [p for p in web if p["spec"].get("nodeName") == node]
        return (
            pods if len(web) == 2 and on_node and any(p["spec"]["nodeName"] == node for p in agent) else None
        )

    pods = await wait_until(settled, "web pods on the node, an agent pod, the budget", timeout=90)
    on_node = sorted(
        f"{kubectl.namespace}/{p['metadata']['name']}"
        for p in pods
        if p["spec"].get("nodeName") == node and p["metadata"]["labels"]["app"] == "web"
    )
    try:

        async def budget_counts() -> bool:
            return (kubectl.get("pdb", "web").get("status") or {}).get("currentHealthy") == 2

        await wait_until(budget_counts, "the budget to count 2 healthy pods", timeout=30)

        # minAvailable 2 of 2: every eviction is refused; the drain times out naming the pods.
        with pytest.raises(DrainTimeout) as caught:
            await drain(api, node, DrainOptions(timeout=6, retry=0.5, retry_cap=2, pod_selector=selector))
        report = caught.value.report
        assert not report.done and report.evicted == []
        assert sorted(b.pod for b in report.blocked) == on_node
        assert all("disruption budget web" in b.reason for b in report.blocked), report.blocked
        assert "disruption budget web" in str(caught.value)
        assert kubectl.cluster.kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}") == "true"

        # The budget allows one disruption: the drain evicts one, waits for its replacement to be
        # ready elsewhere (the node is cordoned), then the next.
        kubectl("patch", "pdb", "web", "--type", "merge", "-p", '{"spec": {"minAvailable": 1}}')
        report = await drain(
            api, node, DrainOptions(timeout=120, retry=0.5, retry_cap=2, pod_selector=selector)
        )
        assert report.done and sorted(report.evicted) == on_node
        skipped = {pod.split("/", 1)[1]: why for pod, why in report.skipped.items()}
        assert skipped["static-web"].startswith("mirror pod")
        assert any(why == "managed by DaemonSet agent" for why in skipped.values())

        left = kubectl.get("pods", None, "-l", selector, "--field-selector", f"spec.nodeName={node}")["items"]
        assert sorted(p["metadata"]["labels"]["app"] for p in left) == ["agent", "static"]

        async def replaced() -> bool:
            web = kubectl.get("pods", None, "-l", f"app=web,{selector}")["items"]
            ready = [p for p in web if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
            return len(ready) == 2 and all(p["spec"]["nodeName"] != node for p in ready)

        await wait_until(replaced, "both web replicas ready on other nodes", timeout=60)
    finally:
        await uncordon(api, node)
        kubectl("delete", "pod", "static-web", "--ignore-not-found", "--wait=false")
    assert kubectl.cluster.kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}") == ""
