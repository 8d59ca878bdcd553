"""Rook follows the nodes (SPEC F-MAINT-5): storage nodes, pool replication, mon and mgr
counts, MDS placement and Ceph CSI resources, one guarded patch per pass.

What EKCO does (pkg/ekcoops/operator.go reconcileRook, pkg/cluster/rook_ceph.go), and where
kustos differs:

- Unless ``rookShouldUseAllNodes``, a Ready node (with ``rookStorageNodesLabel`` if set) is
  appended to every CephCluster's ``storage.nodes``, with the policy's devices or device
  filter, and ``useAllNodes`` is turned off in the same patch. Only appending: a node leaves
  the list when it is purged (purge.py). Rook starts an OSD only on a node Ready when it sees
  it in the list, hence Ready.
- Pool replication is ``clamp(Ready storage nodes, minCephPoolReplication,
  maxCephPoolReplication)``. EKCO counts hosts with OSDs (``ceph osd status``); here, the
  Ready nodes listed in storage.nodes. Sizes rise one replica per step (each step's backfill
  makes Ceph report HEALTH_WARN, so the next one waits for it); CephFilesystem and
  CephObjectStore pools never lower (as in EKCO); a CephBlockPool lowers only to the number of
  nodes *listed* (EKCO lowers it on its full reconcile), so a node that is merely NotReady
  lowers nothing, only its purge does. Rook refuses size 1 with ``requireSafeReplicaSize:
  true`` (pkg/operator/ceph/pool/validate.go): the patch to size 1 turns it off, the patch
  from 1 up turns it back on. A pool change waits while the CephCluster's
  ``status.ceph.health`` is not HEALTH_OK.
- Mons: 1 below three storage nodes, then 3; mgrs: 1 on one node, then 2; never lowered.
- With both pool and count scaling off under ``rookShouldUseAllNodes``, as EKCO's doc says.
- MDS: unless ``rookShouldDisableReconcileMDSPlacement``, with more than one Ready node (with
  ``rookStorageNodesLabel`` when set, as for the CSI threshold) a
  CephFilesystem whose MDS anti-affinity on ``kubernetes.io/hostname`` is only *preferred*
  (kURL's single-node form) gets it *required*; its other preferred terms stay.
- CSI: unless ``rookShouldDisableReconcileCephCSIResources``, from three Ready nodes on the
  ``rook-ceph-operator-config`` ConfigMap gets Rook's recommended CSI requests and limits
  (the values Rook's deploy/examples/operator.yaml recommended until its CSI moved to the
  ceph-csi-operator), compared as parsed YAML so formatting never causes a patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kustos.api.maintenance import MaintenancePolicySpec, RookStatus
from kustos.runtime import objects
from kustos.runtime.refs import ResourceRef
from kustos.runtime.resources import CONFIGMAPS
from kustos.runtime.steps import Wait

CEPH_CLUSTERS = ResourceRef("ceph.rook.io", "v1", "cephclusters", "CephCluster")
CEPH_BLOCK_POOLS = ResourceRef("ceph.rook.io", "v1", "cephblockpools", "CephBlockPool")
CEPH_FILESYSTEMS = ResourceRef("ceph.rook.io", "v1", "cephfilesystems", "CephFilesystem")
CEPH_OBJECT_STORES = ResourceRef("ceph.rook.io", "v1", "cephobjectstores", "CephObjectStore")
OPERATOR_CONFIG = "rook-ceph-operator-config"
HOSTNAME = "kubernetes.io/hostname"
HEALTH_OK = "HEALTH_OK"
POLL = 5.0
Obj = Mapping[str, Any]


def _resources(cpu: str, memory: str, limit: str) -> dict[str, Any]:
    return {"requests": {"memory": memory, "cpu": cpu}, "limits": {"memory": limit}}


_SIDECAR = _resources("100m", "128Mi", "256Mi")
_PLUGIN = _resources("250m", "512Mi", "1Gi")
_REGISTRAR = _resources("50m", "128Mi", "256Mi")


def _containers(*pairs: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "resource": resource} for name, resource in pairs]


_SIDECARS = [(n, _SIDECAR) for n in ("csi-provisioner", "csi-resizer", "csi-attacher", "csi-snapshotter")]
CSI_RESOURCES: dict[str, list[dict[str, Any]]] = {
    "CSI_RBD_PROVISIONER_RESOURCE": _containers(
        *_SIDECARS,
        ("csi-rbdplugin", _PLUGIN),
        ("csi-omap-generator", _PLUGIN),
        ("liveness-prometheus", _REGISTRAR),
    ),
    "CSI_RBD_PLUGIN_RESOURCE": _containers(
        ("driver-registrar", _REGISTRAR), ("csi-rbdplugin", _PLUGIN), ("liveness-prometheus", _REGISTRAR)
    ),
    "CSI_CEPHFS_PROVISIONER_RESOURCE": _containers(
        *_SIDECARS, ("csi-cephfsplugin", _PLUGIN), ("liveness-prometheus", _REGISTRAR)
    ),
    "CSI_CEPHFS_PLUGIN_RESOURCE": _containers(
        ("driver-registrar", _REGISTRAR), ("csi-cephfsplugin", _PLUGIN), ("liveness-prometheus", _REGISTRAR)
    ),
    "CSI_NFS_PROVISIONER_RESOURCE": _containers(
        ("csi-provisioner", _SIDECAR), ("csi-nfsplugin", _PLUGIN), ("csi-attacher", _SIDECAR)
    ),
    "CSI_NFS_PLUGIN_RESOURCE": _containers(("driver-registrar", _REGISTRAR), ("csi-nfsplugin", _PLUGIN)),
}
"""Rook's recommended CSI requests and limits, by rook-ceph-operator-config key."""
CSI_MIN_NODES = 3


@dataclass(frozen=True)
class RookNode:
    name: str
    ready: bool
    labels: tuple[tuple[str, str], ...] = ()
    purging: bool = False
    """A purge has begun on it (kustos.dev/purge): never added back."""


@dataclass(frozen=True)
class RookView:
    """Rook's objects in the policy's rookNamespace (none: Rook is not installed)."""

    clusters: tuple[Obj, ...] = ()
    block_pools: tuple[Obj, ...] = ()
    filesystems: tuple[Obj, ...] = ()
    object_stores: tuple[Obj, ...] = ()
    operator_config: Obj | None = None
    nodes: tuple[RookNode, ...] = ()


@dataclass(frozen=True)
class PatchRook:
    """One guarded JSON patch of one Rook object (or Rook's operator ConfigMap)."""

    ref: ResourceRef
    namespace: str
    name: str
    patch: tuple[Mapping[str, Any], ...] = field(hash=False)
    action: str
    message: str


# ---- pure ------------------------------------------------------------------------------


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def _guard(obj: Obj) -> dict[str, Any]:
    return {"op": "test", "path": "/metadata/resourceVersion", "value": objects.resource_version(obj)}


def _label_matches(label: str, node: RookNode) -> bool:
    if not label:
        return True
    key, _, value = label.partition("=")
    return dict(node.labels).get(key) == value


def storage_names(cluster: Obj) -> list[str]:
    return [str(n.get("name")) for n in _get(cluster, "spec", "storage", "nodes") or [] if n.get("name")]


def storage_entry(spec: MaintenancePolicySpec, node: str) -> dict[str, Any]:
    """A CephCluster storage.nodes entry with the policy's device settings."""
    entry: dict[str, Any] = {"name": node}
    if spec.rook_storage_node_devices:
        entry["devices"] = [{"name": d} for d in spec.rook_storage_node_devices]
    if spec.rook_storage_node_device_filter:
        entry["deviceFilter"] = spec.rook_storage_node_device_filter
    return entry


def counts(view: RookView) -> tuple[int, int]:
    """(Ready storage nodes, listed storage nodes) over every CephCluster."""
    listed = {n for c in view.clusters for n in storage_names(c)}
    ready = {n.name for n in view.nodes if n.ready}
    return len(listed & ready), len(listed)


def _clamp(spec: MaintenancePolicySpec, count: int) -> int:
    return max(spec.min_ceph_pool_replication, min(spec.max_ceph_pool_replication, count))


@dataclass(frozen=True)
class _Pool:
    """One replicated pool of a Rook object: its JSON pointer and size."""

    ref: ResourceRef
    obj: Obj
    pointer: str
    replicated: Mapping[str, Any]
    may_lower: bool

    @property
    def label(self) -> str:
        where = self.pointer.removeprefix("/spec/").removesuffix("/replicated").replace("/", ".")
        return f"{self.ref.kind} {objects.name(self.obj)} {where}"


def pools(view: RookView) -> list[_Pool]:
    """Every replicated pool, in a fixed order (erasure-coded pools have no size to follow)."""
    found = []
    for pool in sorted(view.block_pools, key=objects.name):
        found.append(
            _Pool(CEPH_BLOCK_POOLS, pool, "/spec/replicated", _get(pool, "spec", "replicated"), True)
        )
    for fs in sorted(view.filesystems, key=objects.name):
        found.append(
            _Pool(
                CEPH_FILESYSTEMS,
                fs,
                "/spec/metadataPool/replicated",
                _get(fs, "spec", "metadataPool", "replicated"),
                False,
            )
        )
        for i, data in enumerate(_get(fs, "spec", "dataPools") or []):
            found.append(
                _Pool(
                    CEPH_FILESYSTEMS, fs, f"/spec/dataPools/{i}/replicated", _get(data, "replicated"), False
                )
            )
    for store in sorted(view.object_stores, key=objects.name):
        for part in ("metadataPool", "dataPool"):
            found.append(
                _Pool(
                    CEPH_OBJECT_STORES,
                    store,
                    f"/spec/{part}/replicated",
                    _get(store, "spec", part, "replicated"),
                    False,
                )
            )
    return [
        p for p in found if isinstance(p.replicated, Mapping) and isinstance(p.replicated.get("size"), int)
    ]


def _resize(pool: _Pool, namespace: str, size: int, why: str) -> PatchRook:
    current = int(pool.replicated["size"])
    ops: list[Mapping[str, Any]] = [
        {"op": "test", "path": f"{pool.pointer}/size", "value": current},
        {"op": "replace", "path": f"{pool.pointer}/size", "value": size},
    ]
    safe = pool.replicated.get("requireSafeReplicaSize")
    note = ""
    if size == 1 and safe is True:
        ops.append({"op": "replace", "path": f"{pool.pointer}/requireSafeReplicaSize", "value": False})
        note = "; requireSafeReplicaSize off (Rook refuses size 1 with it on)"
    elif current == 1 and size > 1 and safe is False:
        ops.append({"op": "replace", "path": f"{pool.pointer}/requireSafeReplicaSize", "value": True})
        note = "; requireSafeReplicaSize back on"
    return PatchRook(
        pool.ref,
        namespace,
        objects.name(pool.obj),
        tuple(ops),
        "CephPoolReplication",
        f"{pool.label}: size {current} -> {size} ({why}){note}",
    )


def _health(view: RookView) -> str | None:
    """Why Ceph is not healthy enough for a pool change (None: HEALTH_OK everywhere)."""
    for cluster in sorted(view.clusters, key=objects.name):
        health = _get(cluster, "status", "ceph", "health")
        if health != HEALTH_OK:
            said = f"reports {health}" if health else "reports no health yet"
            return f"CephCluster {objects.name(cluster)} {said}"
    return None


def rook_nodes(spec: MaintenancePolicySpec, view: RookView) -> list[str]:
    """Ready nodes Rook may use: with rookStorageNodesLabel when set, never one being purged.
    What joins storage.nodes, and what the MDS and CSI thresholds count (EKCO counts every
    node there; with a label, the nodes that are not Rook's do not make MDS spread possible)."""
    return sorted(
        n.name
        for n in view.nodes
        if n.ready and not n.purging and _label_matches(spec.rook_storage_nodes_label, n)
    )


def _storage_step(spec: MaintenancePolicySpec, namespace: str, view: RookView) -> PatchRook | None:
    eligible = rook_nodes(spec, view)
    for cluster in sorted(view.clusters, key=objects.name):
        listed = storage_names(cluster)
        missing = [n for n in eligible if n not in listed]
        if not missing:
            continue
        nodes = list(_get(cluster, "spec", "storage", "nodes") or [])
        nodes.append(storage_entry(spec, missing[0]))
        has_storage = isinstance(_get(cluster, "spec", "storage"), Mapping)
        ops: list[Mapping[str, Any]] = [_guard(cluster)]
        if has_storage:
            ops += [
                {"op": "add", "path": "/spec/storage/nodes", "value": nodes},
                {"op": "add", "path": "/spec/storage/useAllNodes", "value": False},
            ]
        else:
            ops.append(
                {"op": "add", "path": "/spec/storage", "value": {"useAllNodes": False, "nodes": nodes}}
            )
        return PatchRook(
            CEPH_CLUSTERS,
            namespace,
            objects.name(cluster),
            tuple(ops),
            "RookStorageNode",
            f"added node {missing[0]} to CephCluster {objects.name(cluster)} storage.nodes",
        )
    return None


def _count_step(namespace: str, view: RookView, ready: int) -> PatchRook | None:
    for cluster in sorted(view.clusters, key=objects.name):
        for daemon, wanted, action in (
            ("mon", 3 if ready >= 3 else 1, "CephMonCount"),
            ("mgr", 2 if ready >= 2 else 1, "CephMgrCount"),
        ):
            current = _get(cluster, "spec", daemon, "count")
            if isinstance(current, int) and current < wanted:
                ops = (
                    {"op": "test", "path": f"/spec/{daemon}/count", "value": current},
                    {"op": "replace", "path": f"/spec/{daemon}/count", "value": wanted},
                )
                return PatchRook(
                    CEPH_CLUSTERS,
                    namespace,
                    objects.name(cluster),
                    ops,
                    action,
                    f"CephCluster {objects.name(cluster)}: {daemon} count {current} -> {wanted} "
                    f"({ready} Ready storage node(s))",
                )
    return None


def _pool_step(
    spec: MaintenancePolicySpec, namespace: str, view: RookView, ready: int, listed: int
) -> PatchRook | None:
    raise_to, lower_to = _clamp(spec, ready), _clamp(spec, listed)
    for pool in pools(view):
        size = int(pool.replicated["size"])
        if size < raise_to:
            return _resize(pool, namespace, size + 1, f"{ready} Ready storage node(s), target {raise_to}")
        if pool.may_lower and size > lower_to:
            return _resize(pool, namespace, size - 1, f"{listed} storage node(s) listed, target {lower_to}")
    return None


def relaxed_mds_term(fs: Obj) -> tuple[int, Mapping[str, Any]] | None:
    """The preferred MDS anti-affinity term on hostname (its index) when none is required."""
    affinity = _get(fs, "spec", "metadataServer", "placement", "podAntiAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    if any(t.get("topologyKey") == HOSTNAME for t in required):
        return None
    for i, term in enumerate(affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        inner = term.get("podAffinityTerm") or {}
        if inner.get("topologyKey") == HOSTNAME:
            return i, inner
    return None


def _mds_step(namespace: str, view: RookView, ready: int) -> PatchRook | None:
    if ready <= 1:
        return None
    for fs in sorted(view.filesystems, key=objects.name):
        found = relaxed_mds_term(fs)
        if found is None:
            continue
        index, term = found
        base = "/spec/metadataServer/placement/podAntiAffinity"
        affinity = _get(fs, "spec", "metadataServer", "placement", "podAntiAffinity")
        preferred = list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
        del preferred[index]
        ops = (
            _guard(fs),
            {"op": "add", "path": f"{base}/requiredDuringSchedulingIgnoredDuringExecution", "value": [term]},
            {
                "op": "add",
                "path": f"{base}/preferredDuringSchedulingIgnoredDuringExecution",
                "value": preferred,
            },
        )
        return PatchRook(
            CEPH_FILESYSTEMS,
            namespace,
            objects.name(fs),
            ops,
            "MDSPlacement",
            f"CephFilesystem {objects.name(fs)}: MDS anti-affinity on {HOSTNAME} made required "
            f"({ready} Ready nodes)",
        )
    return None


def csi_outdated(config: Obj) -> list[str]:
    """The CSI resource keys of rook-ceph-operator-config that differ from Rook's recommendation."""
    data = config.get("data") or {}
    outdated = []
    for key, wanted in CSI_RESOURCES.items():
        try:
            current = yaml.safe_load(data.get(key) or "")
        except yaml.YAMLError:
            current = None
        if current != wanted:
            outdated.append(key)
    return outdated


def _csi_step(namespace: str, view: RookView, ready: int) -> PatchRook | None:
    config = view.operator_config
    if ready < CSI_MIN_NODES or config is None or not csi_outdated(config):
        return None
    ops: list[Mapping[str, Any]] = [_guard(config)]
    if not config.get("data"):
        ops.append({"op": "add", "path": "/data", "value": {}})
    for key, wanted in CSI_RESOURCES.items():
        ops.append({"op": "add", "path": f"/data/{key}", "value": yaml.safe_dump(wanted, sort_keys=False)})
    return PatchRook(
        CONFIGMAPS,
        namespace,
        OPERATOR_CONFIG,
        tuple(ops),
        "CephCSIResources",
        f"set Rook's recommended Ceph CSI provisioner and plugin requests and limits in "
        f"{OPERATOR_CONFIG} ({ready} Ready nodes)",
    )


def plan(spec: MaintenancePolicySpec, view: RookView | None) -> PatchRook | Wait | None:
    """The next Rook change; a Wait when only a pool change is left and Ceph is unhealthy."""
    if view is None or not view.clusters:
        return None
    namespace = spec.rook_namespace
    nodes_ready = len(rook_nodes(spec, view))
    held: Wait | None = None
    if not spec.rook_should_use_all_nodes:
        step = _storage_step(spec, namespace, view)
        if step is not None:
            return step
        ready, listed = counts(view)
        pool = _pool_step(spec, namespace, view, ready, listed)
        if pool is not None:
            unhealthy = _health(view)
            if unhealthy is None:
                return pool
            held = Wait(f"pool replication waits: {unhealthy}, not {HEALTH_OK} ({pool.message})", POLL)
        step = _count_step(namespace, view, ready)
        if step is not None:
            return step
    if not spec.rook_should_disable_reconcile_mds_placement:
        step = _mds_step(namespace, view, nodes_ready)
        if step is not None:
            return step
    if not spec.rook_should_disable_reconcile_ceph_csi_resources:
        step = _csi_step(namespace, view, nodes_ready)
        if step is not None:
            return step
    return held


def status(spec: MaintenancePolicySpec, view: RookView | None) -> RookStatus | None:
    if view is None or not view.clusters:
        return None
    ready, listed = counts(view)
    managed = not spec.rook_should_use_all_nodes
    step = plan(spec, view)
    if isinstance(step, Wait):
        message = step.reason
    elif isinstance(step, PatchRook):
        message = f"next: {step.message}"
    else:
        message = "Rook follows the nodes" if managed else "Rook uses all nodes (rookShouldUseAllNodes)"
    if (
        not spec.rook_should_disable_reconcile_ceph_csi_resources
        and view.operator_config is None
        and len(rook_nodes(spec, view)) >= CSI_MIN_NODES
    ):
        message += f"; no ConfigMap {OPERATOR_CONFIG} in {spec.rook_namespace} for the CSI resources"
    return RookStatus(
        ready_storage_nodes=ready if managed else None,
        listed_storage_nodes=listed if managed else None,
        pool_replication=_clamp(spec, ready) if managed else None,
        message=message[:1000],
    )
