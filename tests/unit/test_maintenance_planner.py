"""The node maintenance planner: dead or not, fenced or not, the next step, the status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from kustos.api.maintenance import FencingPolicy, MaintenancePolicySpec, MaintenancePolicyStatus
from kustos.maintenance import planner
from kustos.maintenance.nodes import node_view
from kustos.maintenance.planner import (
    ClaimView,
    DecideDeletion,
    ForceDeletePod,
    Ignored,
    NodeView,
    Observed,
    PodView,
    Purge,
    Purged,
    Refuse,
    ReleaseClaim,
    RemoveOutOfService,
    TaintOutOfService,
)
from kustos.runtime.cloud import InstanceState
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import Done, Wait

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def spec(**changes: object) -> MaintenancePolicySpec:
    return MaintenancePolicySpec().model_copy(update=changes)


def ready(name: str, control_plane: bool = False) -> NodeView:
    return NodeView(name, ready=True, control_plane=control_plane)


def down(name: str, seconds: float = 20, **fields: object) -> NodeView:
    return NodeView(name, ready=False, unreachable_since=ago(seconds), **fields)  # type: ignore[arg-type]


def observed(*nodes: NodeView, pods: tuple[PodView, ...] = (), claims: tuple[ClaimView, ...] = (),
             policy: MaintenancePolicySpec | None = None, name: str = "default") -> Observed:  # fmt: skip
    return Observed(policy or spec(), tuple(nodes), pods, claims, NOW, name)


def terminating(node: str, name: str = "p-0", seconds: float = 5) -> PodView:
    return PodView("ns", name, f"uid-{name}", node, deleting_since=ago(seconds))


# ---- fencing -----------------------------------------------------------------------------


def test_an_unreachable_node_without_evidence_is_not_fenced_and_nothing_is_done() -> None:
    o = observed(ready("a"), down("b", 3600 * 5), pods=(terminating("b"),))
    assert planner.fenced_by(o.spec, o.nodes[1], NOW) is None
    assert plan_of(o) == Wait("unreachable, not fenced: b", planner.POLL)


def plan_of(o: Observed) -> planner.Step:
    return planner.plan(o)


def test_the_provider_saying_stopped_or_gone_fences() -> None:
    for state in (InstanceState.STOPPED, InstanceState.GONE):
        node = down("b", instance=state)
        assert planner.fenced_by(spec(), node, NOW) == "provider"
    for state in (InstanceState.RUNNING, InstanceState.STOPPING, InstanceState.UNKNOWN):
        assert planner.fenced_by(spec(), down("b", instance=state), NOW) is None


def test_the_provider_is_not_asked_when_the_policy_says_no() -> None:
    policy = spec(fencing=FencingPolicy(provider=False))
    assert planner.fenced_by(policy, down("b", instance=InstanceState.GONE), NOW) is None


def test_a_fencing_annotation_counts_only_when_written_after_the_node_became_unreachable() -> None:
    assert planner.fenced_by(spec(), down("b", 20, fenced_at=ago(5)), NOW) == "annotation"
    assert planner.fenced_by(spec(), down("b", 20, fenced_at=ago(60)), NOW) is None
    policy = spec(fencing=FencingPolicy(annotation=False))
    assert planner.fenced_by(policy, down("b", 20, fenced_at=ago(5)), NOW) is None


def test_the_toleration_fences_only_when_the_policy_allows_it() -> None:
    node = down("b", 3700)
    assert planner.fenced_by(spec(), node, NOW) is None
    allowed = spec(fencing=FencingPolicy(after_toleration=True))
    assert planner.fenced_by(allowed, node, NOW) == "toleration"
    assert planner.fenced_by(allowed, down("b", 3500), NOW) is None


def test_a_ready_node_is_never_fenced_whatever_the_evidence() -> None:
    node = NodeView(
        "b", ready=True, unreachable_since=ago(9999), fenced_at=ago(1), instance=InstanceState.GONE
    )
    assert planner.fenced_by(spec(fencing=FencingPolicy(after_toleration=True)), node, NOW) is None


# ---- clear ---------------------------------------------------------------------------------


def test_a_fenced_node_is_tainted_out_of_service_first() -> None:
    step = plan_of(observed(ready("a"), down("b", fenced_at=ago(1)), pods=(terminating("b"),)))
    assert isinstance(step, TaintOutOfService) and step.node == "b"
    assert "fencing agent" in step.evidence


def test_then_its_terminating_pods_are_force_deleted_one_at_a_time() -> None:
    node = down("b", fenced_at=ago(1), out_of_service=True, out_of_service_ours=True)
    pods = (terminating("b", "p-1"), terminating("b", "p-0"), PodView("ns", "alive", "u", "b"))
    step = plan_of(observed(ready("a"), node, pods=pods))
    assert step == ForceDeletePod("ns", "p-0", "uid-p-0", "b", step.why)  # type: ignore[union-attr]
    assert "fenced" in step.why  # type: ignore[union-attr]


def test_a_pod_not_deleted_yet_is_left_to_the_taint_eviction() -> None:
    node = down("b", fenced_at=ago(1), out_of_service=True)
    step = plan_of(observed(ready("a"), node, pods=(PodView("ns", "p", "u", "b"),)))
    assert step == Wait("fenced and cleared, waiting for their return or purge: b", planner.POLL)


def test_the_taint_kustos_put_is_removed_when_the_node_is_ready_again() -> None:
    back = NodeView("b", ready=True, out_of_service=True, out_of_service_ours=True)
    assert plan_of(observed(ready("a"), back)) == RemoveOutOfService("b", "the node is Ready again")


def test_an_administrators_out_of_service_taint_is_left_alone() -> None:
    back = NodeView("b", ready=True, out_of_service=True, out_of_service_ours=False)
    assert plan_of(observed(ready("a"), back)) == Done()


def test_clear_disabled_does_nothing_even_when_fenced() -> None:
    policy = spec(should_disable_clear_nodes=True)
    o = observed(ready("a"), down("b", fenced_at=ago(1)), pods=(terminating("b"),), policy=policy)
    assert isinstance(plan_of(o), Wait)


def test_legacy_clear_does_what_ekco_does_without_fencing() -> None:
    policy = spec(legacy_clear=True, node_unreachable_toleration="1m")
    young, old = terminating("b", "young", 10), terminating("b", "old", 31)
    step = plan_of(observed(ready("a"), down("b", 61), pods=(young, old), policy=policy))
    assert isinstance(step, ForceDeletePod) and step.name == "old" and "legacyClear" in step.why
    # Before the toleration, nothing; and never a taint without fencing.
    assert isinstance(plan_of(observed(ready("a"), down("b", 59), pods=(old,), policy=policy)), Wait)


def test_without_legacy_clear_an_unfenced_node_past_its_toleration_keeps_its_pods() -> None:
    o = observed(ready("a"), down("b", 99999), pods=(terminating("b", seconds=9999),))
    assert isinstance(plan_of(o), Wait)


# ---- pinned claims ---------------------------------------------------------------------------


def claim(pinned: str, opted_in: bool = True, deleting: bool = False) -> ClaimView:
    return ClaimView("ns", "data-db-0", "cuid", pinned, "db-0", opted_in, deleting)


def test_a_claim_pinned_to_a_fenced_node_is_released_for_an_opted_in_workload() -> None:
    node = down("b", fenced_at=ago(1), out_of_service=True)
    step = plan_of(observed(ready("a"), node, claims=(claim("b"),)))
    assert step == ReleaseClaim("ns", "data-db-0", "cuid", "b", "db-0")


def test_a_claim_is_never_released_before_fencing_or_without_opt_in() -> None:
    assert isinstance(plan_of(observed(ready("a"), down("b"), claims=(claim("b"),))), Wait)
    fenced = down("b", fenced_at=ago(1), out_of_service=True)
    assert isinstance(plan_of(observed(ready("a"), fenced, claims=(claim("b", opted_in=False),))), Wait)
    assert isinstance(plan_of(observed(ready("a"), fenced, claims=(claim("b", deleting=True),))), Wait)
    # A claim pinned to a node that is fine is not touched.
    assert plan_of(observed(ready("a"), claims=(claim("a"),))) == Done()


def test_a_claim_pinned_to_a_node_that_no_longer_exists_is_released() -> None:
    assert isinstance(plan_of(observed(ready("a"), claims=(claim("gone"),))), ReleaseClaim)


# ---- purge -------------------------------------------------------------------------------------


def purge_policy(**changes: object) -> MaintenancePolicySpec:
    return spec(should_enable_purge_nodes=True, node_unreachable_toleration="1m", **changes)


def dead(name: str, seconds: float = 61, **fields: object) -> NodeView:
    """Unreachable, fenced by a fencing agent, and cleared already (nothing left but the purge)."""
    return down(name, seconds, fenced_at=ago(1), out_of_service=True, **fields)


def purges(step: planner.Step, node: str) -> bool:
    """``step`` is the node's next purge step (a worker's purge is its deletion alone, decided first)."""
    return step in (Purge(node), DecideDeletion(node, ""))


def test_an_unfenced_node_past_its_toleration_is_not_purged() -> None:
    """A Node deleted while merely partitioned would let its pods run twice."""
    nodes = (ready("c1", True), ready("c2", True), ready("w1"))
    step = plan_of(observed(*nodes, down("w2", 61), policy=purge_policy()))
    assert isinstance(step, Refuse) and step.node == "w2" and step.action == "Purge"
    assert step.message.startswith("not fenced: node w2")
    status = planner.status(observed(*nodes, down("w2", 61), policy=purge_policy()), step, NOW)
    assert status.last_refusal is not None and "not fenced" in status.last_refusal.message
    # afterToleration keeps EKCO's behaviour: past the toleration is fenced, and purged.
    policy = purge_policy(fencing=FencingPolicy(after_toleration=True))
    assert purges(plan_of(observed(*nodes, down("w2", 61), policy=policy)), "w2")
    # So do the provider and the annotation.
    assert purges(plan_of(observed(*nodes, dead("w2"), policy=purge_policy())), "w2")
    stopped = down("w2", 61, instance=InstanceState.STOPPED)
    assert purges(plan_of(observed(*nodes, stopped, policy=purge_policy())), "w2")


def test_a_node_back_ready_mid_purge_is_shown_in_the_status_until_its_purge_is_gone() -> None:
    back = NodeView("w2", ready=True, purge_done=("RookStorageNode", "RookOSDDeployment"))
    o = observed(ready("c1", True), back, policy=purge_policy())
    assert plan_of(o) == Done()  # a Ready node is not purged further
    status = planner.status(o, plan_of(o), NOW)
    condition = next(c for c in status.conditions if c.type == "PurgeInterrupted")
    assert condition.status == "True" and condition.reason == "NodeReturned"
    assert "node w2 is Ready with its purge unfinished (done: RookStorageNode, RookOSDDeployment)" in (
        condition.message
    )
    cleaned = Observed(o.spec, (ready("c1", True), ready("w2")), now=NOW, previous=status)
    after = planner.status(cleaned, Done(), NOW)
    condition = next(c for c in after.conditions if c.type == "PurgeInterrupted")
    assert condition.status == "False"
    # An unreachable node mid-purge is a purge under way, not an interrupted one.
    going = planner.status(observed(ready("c1", True), dead("w2", purge_done=("Node",))), Done(), NOW)
    assert not [c for c in going.conditions if c.type == "PurgeInterrupted"]


def test_purge_comes_after_the_toleration_only() -> None:
    nodes = (ready("c1", True), ready("c2", True), ready("w1"))
    assert isinstance(plan_of(observed(*nodes, dead("w2", 59), policy=purge_policy())), Wait)
    assert purges(plan_of(observed(*nodes, dead("w2"), policy=purge_policy())), "w2")


def test_guards_count_ready_nodes_of_the_dead_nodes_own_role_without_it() -> None:
    dead_cp = dead("c3", control_plane=True)
    # Two ready control-plane nodes remain: purge allowed at the default minimum of 2.
    o = observed(ready("c1", True), ready("c2", True), dead_cp, policy=purge_policy())
    assert purges(plan_of(o), "c3")
    # One remains: refused, and the message names the count and the minimum.
    o = observed(ready("c1", True), down("c2", 5, control_plane=True), dead_cp, policy=purge_policy())
    step = plan_of(o)
    assert isinstance(step, Refuse)
    assert "leave 1 ready control-plane node(s); minReadyMasterNodeCount is 2" in step.message
    # The worker minimum does not apply to a control-plane node (EKCO applied it to both).
    o = observed(
        ready("c1", True), ready("c2", True), dead_cp, policy=purge_policy(min_ready_worker_node_count=5)
    )
    assert purges(plan_of(o), "c3")
    # And the control-plane minimum does not apply to a worker.
    o = observed(
        ready("c1", True), ready("w1"), dead("w2"), policy=purge_policy(min_ready_worker_node_count=1)
    )
    assert purges(plan_of(o), "w2")
    o = observed(ready("c1", True), dead("w2"), policy=purge_policy(min_ready_worker_node_count=1))
    assert isinstance(plan_of(o), Refuse)


def test_a_refused_purge_does_not_stop_the_clear_of_a_fenced_node() -> None:
    policy = purge_policy(min_ready_worker_node_count=3)
    step = plan_of(observed(ready("c1", True), down("w2", 61, fenced_at=ago(1)), policy=policy))
    assert isinstance(step, TaintOutOfService)


@given(
    masters=st.integers(0, 5), workers=st.integers(0, 5), dead_cp=st.booleans(),
    min_m=st.integers(0, 6), min_w=st.integers(0, 6),
)  # fmt: skip
def test_purge_never_leaves_fewer_ready_nodes_of_a_role_than_its_minimum(
    masters: int, workers: int, dead_cp: bool, min_m: int, min_w: int
) -> None:
    nodes = [ready(f"c{i}", True) for i in range(masters)] + [ready(f"w{i}") for i in range(workers)]
    victim = dead("dead", control_plane=dead_cp)
    policy = purge_policy(min_ready_master_node_count=min_m, min_ready_worker_node_count=min_w)
    step = plan_of(observed(*nodes, victim, policy=policy))
    if isinstance(step, Purge | DecideDeletion):
        if dead_cp:
            assert masters >= min_m
        else:
            assert workers >= min_w
    else:
        assert isinstance(step, Refuse)
        assert (dead_cp and masters < min_m) or (not dead_cp and workers < min_w)


# ---- policy name, status ---------------------------------------------------------------------


def test_only_the_policy_named_default_is_acted_on() -> None:
    step = plan_of(observed(ready("a"), down("b", fenced_at=ago(1)), name="other"))
    assert isinstance(step, Ignored)
    status = planner.status(observed(name="other"), step, NOW)
    ready_condition = next(c for c in status.conditions if c.type == "Ready")
    assert ready_condition.status == "False" and "default" in ready_condition.message


def test_a_nodes_deletion_is_recorded_as_decided_before_it_is_asked_and_done_once_it_is_gone() -> None:
    """The operator may stop between the Node's deletion and its record: the decision, recorded
    first, is what a later pass finds to record the purge done (nothing else names the Node)."""
    w2 = dead("w2", uid="u2")
    deciding = observed(ready("c1", True), w2, policy=purge_policy())
    step = plan_of(deciding)
    assert step == DecideDeletion("w2", "u2")
    decided = planner.status(deciding, step, NOW)
    assert [(d.node, d.uid) for d in decided.purge_deletions] == [("w2", "u2")]
    assert decided.last_action is not None and decided.last_action.message.startswith("deleting Node w2")
    again = Observed(deciding.spec, deciding.nodes, now=NOW, previous=decided)
    assert plan_of(again) == Purge("w2")  # decided: now it is asked
    # The operator stopped right after the deletion: the next one finds the Node gone.
    gone = Observed(deciding.spec, (ready("c1", True),), now=NOW, previous=decided)
    finished = plan_of(gone)
    assert finished == Purged("w2", "Node w2 is gone: its purge is complete", finished=True)
    done = planner.status(gone, finished, NOW)
    assert done.purge_deletions == []
    assert done.last_action is not None and (done.last_action.node, done.last_action.outcome) == (
        "w2",
        "Done",
    )
    assert [n.reason for n in planner.action_notes(decided, done)] == ["Purge"]
    assert plan_of(Observed(gone.spec, gone.nodes, now=NOW, previous=done)) == Done()
    # Without a stop, the pass that deleted it records it done the same way.
    deleted = planner.status(again, Purged("w2", "deleted Node w2", finished=True), NOW)
    assert deleted.purge_deletions == [] and deleted.last_action is not None
    assert deleted.last_action.message == "deleted Node w2"


def test_a_deletion_decided_stays_while_its_node_is_dead_and_is_forgotten_once_it_is_back() -> None:
    policy = purge_policy()
    w2 = dead("w2", uid="u2")  # a worker: nothing on its Node records the purge
    decided = planner.status(observed(ready("c1", True), w2, policy=policy), DecideDeletion("w2", "u2"), NOW)
    # Still dead: the decision stays through passes that do something else.
    elsewhere = Observed(policy, (ready("c1", True), w2, down("w3")), now=NOW, previous=decided)
    kept = planner.status(elsewhere, TaintOutOfService("w3", "fenced"), NOW)
    assert [d.node for d in kept.purge_deletions] == ["w2"]
    assert plan_of(Observed(policy, (ready("c1", True), w2), now=NOW, previous=kept)) == Purge("w2")
    # Ready again: no longer dead, no longer decided.
    back = Observed(
        policy, (ready("c1", True), NodeView("w2", ready=True, uid="u2")), now=NOW, previous=decided
    )
    assert plan_of(back) == Done()
    assert planner.status(back, Done(), NOW).purge_deletions == []
    # A Node registered again under its name is another Node: the one decided is gone.
    again = Observed(
        policy, (ready("c1", True), NodeView("w2", ready=True, uid="u3")), now=NOW, previous=decided
    )
    assert plan_of(again) == Purged("w2", "Node w2 is gone: its purge is complete", finished=True)


def test_the_deletion_is_decided_only_once_every_other_step_of_the_purge_is_done() -> None:
    rook = purge_policy(rook_should_use_all_nodes=False)
    assert plan_of(observed(ready("c1", True), dead("w2", uid="u2"), policy=rook)) == Purge("w2")
    cp_nodes = (ready("c1", True), ready("c2", True))
    control = dead("c3", uid="u3", control_plane=True, purge_done=("Address", "ControlPlaneEndpoint"))
    assert plan_of(observed(*cp_nodes, control, policy=purge_policy())) == Purge("c3")
    control = dead(
        "c3", uid="u3", control_plane=True, purge_done=("Address", "ControlPlaneEndpoint", "EtcdMember")
    )
    assert plan_of(observed(*cp_nodes, control, policy=purge_policy())) == DecideDeletion("c3", "u3")


def test_status_records_the_action_and_the_refusal_until_that_node_succeeds() -> None:
    o = observed(ready("c1", True), dead("w2"), policy=purge_policy(min_ready_worker_node_count=1))
    refused = planner.status(o, plan_of(o), NOW)
    assert refused.last_action is not None and refused.last_action.outcome == "Refused"
    assert refused.last_refusal is not None and refused.last_refusal.node == "w2"
    assert refused.dead_nodes == ["w2"]
    later = Observed(o.spec, o.nodes, now=NOW, previous=refused)
    done = planner.status(later, Purged("w2", "deleted Node w2"), NOW)
    assert done.last_action is not None and done.last_action.outcome == "Done"
    assert done.last_action.message == "deleted Node w2"
    assert done.last_refusal is None


def test_a_purge_step_refused_by_etcd_is_a_refusal() -> None:
    o = observed(ready("c1", True), ready("c2", True), dead("c3", control_plane=True), policy=purge_policy())
    status = planner.status(o, Purged("c3", "removing member would leave 1 healthy", refused=True), NOW)
    assert status.last_refusal is not None
    assert status.last_refusal.message == "removing member would leave 1 healthy"  # said once, no prefix


def test_a_failed_step_is_degraded_with_its_reason() -> None:
    o = observed(ready("a"), down("b", fenced_at=ago(1)))
    status = planner.status(o, plan_of(o), NOW, ReconcileError("the API server said no", reason="ApiError"))
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert degraded.status == "True" and degraded.reason == "ApiError"
    assert status.last_action is not None and status.last_action.outcome == "Failed"


def test_a_repeated_refusal_keeps_its_first_time() -> None:
    o = observed(ready("c1", True), dead("w2"), policy=purge_policy(min_ready_worker_node_count=1))
    first = planner.status(o, plan_of(o), NOW)
    later = NOW + timedelta(seconds=30)
    again = planner.status(Observed(o.spec, o.nodes, now=later, previous=first), plan_of(o), later)
    assert again.last_refusal == first.last_refusal
    assert again.last_action == first.last_action


# ---- the node view -------------------------------------------------------------------------------


def test_node_view_reads_taints_roles_and_the_fencing_annotation() -> None:
    node = {
        "metadata": {
            "name": "b",
            "labels": {"node-role.kubernetes.io/control-plane": ""},
            "annotations": {"kustos.dev/fenced": "2026-11-24T11:59:50Z", "kustos.dev/out-of-service": "x",
                            "kustos.dev/purge": "Address,ControlPlaneEndpoint"},
        },
        "spec": {"taints": [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
             "timeAdded": "2026-11-24T11:59:40Z"},
            {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
        ]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    }  # fmt: skip
    view = node_view(node, InstanceState.RUNNING)
    assert view.control_plane and not view.ready
    assert view.unreachable_since == ago(20)
    assert view.fenced_at == ago(10)
    assert view.out_of_service and view.out_of_service_ours
    assert view.purge_done == ("Address", "ControlPlaneEndpoint")
    assert planner.fenced_by(spec(), view, NOW) == "annotation"
    bad = node_view({**node, "metadata": {**node["metadata"], "annotations": {"kustos.dev/fenced": "yes"}}})
    assert bad.fenced_at is None and bad.fenced_annotation_problem is not None
    assert planner.fenced_by(spec(), bad, NOW) is None


def test_status_is_plain_json() -> None:
    o = observed(ready("a"), down("b", fenced_at=ago(1)))
    dumped = planner.status(o, plan_of(o), NOW).model_dump(by_alias=True)
    assert dumped["lastAction"]["action"] == "Clear"
    assert MaintenancePolicyStatus.model_validate(dumped).last_action is not None


def test_an_unreadable_fencing_annotation_is_named_in_a_condition() -> None:
    bad = NodeView("b", ready=False, unreachable_since=ago(20), fenced_annotation_problem="not a time")
    o = observed(ready("a"), bad)
    assert isinstance(plan_of(o), Wait)
    condition = next(
        c for c in planner.status(o, plan_of(o), NOW).conditions if c.type == "FencingAnnotationsValid"
    )
    assert condition.status == "False" and "node b: not a time" in condition.message


def test_a_claim_pinned_by_hostname_follows_the_node_whose_label_it_is() -> None:
    """A local volume names the node's kubernetes.io/hostname, which may differ from its name."""
    alive = NodeView("node-a", ready=True, hostname="host-a")
    assert plan_of(observed(alive, claims=(claim("host-a"),))) == Done()
    fenced = NodeView("node-b", ready=False, unreachable_since=ago(20), fenced_at=ago(1), out_of_service=True,
                      hostname="host-b")  # fmt: skip
    assert isinstance(plan_of(observed(alive, fenced, claims=(claim("host-b"),))), ReleaseClaim)


node_views = st.builds(
    lambda i, ready_, since, fenced, instance, oos: NodeView(
        f"n{i}", ready=ready_, unreachable_since=None if ready_ or since is None else ago(since),
        fenced_at=None if fenced is None else ago(fenced), instance=instance, out_of_service=oos,
    ),
    st.integers(0, 4), st.booleans(), st.one_of(st.none(), st.integers(0, 7200)),
    st.one_of(st.none(), st.integers(0, 7200)), st.one_of(st.none(), st.sampled_from(list(InstanceState))),
    st.booleans(),
)  # fmt: skip


@given(
    nodes=st.lists(node_views, max_size=5, unique_by=lambda n: n.name),
    after_toleration=st.booleans(), legacy=st.booleans(), purge=st.booleans(),
    pods=st.lists(st.tuples(st.integers(0, 4), st.one_of(st.none(), st.integers(0, 600))), max_size=6),
    claims=st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=4),
)  # fmt: skip
def test_nothing_is_moved_off_a_node_that_is_not_fenced_except_by_legacy_clear(
    nodes: list[NodeView], after_toleration: bool, legacy: bool, purge: bool,
    pods: list[tuple[int, int | None]], claims: list[tuple[int, bool]],
) -> None:  # fmt: skip
    policy = spec(fencing=FencingPolicy(after_toleration=after_toleration), legacy_clear=legacy,
                  should_enable_purge_nodes=purge, node_unreachable_toleration="1m")  # fmt: skip
    pod_views = tuple(
        PodView("ns", f"p{k}", f"u{k}", f"n{i}", None if s is None else ago(s))
        for k, (i, s) in enumerate(pods)
    )
    claim_views = tuple(
        ClaimView("ns", f"c{k}", f"cu{k}", f"n{i}", f"p{k}", opted) for k, (i, opted) in enumerate(claims)
    )
    o = observed(*nodes, pods=pod_views, claims=claim_views, policy=policy)
    step = plan_of(o)
    by_name = {n.name: n for n in nodes}
    if isinstance(step, TaintOutOfService):
        assert planner.fenced_by(policy, by_name[step.node], NOW) is not None
    if isinstance(step, ForceDeletePod):
        fenced = planner.fenced_by(policy, by_name[step.node], NOW) is not None
        assert fenced or (legacy and planner.past_toleration(policy, by_name[step.node], NOW))
    if isinstance(step, ReleaseClaim):
        node = by_name.get(step.node)
        assert node is None or planner.fenced_by(policy, node, NOW) is not None
        assert next(c for c in claim_views if c.name == step.name).opted_in
    if isinstance(step, Purge | DecideDeletion):  # a Node deleted is its pods started elsewhere
        assert planner.fenced_by(policy, by_name[step.node], NOW) is not None
    if isinstance(step, RemoveOutOfService):
        assert by_name[step.node].ready


def test_an_action_recorded_anew_is_one_event_and_a_repeat_none() -> None:
    o = observed(ready("c1", True), dead("w2"), policy=purge_policy(min_ready_worker_node_count=1))
    refused = planner.status(o, plan_of(o), NOW)
    [note] = planner.action_notes(o.previous, refused)
    assert (note.reason, note.type) == ("PurgeRefused", "Warning") and note.message.startswith("w2: ")
    assert planner.action_notes(refused, refused) == []
    failed = planner.status(o, plan_of(o), NOW, ReconcileError("no", reason="ApiError"))
    assert planner.action_notes(o.previous, failed) == []  # Degraded says it


def test_the_next_pass_after_a_refused_purge_step_waits_longer() -> None:
    assert planner.requeue_after(Purged("w2", "quorum", refused=True)) > planner.requeue_after(
        Purged("w2", "done")
    )
