"""The StorageCluster planner and status (pure): one step per observation, status from it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kustos.api.storage import StorageCluster
from kustos.runtime.conditions import get_condition
from kustos.storage import planner
from kustos.storage.manifests import Inputs, desired
from kustos.storage.planner import ClusterSummary, Observed, PodView, choose_active, key_of, plan, status

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def objects(**spec: Any) -> tuple[dict[str, Any], ...]:
    cluster = StorageCluster.model_validate(
        {"metadata": {"name": "stor", "namespace": "default", "uid": "u"}, "spec": spec}
    )
    return tuple(desired(Inputs(cluster, (1, 36))))


def applied(objs: tuple[dict[str, Any], ...]) -> dict[planner.ObjKey, str]:
    return {key_of(o): planner.hash_of(o) for o in objs}


def pods(ready: int, total: int, node_down: int = 0) -> tuple[PodView, ...]:
    return tuple(
        PodView(f"p{i}", f"n{i}", "Running", ready=i < ready, node_ready=i >= node_down) for i in range(total)
    )


def steady(**kw: Any) -> Observed:
    objs = objects()
    base: dict[str, Any] = {"generation": 1, "has_finalizer": True, "desired": objs, "current": applied(objs),
                            "pods": pods(3, 3), "desired_scheduled": 3}  # fmt: skip
    return Observed(**{**base, **kw})


def test_a_new_cluster_takes_its_finalizer_first_then_applies_everything() -> None:
    objs = objects()
    assert plan(Observed(generation=1, desired=objs)) == planner.AddFinalizer()
    step = plan(Observed(generation=1, has_finalizer=True, desired=objs))
    assert isinstance(step, planner.Apply) and step.objects == objs


def test_only_out_of_date_objects_are_applied() -> None:
    before, after = objects(), objects(debug=True)
    step = plan(steady(desired=after, current=applied(before)))
    assert isinstance(step, planner.Apply)
    assert [key_of(o) for o in step.objects] == [("DaemonSet", "storageos", "stor-node")]


def test_steady_state_is_done() -> None:
    assert plan(steady()) == planner.Done()


def test_objects_no_longer_wanted_are_pruned() -> None:
    with_csi, without = objects(csi={"enable": True}), objects()
    step = plan(steady(desired=without, current={**applied(with_csi), **applied(without)}))
    assert isinstance(step, planner.Prune)
    assert ("CSIDriver", "", "storage.csi.kustos.dev") in step.keys
    assert ("StatefulSet", "storageos", "stor-csi-helper") in step.keys
    assert all(k not in {key_of(o) for o in without} for k in step.keys)


def test_pause_and_maintenance_change_nothing() -> None:
    stale = steady(desired=objects(debug=True))
    assert plan(Observed(**{**stale.__dict__, "pause": True})) == planner.Hold("Paused", "spec.pause is true")
    step = plan(Observed(**{**stale.__dict__, "maintenance": "up-1"}))
    assert step == planner.Hold("StorageUpgrade", "maintenance for StorageUpgrade up-1")


def test_refusal_and_another_active_cluster_change_nothing() -> None:
    assert plan(steady(refusals=("bad",))) == planner.Refuse(("bad",))
    assert plan(steady(active_elsewhere="a/b")) == planner.Inactive("a/b")


def test_waiting_for_endpoints() -> None:
    assert plan(steady(waiting="no members")) == planner.Wait("no members")


def test_deletion_removes_everything_then_the_finalizer() -> None:
    o = steady(deleting=True)
    step = plan(o)
    assert isinstance(step, planner.Cleanup)
    assert set(step.keys) == set(o.current)
    kinds = [k for k, _, _ in step.keys]
    assert kinds.index("DaemonSet") < kinds.index("ClusterRole") < kinds.index("Namespace")
    assert plan(steady(deleting=True, current={})) == planner.RemoveFinalizer()
    assert plan(steady(deleting=True, has_finalizer=False)) == planner.Done()


def test_deletion_wins_over_pause_and_refusal() -> None:
    assert isinstance(plan(steady(deleting=True, pause=True, refusals=("x",))), planner.Cleanup)


# ---- status --------------------------------------------------------------------------


def cond(result: dict[str, Any], type_: str) -> tuple[str, str]:
    c = get_condition(result["conditions"], type_)
    assert c is not None
    return c["status"], c["reason"]


def test_running_status() -> None:
    o = steady()
    result = status(o, plan(o), NOW)
    assert (result["phase"], result["ready"]) == ("Running", "3/3")
    assert result["nodes"] == ["n0", "n1", "n2"]
    assert result["nodeHealthStatus"]["n1"] == {"pod": "p1", "phase": "Running", "ready": True, "message": ""}
    assert cond(result, "Available") == ("True", "NodesReady")
    assert cond(result, "Degraded") == ("False", "AsExpected")
    assert cond(result, "Maintenance") == ("False", "NotInMaintenance")
    assert cond(result, "Active") == ("True", "ActiveCluster")


def test_a_node_down_after_running_is_degraded() -> None:
    o = steady(pods=pods(3, 3, node_down=1), previous_phase="Running")
    result = status(o, plan(o), NOW)
    assert (result["phase"], result["ready"]) == ("Degraded", "2/3")
    assert result["nodeHealthStatus"]["n0"]["message"] == "node n0 is not ready"
    assert cond(result, "Degraded") == ("True", "NodesNotReady")


def test_not_yet_ready_while_creating() -> None:
    o = steady(pods=pods(1, 3), previous_phase="Creating")
    assert status(o, plan(o), NOW)["phase"] == "Creating"
    fresh = Observed(generation=1)
    assert status(fresh, plan(fresh), NOW)["phase"] == "Pending"


def test_paused_and_maintenance_status() -> None:
    o = steady(pause=True)
    result = status(o, plan(o), NOW)
    assert result["phase"] == "Paused" and cond(result, "Maintenance") == ("True", "Paused")
    o = steady(maintenance="up-1")
    result = status(o, plan(o), NOW)
    assert result["phase"] == "Paused" and cond(result, "Maintenance") == ("True", "StorageUpgrade")
    maintenance = get_condition(result["conditions"], "Maintenance")
    assert maintenance is not None and "up-1" in maintenance["message"]
    assert result["ready"] == "3/3"  # status keeps being reported


def test_refused_status() -> None:
    o = Observed(generation=2, refusals=("disableTCMU and forceTCMU are both true: choose one",))
    result = status(o, plan(o), NOW)
    assert result["phase"] == "Pending"
    assert cond(result, "SpecValid") == ("False", "InvalidSpec")
    assert cond(result, "Degraded") == ("True", "InvalidSpec")


def test_inactive_status() -> None:
    o = Observed(generation=1, active_elsewhere="other/first")
    result = status(o, plan(o), NOW)
    assert result["phase"] == "Pending"
    assert cond(result, "Active") == ("False", "AnotherClusterActive")


def test_terminating() -> None:
    o = steady(deleting=True)
    assert status(o, plan(o), NOW)["phase"] == "Terminating"


def test_transition_times_hold_while_nothing_changes() -> None:
    o = steady()
    first = status(o, plan(o), NOW)
    again = steady(previous_conditions=tuple(first["conditions"]))
    second = status(again, plan(again), datetime(2026, 1, 1, 1, tzinfo=UTC))
    assert first["conditions"] == second["conditions"]


@given(st.integers(0, 6), st.integers(0, 6), st.integers(0, 6))
def test_ready_never_exceeds_total(ready: int, total: int, down: int) -> None:
    o = steady(pods=pods(min(ready, total), total, node_down=min(down, total)), desired_scheduled=total)
    result = status(o, plan(o), NOW)
    n, m = map(int, result["ready"].split("/"))
    assert 0 <= n <= m == total
    if total and n == m:
        assert result["phase"] == "Running"


# ---- one active cluster ----------------------------------------------------------------


def test_oldest_wins_and_stays_active() -> None:
    a = ClusterSummary("ns1/a", "2026-01-01T00:00:02Z", was_active=False)
    b = ClusterSummary("ns2/b", "2026-01-01T00:00:01Z", was_active=False)
    assert choose_active([a, b]) == "ns2/b"
    a_active = ClusterSummary("ns1/a", "2026-01-01T00:00:02Z", was_active=True)
    assert choose_active([a_active, b]) == "ns1/a"  # once active, a newer one does not take over


def test_an_active_cluster_being_deleted_still_blocks() -> None:
    a = ClusterSummary("ns1/a", "2026-01-01T00:00:01Z", was_active=True, deleting=True)
    b = ClusterSummary("ns2/b", "2026-01-01T00:00:02Z", was_active=False)
    assert choose_active([a, b]) == "ns1/a"
    assert choose_active([b]) == "ns2/b"
    assert choose_active([]) is None


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.booleans()), max_size=6))
def test_choice_is_deterministic_and_order_independent(specs: list[tuple[int, bool, bool]]) -> None:
    summaries = [
        ClusterSummary(f"ns/{i}", f"2026-01-01T00:00:0{t}Z", was_active=w, deleting=d)
        for i, (t, w, d) in enumerate(specs)
    ]
    assert choose_active(summaries) == choose_active(list(reversed(summaries)))


def test_an_image_changed_behind_our_back_is_drift() -> None:
    objs = objects()
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    images = dict(planner.template_images(ds))
    assert images == {"init": "storageos/init:1.0.0", "node": "storageos/node:v2.1.0"}
    changed = {key_of(ds): tuple(sorted({**images, "node": "storageos/node:v2.2.0"}.items()))}
    step = plan(steady(current_images=changed))
    assert isinstance(step, planner.Apply) and [key_of(o) for o in step.objects] == [key_of(ds)]
    assert isinstance(plan(steady(current_images=changed, maintenance="up")), planner.Hold)  # left alone
    assert plan(steady(current_images={key_of(ds): planner.template_images(ds)})) == planner.Done()


def test_a_failed_step_shows_on_progressing() -> None:
    from kustos.runtime.errors import ReconcileError

    o = steady()
    result = status(o, plan(o), NOW, ReconcileError("the API server refused: quota", "Forbidden"))
    progressing = get_condition(result["conditions"], "Progressing")
    assert progressing is not None
    assert (progressing["status"], progressing["reason"]) == ("True", "Forbidden")
    assert progressing["message"].endswith("failed: the API server refused: quota")


def test_status_notes_say_each_transition_once() -> None:
    def cond(type_: str, status: str, reason: str = "R", message: str = "") -> dict[str, str]:
        return {"type": type_, "status": status, "reason": reason, "message": message}

    old = {"phase": "Running", "conditions": [cond("SpecValid", "True"), cond("Maintenance", "False")]}
    new = {
        "phase": "Paused",
        "conditions": [
            cond("SpecValid", "False", "InvalidSpec", "bad"),
            cond("Maintenance", "True", "Paused", "p"),
        ],
    }
    said = [(n.reason, n.message, n.type) for n in planner.status_notes(old, new)]
    assert said == [
        ("InvalidSpec", "bad", "Warning"),
        ("Paused", "p", "Normal"),
        ("PhaseChanged", "Running -> Paused", "Normal"),
    ]
    assert planner.status_notes(new, new) == []  # the same status again: nothing new to say
