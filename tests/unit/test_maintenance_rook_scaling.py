"""Rook follows the nodes (rook_scaling): the planner's steps, applied one per pass."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.maintenance import planner, rook_scaling
from kustos.maintenance.planner import NodeView, Observed
from kustos.maintenance.rook_scaling import CSI_RESOURCES, PatchRook, RookNode, RookView
from kustos.runtime.steps import Done, Wait

MANAGED = {"rookShouldUseAllNodes": False}


def spec(**fields: Any) -> MaintenancePolicySpec:
    return MaintenancePolicySpec.model_validate({**MANAGED, **fields})


def cluster(nodes: list[str], health: str | None = "HEALTH_OK", mon: int = 1, mgr: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "rook-ceph", "resourceVersion": "1"},
        "spec": {
            "mon": {"count": mon},
            "mgr": {"count": mgr},
            "storage": {"useAllNodes": True, "nodes": [{"name": n} for n in nodes]},
        },
        "status": {"ceph": {"health": health}} if health else {},
    }


def block_pool(size: int, safe: bool | None = None) -> dict[str, Any]:
    replicated: dict[str, Any] = {"size": size}
    if safe is not None:
        replicated["requireSafeReplicaSize"] = safe
    return {"metadata": {"name": "replicapool", "resourceVersion": "1"}, "spec": {"replicated": replicated}}


def filesystem(size: int, relaxed: bool = True) -> dict[str, Any]:
    mds = {
        "labelSelector": {"matchLabels": {"app": "rook-ceph-mds"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    zone = {"weight": 100, "podAffinityTerm": {**mds, "topologyKey": "topology.kubernetes.io/zone"}}
    affinity: dict[str, Any] = (
        {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": mds}, zone]}
        if relaxed
        else {"requiredDuringSchedulingIgnoredDuringExecution": [mds]}
    )
    return {
        "metadata": {"name": "rook-shared-fs", "resourceVersion": "1"},
        "spec": {
            "metadataPool": {"replicated": {"size": size}},
            "dataPools": [{"replicated": {"size": size}}],
            "metadataServer": {"activeCount": 1, "placement": {"podAntiAffinity": affinity}},
        },
    }


def nodes(*names: str, ready: bool = True, labels: Mapping[str, str] | None = None) -> tuple[RookNode, ...]:
    return tuple(RookNode(n, ready, tuple(sorted((labels or {}).items()))) for n in names)


def apply(obj: dict[str, Any], step: PatchRook) -> dict[str, Any]:
    """The JSON patch operations the planner uses (test, add, replace), as the API server applies them."""
    obj = copy.deepcopy(obj)
    for op in step.patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent: Any = obj
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        key: Any = int(parts[-1]) if isinstance(parent, list) else parts[-1]
        if op["op"] == "test":
            assert parent[key] == op["value"], op
        else:
            assert op["op"] in ("add", "replace")
            parent[key] = copy.deepcopy(op["value"])
    obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    return obj


def run(s: MaintenancePolicySpec, view: RookView, limit: int = 30) -> tuple[RookView, list[str]]:
    """Plan and apply until nothing is left: the view at rest and each step's action."""
    kinds = {
        "CephCluster": "clusters",
        "CephBlockPool": "block_pools",
        "CephFilesystem": "filesystems",
        "CephObjectStore": "object_stores",
    }
    actions = []
    for _ in range(limit):
        step = rook_scaling.plan(s, view)
        if not isinstance(step, PatchRook):
            return view, actions
        actions.append(step.action)
        if step.ref.kind == "ConfigMap":
            assert view.operator_config is not None
            view = RookView(**{**view.__dict__, "operator_config": apply(dict(view.operator_config), step)})
            continue
        field = kinds[step.ref.kind]
        changed = tuple(
            apply(dict(o), step) if o["metadata"]["name"] == step.name else o for o in getattr(view, field)
        )
        view = RookView(**{**view.__dict__, field: changed})
    raise AssertionError(f"no rest after {limit} steps: {actions}")


def sizes(view: RookView) -> list[int]:
    return [int(p.replicated["size"]) for p in rook_scaling.pools(view)]


def test_joining_nodes_are_added_then_pools_mons_and_mgrs_rise_one_step_at_a_time() -> None:
    s = spec(rookStorageNodeDevices=["sdb"])
    view = RookView(
        clusters=(cluster(["a"]),),
        block_pools=(block_pool(1),),
        filesystems=(filesystem(1),),
        nodes=nodes("a", "b", "c"),
    )
    end, actions = run(s, view)
    assert rook_scaling.storage_names(end.clusters[0]) == ["a", "b", "c"]
    added = end.clusters[0]["spec"]["storage"]
    assert added["useAllNodes"] is False
    assert added["nodes"][1] == {"name": "b", "devices": [{"name": "sdb"}]}
    assert sizes(end) == [3, 3, 3]
    assert (end.clusters[0]["spec"]["mon"]["count"], end.clusters[0]["spec"]["mgr"]["count"]) == (3, 2)
    # Nodes first, then each pool one replica per step, the daemon counts, the MDS placement.
    assert actions == ["RookStorageNode"] * 2 + ["CephPoolReplication"] * 6 + [
        "CephMonCount",
        "CephMgrCount",
        "MDSPlacement",
    ]


def test_replication_stays_between_min_and_max() -> None:
    s = spec(minCephPoolReplication=2, maxCephPoolReplication=2)
    view = RookView(
        clusters=(cluster(["a", "b", "c", "d"]),),
        block_pools=(block_pool(1),),
        nodes=nodes("a", "b", "c", "d"),
    )
    end, _ = run(s, view)
    assert sizes(end) == [2]
    lone = RookView(clusters=(cluster(["a"]),), block_pools=(block_pool(1),), nodes=nodes("a"))
    assert sizes(run(s, lone)[0]) == [2]


def test_a_node_not_ready_lowers_nothing_its_purge_lowers_only_block_pools() -> None:
    s = spec()
    three = ("a", "b", "c")
    down = (*nodes("a", "b"), *nodes("c", ready=False))
    view = RookView(
        clusters=(cluster(list(three), mon=3, mgr=2),),
        block_pools=(block_pool(3),),
        filesystems=(filesystem(3, relaxed=False),),
        nodes=down,
    )
    assert rook_scaling.plan(s, view) is None
    # The purge took c out of storage.nodes: the block pool follows, the filesystem keeps 3.
    purged = RookView(**{**view.__dict__, "clusters": (cluster(["a", "b"], mon=3, mgr=2),)})
    end, actions = run(s, purged)
    assert sizes(end) == [2, 3, 3]
    assert actions == ["CephPoolReplication"]
    assert end.clusters[0]["spec"]["mon"]["count"] == 3  # never lowered


def test_size_one_turns_require_safe_replica_size_off_and_back_on() -> None:
    s = spec()
    view = RookView(clusters=(cluster(["a"]),), block_pools=(block_pool(2, safe=True),), nodes=nodes("a"))
    step = rook_scaling.plan(s, view)
    assert isinstance(step, PatchRook)
    lowered = apply(dict(view.block_pools[0]), step)
    assert lowered["spec"]["replicated"] == {"size": 1, "requireSafeReplicaSize": False}
    grown = RookView(clusters=(cluster(["a", "b"]),), block_pools=(lowered,), nodes=nodes("a", "b"))
    end, _ = run(s, grown)
    assert end.block_pools[0]["spec"]["replicated"] == {"size": 2, "requireSafeReplicaSize": True}


def test_an_unhealthy_ceph_holds_pool_changes_but_not_nodes_or_counts() -> None:
    s = spec()
    view = RookView(
        clusters=(cluster(["a"], health="HEALTH_WARN"),), block_pools=(block_pool(1),), nodes=nodes("a", "b")
    )
    end, actions = run(s, view)
    assert actions == ["RookStorageNode", "CephMgrCount"]
    assert sizes(end) == [1]
    held = rook_scaling.plan(s, end)
    assert isinstance(held, Wait)
    assert "HEALTH_WARN" in held.reason and "size 1 -> 2" in held.reason
    status = rook_scaling.status(s, end)
    assert status is not None and "pool replication waits" in status.message
    unknown = RookView(**{**end.__dict__, "clusters": (cluster(["a", "b"], health=None, mgr=2),)})
    said = rook_scaling.plan(s, unknown)
    assert isinstance(said, Wait) and "no health yet" in said.reason


def test_use_all_nodes_leaves_storage_pools_and_counts_alone() -> None:
    s = MaintenancePolicySpec()  # rookShouldUseAllNodes: true, EKCO's default
    view = RookView(
        clusters=(cluster(["a"]),),
        block_pools=(block_pool(1),),
        filesystems=(filesystem(1, False),),
        nodes=nodes("a", "b", "c"),
    )
    assert rook_scaling.plan(s, view) is None


def test_only_labelled_nodes_and_never_one_being_purged_join() -> None:
    s = spec(rookStorageNodesLabel="storage=ceph")
    view = RookView(
        clusters=(cluster(["a"]),),
        nodes=(
            *nodes("a", "b"),
            *nodes("c", labels={"storage": "ceph"}),
            RookNode("d", True, (("storage", "ceph"),), purging=True),
        ),
    )
    end, _ = run(s, view)
    assert rook_scaling.storage_names(end.clusters[0]) == ["a", "c"]


def test_mds_anti_affinity_becomes_required_with_a_second_node() -> None:
    s = MaintenancePolicySpec()
    one = RookView(clusters=(cluster(["a"]),), filesystems=(filesystem(1),), nodes=nodes("a"))
    assert rook_scaling.plan(s, one) is None
    two = RookView(**{**one.__dict__, "nodes": nodes("a", "b")})
    end, actions = run(s, two)
    assert actions == ["MDSPlacement"]
    affinity = end.filesystems[0]["spec"]["metadataServer"]["placement"]["podAntiAffinity"]
    assert [t["topologyKey"] for t in affinity["requiredDuringSchedulingIgnoredDuringExecution"]] == [
        "kubernetes.io/hostname"
    ]
    preferred = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in preferred] == ["topology.kubernetes.io/zone"]
    off = spec(rookShouldDisableReconcileMDSPlacement=True, rookShouldUseAllNodes=True)
    assert rook_scaling.plan(off, two) is None


def test_csi_resources_from_three_nodes_on_as_parsed_yaml() -> None:
    s = MaintenancePolicySpec()
    config = {
        "metadata": {"name": "rook-ceph-operator-config", "resourceVersion": "1"},
        "data": {"ROOK_LOG_LEVEL": "INFO"},
    }
    two = RookView(clusters=(cluster(["a"]),), operator_config=config, nodes=nodes("a", "b"))
    assert rook_scaling.plan(s, two) is None
    three = RookView(**{**two.__dict__, "nodes": nodes("a", "b", "c")})
    end, actions = run(s, three)
    assert actions == ["CephCSIResources"]
    assert end.operator_config is not None
    data = end.operator_config["data"]
    assert data["ROOK_LOG_LEVEL"] == "INFO"
    rbd = yaml.safe_load(data["CSI_RBD_PLUGIN_RESOURCE"])
    assert {c["name"]: c["resource"]["requests"]["memory"] for c in rbd}["csi-rbdplugin"] == "512Mi"
    # Written differently but equal: no patch.
    reformatted = {k: yaml.safe_dump(v, default_flow_style=True) for k, v in CSI_RESOURCES.items()}
    same = RookView(**{**three.__dict__, "operator_config": {**config, "data": reformatted}})
    assert rook_scaling.plan(s, same) is None
    off = spec(rookShouldUseAllNodes=True, rookShouldDisableReconcileCephCSIResources=True)
    assert rook_scaling.plan(off, three) is None


@given(
    st.integers(1, 7),
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 6),
)
def test_pool_sizes_end_between_min_and_max_and_follow_the_nodes(
    count: int, low: int, span: int, start: int
) -> None:
    s = spec(minCephPoolReplication=low, maxCephPoolReplication=low + span - 1)
    names = [f"n{i}" for i in range(count)]
    view = RookView(
        clusters=(cluster(names),),
        block_pools=(block_pool(start),),
        filesystems=(filesystem(start),),
        nodes=nodes(*names),
    )
    end, _ = run(s, view, limit=80)
    target = max(low, min(low + span - 1, count))
    block, *others = sizes(end)
    assert block == target
    assert all(size == max(start, target) for size in others)  # filesystems never lower


def test_the_policy_records_each_rook_step_and_says_what_waits() -> None:
    s = spec()
    view = RookView(
        clusters=(cluster(["a"], health="HEALTH_ERR"),), block_pools=(block_pool(1),), nodes=nodes("a", "b")
    )
    views = (NodeView("a", True), NodeView("b", True))
    observed = Observed(spec=s, nodes=views, rook=view)
    step = planner.plan(observed)
    assert isinstance(step, PatchRook) and step.action == "RookStorageNode"
    status = planner.status(observed, step, observed.now)
    assert status.last_action is not None
    assert (status.last_action.action, status.last_action.outcome) == ("RookStorageNode", "Done")
    assert "added node b" in status.last_action.message
    assert [n.reason for n in planner.action_notes(observed.previous, status)] == ["RookStorageNode"]
    rest, _ = run(s, view)
    waiting = Observed(spec=s, nodes=views, rook=rest)
    held = planner.plan(waiting)
    assert isinstance(held, Wait) and "HEALTH_ERR" in held.reason
    said = planner.status(waiting, held, waiting.now).rook
    assert said is not None and said.ready_storage_nodes == 2 and said.pool_replication == 2
    assert isinstance(planner.plan(Observed(spec=s, nodes=views)), Done)


def test_min_above_max_is_refused_naming_both_fields() -> None:
    with pytest.raises(ValueError, match=r"minCephPoolReplication .* maxCephPoolReplication"):
        spec(minCephPoolReplication=3, maxCephPoolReplication=2)
