"""The StorageUpgrade planner: every step, resumption from any point, deletion, failures."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kustos.api.storageupgrade import StorageUpgradeStatus
from kustos.runtime.errors import ReconcileError
from kustos.storage import upgrade_planner as up
from kustos.storage.upgrade_planner import (
    ClaimView,
    ClusterView,
    DaemonSetView,
    NodePodView,
    Observed,
    VolumeMatch,
    WorkloadView,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OLD, NEW = "store/node:1", "store/node:2"
ME = "ns/up"


def ds(image: str = OLD, pods: tuple[NodePodView, ...] | None = None, **kw: Any) -> DaemonSetView:
    if pods is None:
        pods = tuple(NodePodView(f"n{i}", image, True) for i in range(3))
    return DaemonSetView("storage", "c-node", image, desired=3, pods=pods, **kw)


def observed(step: Any, **kw: Any) -> Observed:
    base = Observed(
        upgrade=ME, new_image=NEW, step=step, now=NOW, step_started=NOW,
        cluster=ClusterView("c", OLD, maintenance="up", reports_maintenance=True), maintenance_value="up",
        daemon_set=ds(),
    )  # fmt: skip
    return replace(base, **kw)


def test_starts_with_the_pull() -> None:
    o = observed(None, cluster=ClusterView("c", OLD))
    assert up.plan(o) == up.Advance("PullImage")


def test_pull_creates_the_job_then_waits_then_advances() -> None:
    assert up.plan(observed("PullImage")) == up.CreatePullJob()
    assert isinstance(up.plan(observed("PullImage", pull_job_exists=True)), up.Wait)
    done = observed("PullImage", pull_job_exists=True, pull_job_completed=True)
    assert up.plan(done) == up.Advance("PauseClusterCtrl")


def test_a_failed_pull_job_fails_at_once() -> None:
    o = observed("PullImage", pull_job_exists=True, pull_job_failure="spec.nodeSelectorTerms[0]: bad")
    step = up.plan(o)
    assert isinstance(step, up.Fail) and "spec.nodeSelectorTerms[0]: bad" in step.reason


def test_pull_times_out() -> None:
    o = observed("PullImage", pull_job_exists=True, step_started=NOW - timedelta(minutes=11))
    step = up.plan(o)
    assert isinstance(step, up.Fail) and NEW in step.reason


def test_pause_removes_the_job_sets_maintenance_and_waits_for_the_cluster() -> None:
    free = ClusterView("c", OLD)
    assert up.plan(observed("PauseClusterCtrl", pull_job_exists=True, cluster=free)) == up.DeletePullJob()
    assert up.plan(observed("PauseClusterCtrl", cluster=free)) == up.SetMaintenance()
    waiting = ClusterView("c", OLD, maintenance="up")
    assert isinstance(up.plan(observed("PauseClusterCtrl", cluster=waiting)), up.Wait)
    assert up.plan(observed("PauseClusterCtrl")) == up.Advance("ScaleDown")


def test_another_upgrade_holding_the_cluster_blocks() -> None:
    other = ClusterView("c", OLD, maintenance="someone-else")
    step = up.plan(observed("PullImage", cluster=other))
    assert isinstance(step, up.Wait) and "someone-else" in step.reason


def test_missing_cluster_waits() -> None:
    assert isinstance(up.plan(observed(None, cluster=None)), up.Wait)


def test_scale_down_remembers_then_waits_for_pods_then_records() -> None:
    a = WorkloadView("Deployment", "app", "a", 2, pods=2)
    b = WorkloadView("StatefulSet", "app", "b", 3, pods=3)
    unrelated = WorkloadView("Deployment", "app", "z", 5, uses_cluster=False, pods=5)
    step = up.plan(observed("ScaleDown", workloads=(b, a, unrelated)))
    assert step == up.ScaleDown(a, 2)
    a2 = replace(a, replicas=0, remembered=2, owner=ME)
    assert up.plan(observed("ScaleDown", workloads=(a2, b, unrelated))) == up.ScaleDown(b, 3)
    b2 = replace(b, replicas=0, remembered=3, owner=ME)
    step = up.plan(observed("ScaleDown", workloads=(a2, b2, unrelated)))
    assert isinstance(step, up.Wait) and "5 pod(s)" in step.reason
    gone = (replace(a2, pods=0), replace(b2, pods=0), unrelated)
    step = up.plan(observed("ScaleDown", workloads=gone))
    assert isinstance(step, up.Advance) and step.to == "RollNodes"
    assert [(w.kind, w.name, w.replicas) for w in step.workloads] == [
        ("Deployment", "a", 2),
        ("StatefulSet", "b", 3),
    ]


def test_pods_that_never_go_fail_the_upgrade_after_the_timeout() -> None:
    stuck = WorkloadView("Deployment", "app", "a", 0, remembered=2, owner=ME, pods=1)
    late = NOW - timedelta(minutes=11)
    step = up.plan(observed("ScaleDown", workloads=(stuck,), step_started=late))
    assert isinstance(step, up.Fail) and "1 pod(s)" in step.reason


def test_a_remembered_count_is_never_overwritten() -> None:
    # Killed after the patch: replicas is 0 and the annotation holds the truth.
    scaled = WorkloadView("Deployment", "app", "a", 0, remembered=4, owner=ME)
    assert isinstance(up.plan(observed("ScaleDown", workloads=(scaled,))), up.Advance)
    # Someone scaled it back up meanwhile: scale down again, keep the first count.
    bumped = replace(scaled, replicas=1)
    assert up.plan(observed("ScaleDown", workloads=(bumped,))) == up.ScaleDown(bumped, 4)


def test_roll_patches_waits_for_every_pod_then_advances() -> None:
    assert up.plan(observed("RollNodes")) == up.PatchDaemonSet(NEW)
    patched = ds(NEW, pods=(NodePodView("n0", OLD, True), NodePodView("n1", NEW, False)))
    step = up.plan(observed("RollNodes", daemon_set=patched))
    assert isinstance(step, up.Wait) and "0/3" in step.reason
    assert isinstance(up.plan(observed("RollNodes", daemon_set=ds(NEW, generation=2))), up.Wait)
    assert up.plan(observed("RollNodes", daemon_set=ds(NEW))) == up.Advance("ScaleUp")


def test_roll_deletes_old_pods_itself_with_on_delete() -> None:
    old = ds(NEW, pods=(NodePodView("n0", OLD, True), NodePodView("n1", NEW, True)), on_delete=True)
    assert up.plan(observed("RollNodes", daemon_set=old)) == up.DeleteNodePod("n0")


def test_roll_fails_after_the_timeout_and_without_daemonset() -> None:
    late = NOW - timedelta(minutes=30)
    stuck = ds(NEW, pods=(NodePodView("n0", NEW, False),))
    assert isinstance(up.plan(observed("RollNodes", daemon_set=stuck, step_started=late)), up.Fail)
    assert isinstance(up.plan(observed("RollNodes", daemon_set=None)), up.Wait)
    assert isinstance(up.plan(observed("RollNodes", daemon_set=None, step_started=late)), up.Fail)


def test_scale_up_restores_then_sets_the_cluster_image_then_completes() -> None:
    a = WorkloadView("Deployment", "app", "a", 0, remembered=2, owner=ME)
    foreign = WorkloadView("Deployment", "app", "f", 0, remembered=7, owner="other/up")
    assert up.plan(observed("ScaleUp", workloads=(a, foreign))) == up.ScaleUp(a, 2)
    restored = replace(a, replicas=2, remembered=None, owner=None)
    assert up.plan(observed("ScaleUp", workloads=(restored, foreign))) == up.SetClusterImage(NEW)
    cluster = ClusterView("c", NEW, maintenance="up", reports_maintenance=True)
    assert up.plan(observed("ScaleUp", workloads=(restored,), cluster=cluster)) == up.Advance("Completed")


def test_finished_upgrades_do_nothing() -> None:
    assert up.plan(observed("Completed")) == up.Done()
    assert up.plan(observed("Failed")) == up.Done()


def test_deletion_restores_workloads_then_leaves_maintenance_then_releases() -> None:
    a = WorkloadView("Deployment", "app", "a", 0, remembered=2, owner=ME)
    assert up.plan(observed("RollNodes", deleting=True, workloads=(a,))) == up.ScaleUp(a, 2)
    assert up.plan(observed("Completed", deleting=True)) == up.ClearMaintenance()
    other = ClusterView("c", NEW, maintenance="another")
    assert up.plan(observed("Completed", deleting=True, cluster=other)) == up.Release()
    assert up.plan(observed("Completed", deleting=True, cluster=None)) == up.Release()


def test_step_order() -> None:
    assert up.next_step("PullImage") == "PauseClusterCtrl"
    assert up.next_step("ScaleUp") == "Completed"


# ---- a whole upgrade, simulated, killed anywhere ---------------------------------------------------


class World:
    """A tiny model of the cluster that carries out steps the way the controller does."""

    def __init__(self) -> None:
        self.step: Any = None
        self.pull_job = (False, False)
        self.maintenance: str | None = None
        self.node_image = OLD
        self.ds_image = OLD
        self.workloads = {
            ("Deployment", "app", "a"): [2, None, None],
            ("Deployment", "app", "b"): [1, None, None],
            ("StatefulSet", "app", "s"): [3, None, None],
        }
        self.events: list[str] = []

    def observe(self) -> Observed:
        cluster = ClusterView("c", self.node_image, self.maintenance, self.maintenance == "up")
        loads = tuple(
            WorkloadView(k[0], k[1], k[2], v[0], v[1], v[2], pods=v[0]) for k, v in self.workloads.items()
        )
        return Observed(
            upgrade=ME, new_image=NEW, step=self.step, now=NOW, step_started=NOW, cluster=cluster,
            maintenance_value="up", pull_job_exists=self.pull_job[0], pull_job_completed=self.pull_job[1],
            workloads=loads, daemon_set=ds(self.ds_image),
        )  # fmt: skip

    def act(self, step: up.Step) -> None:
        match step:
            case up.Advance(to=to):
                self.step = to
                self.events.append(to)
            case up.CreatePullJob():
                self.pull_job = (True, True)  # the job completes at once here
            case up.DeletePullJob():
                self.pull_job = (False, False)
            case up.SetMaintenance():
                self.maintenance = "up"
            case up.ScaleDown(workload=w, remember=n):
                self.workloads[w.key] = [0, n, ME]
            case up.PatchDaemonSet(image=image):
                self.ds_image = image
            case up.ScaleUp(workload=w, replicas=n):
                self.workloads[w.key] = [n, None, None]
            case up.SetClusterImage(image=image):
                self.node_image = image
            case _:
                raise AssertionError(f"unexpected {step}")


def run(world: World, limit: int = 100) -> None:
    for _ in range(limit):
        step = up.plan(world.observe())
        if isinstance(step, up.Done):
            return
        world.act(step)
    raise AssertionError("no convergence")


def test_a_whole_upgrade_restores_exact_replicas() -> None:
    world = World()
    run(world)
    assert world.step == "Completed" and world.node_image == NEW and world.ds_image == NEW
    assert {k: v[0] for k, v in world.workloads.items()} == {
        ("Deployment", "app", "a"): 2, ("Deployment", "app", "b"): 1, ("StatefulSet", "app", "s"): 3,
    }  # fmt: skip
    assert world.events == ["PullImage", "PauseClusterCtrl", "ScaleDown", "RollNodes", "ScaleUp", "Completed"]


@settings(max_examples=60)
@given(st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=4))
def test_restarting_anywhere_ends_in_the_same_state(kills: list[int]) -> None:
    # An operator restart loses nothing because the planner keeps nothing: re-observing and
    # planning again after any number of steps (and repeating a step) converges the same way.
    world = World()
    for k in kills:
        for _ in range(k):
            step = up.plan(world.observe())
            if isinstance(step, up.Done):
                break
            world.act(step)
            if not isinstance(step, up.Advance):
                world.act(step)  # a step retried after a crash before its status write is harmless
    run(world)
    assert world.step == "Completed"
    assert [v[0] for v in world.workloads.values()] == [2, 1, 3]
    assert all(v[1] is None for v in world.workloads.values())


def test_volume_matching() -> None:
    classes = {"fast": "csi.example", "other": "csi.example", "slow": "local"}
    match = VolumeMatch("fast", "csi.example", default_class="fast", provisioner_of_class=classes)
    claims = {
        "data": ClaimView("fast"),
        "alias": ClaimView("other"),
        "local": ClaimView("slow"),
        "bound-by-driver": ClaimView(None, "csi.example"),
    }

    def deployment(*claim_names: str) -> dict[str, Any]:
        volumes = [{"name": n, "persistentVolumeClaim": {"claimName": n}} for n in claim_names]
        return {"spec": {"template": {"spec": {"volumes": volumes}}}}

    assert up.uses_cluster_volumes(deployment("data"), claims, match)
    assert up.uses_cluster_volumes(deployment("alias"), claims, match)
    assert up.uses_cluster_volumes(deployment("bound-by-driver"), claims, match)
    assert not up.uses_cluster_volumes(deployment("local"), claims, match)
    assert not up.uses_cluster_volumes(deployment("missing"), claims, match)
    assert not up.uses_cluster_volumes({"spec": {}}, claims, match)
    sts = {"spec": {"volumeClaimTemplates": [{"spec": {"storageClassName": "fast"}}]}}
    assert up.uses_cluster_volumes(sts, {}, match)
    assert up.uses_cluster_volumes({"spec": {"volumeClaimTemplates": [{"spec": {}}]}}, {}, match)  # default
    eph = {"ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "fast"}}}, "name": "e"}
    assert up.uses_cluster_volumes({"spec": {"template": {"spec": {"volumes": [eph]}}}}, {}, match)
    claim = {
        "metadata": {"annotations": {"volume.kubernetes.io/storage-provisioner": "csi.example"}},
        "spec": {},
    }
    assert up.claim_view(claim) == ClaimView(None, "csi.example")


def test_selector_and_scaled_down_listing() -> None:
    assert up.selector_string({"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}}}}) == "a=1,b=2"
    assert up.selector_string({"spec": {}}) is None
    annotated = {"kind": "Deployment", "metadata": {"name": "a", "namespace": "app", "annotations": {
        up.REPLICAS_ANNOTATION: "3", up.OWNER_ANNOTATION: ME}}}  # fmt: skip
    other = {"kind": "StatefulSet", "metadata": {"name": "s", "namespace": "app", "annotations": {
        up.REPLICAS_ANNOTATION: "2", up.OWNER_ANNOTATION: "x/y"}}}  # fmt: skip
    plain = {"kind": "Deployment", "metadata": {"name": "p", "namespace": "app"}}
    assert up.scaled_down([annotated, other, plain]) == [
        ("Deployment", "app", "a", 3),
        ("StatefulSet", "app", "s", 2),
    ]
    assert up.scaled_down([annotated, other, plain], ME) == [("Deployment", "app", "a", 3)]


def test_the_pull_job_runs_the_new_image_on_the_storage_nodes() -> None:
    from kustos.api.nodejob import NodeJob
    from kustos.api.storage import StorageCluster
    from kustos.api.storageupgrade import StorageUpgrade
    from kustos.storage.upgrade_controller import pull_job

    name = "u" * 70
    upgrade = StorageUpgrade.model_validate(
        {"metadata": {"name": name, "namespace": "ns", "uid": "uid-1"}, "spec": {"newImage": NEW}}
    )
    terms = [{"matchExpressions": [{"key": "storage", "operator": "In", "values": ["yes"]}]}]
    tolerations = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    cluster = StorageCluster.model_validate(
        {"metadata": {"name": "c", "namespace": "ns"},
         "spec": {"nodeSelectorTerms": terms, "tolerations": tolerations}}
    )  # fmt: skip
    job = NodeJob.model_validate(pull_job(upgrade, cluster))  # the NodeJob schema accepts it
    assert job.spec.image == NEW and job.spec.completion_word == "done"
    assert job.spec.command[:2] == ["sh", "-c"] and "echo done" in job.spec.command[2]
    assert job.model_dump(by_alias=True, exclude_defaults=True)["spec"]["nodeSelectorTerms"] == terms
    assert job.spec.tolerations[0].key == "dedicated"
    assert len(job.metadata["name"]) <= 63 and len(job.spec.label_selector.split("=", 1)[1]) <= 63
    owner = job.metadata["ownerReferences"][0]
    assert owner["kind"] == "StorageUpgrade" and owner["uid"] == "uid-1" and owner["controller"] is True


# ---- status: one pure function of what was observed, the step and the time ----------------


def test_the_shared_steps_are_the_runtime_ones() -> None:
    from kustos.runtime.steps import Done, Wait

    assert up.Wait is Wait and up.Done is Done
    assert up.plan(observed("RollNodes", daemon_set=ds(NEW, generation=2))) == Wait(
        "waiting for the DaemonSet controller to see the new image", seconds=1.0
    )


def test_status_entering_the_pull_records_where_it_started() -> None:
    o = observed(None, cluster=ClusterView("c", OLD), generation=3)
    status = up.status(o, up.Advance("PullImage"), NOW)
    assert (status.step, status.cluster, status.previous_image) == ("PullImage", "c", OLD)
    assert status.start_time == status.step_start_time == "2026-01-01T00:00:00Z"
    assert status.message == f"Pulling the new container image {NEW} on every storage node"
    [completed] = status.conditions
    assert (completed.type, completed.status, completed.reason, completed.observed_generation) == (
        "Completed", "False", "PullImage", 3,
    )  # fmt: skip


def test_status_of_a_wait_says_why_and_counts_node_pods() -> None:
    o = observed("RollNodes", daemon_set=ds(NEW, generation=2), pull_job_progress=" (ignored)")
    status = up.status(o, up.plan(o), NOW)
    assert status.message == "waiting for the DaemonSet controller to see the new image"
    assert status.nodes_ready == "3/3"
    missing = observed(None, cluster=None, cluster_problem="StorageCluster c not found in namespace ns")
    waiting = up.status(missing, up.plan(missing), NOW)
    assert waiting.message == "StorageCluster c not found in namespace ns"
    assert [(c.type, c.status, c.reason, c.message) for c in waiting.conditions] == [
        ("Completed", "False", "ClusterNotFound", "StorageCluster c not found in namespace ns")
    ]


def test_status_of_a_failure_says_how_to_restore_and_a_failed_step_is_degraded() -> None:
    o = observed("ScaleDown")
    status = up.status(o, up.Fail("pods still exist"), NOW)
    assert status.step == "Failed" and status.completion_time == "2026-01-01T00:00:00Z"
    assert "kustos storage restore-workloads up -n ns" in str(status.message)
    assert [(c.type, c.reason) for c in status.conditions] == [("Failed", "UpgradeFailed")]
    w = WorkloadView("Deployment", "ns", "web", 0, remembered=2, owner=ME)
    failed = up.status(o, up.ScaleDown(w, 2), NOW, ReconcileError("forbidden", "Forbidden"))
    assert failed.message == "ScaleDown failed: forbidden" and failed.step is None
    assert [(c.type, c.status, c.reason) for c in failed.conditions] == [("Degraded", "True", "Forbidden")]
    recovered = up.status(replace(o, previous=failed), up.ScaleDown(w, 2), NOW)
    assert [(c.type, c.status, c.reason) for c in recovered.conditions] == [
        ("Degraded", "False", "AsExpected")
    ]


def test_status_marks_a_restored_workload_unless_deleting() -> None:
    previous = StorageUpgradeStatus.model_validate(
        {
            "step": "ScaleUp",
            "workloads": [{"kind": "Deployment", "namespace": "ns", "name": "web", "replicas": 2}],
        }
    )
    w = WorkloadView("Deployment", "ns", "web", 0, remembered=2, owner=ME)
    assert up.status(observed("ScaleUp", previous=previous), up.ScaleUp(w, 2), NOW).workloads[0].restored
    deleting = observed("ScaleUp", previous=previous, deleting=True)
    assert not up.status(deleting, up.ScaleUp(w, 2), NOW).workloads[0].restored


def test_an_upgrade_without_its_finalizer_gets_it_before_holding_anything() -> None:
    assert up.plan(observed(None, cluster=ClusterView("c", OLD), has_finalizer=False)) == up.AddFinalizer()
    # Being deleted, it gives back what it holds, finalizer or not.
    gone = observed("ScaleUp", deleting=True, has_finalizer=False, cluster=ClusterView("c", OLD))
    assert up.plan(gone) == up.Release()


def test_the_events_of_a_pass_say_what_was_done_not_that_a_pass_ran() -> None:
    entering = observed(None, cluster=ClusterView("c", OLD))
    step = up.plan(entering)
    said = up.notes(entering, step, up.status(entering, step, NOW))
    assert [n.reason for n in said] == ["PullImage"] and NEW in said[0].message
    w = WorkloadView("Deployment", "ns", "app", 0, remembered=2, owner=ME, uses_cluster=True)
    restored = up.notes(observed("ScaleUp"), up.ScaleUp(w, 2), StorageUpgradeStatus())
    assert [(n.reason, n.message) for n in restored] == [
        ("WorkloadRestored", "Deployment ns/app scaled back to 2")
    ]
    leaving = up.notes(observed("Completed", deleting=True), up.ClearMaintenance(), StorageUpgradeStatus())
    assert [n.reason for n in leaving] == ["MaintenanceOff"]
    failing = observed("PullImage", pull_job_exists=True, pull_job_failure="bad")
    fail = up.plan(failing)
    assert [(n.reason, n.type) for n in up.notes(failing, fail, up.status(failing, fail, NOW))] == [
        ("UpgradeFailed", "Warning")
    ]


def test_a_missing_cluster_is_an_event_once() -> None:
    missing = observed(
        "PullImage", cluster=None, cluster_problem="StorageCluster c not found in namespace ns"
    )
    step = up.plan(missing)
    first = up.status(missing, step, NOW)
    assert [n.reason for n in up.notes(missing, step, first)] == ["ClusterNotFound"]
    again = replace(missing, previous=first)
    assert up.notes(again, step, up.status(again, step, NOW)) == []


def test_an_invalid_spec_is_an_event_once() -> None:
    failed = up.failed(
        StorageUpgradeStatus(), ME, "invalid spec: spec.newImage: required", NOW, 1, "InvalidSpec"
    )
    new = failed.model_dump(by_alias=True)
    said = up.rejection_notes({}, new)
    assert [(n.reason, n.type) for n in said] == [("InvalidSpec", "Warning")]
    assert "spec.newImage" in said[0].message
    assert up.rejection_notes(new, new) == []
    other = up.failed(StorageUpgradeStatus(), ME, "pull failed", NOW, 1).model_dump(by_alias=True)
    assert up.rejection_notes({}, other) == []
