"""The purge's planner: the next step of a dead node's purge, from what was observed. Pure: no
I/O. ``purge.Purger`` observes (the Node, Rook's OSD Deployments, kubeadm's configuration and
API server pods), asks ``plan`` and takes the one step it answers.

The order and why it is safe are in ``purge``'s docstring. What is done is recorded on the Node
(``PURGE_ANNOTATION``, a comma-separated list of step names), so a purge that a crash
interrupted plans the same next step again. A step that cannot go on is a ``Refuse``: nothing
is recorded and the same step is planned on the next pass (no Ceph toolbox; a Ceph command
that failed; an etcd member whose removal would lose quorum).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from kustos.api.maintenance import MaintenancePolicySpec

PURGE_ANNOTATION = "kustos.dev/purge"
"""Annotation on a Node being purged: the purge steps done so far, comma-separated."""


def steps_done(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The purge steps a Node's annotations record done (``PURGE_ANNOTATION``)."""
    return tuple(s for s in annotations.get(PURGE_ANNOTATION, "").split(",") if s)


ROOK_NODES, ROOK_OSDS, CEPH_PURGE = "RookStorageNode", "RookOSDDeployment", "CephOSDPurge"
ADDRESS, ENDPOINT, ETCD, NODE = "Address", "ControlPlaneEndpoint", "EtcdMember", "Node"
ROOK_STEPS = (ROOK_NODES, ROOK_OSDS, CEPH_PURGE)
CONTROL_PLANE_STEPS = (ADDRESS, ENDPOINT, ETCD)
STEPS = (*ROOK_STEPS, *CONTROL_PLANE_STEPS, NODE)


# ---- what is observed --------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """The Node being purged, as its annotations record the purge."""

    name: str
    uid: str
    control_plane: bool
    done: tuple[str, ...] = ()
    """Steps recorded done (``PURGE_ANNOTATION``)."""
    recorded_osds: tuple[str, ...] = ()
    """OSD IDs recorded before their Deployments were deleted (``purge.OSDS_ANNOTATION``)."""
    ceph_commands_run: int = 0
    """How many of the Ceph commands have run (``purge.CEPH_ANNOTATION``)."""
    recorded_address: str | None = None
    """Its control-plane address, recorded before anything was removed (``purge.ADDRESS_ANNOTATION``)."""


@dataclass(frozen=True)
class ControlPlaneView:
    """kubeadm's view of the control plane (observed only for its steps)."""

    kubeadm_config: bool
    """kube-system/kubeadm-config exists."""
    resource_version: str
    """kubeadm-config's, as read: the guard of the write that removes the endpoint."""
    external_etcd: bool
    annotated_apiservers: bool
    """kube-apiserver pods carry kubeadm's endpoint annotation (kubeadm 1.22 and later)."""
    cluster_status_without_node: str | None
    """kubeadm's ClusterStatus without the node (None: it lists no endpoint for it)."""
    address: str | None
    """The node's address, as the sources below found it."""
    address_source: str
    remaining: tuple[str, ...] = ()
    """The other control-plane hosts (where the etcd members that stay are)."""


@dataclass(frozen=True)
class Observed:
    node: NodeView | None
    """None: the Node is gone."""
    maintain_rook: bool = False
    rook_namespace: str = "rook-ceph"
    osd_deployments: tuple[tuple[str, str], ...] = ()
    """(Deployment, OSD ID) of the node's OSDs (observed only for their step)."""
    toolbox: bool = False
    """A Ceph toolbox can run the Ceph commands."""
    control_plane: ControlPlaneView | None = None


# ---- what to do ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gone:
    """The Node is gone: nothing left to do (someone deleted it, or an earlier pass did)."""


@dataclass(frozen=True)
class RemoveStorageNode:
    """Out of every CephCluster's ``storage.nodes`` (a guarded patch of each that lists it)."""


@dataclass(frozen=True)
class DeleteOSDs:
    record: tuple[str, ...] | None
    """The OSD IDs to record on the Node first (None: recorded already)."""
    deployments: tuple[str, ...]


@dataclass(frozen=True)
class RunCephCommand:
    argv: tuple[str, ...]
    index: int
    total: int


@dataclass(frozen=True)
class RecordAddress:
    address: str | None
    source: str


@dataclass(frozen=True)
class RemoveEndpoint:
    cluster_status: str
    """kubeadm's ClusterStatus without the node, to write back."""
    resource_version: str
    """kubeadm-config's as read: a ClusterStatus written meanwhile is not overwritten."""


@dataclass(frozen=True)
class RemoveEtcdMember:
    address: str
    """The dead member's address ("" when none was found: matched by name alone)."""
    endpoints: tuple[str, ...]
    """The remaining control-plane hosts, whose members are asked."""


@dataclass(frozen=True)
class Skip:
    """The step has nothing to do here: recorded done, saying why."""

    step: str
    message: str


@dataclass(frozen=True)
class Refuse:
    """The step cannot go on now: nothing recorded, the same step planned again."""

    step: str
    message: str


@dataclass(frozen=True)
class DeleteNode:
    uid: str


Step = (
    Gone | RemoveStorageNode | DeleteOSDs | RunCephCommand | RecordAddress | RemoveEndpoint
    | RemoveEtcdMember | Skip | Refuse | DeleteNode
)  # fmt: skip


# ---- the decision --------------------------------------------------------------------------------


def maintains_rook(spec: MaintenancePolicySpec) -> bool:
    """The purge removes the node from Rook (EKCO's ``--maintain_rook_storage_nodes``)."""
    return not spec.rook_should_use_all_nodes


def steps_for(node: NodeView | None, maintain_rook: bool) -> tuple[str, ...]:
    """The steps a node's purge takes, in order."""
    if node is None:
        return ()
    return _steps(node.control_plane, maintain_rook)


def deletes_next(control_plane: bool, done: Collection[str], maintain_rook: bool) -> bool:
    """Every step before the Node's deletion is recorded done: the purge deletes the Node next."""
    return all(step in done for step in _steps(control_plane, maintain_rook) if step != NODE)


def _steps(control_plane: bool, maintain_rook: bool) -> tuple[str, ...]:
    rook = ROOK_STEPS if maintain_rook else ()
    return (*rook, *(CONTROL_PLANE_STEPS if control_plane else ()), NODE)


def pending(node: NodeView | None, maintain_rook: bool) -> str | None:
    """The step the purge is at (None: the Node is gone)."""
    if node is None:
        return None
    return next((s for s in steps_for(node, maintain_rook) if s not in node.done), NODE)


def ceph_commands(ids: Sequence[str], node: str) -> list[list[str]]:
    """EKCO's sequence: each OSD down then purged, then the host out of the CRUSH map."""
    result = []
    for osd in ids:
        result.append(["ceph", "osd", "down", f"osd.{osd}"])
        result.append(["ceph", "osd", "purge", osd, "--yes-i-really-mean-it"])
    result.append(["ceph", "osd", "crush", "rm", node])
    return result


def by_hand(todo: Sequence[Sequence[str]]) -> str:
    return "no Ceph toolbox: run by hand in the toolbox pod: " + "; ".join(" ".join(c) for c in todo)


def plan(o: Observed) -> Step:
    node = o.node
    step = pending(node, o.maintain_rook)
    if node is None or step is None:
        return Gone()
    if step == ROOK_NODES:
        return RemoveStorageNode()
    if step == ROOK_OSDS:
        found = {i for _, i in o.osd_deployments}
        ids = tuple(sorted(found | set(node.recorded_osds), key=_numeric))
        # The intent first: once the Deployments are gone, only the Node says which OSDs to purge.
        record = ids if ids != node.recorded_osds else None
        return DeleteOSDs(record, tuple(d for d, _ in o.osd_deployments))
    if step == CEPH_PURGE:
        return _ceph(o, node)
    if step in CONTROL_PLANE_STEPS:
        assert o.control_plane is not None, f"the control plane is observed for {step}"
        return _control_plane(step, node, o.control_plane)
    return DeleteNode(node.uid)


def _ceph(o: Observed, node: NodeView) -> Step:
    todo = ceph_commands(node.recorded_osds, node.name)
    if not o.toolbox:
        # Not done: a Node deleted while Ceph still counts its OSDs leaves them in the map.
        return Refuse(
            CEPH_PURGE,
            f"{by_hand(todo)}; then add {CEPH_PURGE} to the Node's {PURGE_ANNOTATION} annotation, "
            f"or start Rook's toolbox in {o.rook_namespace}, for the purge to go on",
        )
    index = min(node.ceph_commands_run, len(todo) - 1)
    return RunCephCommand(tuple(todo[index]), index, len(todo))


def _control_plane(step: str, node: NodeView, cp: ControlPlaneView) -> Step:
    if step == ADDRESS:
        return RecordAddress(cp.address, cp.address_source)
    if step == ENDPOINT:
        if not cp.kubeadm_config:
            return Skip(
                ENDPOINT, "no kube-system/kubeadm-config: not a kubeadm control plane, no endpoint to remove"
            )
        if cp.cluster_status_without_node is None:
            return Skip(
                ENDPOINT,
                f"{node.name} has no endpoint in kubeadm's ClusterStatus (kubeadm 1.22 and later keep it "
                "in the kube-apiserver pod's annotation, which goes with the Node)",
            )
        return RemoveEndpoint(cp.cluster_status_without_node, cp.resource_version)
    if cp.external_etcd:
        return Skip(ETCD, "kubeadm's etcd is external: no stacked member to remove")
    if not cp.kubeadm_config and not cp.annotated_apiservers:
        return Skip(
            ETCD,
            "not a kubeadm control plane (no kube-system/kubeadm-config, no annotated kube-apiserver "
            "pods): no stacked etcd member to remove",
        )
    return RemoveEtcdMember(node.recorded_address or cp.address or "", cp.remaining)


def _numeric(osd_id: str) -> tuple[int, str]:
    return (int(osd_id), "") if osd_id.isdigit() else (1 << 30, osd_id)


__all__ = [
    "CEPH_PURGE",
    "PURGE_ANNOTATION",
    "STEPS",
    "ControlPlaneView",
    "DeleteNode",
    "DeleteOSDs",
    "Gone",
    "NodeView",
    "Observed",
    "RecordAddress",
    "Refuse",
    "RemoveEndpoint",
    "RemoveEtcdMember",
    "RemoveStorageNode",
    "RunCephCommand",
    "Skip",
    "Step",
    "by_hand",
    "ceph_commands",
    "deletes_next",
    "maintains_rook",
    "pending",
    "plan",
    "steps_done",
    "steps_for",
]
