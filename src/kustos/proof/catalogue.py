"""Every operator action the proof suite must run under load (issue 25), one entry each.

A scenario records its history under its entry's ``title``, so the report can say, for every
action, whether a checked history proves it this run, or that no scenario exists yet (and why).
The order is the order of the work: cheapest first. The actions a real kubelet does differently
(it restarts, stops and cuts off containers, where the process runner only mimics it) have an
entry of their own on real nodes (``on_real_nodes``), after the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kustos.proof.check import Verdict

__all__ = [
    "ACTIONS", "NODE_ACTIONS", "PROCESS_RUNNER_ACTIONS", "REAL_NODE_ACTIONS",
    "Action", "action", "coverage_table", "on_real_nodes",
]  # fmt: skip


@dataclass(frozen=True)
class Action:
    key: str
    title: str  # the scenario name its history carries (the report's row)
    test: str | None = None  # the test in tests/integration/test_proof*.py that records it
    missing: str = ""  # why no scenario exists yet


_PROCESS_RUNNER: tuple[Action, ...] = (
    Action("etcd-killed", "etcd process killed (no operator)",
           "test_a_member_killed_under_load_leaves_a_linearizable_history"),
    Action("create", "create (members join under load)",
           "test_create_and_resize_under_load_leave_linearizable_histories"),
    Action("scale-up", "scale up 3 to 5",
           "test_create_and_resize_under_load_leave_linearizable_histories"),
    Action("scale-down", "scale down 5 to 3",
           "test_create_and_resize_under_load_leave_linearizable_histories"),
    Action("pod-deleted", "member pod deleted (operator replaces it)",
           "test_a_member_pod_deleted_under_load_leaves_a_linearizable_history"),
    Action("container-killed", "member container killed (restarted in place)",
           "test_a_member_container_killed_under_load_leaves_a_linearizable_history"),
    Action("operator-killed", "operator killed mid-step (after AddMember), next one finishes",
           "test_the_operator_killed_mid_step_under_load_leaves_a_linearizable_history"),
    Action("soak", "soak: pod deletions in a loop, operator sampled",
           "test_a_soak_keeps_histories_linearizable_and_the_operator_flat"),
    Action("node-stopped", "node stopped (member replaced elsewhere)",
           "test_a_member_node_stopped_under_load_leaves_a_linearizable_history"),
    Action("node-partitioned", "node partitioned and healed",
           "test_a_member_node_partitioned_and_healed_under_load_leaves_a_linearizable_history"),
    Action("leader-partitioned", "etcd leader's node partitioned",
           "test_the_leaders_node_partitioned_under_load_leaves_a_linearizable_history"),
    Action("defragmentation", "defragmentation",
           "test_defragmentation_under_load_leaves_a_linearizable_history"),
    Action("upgrade-rollback", "upgrade and rollback",
           "test_an_upgrade_then_a_rollback_under_load_leave_linearizable_histories"),
    Action("chained-upgrade", "chained upgrade (3.5 to 3.7 through 3.6)",
           "test_a_chained_upgrade_under_load_leaves_a_linearizable_history"),
    Action("ca-rotation", "CA rotation (clients take each new client certificate)",
           "test_a_ca_rotation_under_load_leaves_a_linearizable_history"),
    Action("backup", "backup under load (restored elsewhere: the state at its revision)",
           "test_a_backup_under_load_restored_elsewhere_holds_every_write_acknowledged_before_it"),
    Action("restore", "restore",
           missing="the documented exception: a restore replaces the data, so no history spans it"),
    Action("quorum-rebuild", "quorum-loss rebuild, approved (every acknowledged write carried over)",
           "test_quorum_loss_waits_for_approval_and_the_approved_rebuild_keeps_every_acknowledged_write"),
    Action("quorum-rebuild-unapproved", "quorum-loss, waiting for approval (nothing destroyed)",
           "test_quorum_loss_waits_for_approval_and_the_approved_rebuild_keeps_every_acknowledged_write"),
    Action("drain", "node drain with member migration",
           "test_every_member_node_drained_in_turn_under_load_leaves_a_linearizable_history"),
    Action("nodeimage", "NodeImage rollout with etcd members on the nodes",
           "test_a_nodeimage_rollout_over_member_nodes_under_load_leaves_a_linearizable_history"),
    Action("dead-node", "dead-node clearing with etcd members on the nodes",
           "test_a_dead_node_cleared_with_a_member_on_it_under_load_leaves_a_linearizable_history"),
)  # fmt: skip


def on_real_nodes(key: str) -> str:
    """The key of action ``key`` proven on real kubelet nodes (containerd, runc)."""
    return f"{key}@real-nodes"


def _real(key: str, test: str) -> Action:
    base = next(entry for entry in _PROCESS_RUNNER if entry.key == key)
    return Action(on_real_nodes(key), f"{base.title}, on real kubelet nodes", test)


REAL_NODE_ACTIONS: tuple[Action, ...] = (
    _real("pod-deleted", "test_a_member_pod_deleted_on_real_nodes_under_load_leaves_a_linearizable_history"),
    _real("container-killed",
          "test_a_member_container_killed_on_real_nodes_under_load_leaves_a_linearizable_history"),
    _real("node-stopped", "test_a_real_member_node_stopped_under_load_leaves_a_linearizable_history"),
    _real("node-partitioned",
          "test_a_real_member_node_partitioned_and_healed_under_load_leaves_a_linearizable_history"),
    _real("leader-partitioned",
          "test_the_leaders_real_node_partitioned_under_load_leaves_a_linearizable_history"),
)  # fmt: skip

ACTIONS: tuple[Action, ...] = _PROCESS_RUNNER + REAL_NODE_ACTIONS

# Each proof module's report lists the actions it proves, so `make proof`'s report, one section
# per module, lists each action once: test_proof_nodes.py the node actions (several nodes moved
# in turn), test_proof_real_nodes.py the real-node ones, test_proof.py the rest.
NODE_ACTIONS: tuple[Action, ...] = tuple(a for a in _PROCESS_RUNNER if a.key in ("drain", "nodeimage"))
PROCESS_RUNNER_ACTIONS: tuple[Action, ...] = tuple(a for a in _PROCESS_RUNNER if a not in NODE_ACTIONS)


def action(key: str) -> Action:
    for entry in ACTIONS:
        if entry.key == key:
            return entry
    raise KeyError(f"no proof action {key!r}")


def coverage_table(verdicts: Iterable[Verdict], actions: tuple[Action, ...] = ACTIONS) -> str:
    """Which actions a checked history proved in this run, which failed or did not run, and
    which have no scenario yet (Markdown)."""
    by_title: dict[str, list[Verdict]] = {}
    for v in verdicts:
        by_title.setdefault(v.scenario, []).append(v)
    lines = ["| action | scenario | this run |", "|---|---|---|"]
    for entry in actions:
        if entry.test is None:
            lines.append(f"| {entry.title} | — | {entry.missing} |")
            continue
        runs = by_title.get(entry.title, [])
        if not runs:
            outcome = "not run"
        else:
            passed = sum(v.passed for v in runs)
            outcome = f"{passed} of {len(runs)} histories proven" if len(runs) > 1 else runs[0].verdict
        lines.append(f"| {entry.title} | `{entry.test}` | {outcome} |")
    return "\n".join(lines)
