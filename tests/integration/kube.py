"""Helpers for tests against the real dev cluster: waiting with useful failure messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kustos.devcluster.cluster import DevCluster
from kustos.runtime import objects

T = TypeVar("T")


async def wait_until(
    check: Callable[[], Awaitable[T | bool | None]],
    what: str,
    timeout: float = 60,
    interval: float = 0.25,
    cluster: DevCluster | None = None,
    namespace: str | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy; on timeout, show the namespace."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = await check()
            if result:
                return result  # type: ignore[return-value]
        except Exception as err:  # the object may not exist yet
            last_error = err
        await asyncio.sleep(interval)
    message = f"timed out after {timeout:.0f}s waiting for {what}"
    if last_error is not None:
        message += f"\nlast error: {last_error!r}"
    if cluster is not None:
        message += "\n" + describe(cluster, namespace)
    raise AssertionError(message)


def describe(cluster: DevCluster, namespace: str | None) -> str:
    """What a person would look at: pods, nodes and events, as kubectl shows them."""
    scope = ["-n", namespace] if namespace else ["-A"]
    parts = [
        cluster.kubectl("get", "nodes", "-o", "wide", check=False),
        cluster.kubectl("get", "pods,pvc", *scope, "-o", "wide", check=False),
        cluster.kubectl("get", "events", *scope, "--sort-by=.lastTimestamp", check=False)[-4000:],
        "agent log (tail):",
        "\n".join(cluster.agent_log.read_text().splitlines()[-30:]) if cluster.agent_log.exists() else "",
    ]
    return "\n".join(parts)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready") == "True"


def claim(name: str, storage_class: str) -> dict[str, Any]:
    """A 1Gi ReadWriteOnce PersistentVolumeClaim of ``storage_class``."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def budget_breach(pdb: dict[str, Any]) -> str | None:
    """What a workload's PodDisruptionBudget says when fewer pods are healthy than it wants,
    else None. An EtcdCluster's own budget is not a workload's: its minAvailable is above the
    Ready members while it refuses evictions (docs/etcdcluster.md, Disruptions), and the
    rollout tests check etcd's quorum directly."""
    if objects.owner_of(pdb, "EtcdCluster") is not None:
        return None
    status = pdb.get("status") or {}
    if status.get("currentHealthy", 0) < status.get("desiredHealthy", 0):
        return f"{objects.name(pdb)}: {status}"
    return None
