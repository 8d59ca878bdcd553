"""The NodeJob planner: which nodes, which pods, done or not. Pure: no I/O, no clock.

The controller observes the job, its DaemonSet, the nodes and the job's pods (and
the logs of the pods not yet done), and ``plan`` says the one thing to do: create
the DaemonSet, or record the progress it sees (and whether the job is complete);
``status`` says what the status is after that step, from what was observed and the time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from kustos.api.common import Condition
from kustos.api.nodejob import (
    NodeJob,
    NodeJobSpec,
    NodeJobStatus,
    NodeProgress,
    NodeSelectorRequirement,
    NodeSelectorTerm,
)
from kustos.api.nodejob import Toleration as TolerationSpec
from kustos.runtime import objects
from kustos.runtime.conditions import set_model_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.objects import Taint
from kustos.runtime.times import rfc3339

JOB_LABEL = "kustos.dev/nodejob"
CONTAINER = "job"
HOST_VOLUME = "host"
GRACE_SECONDS = 5

# Taints every DaemonSet pod tolerates (the DaemonSet controller adds these tolerations).
DAEMONSET_TOLERATED = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
    }
)


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class PodView:
    name: str
    node: str | None
    running: bool
    deleting: bool = False
    word_seen: bool = False
    """Whether the pod's log shows the completion word (read for pods not yet done)."""


@dataclass(frozen=True)
class Observed:
    spec: NodeJobSpec
    daemon_set_exists: bool
    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...]
    recorded: tuple[NodeProgress, ...] = ()
    """The per-node progress in the status: a node once done stays done."""
    completed: bool = False
    now: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    """From the injected clock (tz-aware UTC)."""
    name: str = ""
    """The job's name (its DaemonSet is named after it)."""
    generation: int | None = None
    previous: NodeJobStatus = field(default_factory=NodeJobStatus)
    """The status as read: times and conditions carry over from it."""


@dataclass(frozen=True)
class Plan:
    action: Literal["Invalid", "CreateDaemonSet", "Record"]
    nodes: tuple[NodeProgress, ...] = ()
    completed: bool = False
    newly_completed: bool = False
    newly_done: tuple[str, ...] = ()
    message: str = ""

    @property
    def progress(self) -> str:
        return f"{sum(n.state == 'Done' for n in self.nodes)}/{len(self.nodes)}"


# ---- names and labels ----------------------------------------------------------------


def daemon_set_name(job_name: str) -> str:
    return f"{job_name}-nodejob"[:63].rstrip("-.")


def parse_label_selector(selector: str) -> dict[str, str]:
    """``a=b,c=d`` -> {"a": "b", "c": "d"} (the schema already checked the syntax)."""
    pairs = [p.split("=", 1) for p in selector.split(",") if p.strip()]
    return {k.strip(): v.strip() for k, v in pairs}


def pod_labels(job_name: str, spec: NodeJobSpec) -> dict[str, str]:
    return {**parse_label_selector(spec.label_selector), JOB_LABEL: job_name}


# ---- validation the schema cannot express -----------------------------------------------


def _requirement_problem(path: str, r: NodeSelectorRequirement) -> str | None:
    if r.operator in ("In", "NotIn") and not r.values:
        return f"{path}: operator {r.operator} needs at least one value"
    if r.operator in ("Exists", "DoesNotExist") and r.values:
        return f"{path}: operator {r.operator} takes no values"
    integer = len(r.values) == 1 and re.fullmatch(r"-?[0-9]+", r.values[0])
    if r.operator in ("Gt", "Lt") and not integer:
        return f"{path}: operator {r.operator} needs exactly one integer value"
    return None


def spec_problems(spec: NodeJobSpec) -> list[str]:
    """What is wrong with a spec that passed the schema (empty when nothing)."""
    problems: list[str] = []
    for i, term in enumerate(spec.node_selector_terms):
        for kind, requirements in (
            ("matchExpressions", term.match_expressions),
            ("matchFields", term.match_fields),
        ):
            for j, r in enumerate(requirements):
                problem = _requirement_problem(f"spec.nodeSelectorTerms[{i}].{kind}[{j}]", r)
                if problem:
                    problems.append(problem)
        for j, r in enumerate(term.match_fields):
            if r.key != "metadata.name":
                problems.append(
                    f"spec.nodeSelectorTerms[{i}].matchFields[{j}]: only metadata.name is supported"
                )
            elif r.operator not in ("In", "NotIn"):
                problems.append(
                    f"spec.nodeSelectorTerms[{i}].matchFields[{j}]: metadata.name takes In or NotIn"
                )
    if JOB_LABEL in parse_label_selector(spec.label_selector):
        problems.append(f"spec.labelSelector: the label {JOB_LABEL} is set by kustos")
    return problems


# ---- node selection ----------------------------------------------------------------------


def _requirement_matches(r: NodeSelectorRequirement, values: Mapping[str, str]) -> bool:
    present = r.key in values
    value = values.get(r.key, "")
    match r.operator:
        case "In":
            return present and value in r.values
        case "NotIn":
            return not present or value not in r.values
        case "Exists":
            return present
        case "DoesNotExist":
            return not present
        case "Gt" | "Lt":
            try:
                have, want = int(value), int(r.values[0])
            except (ValueError, IndexError):
                return False
            return present and (have > want if r.operator == "Gt" else have < want)
    return False


def term_matches(term: NodeSelectorTerm, node: NodeView) -> bool:
    """A term with no requirements matches nothing (as in Kubernetes); otherwise all must hold."""
    if not term.match_expressions and not term.match_fields:
        return False
    fields = {"metadata.name": node.name}
    return all(_requirement_matches(r, node.labels) for r in term.match_expressions) and all(
        _requirement_matches(r, fields) for r in term.match_fields
    )


def _tolerates(toleration: TolerationSpec, taint: Taint) -> bool:
    return objects.tolerates(taint, toleration.key, toleration.operator, toleration.value, toleration.effect)


def schedulable(node: NodeView, tolerations: Sequence[TolerationSpec]) -> bool:
    """Whether the DaemonSet controller would run a pod there (taints only; PreferNoSchedule never blocks)."""
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute") or taint.key in DAEMONSET_TOLERATED:
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def selected(spec: NodeJobSpec, nodes: Sequence[NodeView]) -> list[str]:
    """The names of the nodes the job runs on, sorted."""
    return sorted(
        n.name
        for n in nodes
        if (not spec.node_selector_terms or any(term_matches(t, n) for t in spec.node_selector_terms))
        and schedulable(n, spec.tolerations)
    )


# ---- logs ------------------------------------------------------------------------------------


def log_has_word(text: str, word: str) -> bool:
    """Whether ``word`` appears in the log as a word of its own (``done``, not ``undone``)."""
    pattern = re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])")
    return any(pattern.search(line) for line in text.splitlines())


# ---- the plan ----------------------------------------------------------------------------------


def plan(o: Observed) -> Plan:
    problems = spec_problems(o.spec)
    if problems:
        return Plan("Invalid", message="; ".join(problems))
    if not o.daemon_set_exists and not o.completed:
        return Plan("CreateDaemonSet", o.recorded, message="creating the DaemonSet")
    recorded = {n.name: n for n in o.recorded}
    pods_by_node: dict[str, PodView] = {}
    for candidate in sorted(o.pods, key=lambda p: (p.deleting, p.name)):
        if candidate.node and candidate.node not in pods_by_node:
            pods_by_node[candidate.node] = candidate
    wanted = selected(o.spec, o.nodes)
    names = sorted(set(wanted) | {n for n, p in recorded.items() if p.state == "Done"})
    progress: list[NodeProgress] = []
    newly_done: list[str] = []
    for name in names:
        before = recorded.get(name)
        pod = pods_by_node.get(name)
        pod_name = pod.name if pod else (before.pod if before else "")
        if before is not None and before.state == "Done":
            progress.append(before)
        elif pod is not None and pod.word_seen:
            progress.append(NodeProgress(name=name, pod=pod_name, state="Done", done_time=rfc3339(o.now)))
            newly_done.append(name)
        elif pod is not None and pod.running and not pod.deleting:
            progress.append(NodeProgress(name=name, pod=pod_name, state="Running"))
        else:
            progress.append(NodeProgress(name=name, pod=pod_name, state="Pending"))
    done = {p.name for p in progress if p.state == "Done"}
    all_done = bool(wanted) and set(wanted) <= done
    completed = o.completed or all_done
    if completed:
        message = f"done on {len(done)} node(s): {', '.join(sorted(done))}"
    elif not wanted:
        message = "no node matches the job's nodeSelectorTerms and tolerations"
    else:
        waiting = [p.name for p in progress if p.name in wanted and p.state != "Done"]
        message = f"waiting for {len(waiting)} of {len(wanted)} node(s): {', '.join(waiting)}"
    return Plan(
        "Record",
        tuple(progress),
        completed=completed,
        newly_completed=completed and not o.completed,
        newly_done=tuple(newly_done),
        message=message,
    )


# ---- the status ---------------------------------------------------------------------------------


def _set(
    conditions: list[Condition], type_: str, value: bool, reason: str, message: str,
    generation: int | None, now: datetime,
) -> list[Condition]:  # fmt: skip
    return set_model_condition(Condition, conditions, type_, value, reason, message, generation, now)


def _conditions(o: Observed, type_: str, value: bool, reason: str, message: str) -> list[Condition]:
    return _set(o.previous.conditions, type_, value, reason, message, o.generation, o.now)


def invalid(previous: NodeJobStatus, message: str, generation: int | None, now: datetime) -> NodeJobStatus:
    """The status of a job whose spec cannot run: Failed, and Degraded says why."""
    result = previous.model_copy(deep=True)
    result.phase = "Failed"
    result.message = message[:1000]
    result.conditions = _set(
        previous.conditions, "Degraded", True, "InvalidSpec", result.message, generation, now
    )
    return result


def _recovered(o: Observed, conditions: list[Condition]) -> list[Condition]:
    """A Degraded condition from an earlier pass (invalid spec, failed step) no longer holds."""
    if not any(c.type == "Degraded" and c.status == "True" for c in conditions):
        return conditions
    return _set(conditions, "Degraded", False, "AsExpected", "", o.generation, o.now)


def status(o: Observed, step: Plan, now: datetime, failure: ReconcileError | None = None) -> NodeJobStatus:
    """The whole status after ``step`` (acted on, unless ``failure`` says it failed)."""
    result = o.previous.model_copy(deep=True)
    if step.action == "Invalid":
        return invalid(o.previous, step.message, o.generation, now)
    stamp = rfc3339(now)
    if failure is not None:
        result.message = failure.message[:1000]
        result.conditions = _conditions(o, "Degraded", True, failure.reason, result.message)
        return result
    if step.action == "CreateDaemonSet":
        result.phase = "Running"
        result.daemon_set = daemon_set_name(o.name)
        result.start_time = result.start_time or stamp
        result.message = f"running {o.spec.image} through DaemonSet {result.daemon_set}"
        result.conditions = _conditions(o, "Completed", False, "Running", result.message)
        result.conditions = _recovered(o, result.conditions)
        return result
    result.nodes = list(step.nodes)
    result.progress = step.progress
    result.message = step.message
    result.daemon_set = result.daemon_set or daemon_set_name(o.name)
    if step.completed:
        result.completed = True
        result.phase = "Completed"
        result.completion_time = result.completion_time or stamp
        result.conditions = _conditions(o, "Completed", True, "AllNodesDone", step.message)
    else:
        result.phase = "Running"
        result.conditions = _conditions(o, "Completed", False, "Running", step.message)
    result.conditions = _recovered(o, result.conditions)
    return result


# ---- the DaemonSet ---------------------------------------------------------------------------


def daemon_set(job: NodeJob) -> dict[str, Any]:
    """The DaemonSet that runs the job: one pod per selected node, owned by the job."""
    meta = job.metadata
    spec = job.spec
    labels = pod_labels(meta["name"], spec)
    container: dict[str, Any] = {"name": CONTAINER, "image": spec.image}
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": GRACE_SECONDS,
    }
    if spec.host_path and spec.mount_path:
        container["volumeMounts"] = [{"name": HOST_VOLUME, "mountPath": spec.mount_path}]
        pod_spec["volumes"] = [{"name": HOST_VOLUME, "hostPath": {"path": spec.host_path}}]
    if spec.node_selector_terms:
        terms = [t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.node_selector_terms]
        pod_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    if spec.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.tolerations
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": daemon_set_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {JOB_LABEL: meta["name"], "app.kubernetes.io/managed-by": "kustos"},
            "ownerReferences": [
                {
                    "apiVersion": job.crd.api_version,
                    "kind": job.crd.kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
