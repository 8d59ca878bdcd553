"""A pod that cannot start or run is named with its reason and the next step: the
classification (pure) and what the status and Events make of it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kustos.etcd import planner
from kustos.etcd.status import notes, status
from kustos.etcd.stuck import Stuck, classify, volume_failure, waiting_for_volumes, with_log
from kustos.runtime.steps import Done, Wait
from tests.unit.test_etcd_status import condition, formed

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LONG_AGO = "2026-11-22T11:59:00Z"
JUST_NOW = "2026-11-22T11:59:58Z"


def pod(status: dict[str, Any], node: str | None = None, name: str = "e-0") -> dict[str, Any]:
    spec = {"containers": [{"name": "etcd"}], **({"nodeName": node} if node else {})}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}


def waiting(reason: str, message: str = "", restarts: int = 0, **extra: Any) -> dict[str, Any]:
    return {"phase": "Pending", "containerStatuses": [{
        "name": "etcd", "image": "registry.k8s.io/etcd:3.7.3-0", "restartCount": restarts,
        "state": {"waiting": {"reason": reason, "message": message}}, **extra,
    }]}  # fmt: skip


def unschedulable(since: str) -> dict[str, Any]:
    message = "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector."
    return {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
        "lastTransitionTime": since,
    }]}  # fmt: skip


def claim(phase: str, created: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "e-0-data", "creationTimestamp": created},
        "spec": {"storageClassName": "never"},
        "status": {"phase": phase},
    }


def test_an_image_that_cannot_be_pulled_names_the_image_and_what_to_check() -> None:
    for reason in ("ErrImagePull", "ImagePullBackOff"):
        found = classify(pod(waiting(reason, "not found"), node="w-1"), None, NOW)
        assert found is not None and found.reason == "ImagePullFailed"
        assert "registry.k8s.io/etcd:3.7.3-0" in found.message and "not found" in found.message
        assert "spec.version" in found.message


def test_a_crash_loop_is_named_after_the_second_restart_with_its_exit_code() -> None:
    last = {"lastState": {"terminated": {"exitCode": 2}}}
    assert classify(pod(waiting("CrashLoopBackOff", restarts=1, **last), node="w-1"), None, NOW) is None
    found = classify(pod(waiting("CrashLoopBackOff", restarts=3, **last), node="w-1"), None, NOW)
    assert found is not None and found.reason == "CrashLoopBackOff" and found.container == "etcd"
    assert "exit code 2" in found.message and "spec.extraArgs" in found.message
    usage = "\n".join(f"  --option-{i}  what it does" for i in range(50))
    logged = with_log(found, f"flag provided but not defined: -bogus\n\nUsage of etcd:\n{usage}\n")
    assert logged.message.endswith("last log lines: flag provided but not defined: -bogus")
    plain = with_log(found, "line 1\n\nline 2\n")
    assert plain.message.endswith("last log lines: line 1 | line 2")
    assert with_log(found, "") == found
    # The same crash loop later is the same message: no Event, no write per restart.
    again = classify(pod(waiting("CrashLoopBackOff", restarts=9, **last), node="w-1"), None, NOW)
    assert again == found


def test_unschedulable_carries_the_schedulers_words_after_a_grace() -> None:
    assert classify(pod(unschedulable(JUST_NOW)), None, NOW) is None
    found = classify(pod(unschedulable(LONG_AGO)), None, NOW)
    assert found is not None and found.reason == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in found.message and "nodeSelector" in found.message


def test_a_pending_claim_comes_before_the_scheduler_complaint_it_causes() -> None:
    found = classify(pod(unschedulable(LONG_AGO)), claim("Pending", LONG_AGO), NOW)
    assert found is not None and found.reason == "VolumePending"
    assert "e-0-data" in found.message and "never" in found.message
    young = classify(pod(unschedulable(JUST_NOW)), claim("Pending", JUST_NOW), NOW)
    assert young is None
    bound = classify(pod(unschedulable(LONG_AGO)), claim("Bound", LONG_AGO), NOW)
    assert bound is not None and bound.reason == "Unschedulable"


def test_running_and_terminating_pods_are_not_stuck() -> None:
    running = {"phase": "Running", "containerStatuses": [{"name": "etcd", "state": {"running": {}}}]}
    assert classify(pod(running, node="w-1"), None, NOW) is None
    gone = pod(waiting("ErrImagePull"), node="w-1")
    gone["metadata"]["deletionTimestamp"] = LONG_AGO
    assert classify(gone, None, NOW) is None


PULL = Stuck("e-1", "ImagePullFailed", "member pod e-1 cannot pull image x; check spec.version")


def test_a_stuck_pod_is_named_in_degraded_progressing_the_status_and_an_event() -> None:
    seen = replace(formed(healthy=2), stuck=(PULL,))
    step = Wait("a member is unhealthy", 2.0)
    result = status(seen, step, NOW)
    assert result["stuck"] == [{"pod": "e-1", "reason": "ImagePullFailed", "message": PULL.message}]
    degraded, progressing = condition(result, "Degraded"), condition(result, "Progressing")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        "ImagePullFailed",
        PULL.message,
    )
    assert (progressing["status"], progressing["reason"]) == ("False", "ImagePullFailed")
    events = notes(seen, step, result)
    assert [(n.reason, n.message) for n in events] == [("ImagePullFailed", PULL.message)]
    # Said once: the same state in the next pass is no news.
    again = replace(seen, previous=result)
    assert not [n for n in notes(again, step, status(again, step, NOW)) if n.reason == "ImagePullFailed"]
    # Fixed: the list empties and Degraded goes back.
    healed = replace(formed(), previous=result)
    after = status(healed, Done(), NOW)
    assert after["stuck"] == [] and condition(after, "Degraded")["reason"] == "AllHealthy"


def test_quorum_loss_keeps_its_reason_and_names_the_stuck_pod() -> None:
    seen = replace(formed(healthy=1), stuck=(PULL,))
    lost = planner.QuorumLost("1 of 3 voting members are healthy")
    first = status(seen, lost, NOW)
    later = status(replace(seen, previous=first), lost, NOW + timedelta(seconds=10))
    degraded = condition(later, "Degraded")
    assert degraded["reason"] == "QuorumLost" and PULL.message in degraded["message"]


def test_a_replacement_with_no_node_to_go_to_says_which_drain_waits_and_why() -> None:
    seen = formed()
    assert seen.observed is not None
    pods = list(seen.observed.pods)
    pods[1] = replace(pods[1], node="w-1", draining=True)
    unplaced = Stuck("e-3", "Unschedulable", "member pod e-3 cannot be scheduled: 0/4 nodes are available")
    seen = replace(seen, observed=replace(seen.observed, pods=tuple(pods)), stuck=(unplaced,))
    result = status(seen, Wait("a member is joining", 1.0), NOW)
    degraded = condition(result, "Degraded")
    assert degraded["reason"] == "NoSpareNode" and result["stuck"][0]["reason"] == "NoSpareNode"
    message = degraded["message"]
    assert "member e-1 cannot leave node w-1" in message and "0/4 nodes are available" in message
    assert "uncordon w-1" in message
    assert [n.reason for n in notes(seen, Wait("a member is joining", 1.0), result)] == ["NoSpareNode"]
    # Without migration the same pod is just unschedulable.
    kept = replace(seen, observed=replace(seen.observed, migrate=False))
    assert condition(status(kept, Wait("x", 1.0), NOW), "Degraded")["reason"] == "Unschedulable"


def no_sandbox(since: str) -> dict[str, Any]:
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": since},
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": since},
    ]}  # fmt: skip


def warning(reason: str, message: str, at: str) -> dict[str, Any]:
    return {"type": "Warning", "reason": reason, "message": message, "lastTimestamp": at}


def test_a_scheduled_pod_without_its_sandbox_after_a_grace_waits_for_its_volumes() -> None:
    assert waiting_for_volumes(pod(no_sandbox(LONG_AGO), node="w1"), NOW)
    assert not waiting_for_volumes(pod(no_sandbox(JUST_NOW), node="w1"), NOW)
    assert not waiting_for_volumes(pod(no_sandbox(LONG_AGO)), NOW)  # not scheduled: the scheduler says why
    started = {**no_sandbox(LONG_AGO), "phase": "Running"}
    assert not waiting_for_volumes(pod(started, node="w1"), NOW)


def test_a_volume_that_does_not_attach_or_mount_is_said_with_the_drivers_words_and_the_node() -> None:
    stuck_pod = pod(no_sandbox(LONG_AGO), node="w1")
    attach = warning(
        "FailedAttachVolume", 'AttachVolume.Attach failed for volume "pv-1" : timed out', LONG_AGO
    )
    mount = warning("FailedMount", 'MountVolume.NewMounter initialization failed for volume "pv-1" : path '
                    '"/nope" does not exist', JUST_NOW)  # fmt: skip
    said = volume_failure(stuck_pod, [attach, mount])
    assert said is not None and said.reason == "VolumeMountFailed"  # the newest
    assert 'path "/nope" does not exist' in said.message and "node w1" in said.message
    said = volume_failure(stuck_pod, [attach, warning("BackOff", "x", JUST_NOW)], what="backup agent pod")
    assert said is not None and said.reason == "VolumeAttachFailed"
    assert said.message.startswith("backup agent pod e-0 cannot start: its volume does not attach to node w1")
    assert "volumeattachments" in said.message
    assert volume_failure(stuck_pod, [warning("BackOff", "x", JUST_NOW)]) is None


def test_an_init_container_that_cannot_pull_is_named_like_a_container() -> None:
    """A restore's seed fetches its snapshot in an init container."""
    status = {
        "phase": "Pending",
        "initContainerStatuses": waiting("ErrImagePull", "not found")["containerStatuses"],
    }
    said = classify(pod(status, node="w1"), None, NOW)
    assert said is not None and said.reason == "ImagePullFailed"


def test_a_crash_loop_stays_named_between_its_back_offs() -> None:
    """The kubelet reports the crash itself and a moment of the next try between two
    back-offs: the same message all along, or STUCK and Degraded blink at every restart."""
    crashed = {"terminated": {"exitCode": 2, "reason": "Error"}}
    loop = classify(pod(waiting("CrashLoopBackOff", restarts=3, lastState=crashed), node="w-1"), None, NOW)

    def at(state: dict[str, Any], ready: bool = False) -> Stuck | None:
        statuses = [{"name": "etcd", "restartCount": 3, "ready": ready, "state": state, "lastState": crashed}]
        return classify(pod({"phase": "Running", "containerStatuses": statuses}, node="w-1"), None, NOW)

    assert loop is not None and at(crashed) == loop
    trying = at({"running": {"startedAt": JUST_NOW}})
    assert trying == loop and trying is not None and trying.previous_log and not loop.previous_log
    # A member that came back and has run past the grace, or is ready, is not stuck.
    assert at({"running": {"startedAt": LONG_AGO}}) is None
    assert at({"running": {"startedAt": JUST_NOW}}, ready=True) is None
    assert at({"terminated": {"exitCode": 0, "reason": "Completed"}}) is None
