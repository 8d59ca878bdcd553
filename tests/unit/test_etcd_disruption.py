"""The PodDisruptionBudget's numbers: an eviction the budget allows never costs quorum, and
never comes while anything is in flight."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from kustos.etcd import disruption, planner
from kustos.etcd.planner import MemberView, Observed, PodView
from kustos.etcd.quorum import quorum
from tests.unit.test_etcd_planner import healthy_cluster, observed


def allowed(o: Observed, step: object, extra_ready: int = 0) -> int:
    """What the disruption controller computes: Ready member pods less minAvailable."""
    live = [p for p in o.pods if not p.deleting]
    ready = sum(1 for p in live if p.ready) + extra_ready
    return max(0, ready - disruption.min_available(o, step, o.size, len(live)))


def test_numbers_per_size_while_steady() -> None:
    wanted = {1: 1, 2: 2, 3: 2, 4: 3, 5: 4, 7: 6, 9: 8}
    for size, min_available in wanted.items():
        members, pods = healthy_cluster(size)
        o = observed(members, pods, size, migrate=False)
        assert planner.plan(o) == planner.Done()
        assert disruption.min_available(o, planner.Done(), size, size) == min_available
        assert allowed(o, planner.Done()) == (1 if size >= 3 else 0)
        # Migrating members: no eviction ever; drains wait for the operator to move them.
        moving = observed(members, pods, size)
        assert disruption.min_available(moving, planner.Done(), size, size) == size
        assert allowed(moving, planner.Done()) == 0


def test_a_joining_learner_allows_no_eviction_even_when_its_pod_is_ready() -> None:
    members, pods = healthy_cluster(3)
    pods.append(PodView("e-3", 3, ip="127.1.1.4", running=True, ready=True, member_id=103))
    members.append(MemberView(103, "e-3", "http://127.1.1.4:2380", learner=True, healthy=True))
    o = observed(members, pods, 3)
    step = planner.plan(o)
    assert allowed(o, step) == 0


def test_after_one_eviction_the_next_waits_for_the_replacement() -> None:
    members, pods = healthy_cluster(5)
    pods[1] = dataclasses.replace(pods[1], deleting=True, ready=False)
    members[1] = dataclasses.replace(members[1], healthy=False)
    o = observed(members, pods, 5)
    assert allowed(o, planner.plan(o)) == 0


def test_a_pod_not_ready_blocks_even_a_steady_looking_plan() -> None:
    members, pods = healthy_cluster(3)
    pods[2] = dataclasses.replace(pods[2], ready=False)
    o = observed(members, pods, 3, migrate=False)
    assert allowed(o, planner.Done()) == 0


def test_nothing_is_allowed_without_an_observation() -> None:
    assert disruption.min_available(None, planner.Done(), 3, 3) == 4


@st.composite
def clusters(draw: st.DrawFn) -> Observed:
    size = draw(st.integers(1, 7))
    n = draw(st.integers(1, 8))
    members, pods = [], []
    for i in range(n):
        ip = f"127.1.1.{i + 1}"
        learner = draw(st.booleans()) if i else False
        healthy = draw(st.booleans())
        members.append(MemberView(100 + i, f"e-{i}", f"http://{ip}:2380", learner=learner, healthy=healthy))
        ready = draw(st.booleans())
        deleting = draw(st.booleans())
        if draw(st.booleans()):  # some members without a pod
            pods.append(PodView(f"e-{i}", i, uid=f"u{i}", ip=ip, running=True, ready=ready,
                                member_id=100 + i, deleting=deleting))  # fmt: skip
    return observed(members, pods, size, migrate=draw(st.booleans()))


@given(clusters())
def test_an_allowed_eviction_keeps_quorum_and_never_overlaps_a_change(o: Observed) -> None:
    step = planner.plan(o)
    if not disruption.steady(o, step):
        # Whatever the step starts (a pod that becomes Ready before the next pass) is covered.
        assert allowed(o, step, extra_ready=1) == 0
        return
    assert allowed(o, step) <= 1
    if allowed(o, step):
        members = o.members or ()
        voters = [m for m in members if not m.learner]
        assert len(voters) == len(members) == o.size
        # Whichever Ready member is evicted, the healthy voters left are a quorum.
        assert sum(m.healthy for m in voters) - 1 >= quorum(len(voters))
