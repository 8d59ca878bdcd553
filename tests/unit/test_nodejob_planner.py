"""The NodeJob planner: node selection, log matching, progress and completion."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.api.nodejob import NodeJob, NodeJobSpec, NodeJobStatus, NodeProgress
from kustos.nodejob import planner
from kustos.nodejob.planner import NodeView, Observed, Plan, PodView, Taint
from kustos.runtime.errors import ReconcileError

NOW = datetime(2026, 1, 1, tzinfo=UTC)
NOW_TEXT = "2026-01-01T00:00:00Z"


def spec(**extra: Any) -> NodeJobSpec:
    return NodeJobSpec.model_validate({"image": "busybox", "completionWord": "done", **extra})


def label_term(key: str, op: str = "In", *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


NODES = (
    NodeView("w1", {"role": "storage"}),
    NodeView("w2", {"role": "storage"}),
    NodeView("w3", {"role": "web"}),
    NodeView("cp", {}, (Taint("node-role.kubernetes.io/control-plane", "", "NoSchedule"),)),
)


def observed(s: NodeJobSpec, pods: tuple[PodView, ...] = (), **kw: Any) -> Observed:
    return Observed(
        spec=s, daemon_set_exists=kw.pop("ds", True), nodes=kw.pop("nodes", NODES), pods=pods, now=NOW, **kw
    )


def test_defaults_follow_the_reference_operator() -> None:
    s = spec()
    assert s.label_selector == "daemonset-job=true"
    assert s.node_selector_terms == [] and s.args == [] and s.host_path is None


def test_every_untainted_node_when_no_terms() -> None:
    assert planner.selected(spec(), NODES) == ["w1", "w2", "w3"]


def test_terms_select_matching_nodes_only() -> None:
    chosen = planner.selected(spec(nodeSelectorTerms=[label_term("role", "In", "storage")]), NODES)
    assert chosen == ["w1", "w2"]


def test_terms_are_ored_and_expressions_anded() -> None:
    terms = [
        {"matchExpressions": [{"key": "role", "operator": "In", "values": ["storage"]},
                              {"key": "role", "operator": "NotIn", "values": ["storage"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w3"]}]},
    ]  # fmt: skip
    assert planner.selected(spec(nodeSelectorTerms=terms), NODES) == ["w3"]


def test_an_empty_term_matches_nothing() -> None:
    assert planner.selected(spec(nodeSelectorTerms=[{}]), NODES) == []


@pytest.mark.parametrize(
    ("op", "values", "expected"),
    [
        ("Exists", [], ["w1", "w2", "w3"]),
        ("DoesNotExist", [], []),
        ("NotIn", ["web"], ["w1", "w2"]),
    ],
)
def test_operators(op: str, values: list[str], expected: list[str]) -> None:
    assert planner.selected(spec(nodeSelectorTerms=[label_term("role", op, *values)]), NODES) == expected


def test_gt_and_lt_compare_integers() -> None:
    nodes = (NodeView("a", {"disks": "2"}), NodeView("b", {"disks": "8"}), NodeView("c", {"disks": "x"}))
    assert planner.selected(spec(nodeSelectorTerms=[label_term("disks", "Gt", "4")]), nodes) == ["b"]
    assert planner.selected(spec(nodeSelectorTerms=[label_term("disks", "Lt", "4")]), nodes) == ["a"]


def test_tolerations_admit_tainted_nodes() -> None:
    key = "node-role.kubernetes.io/control-plane"
    tolerate = [{"key": key, "operator": "Exists", "effect": "NoSchedule"}]
    assert "cp" in planner.selected(spec(tolerations=tolerate), NODES)
    assert "cp" in planner.selected(spec(tolerations=[{"operator": "Exists"}]), NODES)
    wrong_effect = [{"key": key, "operator": "Exists", "effect": "NoExecute"}]
    assert "cp" not in planner.selected(spec(tolerations=wrong_effect), NODES)


def test_daemonset_default_tolerations_and_soft_taints() -> None:
    nodes = (
        NodeView("down", {}, (Taint("node.kubernetes.io/unreachable", "", "NoExecute"),)),
        NodeView("soft", {}, (Taint("x", "", "PreferNoSchedule"),)),
        NodeView("hard", {}, (Taint("x", "y", "NoExecute"),)),
    )
    assert planner.selected(spec(), nodes) == ["down", "soft"]
    assert planner.selected(spec(tolerations=[{"key": "x", "value": "y"}]), nodes) == ["down", "hard", "soft"]
    assert planner.selected(spec(tolerations=[{"key": "x", "value": "z"}]), nodes) == ["down", "soft"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("working\ndone\n", True),
        ("all done now", True),
        ("done.", True),
        ("undone\n", False),
        ("done-ish", False),
        ("doner kebab", False),
        ("", False),
        ("2026-01-01T00:00:00Z stdout F done", True),
    ],
)
def test_log_word(text: str, found: bool) -> None:
    assert planner.log_has_word(text, "done") is found


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_log_word_never_raises_and_regex_characters_are_literal(noise: str) -> None:
    assert planner.log_has_word(f"{noise}\n[ok]\n", "[ok]")
    if planner.log_has_word(noise, "a+b"):
        assert "a+b" in noise


def test_creates_the_daemonset_first() -> None:
    assert planner.plan(observed(spec(), ds=False)).action == "CreateDaemonSet"


def test_progress_pending_running_done() -> None:
    s = spec(nodeSelectorTerms=[label_term("role", "In", "storage")])
    pods = (PodView("p1", "w1", running=True, word_seen=True), PodView("p2", "w2", running=True))
    step = planner.plan(observed(s, pods))
    assert step.action == "Record" and not step.completed
    assert [(n.name, n.state, n.pod) for n in step.nodes] == [("w1", "Done", "p1"), ("w2", "Running", "p2")]
    assert step.newly_done == ("w1",) and step.progress == "1/2"
    assert step.nodes[0].done_time == NOW_TEXT
    assert "w2" in step.message


def test_pod_on_an_unselected_node_is_ignored() -> None:
    s = spec(nodeSelectorTerms=[label_term("role", "In", "storage")])
    pods = (PodView("p1", "w1", True, word_seen=True), PodView("p3", "w3", True, word_seen=True))
    step = planner.plan(observed(s, pods))
    assert [n.name for n in step.nodes] == ["w1", "w2"] and not step.completed


def test_completes_when_every_selected_node_is_done() -> None:
    s = spec(nodeSelectorTerms=[label_term("role", "In", "storage")])
    pods = (PodView("p1", "w1", True, word_seen=True), PodView("p2", "w2", True, word_seen=True))
    step = planner.plan(observed(s, pods))
    assert step.completed and step.newly_completed and step.progress == "2/2"


def test_a_node_once_done_stays_done_without_its_log() -> None:
    s = spec(nodeSelectorTerms=[label_term("role", "In", "storage")])
    recorded = (NodeProgress(name="w1", pod="p1", state="Done", done_time="earlier"),)
    pods = (PodView("p2", "w2", True, word_seen=True),)
    step = planner.plan(observed(s, pods, recorded=recorded))
    assert step.completed and step.newly_done == ("w2",)
    assert step.nodes[0].done_time == "earlier"


def test_a_node_joining_before_completion_is_waited_for() -> None:
    s = spec(nodeSelectorTerms=[label_term("role", "In", "storage")])
    nodes = (*NODES, NodeView("w4", {"role": "storage"}))
    recorded = (NodeProgress(name="w1", state="Done"), NodeProgress(name="w2", state="Done"))
    step = planner.plan(observed(s, nodes=nodes, recorded=recorded))
    assert not step.completed and [n.state for n in step.nodes] == ["Done", "Done", "Pending"]


def test_no_matching_node_is_never_complete() -> None:
    step = planner.plan(observed(spec(nodeSelectorTerms=[label_term("role", "In", "none")])))
    assert not step.completed and "no node matches" in step.message


def test_completed_stays_completed() -> None:
    step = planner.plan(observed(spec(), completed=True, ds=False))
    assert step.action == "Record" and step.completed and not step.newly_completed


def test_a_deleting_pod_is_not_running() -> None:
    pods = (PodView("old", "w1", True, deleting=True),)
    step = planner.plan(observed(spec(nodeSelectorTerms=[label_term("role", "In", "storage")]), pods))
    assert step.nodes[0].state == "Pending"


@pytest.mark.parametrize(
    ("term", "problem"),
    [
        (label_term("role", "In"), "needs at least one value"),
        (label_term("role", "Exists", "x"), "takes no values"),
        (label_term("n", "Gt", "x"), "one integer value"),
        ({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["a"]}]}, "only metadata.name"),
    ],
)
def test_invalid_terms_are_reported_with_their_path(term: dict[str, Any], problem: str) -> None:
    step = planner.plan(observed(spec(nodeSelectorTerms=[term])))
    assert step.action == "Invalid" and problem in step.message
    assert "spec.nodeSelectorTerms[0]" in step.message


def test_the_job_label_is_reserved() -> None:
    assert planner.plan(observed(spec(labelSelector="kustos.dev/nodejob=x"))).action == "Invalid"


def test_label_selector_schema() -> None:
    NodeJobSpec.model_validate({"image": "i", "completionWord": "w", "labelSelector": "a=b,example.com/c=d"})
    with pytest.raises(ValueError, match=r"label_selector|labelSelector"):
        NodeJobSpec.model_validate({"image": "i", "completionWord": "w", "labelSelector": "a b"})


def test_daemonset_manifest() -> None:
    job = NodeJob.model_validate({
        "metadata": {"name": "clean", "namespace": "ns", "uid": "u-1"},
        "spec": {"image": "busybox", "command": ["sh", "-c"], "args": ["rm -rf /h/x; echo done"],
                 "hostPath": "/var/lib", "mountPath": "/h", "completionWord": "done",
                 "nodeSelectorTerms": [label_term("role", "In", "storage")],
                 "tolerations": [{"operator": "Exists"}]},
    })  # fmt: skip
    ds = planner.daemon_set(job)
    assert ds["metadata"]["name"] == "clean-nodejob"
    owner = ds["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "NodeJob" and owner["uid"] == "u-1" and owner["controller"] is True
    labels = {"daemonset-job": "true", "kustos.dev/nodejob": "clean"}
    assert ds["spec"]["selector"]["matchLabels"] == labels
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"] == labels
    container = pod["spec"]["containers"][0]
    assert container["image"] == "busybox" and container["command"] == ["sh", "-c"]
    assert container["volumeMounts"] == [{"name": "host", "mountPath": "/h"}]
    assert pod["spec"]["volumes"] == [{"name": "host", "hostPath": {"path": "/var/lib"}}]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [label_term("role", "In", "storage")]
    assert pod["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_long_names_fit() -> None:
    assert len(planner.daemon_set_name("x" * 63)) <= 63


# ---- status: one pure function of what was observed, the step and the time ----------------


def test_status_after_creating_the_daemon_set() -> None:
    o = observed(spec(), ds=False, name="clean", generation=2)
    step = planner.plan(o)
    assert step.action == "CreateDaemonSet"
    status = planner.status(o, step, NOW)
    assert (status.phase, status.daemon_set, status.start_time) == ("Running", "clean-nodejob", NOW_TEXT)
    assert status.message == "running busybox through DaemonSet clean-nodejob"
    [completed] = status.conditions
    assert (completed.type, completed.status, completed.reason, completed.observed_generation) == (
        "Completed", "False", "Running", 2,
    )  # fmt: skip


def test_status_when_complete_keeps_times_and_clears_an_old_degraded() -> None:
    previous = planner.invalid(NodeJobStatus(start_time="2025-12-31T00:00:00Z"), "bad", 1, NOW)
    pods = tuple(PodView(f"p-{n}", n, True, word_seen=True) for n in ("w1", "w2", "w3"))
    o = observed(spec(), pods, name="clean", previous=previous)
    step = planner.plan(o)
    status = planner.status(o, step, NOW)
    assert status.completed and status.phase == "Completed" and status.progress == "3/3"
    assert status.start_time == "2025-12-31T00:00:00Z" and status.completion_time == NOW_TEXT
    kinds = {c.type: (c.status, c.reason) for c in status.conditions}
    assert kinds == {"Completed": ("True", "AllNodesDone"), "Degraded": ("False", "AsExpected")}


def test_status_invalid_and_failed() -> None:
    o = observed(spec(nodeSelectorTerms=[label_term("role", "In")]))
    status = planner.status(o, planner.plan(o), NOW)
    assert status.phase == "Failed" and "needs at least one value" in str(status.message)
    assert [(c.type, c.status, c.reason) for c in status.conditions] == [("Degraded", "True", "InvalidSpec")]
    failed = planner.status(
        observed(spec(), ds=False), Plan("CreateDaemonSet"), NOW, ReconcileError("quota", "Refused")
    )
    assert failed.message == "quota"
    assert [(c.type, c.status, c.reason) for c in failed.conditions] == [("Degraded", "True", "Refused")]
