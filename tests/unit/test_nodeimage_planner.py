"""The NodeImage planner: tables of single decisions, and a simulated cloud in which hypothesis
runs whole rollouts (every node replaced; surge, unavailability and control-plane-first
never broken; no second heir for a donor after any restart, since the planner keeps nothing)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kustos.api.nodeimage import NodeImageSpec, RolloutPolicy, StackedEtcd
from kustos.nodes.labels import user_key
from kustos.nodes.nodeimage import planner
from kustos.nodes.nodeimage.planner import (
    ClaimInstance,
    CreateHeir,
    DeleteDonor,
    Drain,
    ForgetPending,
    Gate,
    GroupView,
    NodeView,
    Observed,
    Pair,
    PendingView,
    RemoveEtcdMember,
    RetireObsolete,
    Taint,
)
from kustos.runtime.cloud import Role
from kustos.runtime.steps import Done, Wait

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OLD, NEW = "os-v1", "os-v2"


def spec(**kw: object) -> NodeImageSpec:
    """spec.etcd defaults to an explicit "no stacked etcd" here (unset holds the control plane)."""
    return NodeImageSpec.model_validate({"image": NEW, "etcd": {"enabled": False}, **kw})


def node(name: str, group: str = "w", image: str = OLD, **kw: object) -> NodeView:
    return NodeView(name=name, provider_id=f"kwok://{name}", group=group, image=image, **kw)  # type: ignore[arg-type]


GROUPS = (GroupView("cp", Role.CONTROL_PLANE, NEW, ()), GroupView("w", Role.WORKER, NEW, ()))


def observed(nodes: list[NodeView], pending: tuple[PendingView, ...] = (), **kw: object) -> Observed:
    instances = {
        g.group_id: tuple(sorted(n.provider_id for n in nodes if n.group == g.group_id)) for g in GROUPS
    }
    groups = tuple(replace(g, instances=instances[g.group_id]) for g in GROUPS)
    values: dict[str, object] = {"name": "os", "spec": spec(), "nodes": tuple(nodes), "groups": groups,
                                 "pending": pending, "now": NOW}  # fmt: skip
    values.update(kw)
    return Observed(**values)  # type: ignore[arg-type]


# ---- arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "total", "up", "expected"),
    [(3, 10, True, 3), ("25%", 10, True, 3), ("25%", 10, False, 2), ("100%", 7, True, 7), ("0%", 7, False, 0),
     ("10%", 1, True, 1), ("10%", 1, False, 0)],
)  # fmt: skip
def test_resolve(value: int | str, total: int, up: bool, expected: int) -> None:
    assert planner.resolve(value, total, up) == expected


def test_surge_is_at_least_one() -> None:
    assert planner.surge(RolloutPolicy(max_surge="1%"), 3) == 1


@pytest.mark.parametrize(
    ("key", "user"),
    [("team", True), ("example.com/tier", True), ("kubernetes.io/hostname", False),
     ("node-role.kubernetes.io/worker", False), ("topology.kubernetes.io/zone", False),
     ("node.kubernetes.io/unschedulable", False), ("x.k8s.io/y", False), ("k8s.io/y", False),
     ("kustos.dev/donor", False), ("mykubernetes.io/x", True)],
)  # fmt: skip
def test_user_keys(key: str, user: bool) -> None:
    assert user_key(key) is user


# ---- single decisions --------------------------------------------------------------------------


def test_no_provider_waits() -> None:
    step = planner.plan(replace(observed([node("a")]), provider=False))
    assert isinstance(step, Wait) and "cloud provider" in step.reason


def test_all_up_to_date_is_done() -> None:
    assert isinstance(planner.plan(observed([node("a", image=NEW), node("c", "cp", NEW)])), Done)


def test_control_plane_first() -> None:
    step = planner.plan(observed([node("a"), node("c", "cp")]))
    assert isinstance(step, CreateHeir) and step.group == "cp" and step.role == Role.CONTROL_PLANE


def test_workers_wait_for_the_control_plane() -> None:
    # The control plane's heir is joining (surge 1 used): no worker heir meanwhile.
    o = observed([node("a"), node("c", "cp")], (PendingView("p", "cp", "Join", known=("kwok://c",)),))
    step = planner.plan(o)
    assert isinstance(step, Wait)
    assert "control plane" in step.reason or "join" in step.reason


def test_group_image_not_yet_set_waits() -> None:
    o = observed([node("a")])
    o = replace(o, groups=tuple(replace(g, image=OLD) for g in o.groups))
    step = planner.plan(o)
    assert isinstance(step, Wait) and "still creates nodes from os-v1" in step.reason


def test_heir_intent_names_the_known_instances() -> None:
    step = planner.plan(observed([node("a"), node("b")]))
    assert isinstance(step, CreateHeir)
    assert step.known == ("kwok://a", "kwok://b")
    assert step.pending_name == planner.pending_name("os", "w", step.known)


def test_a_second_intent_before_the_first_instance_is_listed_has_a_name_of_its_own() -> None:
    # maxSurge 2: the first Join is there, its instance not yet listed by the provider. The
    # second intent must not take the first one's name (a 409 then asks the provider nothing).
    nodes = [node(f"n{i}") for i in range(4)]
    first = planner.plan(observed(nodes, spec=spec(workers={"maxSurge": 2})))
    assert isinstance(first, CreateHeir)
    joined = (PendingView(first.pending_name, "w", "Join", known=first.known),)
    second = planner.plan(observed(nodes, joined, spec=spec(workers={"maxSurge": 2})))
    assert isinstance(second, CreateHeir) and second.known == first.known
    assert second.pending_name != first.pending_name
    # A pass whose cache does not show the first Join yet names the very same intent.
    again = planner.plan(observed(nodes, spec=spec(workers={"maxSurge": 2})))
    assert isinstance(again, CreateHeir) and again.pending_name == first.pending_name


def test_a_join_claims_the_instance_nobody_knows() -> None:
    nodes = [node("a"), node("new", image=NEW, ready=False)]
    o = observed(nodes, (PendingView("p", "w", "Join", known=("kwok://a",)),))
    assert planner.plan(o) == ClaimInstance("p", "kwok://new", "new")


def test_a_join_whose_instance_is_not_there_waits_and_asks_for_no_second() -> None:
    o = observed([node("a"), node("b")], (PendingView("p", "w", "Join", known=("kwok://a", "kwok://b")),))
    step = planner.plan(o)
    assert isinstance(step, Wait)  # surge 1 is used by the join: no second CreateHeir


def test_ready_heir_pairs_with_an_outdated_node_and_inherits_user_labels_and_taints() -> None:
    donor = node("a", labels={"team": "x", "kubernetes.io/hostname": "a"},
                 taints=(Taint("dedicated", "db"), Taint("node.kubernetes.io/unschedulable")))  # fmt: skip
    heir = node("h", image=NEW)
    o = observed([donor, heir], (PendingView("p", "w", "Join", provider_id="kwok://h"),))
    step = planner.plan(o)
    assert step == Pair("h", "a", {"team": "x"}, (Taint("dedicated", "db"),), "p")


def test_a_paired_join_is_forgotten() -> None:
    o = observed(
        [node("a"), node("h", image=NEW, donor="a")], (PendingView("p", "w", "Join", provider_id="kwok://h"),)
    )
    assert planner.plan(o) == ForgetPending("p")


def test_pair_drains_the_donor_once_its_heir_is_ready() -> None:
    o = observed([node("a"), node("b"), node("h", image=NEW, donor="a")])
    assert planner.plan(o) == Drain("a")


def test_no_drain_while_the_heir_is_not_ready() -> None:
    o = observed([node("a"), node("h", image=NEW, donor="a", ready=False)])
    step = planner.plan(o)
    assert isinstance(step, Wait) and "heir h" in step.reason


def test_max_unavailable_zero_waits_when_another_node_is_down() -> None:
    o = observed([node("a"), node("b", ready=False), node("h", image=NEW, donor="a")])
    step = planner.plan(o)
    assert isinstance(step, Wait) and "maxUnavailable" in step.reason


def test_a_failing_gate_on_the_nodes_involved_holds_the_drain() -> None:
    gate = Gate("EtcdCluster ns/e", False, "2/3 members healthy", frozenset({"a"}))
    o = observed([node("a"), node("h", image=NEW, donor="a")], gates=(gate,))
    step = planner.plan(o)
    assert isinstance(step, Wait) and "EtcdCluster ns/e: 2/3 members healthy" in step.reason


def test_a_gate_on_other_nodes_does_not_hold() -> None:
    gate = Gate("EtcdCluster ns/e", False, "2/3", frozenset({"elsewhere"}))
    o = observed([node("a"), node("h", image=NEW, donor="a")], gates=(gate,))
    assert planner.plan(o) == Drain("a")


def test_drain_under_way_continues_and_forces_only_by_policy() -> None:
    started = NOW - timedelta(minutes=11)
    nodes = [node("a", unschedulable=True, drain_started=started), node("h", image=NEW, donor="a")]
    assert planner.plan(observed(nodes)) == Drain("a", force=False, started=True)
    forced = observed(nodes, spec=spec(onDrainTimeout="force"))
    assert planner.plan(forced) == Drain("a", force=True, started=True)
    early = observed([replace(nodes[0], drain_started=NOW - timedelta(minutes=1)), nodes[1]],
                     spec=spec(onDrainTimeout="force"))  # fmt: skip
    assert planner.plan(early) == Drain("a", force=False, started=True)


def test_drained_worker_is_deleted() -> None:
    o = observed([node("a", unschedulable=True, drained=True), node("h", image=NEW, donor="a")])
    assert planner.plan(o) == DeleteDonor("a", "w", "kwok://a", Role.WORKER, "h")


def test_control_plane_donor_loses_its_etcd_member_first() -> None:
    cp = node("c", "cp", unschedulable=True, drained=True, internal_ip="127.0.0.5")
    nodes = [cp, node("h", "cp", NEW, donor="c", internal_ip="127.0.0.9")]
    o = observed(nodes, spec=spec(etcd=StackedEtcd().model_dump()))
    assert planner.plan(o) == RemoveEtcdMember("c", "127.0.0.5", "127.0.0.9")
    done = observed(
        [replace(cp, etcd_member_removed=True), nodes[1]], spec=spec(etcd=StackedEtcd().model_dump())
    )
    assert planner.plan(done) == DeleteDonor("c", "cp", "kwok://c", Role.CONTROL_PLANE, "h")


def test_a_heir_with_no_outdated_node_left_is_drained_then_retired() -> None:
    join = (PendingView("p", "w", "Join", provider_id="kwok://x"),)
    o = observed([node("a", image=NEW), node("x", image=NEW)], join)
    assert planner.plan(o) == Drain("x")  # it is Ready and schedulable: pods may run there
    draining = observed([node("a", image=NEW), node("x", image=NEW, unschedulable=True, drain_started=NOW)],
                        join)  # fmt: skip
    assert planner.plan(draining) == Drain("x", started=True)
    drained = observed([node("a", image=NEW), node("x", image=NEW, unschedulable=True, drained=True)], join)
    assert planner.plan(drained) == RetireObsolete("x", "w", "kwok://x", Role.WORKER, "p")


def test_a_retired_control_plane_node_loses_its_etcd_member_first() -> None:
    join = (PendingView("p", "cp", "Join", provider_id="kwok://x"),)
    x = node("x", "cp", NEW, unschedulable=True, drained=True, internal_ip="127.0.0.7")
    o = observed([node("c", "cp", NEW), x], join, spec=spec(etcd={}))
    assert planner.plan(o) == RemoveEtcdMember("x", "127.0.0.7")
    gone = observed([node("c", "cp", NEW), replace(x, etcd_member_removed=True)], join, spec=spec(etcd={}))
    assert planner.plan(gone) == RetireObsolete("x", "cp", "kwok://x", Role.CONTROL_PLANE, "p")


def test_a_heir_that_joined_on_another_image_is_retired_not_waited_for() -> None:
    # The group created it from the old image: it will never be paired, and the rollout must
    # not wait for it to "join" forever.
    join = (PendingView("p", "w", "Join", provider_id="kwok://x"),)
    o = observed([node("a"), node("x", image=OLD)], join)
    assert planner.plan(o) == Drain("x")
    drained = observed([node("a"), node("x", image=OLD, unschedulable=True, drained=True)], join)
    assert planner.plan(drained) == RetireObsolete("x", "w", "kwok://x", Role.WORKER, "p")
    # Once it is gone, the outdated node gets a new heir.
    assert isinstance(planner.plan(observed([node("a")])), CreateHeir)


def test_a_retiree_is_not_paired_when_an_outdated_node_shows_up() -> None:
    join = (PendingView("p", "w", "Join", provider_id="kwok://x"),)
    x = node("x", image=NEW, unschedulable=True, drain_started=NOW)
    assert planner.plan(observed([node("a"), x], join)) == Drain("x", started=True)


def test_control_plane_waits_for_spec_etcd_and_says_so_in_degraded() -> None:
    o = observed([node("c", "cp"), node("a", image=NEW)], spec=NodeImageSpec(image=NEW))
    step = planner.plan(o)
    assert isinstance(step, planner.Held) and "set spec.etcd" in step.reason
    degraded = next(c for c in planner.status(o, step, o.now).conditions if c.type == "Degraded")
    assert degraded.status == "True" and degraded.reason == "EtcdUnset"
    assert "enabled: false" in degraded.message


def test_a_control_plane_donor_is_not_deleted_while_spec_etcd_is_unset() -> None:
    nodes = [node("c", "cp", unschedulable=True, drained=True), node("h", "cp", NEW, donor="c")]
    step = planner.plan(observed(nodes, spec=NodeImageSpec(image=NEW)))
    assert isinstance(step, planner.Held) and "c" in step.reason
    explicit = observed(nodes, spec=spec(etcd={"enabled": False}))
    assert planner.plan(explicit) == DeleteDonor("c", "cp", "kwok://c", Role.CONTROL_PLANE, "h")


def test_workers_roll_while_spec_etcd_is_unset_if_no_control_plane_node_is_outdated() -> None:
    o = observed([node("c", "cp", NEW), node("a")], spec=NodeImageSpec(image=NEW))
    assert isinstance(planner.plan(o), CreateHeir)


def test_malformed_annotations_are_absent_and_reported_in_degraded() -> None:
    from kustos.runtime.objects import annotation_time

    malformed: list[str] = []
    for value in ("yesterday", "2026-01-01T00:00:00"):  # not a time; no zone
        raw = {"metadata": {"name": "a", "annotations": {"kustos.dev/drain-started": value}}}
        assert annotation_time(raw, "kustos.dev/drain-started", malformed) is None
    assert len(malformed) == 2 and "node a annotation kustos.dev/drain-started" in malformed[0]
    good = {"metadata": {"name": "a", "annotations": {"kustos.dev/drain-started": "2026-01-01T00:00:00Z"}}}
    assert annotation_time(good, "kustos.dev/drain-started") == NOW
    # The donor's drain simply starts (again): the annotation is written anew.
    o = observed([node("a", unschedulable=True), node("h", image=NEW, donor="a")], malformed=tuple(malformed))
    step = planner.plan(o)
    assert step == Drain("a")
    degraded = next(c for c in planner.status(o, step, o.now).conditions if c.type == "Degraded")
    assert degraded.reason == "MalformedAnnotation" and "node a" in degraded.message


def test_paused_takes_no_step() -> None:
    o = observed([node("a")], spec=spec(paused=True))
    assert planner.plan(o) == Wait("paused", 30)


def test_surge_allows_several_heirs() -> None:
    o = observed([node(f"n{i}") for i in range(5)], (PendingView("p", "w", "Join", provider_id="kwok://x"),),
                 spec=spec(workers={"maxSurge": 2}))  # fmt: skip
    assert isinstance(planner.plan(o), CreateHeir)
    o2 = replace(o, pending=(*o.pending, PendingView("q", "w", "Join", provider_id="kwok://y")))
    assert isinstance(planner.plan(o2), Wait)


def test_nodes_of_unknown_groups_are_invalid_and_not_replaced() -> None:
    o = observed([node("a", image=NEW), node("z", group="elsewhere")])
    assert isinstance(planner.plan(o), Done)
    assert planner.status(o, Done(), o.now).invalid == ["z"]


def test_status_reports_states_progress_and_why_it_waits() -> None:
    nodes = [node("a"), node("b"), node("c", image=NEW), node("h", image=NEW, donor="a", ready=False)]
    o = observed(nodes)
    step = planner.plan(o)
    result = planner.status(o, step, o.now)
    assert result.progress == "1/3"
    assert result.donors == ["a"] and result.heirs == ["h"] and result.outdated == ["b"]
    assert result.waiting_for and "heir h" in result.waiting_for
    assert result.replacements[0].phase == "WaitingForHeir"
    progressing = next(c for c in result.conditions if c.type == "Progressing")
    assert progressing.status == "True" and "heir h" in progressing.message


def test_status_done_is_available() -> None:
    o = observed([node("a", image=NEW)])
    result = planner.status(o, planner.plan(o), o.now)
    assert result.progress == "1/1"
    assert next(c for c in result.conditions if c.type == "Available").status == "True"


# ---- whole rollouts in a simulated cloud --------------------------------------------------------


@dataclass
class World:
    nodes: dict[str, NodeView]
    pending: dict[str, PendingView] = field(default_factory=dict)
    now: datetime = NOW
    counter: int = 0
    created: int = 0
    log: list[str] = field(default_factory=list)

    def observe(self, s: NodeImageSpec) -> Observed:
        return observed(list(self.nodes.values()), tuple(self.pending.values()), spec=s, now=self.now)

    def apply(self, step: planner.Step, role_of: dict[str, Role]) -> None:
        self.log.append(type(step).__name__)
        match step:
            case CreateHeir():
                assert step.pending_name not in self.pending, "a second intent for the same heir"
                self.pending[step.pending_name] = PendingView(
                    step.pending_name, step.group, "Join", known=step.known
                )
                self.counter += 1
                self.created += 1
                name = f"new{self.counter}"
                self.nodes[name] = node(name, step.group, NEW, ready=False)
            case ClaimInstance():
                self.pending[step.pending] = replace(self.pending[step.pending], provider_id=step.provider_id)
            case Pair():
                heir = self.nodes[step.heir]
                self.nodes[step.heir] = replace(heir, donor=step.donor, labels={**heir.labels, **step.labels},
                                                taints=tuple({*heir.taints, *step.taints}))  # fmt: skip
                if step.pending:
                    self.pending.pop(step.pending)
            case ForgetPending():
                self.pending.pop(step.pending)
            case Drain():
                self.nodes[step.donor] = replace(self.nodes[step.donor], unschedulable=True,
                                                 drain_started=self.now, drained=True)  # fmt: skip
            case RemoveEtcdMember():
                self.nodes[step.donor] = replace(self.nodes[step.donor], etcd_member_removed=True)
            case DeleteDonor():
                del self.nodes[step.donor]
            case RetireObsolete():
                del self.nodes[step.node]
                if step.pending:
                    self.pending.pop(step.pending)
            case Wait():
                self.now += timedelta(seconds=step.seconds)
                for name, n in list(self.nodes.items()):
                    if not n.ready:
                        self.nodes[name] = replace(n, ready=True)
            case _:
                raise AssertionError(step)


def _check(world: World, s: NodeImageSpec, totals: dict[Role, int]) -> None:
    role_of = {"cp": Role.CONTROL_PLANE, "w": Role.WORKER}
    for role, total in totals.items():
        in_role = [n for n in world.nodes.values() if role_of[n.group or ""] == role]
        extra = len(in_role) - total
        assert extra <= planner.surge(planner.policy_for(s, role), total), (role, extra)
        available = sum(1 for n in in_role if n.ready and not n.unschedulable)
        assert total - available <= planner.unavailable(planner.policy_for(s, role), total), (role, available)
    cp_outdated = any(n.image == OLD and n.group == "cp" for n in world.nodes.values())
    if cp_outdated:
        assert not any(n.image == NEW and n.group == "w" for n in world.nodes.values()), "workers before cp"


@settings(max_examples=60, deadline=None)
@given(
    cp=st.integers(1, 3),
    workers=st.integers(0, 8),
    surge=st.integers(1, 4),
    unavailable=st.integers(0, 2),
)
def test_every_rollout_replaces_every_node_within_its_budgets(
    cp: int, workers: int, surge: int, unavailable: int
) -> None:
    s = spec(workers={"maxSurge": surge, "maxUnavailable": unavailable})
    nodes = {f"c{i}": node(f"c{i}", "cp", labels={"team": f"t{i}"}) for i in range(cp)}
    nodes |= {f"w{i}": node(f"w{i}", "w", taints=(Taint("dedicated", str(i)),)) for i in range(workers)}
    world = World(nodes)
    totals = {Role.CONTROL_PLANE: cp, Role.WORKER: workers}
    for _ in range(2000):
        # The planner keeps nothing between passes: a "restart" is simply the next call.
        step = planner.plan(world.observe(s))
        if isinstance(step, Done):
            break
        world.apply(step, {})
        _check(world, s, totals)
    else:
        raise AssertionError(f"no end: {world.log[-20:]}")
    assert all(n.image == NEW for n in world.nodes.values())
    assert len(world.nodes) == cp + workers
    assert world.created == cp + workers, "a heir too many"
    assert not world.pending
    labels = sorted(n.labels.get("team", "") for n in world.nodes.values() if n.group == "cp")
    assert labels == sorted(f"t{i}" for i in range(cp))
    taints = sorted(t.value for n in world.nodes.values() for t in n.taints if t.key == "dedicated")
    assert taints == sorted(str(i) for i in range(workers))


def test_observed_is_all_the_planner_needs() -> None:
    # No field of Observed is mutable state the planner could carry between passes.
    assert all(f.name != "memory" for f in dataclasses.fields(Observed))


def test_a_failed_step_is_degraded_with_its_reason_and_recovers() -> None:
    from kustos.runtime.cloud import CapacityError

    o = observed([node("a")])
    step = planner.plan(o)
    failed = planner.status(o, step, o.now, CapacityError("group w is at its maximum"))
    degraded = next(c for c in failed.conditions if c.type == "Degraded")
    assert degraded.status == "True" and degraded.reason == "ProviderCapacity"
    assert failed.waiting_for == "group w is at its maximum"
    later = replace(o, previous=failed)
    recovered = planner.status(later, planner.plan(later), later.now)
    assert next(c for c in recovered.conditions if c.type == "Degraded").status == "False"


def test_paused_is_a_condition() -> None:
    o = observed([node("a")], spec=spec(paused=True))
    result = planner.status(o, planner.plan(o), o.now)
    assert next(c for c in result.conditions if c.type == "Paused").status == "True"
    assert result.waiting_for == "paused"


def test_bookkeeping_goes_on_while_paused() -> None:
    nodes = [node("a"), node("new", image=NEW, ready=False)]
    o = observed(nodes, (PendingView("p", "w", "Join", known=("kwok://a",)),), spec=spec(paused=True))
    assert isinstance(planner.plan(o), ClaimInstance)


def test_percentages_resolve_against_the_role() -> None:
    nodes = [node(f"n{i}") for i in range(10)]
    o = observed(nodes, spec=spec(workers={"maxSurge": "30%"}))
    pending = tuple(PendingView(f"p{i}", "w", "Join", provider_id=f"kwok://x{i}") for i in range(2))
    assert isinstance(planner.plan(replace(o, pending=pending)), CreateHeir)  # 2 < 3
    pending3 = (*pending, PendingView("p2", "w", "Join", provider_id="kwok://x2"))
    assert isinstance(planner.plan(replace(o, pending=pending3)), Wait)  # 3 = ceil(30% of 10)


def test_a_drain_past_its_timeout_keeps_its_donor_marked_draining() -> None:
    started = NOW - timedelta(hours=1)
    nodes = [node("a", unschedulable=True, drain_started=started), node("h", image=NEW, donor="a")]
    o = observed(nodes)
    result = planner.status(o, planner.plan(o), o.now)
    assert result.replacements[0].phase == "Draining"


def test_an_unobservable_world_keeps_what_was_known_and_says_why() -> None:
    from kustos.runtime.cloud import Throttled

    o = observed([node("a"), node("b", image=NEW)])
    before = planner.status(o, planner.plan(o), o.now)
    after = planner.unobserved(before, Throttled("rate exceeded"), 1, NOW)
    assert after.progress == before.progress == "1/2"
    assert after.waiting_for == "rate exceeded"
    assert next(c for c in after.conditions if c.type == "Degraded").reason == "ProviderThrottled"


def test_an_invalid_spec_keeps_the_rollouts_heirs_and_donors_in_status() -> None:
    """An invalid spec is no observation: clearing heirs and donors let AutoscalingStrategy give
    the autoscaler back mid-rollout."""
    from kustos.nodes.nodeimage.controller import status_kept
    from kustos.runtime.reconciler import InvalidSpec

    raw = {
        "metadata": {"name": "fleet", "generation": 3},
        "status": {"heirs": ["w-new"], "donors": ["w-old"], "progress": "1/3", "observedGeneration": 2},
    }
    kept = status_kept(raw, InvalidSpec("invalid spec: spec.image: String should match pattern"), NOW)
    assert (kept["heirs"], kept["donors"], kept["progress"]) == (["w-new"], ["w-old"], "1/3")
    degraded = next(c for c in kept["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.image" in degraded["message"] and "spec.image" in kept["waitingFor"]
