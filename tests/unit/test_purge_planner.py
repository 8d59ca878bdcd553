"""The purge's planner, decision by decision: what a dead node's purge does next, from what was
observed of the Node, Rook and kubeadm's control plane."""

from __future__ import annotations

from dataclasses import replace

from kustos.maintenance import purge_planner as pp
from kustos.maintenance.purge_planner import ControlPlaneView, NodeView, Observed

WORKER = NodeView("w", "uid-w", control_plane=False)
CONTROL = NodeView("c", "uid-c", control_plane=True)
KUBEADM = ControlPlaneView(
    kubeadm_config=True, resource_version="7", external_etcd=False, annotated_apiservers=False,
    cluster_status_without_node="apiEndpoints: {}\n", address="10.0.0.3", address_source="ClusterStatus",
    remaining=("10.0.0.1", "10.0.0.2"),
)  # fmt: skip
ALL_ROOK = (pp.ROOK_NODES, pp.ROOK_OSDS, pp.CEPH_PURGE)


def rook(node: NodeView, **kw: object) -> Observed:
    return replace(Observed(node, maintain_rook=True, toolbox=True), **kw)


def test_a_gone_node_is_the_end() -> None:
    assert pp.plan(Observed(None)) == pp.Gone()
    assert pp.plan(Observed(None, maintain_rook=True)) == pp.Gone()


def test_a_worker_without_rook_is_deleted_guarded_by_its_uid() -> None:
    assert pp.plan(Observed(WORKER)) == pp.DeleteNode("uid-w")


def test_rook_comes_first_the_node_leaves_the_ceph_clusters() -> None:
    assert pp.plan(rook(WORKER)) == pp.RemoveStorageNode()


def test_osd_ids_are_recorded_before_their_deployments_go() -> None:
    node = replace(WORKER, done=(pp.ROOK_NODES,))
    found = (("rook-ceph-osd-10", "10"), ("rook-ceph-osd-2", "2"))
    assert pp.plan(rook(node, osd_deployments=found)) == pp.DeleteOSDs(
        ("2", "10"), ("rook-ceph-osd-10", "rook-ceph-osd-2")
    )
    # Recorded already (a pass cut short after the record): not recorded again.
    recorded = replace(node, recorded_osds=("2", "10"))
    assert pp.plan(rook(recorded, osd_deployments=found)).record is None  # type: ignore[union-attr]
    # Deployments gone, the record kept: nothing forgotten, nothing left to delete.
    assert pp.plan(rook(recorded)) == pp.DeleteOSDs(None, ())
    # A new OSD seen after the record: the record grows (the union, in OSD order).
    grown = rook(replace(node, recorded_osds=("2",)), osd_deployments=found)
    assert pp.plan(grown).record == ("2", "10")  # type: ignore[union-attr]


def test_without_a_toolbox_the_ceph_purge_is_refused_with_the_commands_to_run_by_hand() -> None:
    node = replace(WORKER, done=(pp.ROOK_NODES, pp.ROOK_OSDS), recorded_osds=("4",))
    step = pp.plan(rook(node, toolbox=False))
    assert isinstance(step, pp.Refuse) and step.step == pp.CEPH_PURGE
    assert "run by hand" in step.message and "ceph osd purge 4 --yes-i-really-mean-it" in step.message
    assert "rook-ceph" in step.message  # where to start the toolbox


def test_the_ceph_commands_run_one_per_pass_from_the_recorded_count() -> None:
    node = replace(WORKER, done=(pp.ROOK_NODES, pp.ROOK_OSDS), recorded_osds=("4",))
    assert pp.plan(rook(node)) == pp.RunCephCommand(("ceph", "osd", "down", "osd.4"), 0, 3)
    assert pp.plan(rook(replace(node, ceph_commands_run=2))) == pp.RunCephCommand(
        ("ceph", "osd", "crush", "rm", "w"), 2, 3
    )
    # A count beyond the list (the OSDs recorded changed): the last command, not an index error.
    assert pp.plan(rook(replace(node, ceph_commands_run=9))).index == 2  # type: ignore[union-attr]
    # No OSDs: the host still leaves the CRUSH map.
    assert pp.plan(rook(replace(node, recorded_osds=()))) == pp.RunCephCommand(
        ("ceph", "osd", "crush", "rm", "w"), 0, 1
    )


def test_after_rook_a_worker_is_deleted() -> None:
    assert pp.plan(rook(replace(WORKER, done=ALL_ROOK))) == pp.DeleteNode("uid-w")


def test_a_control_plane_node_records_its_address_first() -> None:
    assert pp.plan(Observed(CONTROL, control_plane=KUBEADM)) == pp.RecordAddress("10.0.0.3", "ClusterStatus")
    nowhere = replace(KUBEADM, address=None, address_source="Node")
    assert pp.plan(Observed(CONTROL, control_plane=nowhere)) == pp.RecordAddress(None, "Node")


def test_its_endpoint_leaves_the_cluster_status_guarded_by_the_version_read() -> None:
    at_endpoint = replace(CONTROL, done=(pp.ADDRESS,))
    assert pp.plan(Observed(at_endpoint, control_plane=KUBEADM)) == pp.RemoveEndpoint(
        "apiEndpoints: {}\n", "7"
    )


def test_an_endpoint_with_nothing_to_remove_is_skipped_saying_why() -> None:
    at_endpoint = replace(CONTROL, done=(pp.ADDRESS,))
    unlisted = pp.plan(
        Observed(at_endpoint, control_plane=replace(KUBEADM, cluster_status_without_node=None))
    )
    assert (
        isinstance(unlisted, pp.Skip) and unlisted.step == pp.ENDPOINT and "kubeadm 1.22" in unlisted.message
    )
    no_kubeadm = replace(KUBEADM, kubeadm_config=False, cluster_status_without_node=None)
    skipped = pp.plan(Observed(at_endpoint, control_plane=no_kubeadm))
    assert isinstance(skipped, pp.Skip) and "not a kubeadm control plane" in skipped.message


def test_the_etcd_member_is_removed_by_the_recorded_address_through_the_others() -> None:
    at_etcd = replace(CONTROL, done=(pp.ADDRESS, pp.ENDPOINT), recorded_address="10.0.0.9")
    assert pp.plan(Observed(at_etcd, control_plane=KUBEADM)) == pp.RemoveEtcdMember(
        "10.0.0.9", ("10.0.0.1", "10.0.0.2")
    )
    # Nothing recorded (no address was found then): the address found now, else by name alone.
    unrecorded = replace(at_etcd, recorded_address=None)
    assert pp.plan(Observed(unrecorded, control_plane=KUBEADM)).address == "10.0.0.3"  # type: ignore[union-attr]
    unknown = replace(KUBEADM, address=None)
    assert pp.plan(Observed(unrecorded, control_plane=unknown)).address == ""  # type: ignore[union-attr]


def test_no_stacked_member_is_skipped_external_etcd_or_no_kubeadm() -> None:
    at_etcd = replace(CONTROL, done=(pp.ADDRESS, pp.ENDPOINT))
    external = pp.plan(Observed(at_etcd, control_plane=replace(KUBEADM, external_etcd=True)))
    assert isinstance(external, pp.Skip) and external.step == pp.ETCD and "external" in external.message
    bare = replace(KUBEADM, kubeadm_config=False)
    skipped = pp.plan(Observed(at_etcd, control_plane=bare))
    assert isinstance(skipped, pp.Skip) and "no stacked etcd member" in skipped.message
    # kubeadm 1.22+: no ClusterStatus, but annotated API server pods say it is kubeadm's.
    annotated = replace(bare, annotated_apiservers=True)
    assert isinstance(pp.plan(Observed(at_etcd, control_plane=annotated)), pp.RemoveEtcdMember)


def test_the_node_goes_last_and_a_finished_record_still_deletes_it() -> None:
    every = replace(CONTROL, done=pp.STEPS[:-1])
    assert pp.plan(Observed(every, maintain_rook=True)) == pp.DeleteNode("uid-c")
    assert pp.pending(every, True) == pp.NODE


def test_what_is_observed_follows_the_step_the_purge_is_at() -> None:
    assert pp.pending(None, True) is None
    assert pp.pending(WORKER, True) == pp.ROOK_NODES
    assert pp.pending(replace(CONTROL, done=ALL_ROOK), True) == pp.ADDRESS
    assert pp.pending(replace(CONTROL, done=ALL_ROOK), False) == pp.ADDRESS
    assert pp.pending(CONTROL, False) == pp.ADDRESS
