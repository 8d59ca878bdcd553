"""Drain: kubectl's skip rules, PDB refusals retried and reported, the timeout."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from kustos.runtime.api import Api
from kustos.runtime.drain import (
    Blocker,
    DrainOptions,
    DrainTimeout,
    block_reason,
    drain,
    skip_reason,
    uncordon,
)

FAST = DrainOptions(timeout=1.0, retry=0.01, retry_cap=0.05, poll=0.01)


def _pod(name: str, owner: str | None = "ReplicaSet", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "annotations": extra.pop("annotations", {})}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": "n1", **extra.pop("spec", {})}, "status": extra}


def test_skip_rules_follow_kubectl_drain() -> None:
    assert skip_reason(_pod("ds", "DaemonSet")) == "managed by DaemonSet ds-owner"
    mirror = _pod("static", None, annotations={"kubernetes.io/config.mirror": "abc"})
    assert skip_reason(mirror) == "mirror pod (a static pod the kubelet owns)"
    assert skip_reason(_pod("web")) is None


def test_block_rules() -> None:
    options = DrainOptions()
    assert block_reason(_pod("web"), options) is None
    assert "not managed by a controller" in str(block_reason(_pod("bare", None), options))
    assert block_reason(_pod("bare", None), DrainOptions(force=True)) is None
    assert block_reason(_pod("done", None, phase="Succeeded"), options) is None  # finished: no harm
    scratch = _pod("scratch", spec={"volumes": [{"name": "tmp", "emptyDir": {}}]})
    assert block_reason(scratch, options) is None  # evicted by default: its data goes with the node
    assert "emptyDir" in str(block_reason(scratch, DrainOptions(delete_emptydir_data=False)))


REFUSAL = {
    "reason": "TooManyRequests",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
            }
        ]
    },
}


class FakeNode:
    """A node's pods behind the API: evictions refused while the budget says no."""

    def __init__(self, pods: list[dict[str, Any]], refusals: int = 0) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.refusals = refusals
        self.unschedulable: bool | None = None
        self.evictions: list[str] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if path == "/api/v1/nodes/n1" and request.method == "PATCH":
            self.unschedulable = json.loads(request.content)["spec"]["unschedulable"]
            return httpx2.Response(200, json={"metadata": {"name": "n1"}})
        if path == "/api/v1/pods":
            assert request.url.params["fieldSelector"] == "spec.nodeName=n1"
            # An evicted pod terminates: deleting on the next look, gone on the one after.
            items = list(self.pods.values())
            for name, pod in list(self.pods.items()):
                if pod["metadata"].get("deletionTimestamp"):
                    del self.pods[name]
            return httpx2.Response(200, json={"items": items, "metadata": {}})
        if path.endswith("/eviction"):
            name = path.split("/")[-2]
            if self.refusals > 0:
                self.refusals -= 1
                return httpx2.Response(429, json=REFUSAL)
            self.evictions.append(name)
            self.pods[name] = {
                **self.pods[name],
                "metadata": {**self.pods[name]["metadata"], "deletionTimestamp": "x"},
            }
            return httpx2.Response(201, json={})
        raise AssertionError(f"unexpected {request.method} {path}")

    def api(self) -> Api:
        return Api(httpx2.AsyncClient(transport=httpx2.MockTransport(self), base_url="https://k8s"))


async def test_drain_evicts_retries_refusals_and_skips_daemonset_and_mirror_pods() -> None:
    node = FakeNode(
        [_pod("web-1"), _pod("web-2"), _pod("ds", "DaemonSet"),
         _pod("static", None, annotations={"kubernetes.io/config.mirror": "x"})],
        refusals=3,
    )  # fmt: skip
    report = await drain(node.api(), "n1", FAST)
    assert report.done and node.unschedulable is True
    assert sorted(report.evicted) == ["ns/web-1", "ns/web-2"]
    assert set(report.skipped) == {"ns/ds", "ns/static"}
    assert "ds" not in node.evictions and "static" not in node.evictions
    assert "drained: 2 pod(s) evicted, 2 skipped" in report.describe()


async def test_drain_blocked_by_a_budget_times_out_naming_the_pods() -> None:
    node = FakeNode([_pod("web-1"), _pod("bare", None)], refusals=10**6)
    with pytest.raises(DrainTimeout) as caught:
        await drain(node.api(), "n1", DrainOptions(timeout=0.2, retry=0.01, retry_cap=0.02, poll=0.01))
    report = caught.value.report
    assert not report.done and caught.value.reason == "DrainBlocked"
    assert (
        Blocker("ns/web-1", "The disruption budget web needs 2 healthy pods and has 2 currently")
        in report.blocked
    )
    assert any(b.pod == "ns/bare" and "not managed by a controller" in b.reason for b in report.blocked)
    assert "ns/web-1: The disruption budget web needs 2 healthy pods" in str(caught.value)


async def test_uncordon_clears_unschedulable() -> None:
    node = FakeNode([])
    await uncordon(node.api(), "n1")
    assert node.unschedulable is None
