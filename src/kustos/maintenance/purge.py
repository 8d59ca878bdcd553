"""Purging a dead node, one step at a time: shared by the controller and ``kustos purge-node``.

The order (EKCO's, with a quorum check it lacks): with Rook storage nodes maintained
(``rookShouldUseAllNodes: false``, EKCO's ``--maintain_rook_storage_nodes``), remove the node
from each CephCluster's ``storage.nodes``, delete its OSD Deployments (their OSD IDs recorded
on the Node first) and run ``ceph osd down/purge`` and ``ceph osd crush rm`` through the Ceph
toolbox (``rook.CephToolbox``, one command per step, how many ran recorded on the Node; unlike
EKCO, a failed ``osd purge`` or ``crush rm``, or no toolbox at all, stops the purge there: a
refusal, retried, rather than a Node deleted while Ceph still counts its OSDs);
then remember the node's control-plane
address on the Node (so a crash after the endpoint is gone still finds its etcd member),
remove its API endpoint from kubeadm's ClusterStatus, remove its stacked etcd member
through ``etcd.membership.remove_keeping_quorum`` (refused when the members left would
lose quorum), then delete the Node. Every step is idempotent and recorded on the Node
(annotation ``kustos.dev/purge``), so a purge interrupted by a crash goes on where it was.

A kustos EtcdCluster member on the node is not touched here: its own controller replaces
members on lost nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.etcd import kubeadm
from kustos.maintenance import rook
from kustos.maintenance.planner import PURGE_ANNOTATION
from kustos.runtime import faults, objects
from kustos.runtime.api import Api
from kustos.runtime.resources import CONFIGMAPS, DEPLOYMENTS, NODES, PODS

log = logging.getLogger(__name__)

ADDRESS_ANNOTATION = "kustos.dev/purge-address"
"""The dead control-plane node's advertise address, written before anything is removed."""

OSDS_ANNOTATION = "kustos.dev/purge-osds"
"""The OSD IDs of the node's OSD Deployments, written before they are deleted."""

CEPH_ANNOTATION = "kustos.dev/purge-ceph"
"""How many of the CephOSDPurge step's Ceph commands have run (one command per pass)."""

ROOK_NODES, ROOK_OSDS, CEPH_PURGE = "RookStorageNode", "RookOSDDeployment", "CephOSDPurge"
ADDRESS, ENDPOINT, ETCD, NODE = "Address", "ControlPlaneEndpoint", "EtcdMember", "Node"
ROOK_STEPS = (ROOK_NODES, ROOK_OSDS, CEPH_PURGE)
CONTROL_PLANE_STEPS = (ADDRESS, ENDPOINT, ETCD)
STEPS = (*ROOK_STEPS, *CONTROL_PLANE_STEPS, NODE)


@dataclass(frozen=True)
class PurgeOptions:
    certificates_dir: Path = Path("/etc/kubernetes/pki")
    etcd_certificates_secret: str | None = None
    """namespace/name of a Secret with ca.crt, healthcheck-client.crt and .key."""
    maintain_rook: bool = False
    """Remove the node from Rook (EKCO's maintain_rook_storage_nodes)."""
    rook_namespace: str = "rook-ceph"

    @classmethod
    def from_spec(cls, spec: MaintenancePolicySpec) -> PurgeOptions:
        return cls(
            Path(spec.certificates_dir),
            spec.etcd_certificates_secret,
            maintain_rook=not spec.rook_should_use_all_nodes,
            rook_namespace=spec.rook_namespace,
        )


@dataclass(frozen=True)
class Outcome:
    step: str
    message: str
    refused: bool = False
    finished: bool = False
    deleted: bool = False
    """This step deleted the Node: its purge is complete (``finished`` alone may mean it was gone)."""


def steps_for(node: dict[str, Any] | None, options: PurgeOptions) -> tuple[str, ...]:
    """The steps a node's purge takes, in order."""
    if node is None:
        return ()
    rook = ROOK_STEPS if options.maintain_rook else ()
    control_plane = CONTROL_PLANE_STEPS if objects.is_control_plane(node) else ()
    return (*rook, *control_plane, NODE)


class Purger:
    def __init__(
        self,
        api: Api,
        options: PurgeOptions,
        announce: Callable[[dict[str, Any], str, str], Any] | None = None,
        toolbox: rook.CephToolbox | None = None,
    ) -> None:
        self.api = api
        self.options = options
        self.announce = announce
        self.toolbox = toolbox

    async def remaining(self, name: str) -> list[str]:
        """What is left to do for ``name``, as sentences (the CLI shows them first)."""
        node = await self.api.get(NODES, None, name)
        if node is None:
            return []
        done = _done(node)
        ceph = "through the Ceph toolbox" if self.toolbox else "(no toolbox: printed, the purge waits)"
        lines = {
            ROOK_NODES: f"remove it from storage.nodes of the CephClusters in {self.options.rook_namespace}",
            ROOK_OSDS: "delete its OSD Deployments (app=rook-ceph-osd), their OSD IDs recorded first",
            CEPH_PURGE: f"ceph osd down, ceph osd purge and ceph osd crush rm {ceph}",
            ADDRESS: "record its control-plane address on the Node",
            ENDPOINT: "remove its API endpoint from kubeadm's ClusterStatus (kube-system/kubeadm-config)",
            ETCD: "remove its stacked etcd member, only if the remaining members keep quorum",
            NODE: f"delete the Node {name}",
        }
        return [f"{step}: {lines[step]}" for step in steps_for(node, self.options) if step not in done]

    async def next(self, name: str) -> Outcome:
        """Take the next step of ``name``'s purge (each call one step)."""
        node = await self.api.get(NODES, None, name)
        if node is None:
            return Outcome(NODE, f"node {name} is gone", finished=True)
        done = _done(node)
        todo = [s for s in steps_for(node, self.options) if s not in done]
        step = todo[0] if todo else NODE
        if step == ROOK_NODES:
            message = await rook.remove_storage_node(self.api, self.options.rook_namespace, name)
            await self._mark(node, ROOK_NODES)
            return await self._said(node, Outcome(ROOK_NODES, message))
        if step == ROOK_OSDS:
            deployments = await rook.osd_deployments(self.api, self.options.rook_namespace, name)
            ids = sorted({i for _, i in deployments}, key=_numeric)
            recorded = [i for i in objects.annotations(node).get(OSDS_ANNOTATION, "").split(",") if i]
            ids = sorted(set(ids) | set(recorded), key=_numeric)
            if ids != recorded:
                # The intent first: once the Deployments are gone, only this says which OSDs to purge.
                patch = {"metadata": {"annotations": {OSDS_ANNOTATION: ",".join(ids)}}}
                node = await self.api.patch(NODES, None, name, patch)
            for deployment, _ in deployments:
                await self.api.delete(DEPLOYMENTS, self.options.rook_namespace, deployment)
            await self._mark(node, ROOK_OSDS)
            names = ", ".join(d for d, _ in deployments) or "none"
            return await self._said(node, Outcome(ROOK_OSDS, f"deleted OSD Deployments: {names}"))
        if step == CEPH_PURGE:
            return await self._ceph(node)
        if step == ADDRESS:
            where = await self._addresses(name)
            address = where.dead or ""
            await self._mark(node, ADDRESS, {ADDRESS_ANNOTATION: address or None})
            said = f"its address {address} (from {where.source})" if address else "no address found"
            return await self._said(node, Outcome(ADDRESS, f"purging {name}: {said}"))
        if step == ENDPOINT:
            message = await self._remove_endpoint(name)
            await self._mark(node, ENDPOINT)
            return await self._said(node, Outcome(ENDPOINT, message))
        if step == ETCD:
            message, refused = await self._remove_member(node)
            if refused:
                return await self._said(node, Outcome(ETCD, message, refused=True))
            faults.exit_after(f"Purge{ETCD}")  # done, not yet recorded: the next pass must cope
            await self._mark(node, ETCD)
            return await self._said(node, Outcome(ETCD, message))
        await self._said(node, Outcome(NODE, f"deleting Node {name}"))
        await self.api.delete(NODES, None, name, uid=objects.uid(node))
        return Outcome(NODE, f"deleted Node {name}", finished=True, deleted=True)

    async def run(self, name: str, progress: Callable[[Outcome], None] = lambda _: None) -> Outcome:
        """Every step until the Node is gone or a step is refused (the CLI's purge)."""
        while True:
            outcome = await self.next(name)
            progress(outcome)
            if outcome.finished or outcome.refused:
                return outcome

    # ---- steps -------------------------------------------------------------------------

    async def _ceph(self, node: dict[str, Any]) -> Outcome:
        """One Ceph command per call, how many ran recorded on the Node: each command may take
        up to its exec timeout, so a pass stays well under the controller's timeout however
        many OSDs the node had, and a pass cut short repeats one command, not all."""
        name = objects.name(node)
        annotations = objects.annotations(node)
        ids = [i for i in annotations.get(OSDS_ANNOTATION, "").split(",") if i]
        todo = rook.commands(ids, name)
        if self.toolbox is None:
            # Not done: a Node deleted while Ceph still counts its OSDs leaves them in the map.
            message = (
                f"{rook.by_hand(todo)}; then add {CEPH_PURGE} to the Node's {PURGE_ANNOTATION} annotation, "
                f"or start Rook's toolbox in {self.options.rook_namespace}, for the purge to go on"
            )
            return await self._said(node, Outcome(CEPH_PURGE, message, refused=True))
        recorded = annotations.get(CEPH_ANNOTATION, "")
        ran = min(int(recorded), len(todo) - 1) if recorded.isdigit() else 0
        clause, go_on = await rook.run_one(self.toolbox, todo[ran])
        message = f"{clause} ({ran + 1}/{len(todo)})"
        if not go_on:  # the count stays: the same command runs again on a later pass
            return await self._said(node, Outcome(CEPH_PURGE, message, refused=True))
        if ran + 1 >= len(todo):
            await self._mark(node, CEPH_PURGE, {CEPH_ANNOTATION: None})
        else:
            patch = {"metadata": {"annotations": {CEPH_ANNOTATION: str(ran + 1)}}}
            await self.api.patch(NODES, None, name, patch)
        return await self._said(node, Outcome(CEPH_PURGE, message))

    async def _said(self, node: dict[str, Any], outcome: Outcome) -> Outcome:
        log.info("purge %s: %s: %s", objects.name(node), outcome.step, outcome.message)
        if self.announce is not None:
            reason = f"Purge{outcome.step}" + ("Refused" if outcome.refused else "")
            await self.announce(node, reason, outcome.message)
        return outcome

    async def _mark(
        self, node: dict[str, Any], step: str, extra: dict[str, str | None] | None = None
    ) -> None:
        done = [*_done(node), step]
        patch = {"metadata": {"annotations": {PURGE_ANNOTATION: ",".join(done), **(extra or {})}}}
        await self.api.patch(NODES, None, objects.name(node), patch)

    async def _addresses(self, name: str) -> kubeadm.ControlPlaneAddresses:
        config_map = await self.api.get(CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG)
        apiservers = await self.api.list_objects(
            PODS, kubeadm.KUBE_SYSTEM, label_selector=kubeadm.APISERVER_SELECTOR
        )
        nodes = await self.api.list_objects(NODES)
        return kubeadm.addresses(name, config_map, apiservers, nodes)

    async def _remove_endpoint(self, name: str) -> str:
        config_map = await self.api.get(CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG)
        if config_map is None:
            return "no kube-system/kubeadm-config: not a kubeadm control plane, no endpoint to remove"
        text = kubeadm.without_node(config_map, name)
        if text is None:
            return (
                f"{name} has no endpoint in kubeadm's ClusterStatus (kubeadm 1.22 and later keep it "
                "in the kube-apiserver pod's annotation, which goes with the Node)"
            )
        patch = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": objects.resource_version(config_map),
            },
            {"op": "replace", "path": f"/data/{kubeadm.CLUSTER_STATUS_KEY}", "value": text},
        ]
        await self.api.patch(CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG, patch, kind="json")
        return f"removed {name}'s API endpoint from kubeadm's ClusterStatus"

    async def _remove_member(self, node: dict[str, Any]) -> tuple[str, bool]:
        name = objects.name(node)
        config_map = await self.api.get(CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG)
        if kubeadm.external_etcd(config_map):
            return "kubeadm's etcd is external: no stacked member to remove", False
        apiservers = await self.api.list_objects(
            PODS, kubeadm.KUBE_SYSTEM, label_selector=kubeadm.APISERVER_SELECTOR
        )
        if config_map is None and not kubeadm.pod_endpoints(apiservers):
            return (
                "not a kubeadm control plane (no kube-system/kubeadm-config, no annotated kube-apiserver "
                "pods): no stacked etcd member to remove"
            ), False
        where = await self._addresses(name)
        dead = objects.annotations(node).get(ADDRESS_ANNOTATION) or where.dead or ""
        endpoints = [kubeadm.client_url(ip) for ip in where.remaining]
        options = self.options
        async with kubeadm.client_tls(
            self.api, options.certificates_dir, options.etcd_certificates_secret
        ) as tls:
            removal = await kubeadm.remove_member(endpoints, tls, name=name, address=dead)
        return removal.message, removal.refused


def _numeric(osd_id: str) -> tuple[int, str]:
    return (int(osd_id), "") if osd_id.isdigit() else (1 << 30, osd_id)


def _done(node: dict[str, Any]) -> list[str]:
    return [s for s in objects.annotations(node).get(PURGE_ANNOTATION, "").split(",") if s]


__all__ = [
    "ADDRESS_ANNOTATION",
    "CEPH_ANNOTATION",
    "OSDS_ANNOTATION",
    "STEPS",
    "Outcome",
    "PurgeOptions",
    "Purger",
    "steps_for",
]
