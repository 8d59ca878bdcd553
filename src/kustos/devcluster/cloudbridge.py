"""A bridge from any cloud provider's instances to kwok Nodes (dev tool, F-NODE-6).

The local fakes of GCP and Azure (``gcpfake``, ``azurefake``) run no kubelet, so nothing
would register their instances as Nodes. Like ``awsbridge`` does for AWS, the bridge plays
kubelet and the cloud controller manager: it reads the groups and instances through a
``CloudProvider`` (the one kustos uses, against the fake) and

- gives a pending or running instance a kwok Node named as the instance's node name, with
  its ``spec.providerID``, its image as the ``kustos.dev/image`` label (made a label value),
  the role's label and taint, and a loopback InternalIP of its own;
- takes ``kustos.dev/kwok-managed`` off the Node of a stopped instance (kwok stops its
  heartbeat: NotReady) and gives it back when the instance runs again;
- deletes the Node of an instance that is stopping for good or gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kustos.devcluster.awsbridge import free_ip
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.cloud import CloudProvider, Instance, InstanceState, Role
from kustos.runtime.resources import NODES

log = logging.getLogger(__name__)

BRIDGE_LABEL = "kustos.dev/cloud-bridge"
IMAGE_LABEL = "kustos.dev/image"
IMAGE_ANNOTATION = "kustos.dev/cloud-image"
LIVE = frozenset({InstanceState.PENDING, InstanceState.RUNNING})
HALTED = frozenset({InstanceState.STOPPED})


def label_value(text: str) -> str:
    """The last 63 characters an image name can give a label value (its version is at the end)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[-63:]
    return cleaned.strip("-_.")


@dataclass(frozen=True)
class Machine:
    instance: Instance
    role: Role

    @property
    def node_name(self) -> str:
        return (self.instance.node_name or self.instance.provider_id.rpartition("/")[2]).lower()


@dataclass
class Actions:
    create: list[Machine] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    halt: list[str] = field(default_factory=list)
    resume: list[str] = field(default_factory=list)


def plan(machines: Iterable[Machine], nodes: Iterable[Mapping[str, Any]]) -> Actions:
    """What to do so the bridge's Nodes mirror the machines; pure."""
    by_pid = {m.instance.provider_id: m for m in machines}
    actions = Actions()
    seen: set[str] = set()
    for node in nodes:
        pid = str((node.get("spec") or {}).get("providerID") or "")
        seen.add(pid)
        machine = by_pid.get(pid)
        name = objects.name(node)
        if machine is None or machine.instance.state not in LIVE | HALTED:
            if not objects.deleting(node):
                actions.delete.append(name)
            continue
        managed = objects.labels(node).get(MANAGED_LABEL) == "true"
        if machine.instance.state in HALTED and managed:
            actions.halt.append(name)
        elif machine.instance.state in LIVE and not managed:
            actions.resume.append(name)
    for pid, machine in sorted(by_pid.items()):
        if pid not in seen and machine.instance.state in LIVE:
            actions.create.append(machine)
    return actions


def free_pod_cidr(prefix: str, nodes: Iterable[Mapping[str, Any]], first: int) -> str:
    """The lowest ``<prefix>.<n>.0/24`` (n >= first) no Node has as its podCIDR."""
    used = {str((n.get("spec") or {}).get("podCIDR") or "") for n in nodes}
    for third in range(first, 255):
        cidr = f"{prefix}.{third}.0/24"
        if cidr not in used:
            return cidr
    raise RuntimeError(f"no free pod range left in {prefix}.{first}-254.0/24")


def node_manifest(machine: Machine, internal_ip: str, pod_cidr: str | None = None) -> dict[str, Any]:
    image = machine.instance.image or ""
    labels = {
        MANAGED_LABEL: "true",
        BRIDGE_LABEL: "true",
        IMAGE_LABEL: label_value(image),
        "type": "kwok",
        "kubernetes.io/hostname": machine.node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    taints: list[dict[str, str]] = []
    if machine.role == Role.CONTROL_PLANE:
        labels["node-role.kubernetes.io/control-plane"] = ""
        taints.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
    else:
        labels["node-role.kubernetes.io/worker"] = ""
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": machine.node_name, "labels": labels, "annotations": {IMAGE_ANNOTATION: image}},
        "spec": {
            "providerID": machine.instance.provider_id,
            "taints": taints,
            **({"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]} if pod_cidr else {}),
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": machine.node_name},
            ],
            "allocatable": capacity,
            "capacity": capacity,
        },
    }


class CloudBridge:
    """Mirrors every instance of the provider's groups as a kwok Node."""

    def __init__(
        self, api: Api, provider: CloudProvider, *, ip_prefix: str = "127.79",
        pod_cidr_prefix: str | None = None, first_pod_range: int = 180,
    ) -> None:  # fmt: skip
        """``pod_cidr_prefix`` (two octets of the dev cluster's network): each Node gets a
        /24 of it from ``first_pod_range`` on, so the pods the dev cluster runs for real on
        it get addresses of their own."""
        self.api = api
        self.provider = provider
        self.ip_prefix = ip_prefix
        self.pod_cidr_prefix = pod_cidr_prefix
        self.first_pod_range = first_pod_range

    async def machines(self) -> list[Machine]:
        machines = []
        for group in await self.provider.groups():
            for instance in await self.provider.instances(group.group_id):
                machines.append(Machine(instance, group.role))
        return machines

    async def sync(self) -> Actions:
        machines = await self.machines()
        nodes = await self.api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
        actions = plan(machines, nodes)
        all_nodes: list[Mapping[str, Any]] = (
            list(await self.api.list_objects(NODES)) if actions.create else []
        )
        for machine in actions.create:
            cidr = (
                free_pod_cidr(self.pod_cidr_prefix, all_nodes, self.first_pod_range)
                if self.pod_cidr_prefix
                else None
            )
            manifest = node_manifest(machine, free_ip(self.ip_prefix, all_nodes), cidr)
            try:
                await self.api.create(NODES, manifest)
            except ApiStatusError as err:
                if not err.conflict:
                    raise
                continue  # still being deleted; the next pass
            all_nodes.append(manifest)
            log.info("node %s for %s created", machine.node_name, machine.instance.provider_id)
        for name in actions.delete:
            await self.api.delete(NODES, None, name)
        for name in actions.halt:
            await self.api.patch(NODES, None, name, {"metadata": {"labels": {MANAGED_LABEL: None}}})
        for name in actions.resume:
            await self.api.patch(NODES, None, name, {"metadata": {"labels": {MANAGED_LABEL: "true"}}})
        return actions

    async def run(self, stop: asyncio.Event, interval: float = 0.3) -> None:
        while not stop.is_set():
            try:
                await self.sync()
            except Exception:  # a dev tool keeps going: log, and the next pass retries
                log.exception("cloud bridge pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)


__all__ = ["BRIDGE_LABEL", "IMAGE_LABEL", "CloudBridge", "Machine", "label_value", "node_manifest", "plan"]
