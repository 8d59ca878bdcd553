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

``purge_planner.plan`` decides the next step from what ``Purger.observe`` saw (pure, unit-tested
decision by decision); ``Purger.act`` takes it. ``Purger.next`` is one step (the controller's
pass), ``Purger.run`` every step until the node is gone or a step is refused (the CLI).

A kustos EtcdCluster member on the node is not touched here: its own controller replaces
members on lost nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.etcd import kubeadm
from kustos.maintenance import purge_planner as pp
from kustos.maintenance import rook
from kustos.maintenance.purge_planner import PURGE_ANNOTATION
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
            maintain_rook=pp.maintains_rook(spec),
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
        node = node_view(await self.api.get(NODES, None, name))
        if node is None:
            return []
        options = self.options
        ceph = "through the Ceph toolbox" if self.toolbox else "(no toolbox: printed, the purge waits)"
        lines = {
            pp.ROOK_NODES: f"remove it from storage.nodes of the CephClusters in {options.rook_namespace}",
            pp.ROOK_OSDS: "delete its OSD Deployments (app=rook-ceph-osd), their OSD IDs recorded first",
            pp.CEPH_PURGE: f"ceph osd down, ceph osd purge and ceph osd crush rm {ceph}",
            pp.ADDRESS: "record its control-plane address on the Node",
            pp.ENDPOINT: "remove its API endpoint from kubeadm's ClusterStatus (kube-system/kubeadm-config)",
            pp.ETCD: "remove its stacked etcd member, only if the remaining members keep quorum",
            pp.NODE: f"delete the Node {name}",
        }
        todo = pp.steps_for(node, options.maintain_rook)
        return [f"{step}: {lines[step]}" for step in todo if step not in node.done]

    async def next(self, name: str) -> Outcome:
        """Take the next step of ``name``'s purge (each call one step)."""
        raw = await self.api.get(NODES, None, name)
        step = pp.plan(await self.observe(name, raw))
        if raw is None or isinstance(step, pp.Gone):
            return Outcome(pp.NODE, f"node {name} is gone", finished=True)
        return await self.act(raw, step)

    async def run(self, name: str, progress: Callable[[Outcome], None] = lambda _: None) -> Outcome:
        """Every step until the Node is gone or a step is refused (the CLI's purge)."""
        while True:
            outcome = await self.next(name)
            progress(outcome)
            if outcome.finished or outcome.refused:
                return outcome

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, name: str, raw: dict[str, Any] | None) -> pp.Observed:
        """The Node, and what its next step needs: Rook's OSD Deployments, kubeadm's view."""
        node = node_view(raw)
        options = self.options
        base = pp.Observed(
            node, options.maintain_rook, options.rook_namespace, toolbox=self.toolbox is not None
        )
        match pp.pending(node, options.maintain_rook):
            case pp.ROOK_OSDS:
                deployments = await rook.osd_deployments(self.api, options.rook_namespace, name)
                return replace(base, osd_deployments=tuple(deployments))
            case pp.ADDRESS | pp.ENDPOINT | pp.ETCD:
                return replace(base, control_plane=await self._control_plane(name))
        return base

    async def _control_plane(self, name: str) -> pp.ControlPlaneView:
        config_map = await self.api.get(CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG)
        apiservers = await self.api.list_objects(
            PODS, kubeadm.KUBE_SYSTEM, label_selector=kubeadm.APISERVER_SELECTOR
        )
        nodes = await self.api.list_objects(NODES)
        where = kubeadm.addresses(name, config_map, apiservers, nodes)
        without = None if config_map is None else kubeadm.without_node(config_map, name)
        return pp.ControlPlaneView(
            kubeadm_config=config_map is not None,
            resource_version=objects.resource_version(config_map) or "" if config_map is not None else "",
            external_etcd=kubeadm.external_etcd(config_map),
            annotated_apiservers=bool(kubeadm.pod_endpoints(apiservers)),
            cluster_status_without_node=without,
            address=where.dead,
            address_source=where.source,
            remaining=where.remaining,
        )

    # ---- act ---------------------------------------------------------------------------

    async def act(self, node: dict[str, Any], step: pp.Step) -> Outcome:
        """Take ``step``, record it done on the Node, and say it."""
        name = objects.name(node)
        match step:
            case pp.Gone():
                return Outcome(pp.NODE, f"node {name} is gone", finished=True)
            case pp.RemoveStorageNode():
                message = await rook.remove_storage_node(self.api, self.options.rook_namespace, name)
                await self._mark(node, pp.ROOK_NODES)
                return await self._said(node, Outcome(pp.ROOK_NODES, message))
            case pp.DeleteOSDs(record=record, deployments=deployments):
                if record is not None:
                    patch = {"metadata": {"annotations": {OSDS_ANNOTATION: ",".join(record)}}}
                    node = await self.api.patch(NODES, None, name, patch)
                for deployment in deployments:
                    await self.api.delete(DEPLOYMENTS, self.options.rook_namespace, deployment)
                await self._mark(node, pp.ROOK_OSDS)
                said = ", ".join(deployments) or "none"
                return await self._said(node, Outcome(pp.ROOK_OSDS, f"deleted OSD Deployments: {said}"))
            case pp.RunCephCommand():
                return await self._ceph(node, step)
            case pp.RecordAddress(address=address, source=source):
                await self._mark(node, pp.ADDRESS, {ADDRESS_ANNOTATION: address or None})
                said = f"its address {address} (from {source})" if address else "no address found"
                return await self._said(node, Outcome(pp.ADDRESS, f"purging {name}: {said}"))
            case pp.RemoveEndpoint(cluster_status=text, resource_version=version):
                # Guarded by the version read: a ClusterStatus written meanwhile is planned again.
                guarded = [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "replace", "path": f"/data/{kubeadm.CLUSTER_STATUS_KEY}", "value": text},
                ]
                await self.api.patch(
                    CONFIGMAPS, kubeadm.KUBE_SYSTEM, kubeadm.KUBEADM_CONFIG, guarded, kind="json"
                )
                await self._mark(node, pp.ENDPOINT)
                message = f"removed {name}'s API endpoint from kubeadm's ClusterStatus"
                return await self._said(node, Outcome(pp.ENDPOINT, message))
            case pp.RemoveEtcdMember(address=address, endpoints=hosts):
                options = self.options
                endpoints = [kubeadm.client_url(host) for host in hosts]
                async with kubeadm.client_tls(
                    self.api, options.certificates_dir, options.etcd_certificates_secret
                ) as tls:
                    removal = await kubeadm.remove_member(endpoints, tls, name=name, address=address)
                if removal.refused:
                    return await self._said(node, Outcome(pp.ETCD, removal.message, refused=True))
                faults.exit_after(f"Purge{pp.ETCD}")  # done, not yet recorded: the next pass must cope
                await self._mark(node, pp.ETCD)
                return await self._said(node, Outcome(pp.ETCD, removal.message))
            case pp.Skip(step=done, message=message):
                await self._mark(node, done)
                return await self._said(node, Outcome(done, message))
            case pp.Refuse(step=refused, message=message):
                return await self._said(node, Outcome(refused, message, refused=True))
            case pp.DeleteNode(uid=uid):
                await self._said(node, Outcome(pp.NODE, f"deleting Node {name}"))
                await self.api.delete(NODES, None, name, uid=uid)
                return Outcome(pp.NODE, f"deleted Node {name}", finished=True, deleted=True)

    async def _ceph(self, node: dict[str, Any], step: pp.RunCephCommand) -> Outcome:
        """One Ceph command per call, how many ran recorded on the Node: each command may take
        up to its exec timeout, so a pass stays well under the controller's timeout however
        many OSDs the node had, and a pass cut short repeats one command, not all."""
        assert self.toolbox is not None, "planned only with a toolbox"
        clause, go_on = await rook.run_one(self.toolbox, list(step.argv))  # an argv, as a list
        message = f"{clause} ({step.index + 1}/{step.total})"
        if not go_on:  # the count stays: the same command runs again on a later pass
            return await self._said(node, Outcome(pp.CEPH_PURGE, message, refused=True))
        if step.index + 1 >= step.total:
            await self._mark(node, pp.CEPH_PURGE, {CEPH_ANNOTATION: None})
        else:
            patch = {"metadata": {"annotations": {CEPH_ANNOTATION: str(step.index + 1)}}}
            await self.api.patch(NODES, None, objects.name(node), patch)
        return await self._said(node, Outcome(pp.CEPH_PURGE, message))

    async def _said(self, node: dict[str, Any], outcome: Outcome) -> Outcome:
        log.info("purge %s: %s: %s", objects.name(node), outcome.step, outcome.message)
        if self.announce is not None:
            reason = f"Purge{outcome.step}" + ("Refused" if outcome.refused else "")
            await self.announce(node, reason, outcome.message)
        return outcome

    async def _mark(
        self, node: dict[str, Any], step: str, extra: dict[str, str | None] | None = None
    ) -> None:
        done = [*pp.steps_done(objects.annotations(node)), step]
        patch = {"metadata": {"annotations": {PURGE_ANNOTATION: ",".join(done), **(extra or {})}}}
        await self.api.patch(NODES, None, objects.name(node), patch)


def node_view(node: dict[str, Any] | None) -> pp.NodeView | None:
    """The Node as the planner sees it: what its annotations record of the purge."""
    if node is None:
        return None
    annotations = objects.annotations(node)
    recorded = annotations.get(CEPH_ANNOTATION, "")
    return pp.NodeView(
        name=objects.name(node),
        uid=objects.uid(node) or "",
        control_plane=objects.is_control_plane(node),
        done=pp.steps_done(annotations),
        recorded_osds=tuple(i for i in annotations.get(OSDS_ANNOTATION, "").split(",") if i),
        ceph_commands_run=int(recorded) if recorded.isdigit() else 0,
        recorded_address=annotations.get(ADDRESS_ANNOTATION) or None,
    )


__all__ = [
    "ADDRESS_ANNOTATION",
    "CEPH_ANNOTATION",
    "OSDS_ANNOTATION",
    "Outcome",
    "PurgeOptions",
    "Purger",
    "node_view",
]
