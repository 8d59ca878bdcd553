"""Auto-resource scaling's planner: up as nodes allow, never above desired, never below the object."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.api.maintenance import MaintenancePolicySpec, ScaledResource
from kustos.maintenance import planner, scaling
from kustos.maintenance.planner import NodeView, Observed
from kustos.maintenance.scaling import Candidate, ScaleWorkload, WorkloadView, json_pointer, replicas_at

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def entry(replicas: int = 3, **fields: object) -> ScaledResource:
    return ScaledResource.model_validate(
        {"kind": "Deployment", "namespace": "ns", "name": "web", "replicas": replicas, **fields}
    )


def nodes(count: int, **labels: str) -> tuple[Candidate, ...]:
    return tuple(Candidate(f"n-{i}", True, labels=tuple(labels.items())) for i in range(count))


def test_a_workload_grows_with_its_nodes_up_to_what_it_wants() -> None:
    wanted = [entry(3)]

    assert scaling.plan(wanted, [WorkloadView(1)], nodes(1)) is None
    assert scaling.plan(wanted, [WorkloadView(1)], nodes(2)) == ScaleWorkload(wanted[0], 1, 2, 2)
    assert scaling.plan(wanted, [WorkloadView(2)], nodes(5)) == ScaleWorkload(wanted[0], 2, 3, 5)
    assert scaling.plan(wanted, [WorkloadView(3)], nodes(5)) is None


def test_only_ready_schedulable_selected_nodes_count() -> None:
    wanted = entry(3, nodeSelector={"pool": "db"})
    found = (
        Candidate("a", True, labels=(("pool", "db"),)),
        Candidate("b", False, labels=(("pool", "db"),)),
        Candidate("c", True, unschedulable=True, labels=(("pool", "db"),)),
        Candidate("d", True, labels=(("pool", "web"),)),
        Candidate("e", True, labels=(("pool", "db"), ("zone", "x"))),
    )

    assert scaling.eligible(wanted, found) == 2


@given(desired=st.integers(1, 9), current=st.integers(0, 12), count=st.integers(0, 12))
def test_never_above_desired_never_below_the_object(desired: int, current: int, count: int) -> None:
    wanted = entry(desired)
    step = scaling.plan([wanted], [WorkloadView(current)], nodes(count))

    if step is not None:
        assert current < step.to <= desired and step.to <= count
    else:
        assert current >= min(desired, count)


def test_the_status_says_what_waits_for_nodes() -> None:
    wanted = [entry(3, nodeSelector={"pool": "db"}), entry(2, name="gone")]
    rows = scaling.status(wanted, [WorkloadView(1), WorkloadView(None, "Deployment ns/gone does not exist")],
                          nodes(1, pool="db"))  # fmt: skip

    assert rows[0].message == (
        "waiting for nodes: 3 desired, 1 now; 1 Ready, schedulable node(s) with pool=db, 2 more needed"
    )
    assert rows[1].replicas is None and rows[1].message == "Deployment ns/gone does not exist"


def test_a_custom_resource_needs_its_plural_and_may_keep_replicas_elsewhere() -> None:
    with pytest.raises(ValueError, match="resource"):
        entry(kind="Prometheus", apiVersion="monitoring.coreos.com/v1")
    custom = entry(kind="Prometheus", apiVersion="monitoring.coreos.com/v1", resource="prometheuses",
                   replicasPath="spec.shards")  # fmt: skip

    assert replicas_at({"spec": {"shards": 2, "replicas": 1}}, custom.replicas_path) == 2
    assert replicas_at({"spec": {"shards": "2"}}, custom.replicas_path) is None
    assert json_pointer(custom.replicas_path) == "/spec/shards"


def test_the_policy_scales_after_clearing_and_records_the_step() -> None:
    spec = MaintenancePolicySpec(auto_resource_scaling=[entry(3)])
    o = Observed(spec, (NodeView("n-0", True), NodeView("n-1", True)), now=NOW,
                 workloads=(WorkloadView(1),), candidates=nodes(2))  # fmt: skip

    step = planner.plan(o)
    status = planner.status(o, step, NOW)

    assert step == ScaleWorkload(spec.auto_resource_scaling[0], 1, 2, 2)
    assert status.last_action is not None and status.last_action.action == "Scale"
    assert "from 1 to 2 replicas" in status.last_action.message
    assert status.auto_resource_scaling[0].nodes == 2
