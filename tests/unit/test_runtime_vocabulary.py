"""The shared vocabulary: steps, clocks, deps, typed errors and object accessors."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.clock import FixedClock, SystemClock
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError, ReconcileTimeout, TerminalError
from kustos.runtime.steps import Done, Wait


def test_steps_are_frozen_values() -> None:
    assert Wait("pods not ready") == Wait("pods not ready", 2.0)
    assert Done() == Done()
    with pytest.raises(dataclasses.FrozenInstanceError):
        Wait("x").seconds = 1  # type: ignore[misc]


def test_fixed_clock_is_utc_and_moves_only_when_told() -> None:
    clock = FixedClock(datetime(2026, 3, 1, 12, tzinfo=UTC))
    assert clock.now() == clock.now()
    assert clock.advance(90) == datetime(2026, 3, 1, 12, 1, 30, tzinfo=UTC)
    assert clock.now().tzinfo is not None
    with pytest.raises(ValueError, match="timezone-aware"):
        FixedClock(datetime(2026, 1, 1))


def test_system_clock_is_timezone_aware() -> None:
    now = SystemClock().now()
    assert now.utcoffset() == timedelta(0)
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)


def test_deps_defaults_to_the_system_clock_and_no_provider() -> None:
    deps = Deps()
    assert isinstance(deps.clock, SystemClock) and deps.cloud is None
    assert Deps(clock=FixedClock()).clock.now() == datetime(2026, 1, 1, tzinfo=UTC)


def test_error_hierarchy_and_reasons() -> None:
    assert ReconcileError("boom").reason == "ReconcileFailed"
    assert isinstance(TerminalError("bad spec", "InvalidSpec"), ReconcileError)
    timeout = ReconcileTimeout("took 120s")
    assert isinstance(timeout, ReconcileError) and timeout.reason == "ReconcileTimeout"
    refused = ApiStatusError(409, "Conflict", "the object has been modified")
    assert isinstance(refused, ReconcileError)
    assert refused.conflict and refused.message == "the object has been modified"
    assert str(refused) == "409 Conflict: the object has been modified"
    # A Status without a reason still gives the failure condition one (an empty one is refused).
    assert ApiStatusError(500, "", "oops").reason == "Http500"


POD = {
    "metadata": {
        "name": "p-0", "namespace": "team-a", "uid": "u1", "generation": 3, "resourceVersion": "7",
        "labels": {"app": "x"}, "annotations": {"a": "b"},
        "ownerReferences": [
            {"kind": "ReplicaSet", "name": "rs-old"},
            {"kind": "ReplicaSet", "name": "rs", "controller": True},
        ],
    },
    "spec": {"nodeName": "n1"},
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:05Z"}}},
            {"ready": True, "state": {"running": {"startedAt": "2026-01-01T00:00:09Z"}}},
        ],
    },
}  # fmt: skip


def test_accessors() -> None:
    assert objects.name(POD) == "p-0" and objects.namespace(POD) == "team-a"
    assert objects.key(POD) == "team-a/p-0"
    assert objects.key({"metadata": {"name": "n1"}}) == "n1"
    assert objects.namespace({"metadata": {"name": "n1"}}) is None
    assert objects.split_key("team-a/p-0") == ("team-a", "p-0")
    assert objects.split_key("n1") == (None, "n1")
    assert objects.labels(POD) == {"app": "x"} and objects.annotations(POD) == {"a": "b"}
    assert objects.labels({"metadata": {"name": "x"}}) == {}
    assert objects.uid(POD) == "u1" and objects.generation(POD) == 3
    assert objects.resource_version(POD) == "7"
    assert objects.owner_of(POD, "ReplicaSet") == "rs"  # the controlling owner first
    assert objects.owner_of(POD, "StatefulSet") is None
    assert objects.pod_node(POD) == "n1"


def test_pod_facts() -> None:
    assert not objects.pod_ready(POD)
    assert objects.pod_ready(POD, trust_containers=True)
    assert objects.pod_running(POD)
    assert objects.running_since(POD) == datetime(2026, 1, 1, 0, 0, 9, tzinfo=UTC)
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert objects.pod_ready(ready)
    assert objects.running_since(ready) is None
    assert not objects.pod_ready(
        {"status": {"phase": "Running", "containerStatuses": []}}, trust_containers=True
    )
    assert objects.mirror_pod({"metadata": {"name": "m", "annotations": {objects.MIRROR_ANNOTATION: "x"}}})


def _node(ready: str | None, taints: list[dict[str, str]] | None = None) -> dict[str, object]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": "n"}, "spec": {"taints": taints or []}, "status": {"conditions": conditions}}


def test_node_facts() -> None:
    assert objects.node_ready(_node("True")) and not objects.node_lost(_node("True"))
    for lost in (None, _node("Unknown"), _node("False"), _node(None)):
        assert objects.node_lost(lost) and not objects.node_ready(lost)
    unreachable = _node("True", [{"key": objects.UNREACHABLE_TAINT, "effect": "NoExecute"}])
    assert objects.node_ready(unreachable) and objects.node_lost(unreachable)
    assert objects.node_unschedulable({"spec": {"unschedulable": True}})
    assert not objects.node_unschedulable(None)


def test_accessors_read_typed_resources_too() -> None:
    from kustos.api.nodejob import NodeJob

    job = NodeJob.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeJob",
        "metadata": {"name": "clean", "namespace": "ns", "generation": 4, "deletionTimestamp": "2026-01-01T00:00:00Z"},  # noqa: E501
        "spec": {"image": "busybox", "completionWord": "done"},
    })  # fmt: skip
    assert (objects.name(job), objects.namespace(job), objects.key(job)) == ("clean", "ns", "ns/clean")
    assert objects.generation(job) == 4 and objects.deleting(job)


def test_an_unexpected_error_becomes_a_reconcile_error_named_after_its_type() -> None:
    from kustos.runtime.errors import ReconcileError, as_reconcile_error

    expected = ReconcileError("etcd refused", reason="EtcdRefused")
    assert as_reconcile_error(expected) is expected
    wrapped = as_reconcile_error(ConnectionResetError("peer went away"))
    assert wrapped.reason == "ConnectionResetError" and "peer went away" in wrapped.message
