"""The certificate rotation planner: which control-plane node next, one at a time, and what
the status and the Node say."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.maintenance import certrotation, planner
from kustos.maintenance.certrotation import (
    CertRotationView,
    Checked,
    ControlPlaneNode,
    FinishRenewal,
    RemoveRenewalPod,
    RenewalPod,
    StartRenewal,
)

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
SPEC = MaintenancePolicySpec()


def cp(
    name: str, checked: timedelta | None = None, outcome: str = "Renewed", **kw: object
) -> ControlPlaneNode:
    record = Checked(NOW - checked, outcome, "done", "old-uid") if checked is not None else None  # type: ignore[arg-type]
    return ControlPlaneNode(name=name, ready=bool(kw.get("ready", True)),
                            apiserver=kw.get("apiserver", f"10.0.0.{name[-1]}:6443"), checked=record)  # type: ignore[arg-type]  # fmt: skip


def pod(node: str, phase: str = "Running", age: timedelta = timedelta(minutes=1), **kw: object) -> RenewalPod:
    return RenewalPod("kube-system", certrotation.pod_name(node), f"uid-{node}", node, phase,
                      created=NOW - age, **kw)  # type: ignore[arg-type]  # fmt: skip


def plan(*nodes: ControlPlaneNode, pods: tuple[RenewalPod, ...] = (), spec: MaintenancePolicySpec = SPEC):
    return certrotation.plan(spec, CertRotationView(nodes, pods, "kustos:dev"), NOW)


def test_defaults_are_ekcos() -> None:
    assert (SPEC.rotate_certs, SPEC.rotate_certs_check_interval, SPEC.rotate_certs_threshold) == (
        True,
        "24h",
        "720h",
    )


def test_never_checked_nodes_start_in_name_order() -> None:
    step = plan(cp("cp-2"), cp("cp-1"), cp("cp-3"))
    assert isinstance(step, StartRenewal) and step.node == "cp-1"


def test_one_node_at_a_time_while_a_renewal_pod_runs() -> None:
    assert plan(cp("cp-1"), cp("cp-2"), pods=(pod("cp-1"),)) is None
    assert plan(cp("cp-1"), cp("cp-2"), pods=(pod("cp-1", deleting=True),)) is None


def test_a_succeeded_pod_is_checked_and_recorded_before_the_next_node() -> None:
    done = pod("cp-1", "Succeeded", message="renewed 1: apiserver")
    step = plan(cp("cp-1"), cp("cp-2"), pods=(done,))
    assert step == FinishRenewal(done, "10.0.0.1:6443", "Renewed", "renewed 1: apiserver")
    # Recorded on its node (the annotation names the pod): the pod goes, then cp-2 starts.
    recorded = replace(cp("cp-1"), checked=Checked(NOW, "Renewed", "renewed 1", "uid-cp-1"))
    step = plan(recorded, cp("cp-2"), pods=(pod("cp-1", "Succeeded"),))
    assert isinstance(step, RemoveRenewalPod) and step.pod.node == "cp-1"
    step = plan(recorded, cp("cp-2"))
    assert isinstance(step, StartRenewal) and step.node == "cp-2"


def test_a_failed_or_stuck_pod_is_a_failure_retried_sooner() -> None:
    failed = plan(cp("cp-1"), pods=(pod("cp-1", "Failed", message="failed: no CA key"),))
    assert isinstance(failed, FinishRenewal) and failed.outcome == "Failed"
    stuck = plan(cp("cp-1"), pods=(pod("cp-1", "Running", age=timedelta(minutes=11)),))
    assert (
        isinstance(stuck, FinishRenewal) and stuck.outcome == "Failed" and "did not finish" in stuck.message
    )
    # A pod that never started says why (its container's waiting message), and so does the record.
    why = "failed to set up the pod network"
    waiting = plan(cp("cp-1"), pods=(pod("cp-1", "Pending", age=timedelta(minutes=11), message=why),))
    assert isinstance(waiting, FinishRenewal) and waiting.message.endswith(f"(Pending: {why})")
    assert plan(cp("cp-1", timedelta(minutes=5), "Failed")) is None
    assert isinstance(plan(cp("cp-1", timedelta(minutes=11), "Failed")), StartRenewal)
    # Meanwhile no other node is touched: the failed node's API server may be down.
    assert plan(cp("cp-1", timedelta(minutes=5), "Failed"), cp("cp-2")) is None
    step = plan(cp("cp-1"), cp("cp-2", timedelta(minutes=11), "Failed"))
    assert isinstance(step, StartRenewal) and step.node == "cp-2"


def test_checked_nodes_wait_for_the_interval() -> None:
    assert plan(cp("cp-1", timedelta(hours=23)), cp("cp-2", timedelta(hours=1))) is None
    step = plan(cp("cp-1", timedelta(hours=23)), cp("cp-2", timedelta(hours=24)))
    assert isinstance(step, StartRenewal) and step.node == "cp-2"
    spec = SPEC.model_copy(update={"rotate_certs_check_interval": "1h"})
    assert isinstance(plan(cp("cp-1", timedelta(hours=2)), spec=spec), StartRenewal)
    view = CertRotationView((cp("cp-1", timedelta(hours=23)), cp("cp-2", timedelta(hours=1))))
    assert certrotation.next_check(SPEC, view, NOW) == timedelta(hours=1)


def test_not_kubeadms_or_not_ready_nodes_are_left_alone() -> None:
    assert plan(cp("cp-1", apiserver=None), cp("cp-2", ready=False)) is None
    step = plan(cp("cp-1", apiserver=None), pods=(pod("cp-1"),))
    assert isinstance(step, RemoveRenewalPod) and "no longer a kubeadm control-plane node" in step.why


def test_off_removes_its_pods_and_starts_none() -> None:
    off = SPEC.model_copy(update={"rotate_certs": False})
    assert plan(cp("cp-1"), spec=off) is None
    step = plan(cp("cp-1"), pods=(pod("cp-1"),), spec=off)
    assert isinstance(step, RemoveRenewalPod) and step.why == "rotateCerts is off"
    assert certrotation.status(off, CertRotationView((cp("cp-1"),)), NOW) is None


def test_the_pod_is_pinned_rooted_and_mounts_etc_kubernetes() -> None:
    step = plan(cp("cp-1"))
    assert isinstance(step, StartRenewal)
    spec = step.pod["spec"]
    assert spec["nodeName"] == "cp-1" and spec["restartPolicy"] == "Never" and "hostNetwork" not in spec
    assert spec["volumes"] == [
        {"name": "kubernetes", "hostPath": {"path": "/etc/kubernetes", "type": "Directory"}}
    ]
    command = spec["containers"][0]["command"]
    assert command[:3] == ["kustos", "maintenance", "certs"]
    assert command[command.index("--threshold") + 1] == "720h"
    assert command[command.index("--apiserver") + 1] == "10.0.0.1:6443"
    # What it did or why it failed comes back as its termination message.
    container = spec["containers"][0]
    assert command[command.index("--summary-file") + 1] == container["terminationMessagePath"]
    assert spec["containers"][0]["image"] == "kustos:dev"
    assert len(certrotation.pod_name("n" * 200)) <= 63


def test_status_counts_fresh_nodes_and_says_the_latest() -> None:
    view = CertRotationView((cp("cp-1", timedelta(hours=1)), cp("cp-2", timedelta(hours=30)), cp("cp-3")),
                            (pod("cp-3"),))  # fmt: skip
    status = certrotation.status(SPEC, view, NOW)
    assert status is not None
    assert (status.nodes_checked, status.renewing, status.message) == ("1/3", "cp-3", "cp-1: Renewed: done")
    none = certrotation.status(SPEC, CertRotationView((cp("cp-1", apiserver=None),)), NOW)
    assert none is not None and none.message == "no kubeadm control-plane node: nothing to rotate"


def test_the_annotation_round_trips_and_garbage_reads_as_never_checked() -> None:
    checked = Checked(NOW, "Failed", "x" * 600, "uid")
    parsed = Checked.parse(checked.text())
    assert (
        parsed is not None
        and parsed.time == NOW
        and parsed.outcome == "Failed"
        and len(parsed.message) == 500
    )
    assert Checked.parse("not json") is None
    assert Checked.parse('{"time": "yesterday", "outcome": "Renewed"}') is None


def test_the_maintenance_plan_records_a_renewal_and_a_failure_warns() -> None:
    view = CertRotationView((cp("cp-1"),), (pod("cp-1", "Failed", message="boom"),))
    observed = planner.Observed(spec=SPEC, nodes=(), now=NOW, certificates=view)
    step = planner.plan(observed)
    assert isinstance(step, FinishRenewal)
    status = planner.status(observed, step, NOW)
    assert status.last_action is not None
    assert (status.last_action.action, status.last_action.outcome) == ("RotateCerts", "Refused")
    assert status.last_action.message == "failed: boom"
    notes = planner.action_notes(planner.Observed(spec=SPEC, nodes=()).previous, status)
    assert notes[0].reason == "RotateCertsRefused" and notes[0].type == "Warning"


@given(st.lists(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]), min_size=1, max_size=3),
       st.sets(st.sampled_from(["cp-1", "cp-2", "cp-3"])))  # fmt: skip
def test_never_a_second_pod_while_one_exists(phases: list[str], checked: set[str]) -> None:
    nodes = tuple(cp(n, timedelta(days=2) if n in checked else None) for n in ("cp-1", "cp-2", "cp-3"))
    pods = tuple(pod(f"cp-{i + 1}", phase) for i, phase in enumerate(phases))
    assert not isinstance(plan(*nodes, pods=pods), StartRenewal)


def test_the_pod_view_reads_what_the_pod_said_or_why_it_waits() -> None:
    from kustos.maintenance.certrotation_act import renewal_pod_view

    def with_state(state: dict[str, object]) -> RenewalPod:
        meta = {"name": "p", "namespace": "kube-system", "uid": "u",
                "creationTimestamp": "2026-11-26T04:00:00Z",
                "annotations": {certrotation.NODE_ANNOTATION: "cp-1"}}  # fmt: skip
        return renewal_pod_view(
            {"metadata": meta, "status": {"phase": "Failed", "containerStatuses": [{"state": state}]}}
        )

    done = with_state(
        {"terminated": {"exitCode": 0, "message": "kube-apiserver restarted\nrenewed 1: apiserver\n"}}
    )
    assert (done.node, done.message) == ("cp-1", "renewed 1: apiserver")
    assert (
        with_state({"waiting": {"reason": "ContainerCreating", "message": "no network"}}).message
        == "no network"
    )
    assert with_state({"running": {}}).message == ""
