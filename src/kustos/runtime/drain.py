"""Cordon and drain a node as ``kubectl drain`` does, for the node families.

- cordon: ``spec.unschedulable`` so nothing new lands there; ``uncordon`` undoes it.
- drain: evict every pod on the node through the Eviction API (policy/v1), so that
  PodDisruptionBudgets are honoured: a 429 (the budget allows no disruption now) is
  retried with exponential backoff until ``timeout``; then ``DrainTimeout`` carries a
  report naming each pod that still blocks and why (the budget's own words).
- skipped as kubectl drain skips them: mirror pods (static pods: the kubelet owns them,
  the API cannot evict them) and DaemonSet pods (their controller ignores
  unschedulable and would put them straight back; kubectl's --ignore-daemonsets).
- pods with emptyDir volumes are evicted (their data is lost, which is what draining a
  node means; kubectl asks for --delete-emptydir-data); ``DrainOptions(
  delete_emptydir_data=False)`` makes them blockers instead.
- pods no controller manages (no ownerReference with controller: true) block the
  drain by default, since nothing would recreate them (kubectl's --force);
  ``DrainOptions(force=True)`` evicts them too.
- finished pods (Succeeded or Failed) are evicted without a budget's say.

It reads pods straight from the API server (a field selector on spec.nodeName): a
drain must see what is on the node now, not what a cache saw.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.resources import NODES, PODS

log = logging.getLogger(__name__)

Obj = dict[str, Any]


@dataclass(frozen=True)
class DrainOptions:
    timeout: float = 300.0
    """Seconds the whole drain may take before ``DrainTimeout``."""
    grace_seconds: int | None = None
    """The pods' terminationGracePeriodSeconds override (None: each pod's own)."""
    delete_emptydir_data: bool = True
    force: bool = False
    """Evict pods no controller manages (nothing recreates them)."""
    retry: float = 1.0
    """First delay after a refused eviction; doubles up to ``retry_cap``."""
    retry_cap: float = 10.0
    poll: float = 1.0
    """How often to look whether evicted pods are gone."""
    pod_selector: str | None = None
    """Only pods with these labels (kubectl's --pod-selector); None: every pod on the node."""


@dataclass(frozen=True)
class Blocker:
    pod: str
    """``namespace/name``"""
    reason: str


@dataclass
class DrainReport:
    node: str
    evicted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """pod -> why it stays (DaemonSet, mirror pod)"""
    blocked: list[Blocker] = field(default_factory=list)
    """What blocked the last attempt (empty once drained)."""
    waiting: list[str] = field(default_factory=list)
    """Evicted pods still terminating at the last look."""
    done: bool = False

    def describe(self) -> str:
        if self.done:
            return (
                f"node {self.node} drained: {len(self.evicted)} pod(s) evicted, {len(self.skipped)} skipped"
            )
        parts = [f"{b.pod}: {b.reason}" for b in self.blocked]
        if self.waiting:
            parts.append(f"still terminating: {', '.join(self.waiting)}")
        return f"node {self.node} not drained; " + ("; ".join(parts) or "pods remain")


class DrainTimeout(ReconcileError):
    """The drain did not finish within its timeout; ``report`` says which pods block it and why."""

    def __init__(self, report: DrainReport, timeout: float) -> None:
        super().__init__(f"{report.describe()} (after {timeout:g}s)", "DrainBlocked")
        self.report = report


# ---- pure rules ---------------------------------------------------------------------------


def skip_reason(pod: Obj) -> str | None:
    """Why drain leaves ``pod`` on the node (None: it is to be evicted)."""
    if objects.mirror_pod(pod):
        return "mirror pod (a static pod the kubelet owns)"
    if objects.owner_of(pod, "DaemonSet") is not None and _controlled_by(pod, "DaemonSet"):
        return "managed by DaemonSet " + str(objects.owner_of(pod, "DaemonSet"))
    return None


def block_reason(pod: Obj, options: DrainOptions) -> str | None:
    """Why drain refuses to evict ``pod`` under ``options`` (None: it may)."""
    if _finished(pod):
        return None
    if not options.force and not any(r.get("controller") for r in _owners(pod)):
        return "not managed by a controller: nothing would recreate it (force evicts it)"
    if not options.delete_emptydir_data:
        volumes = [v.get("name") for v in (pod.get("spec") or {}).get("volumes") or [] if "emptyDir" in v]
        if volumes:
            return (
                f"has emptyDir volumes {volumes}: their data would be lost (delete_emptydir_data evicts it)"
            )
    return None


def _owners(pod: Obj) -> list[Obj]:
    return list((pod.get("metadata") or {}).get("ownerReferences") or [])


def _controlled_by(pod: Obj, kind: str) -> bool:
    return any(r.get("kind") == kind and r.get("controller") for r in _owners(pod))


def _finished(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def refusal(err: ApiStatusError) -> str:
    """The budget's own words for a 429 (``The disruption budget web needs 2 healthy pods ...``)."""
    if err.causes:
        return "; ".join(err.causes)
    return err.message


# ---- acting ---------------------------------------------------------------------------------


async def cordon(api: Api, node: str) -> None:
    """Mark the node unschedulable (idempotent)."""
    await api.patch(NODES, None, node, {"spec": {"unschedulable": True}})


async def uncordon(api: Api, node: str) -> None:
    """Make the node schedulable again (idempotent)."""
    await api.patch(NODES, None, node, {"spec": {"unschedulable": None}})


async def pods_on(api: Api, node: str, label_selector: str | None = None) -> list[Obj]:
    return await api.list_objects(PODS, None, label_selector, field_selector=f"spec.nodeName={node}")


async def drain(api: Api, node: str, options: DrainOptions | None = None) -> DrainReport:
    """Cordon ``node`` and evict its pods (see the module); returns the report once it is empty
    of everything but skipped pods, or raises ``DrainTimeout`` with the report of what blocks."""
    options = options or DrainOptions()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.timeout
    report = DrainReport(node)
    await cordon(api, node)
    delay = options.retry
    while True:
        pods = await pods_on(api, node, options.pod_selector)
        report.blocked, report.waiting = [], []
        refused = False
        for pod in pods:
            key = objects.key(pod)
            why = skip_reason(pod)
            if why is not None:
                report.skipped[key] = why
                continue
            if objects.deleting(pod):
                report.waiting.append(key)
                continue
            why = block_reason(pod, options)
            if why is not None:
                report.blocked.append(Blocker(key, why))
                continue
            try:
                await api.evict(str(objects.namespace(pod)), objects.name(pod), options.grace_seconds)
            except ApiStatusError as err:
                if err.not_found:
                    continue  # gone meanwhile
                refused = True
                why = refusal(err) if err.too_many_requests else f"eviction refused: {err}"
                report.blocked.append(Blocker(key, why))
                continue
            log.info("evicted %s from node %s", key, node)
            if key not in report.evicted:
                report.evicted.append(key)
            report.waiting.append(key)
        if not report.blocked and not report.waiting:
            report.done = True
            log.info("%s", report.describe())
            return report
        now = loop.time()
        if now >= deadline:
            raise DrainTimeout(report, options.timeout)
        # Refused: back off (a budget frees up as replacements become ready); else poll for the
        # evicted pods to go.
        wait = delay if refused or report.blocked else options.poll
        delay = min(delay * 2, options.retry_cap) if refused or report.blocked else options.retry
        await asyncio.sleep(min(wait, deadline - now))


__all__ = [
    "Blocker", "DrainOptions", "DrainReport", "DrainTimeout", "block_reason", "cordon", "drain", "pods_on",
    "skip_reason", "uncordon",
]  # fmt: skip
