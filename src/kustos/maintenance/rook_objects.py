"""Reads Rook's objects for rook_scaling's planner and applies its one patch (the I/O half)."""

from __future__ import annotations

from collections.abc import Sequence

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.maintenance.rook_scaling import (
    CEPH_BLOCK_POOLS,
    CEPH_CLUSTERS,
    CEPH_FILESYSTEMS,
    CEPH_OBJECT_STORES,
    OPERATOR_CONFIG,
    Obj,
    PatchRook,
    RookNode,
    RookView,
)
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.refs import ResourceRef
from kustos.runtime.resources import CONFIGMAPS


async def _list(api: Api, ref: ResourceRef, namespace: str) -> tuple[Obj, ...]:
    try:
        return tuple(await api.list_objects(ref, namespace))
    except ApiStatusError as err:
        if err.not_found:  # that Rook CRD is not installed
            return ()
        raise


async def observe(api: Api, spec: MaintenancePolicySpec, nodes: Sequence[RookNode]) -> RookView | None:
    """Rook's objects in rookNamespace, read on every pass (no watch: a change of theirs is seen
    within a resync, a held pool change looks again every few seconds); None when nothing of
    Rook is maintained."""
    if (
        spec.rook_should_use_all_nodes
        and spec.rook_should_disable_reconcile_mds_placement
        and spec.rook_should_disable_reconcile_ceph_csi_resources
    ):
        return None
    namespace = spec.rook_namespace
    clusters = await _list(api, CEPH_CLUSTERS, namespace)
    if not clusters:
        return RookView(nodes=tuple(nodes))
    managed = not spec.rook_should_use_all_nodes
    return RookView(
        clusters=clusters,
        block_pools=await _list(api, CEPH_BLOCK_POOLS, namespace) if managed else (),
        filesystems=await _list(api, CEPH_FILESYSTEMS, namespace)
        if managed or not spec.rook_should_disable_reconcile_mds_placement
        else (),
        object_stores=await _list(api, CEPH_OBJECT_STORES, namespace) if managed else (),
        operator_config=None
        if spec.rook_should_disable_reconcile_ceph_csi_resources
        else await api.get(CONFIGMAPS, namespace, OPERATOR_CONFIG),
        nodes=tuple(nodes),
    )


async def act(api: Api, step: PatchRook) -> None:
    await api.patch(step.ref, step.namespace, step.name, [dict(op) for op in step.patch], kind="json")
