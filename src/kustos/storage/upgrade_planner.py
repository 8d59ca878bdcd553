"""The StorageUpgrade planner: the next step of an offline upgrade, and the status after it.
Pure: no I/O, no clock (``now`` is observed, from the injected clock).

The flow, each step recorded in ``status.step`` before the next begins:

PullImage        a NodeJob runs the new image on every storage node (event PullImage)
PauseClusterCtrl the maintenance annotation on the StorageCluster, until it reports
                 maintenance (event PauseClusterCtrl)
ScaleDown        every Deployment and StatefulSet using the cluster's volumes gets its
                 replicas remembered in an annotation and is scaled to 0, in one patch;
                 then wait until their pods are gone (event UpgradeInit)
RollNodes        the node DaemonSet's node container gets the new image; wait until every
                 node pod runs it and is ready
ScaleUp          the workloads get their remembered replicas back (and lose the
                 annotation, in one patch); the StorageCluster's node image is set
Completed        (event UpgradeComplete); maintenance stays until the upgrade is deleted

Everything the planner needs is observed again on every pass (annotations on the
workloads and the cluster, the NodeJob, the DaemonSet), so an operator killed at any
point plans the same next step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kustos.api.common import Condition
from kustos.api.storageupgrade import StorageUpgradeStatus, UpgradeStep, WorkloadStatus
from kustos.runtime.conditions import set_model_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import WARNING, Done, Note, Wait
from kustos.runtime.times import rfc3339

REPLICAS_ANNOTATION = "kustos.dev/upgrade-replicas"
OWNER_ANNOTATION = "kustos.dev/upgrade"
FINALIZER = "kustos.dev/storageupgrade"
COMPLETION_WORD = "done"
PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)

ORDER: tuple[UpgradeStep, ...] = (
    "PullImage",
    "PauseClusterCtrl",
    "ScaleDown",
    "RollNodes",
    "ScaleUp",
    "Completed",
)


# ---- what is observed ----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadView:
    kind: str  # Deployment or StatefulSet
    namespace: str
    name: str
    replicas: int
    remembered: int | None = None
    """The replicas in its kustos.dev/upgrade-replicas annotation, if any."""
    owner: str | None = None
    """The upgrade (namespace/name) that scaled it down, from kustos.dev/upgrade."""
    uses_cluster: bool = True
    """Whether its pods mount volumes of the cluster's StorageClass or provisioner."""
    pods: int = 0
    """Its pods that still exist (terminating ones included)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.namespace, self.name)


@dataclass(frozen=True)
class NodePodView:
    name: str
    image: str
    ready: bool
    deleting: bool = False


@dataclass(frozen=True)
class DaemonSetView:
    namespace: str
    name: str
    image: str
    """The node container's image in the pod template."""
    generation: int = 1
    observed_generation: int = 1
    desired: int = 0
    on_delete: bool = False
    pods: tuple[NodePodView, ...] = ()


@dataclass(frozen=True)
class ClusterView:
    name: str
    node_image: str
    maintenance: str | None = None
    """The value of the maintenance annotation: which upgrade holds the cluster."""
    reports_maintenance: bool = False
    """Whether the cluster reports the Maintenance condition True (its controller stands still)."""


@dataclass(frozen=True)
class Observed:
    upgrade: str
    """The upgrade's namespace/name: the value of the owner annotations."""
    new_image: str
    step: UpgradeStep | None
    now: datetime
    step_started: datetime | None = None
    timeout: timedelta = timedelta(minutes=10)
    cluster: ClusterView | None = None
    maintenance_value: str = ""
    """The value this upgrade puts in the maintenance annotation (its name)."""
    pull_job_exists: bool = False
    pull_job_completed: bool = False
    pull_job_failure: str | None = None
    """The NodeJob's message when it failed (an invalid spec: it never runs)."""
    workloads: tuple[WorkloadView, ...] = ()
    daemon_set: DaemonSetView | None = None
    deleting: bool = False
    previous: StorageUpgradeStatus = field(default_factory=StorageUpgradeStatus)
    """The status as read: what the next status starts from."""
    generation: int | None = None
    cluster_problem: str = ""
    """Why no single StorageCluster was found (not found, several, invalid)."""
    pull_job_progress: str = ""
    """The pre-pull NodeJob's progress, as its status says it (`` (2/3 nodes: ...)``)."""
    has_finalizer: bool = True
    """The upgrade carries ``FINALIZER``: deleting it gives back what it holds first."""


# ---- what to do ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advance:
    to: UpgradeStep
    workloads: tuple[WorkloadStatus, ...] = ()


@dataclass(frozen=True)
class Fail:
    reason: str


@dataclass(frozen=True)
class CreatePullJob:
    pass


@dataclass(frozen=True)
class DeletePullJob:
    pass


@dataclass(frozen=True)
class SetMaintenance:
    pass


@dataclass(frozen=True)
class ClearMaintenance:
    pass


@dataclass(frozen=True)
class ScaleDown:
    workload: WorkloadView
    remember: int


@dataclass(frozen=True)
class ScaleUp:
    workload: WorkloadView
    replicas: int


@dataclass(frozen=True)
class PatchDaemonSet:
    image: str


@dataclass(frozen=True)
class DeleteNodePod:
    name: str


@dataclass(frozen=True)
class SetClusterImage:
    image: str


@dataclass(frozen=True)
class Release:
    """Everything the upgrade held is given back: remove its finalizer."""


@dataclass(frozen=True)
class AddFinalizer:
    """Before the upgrade holds anything, so that deleting it gives everything back."""


Step = (
    Wait | Done | AddFinalizer | Advance | Fail | CreatePullJob | DeletePullJob | SetMaintenance
    | ClearMaintenance | ScaleDown | ScaleUp | PatchDaemonSet | DeleteNodePod | SetClusterImage | Release
)  # fmt: skip


# ---- which workloads use the cluster's volumes ------------------------------------------------


@dataclass(frozen=True)
class ClaimView:
    storage_class: str | None
    provisioner: str | None = None


def claim_view(claim: Mapping[str, Any]) -> ClaimView:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    provisioner = next((annotations[a] for a in PROVISIONER_ANNOTATIONS if a in annotations), None)
    return ClaimView((claim.get("spec") or {}).get("storageClassName"), provisioner)


@dataclass(frozen=True)
class VolumeMatch:
    """The cluster's StorageClass and provisioner, and the default class (for claims without one)."""

    storage_class: str
    provisioner: str
    default_class: str | None = None
    provisioner_of_class: Mapping[str, str] = field(default_factory=dict)
    """Every StorageClass's provisioner, so a claim of another class with the same driver counts."""

    def class_matches(self, name: str | None) -> bool:
        name = name if name is not None else self.default_class
        if name is None:
            return False
        return name == self.storage_class or self.provisioner_of_class.get(name) == self.provisioner

    def claim_matches(self, claim: ClaimView) -> bool:
        return self.class_matches(claim.storage_class) or claim.provisioner == self.provisioner


def uses_cluster_volumes(
    workload: Mapping[str, Any], claims: Mapping[str, ClaimView], match: VolumeMatch
) -> bool:
    """Whether the workload's pods mount a claim (or claim template) of the cluster's volumes.

    ``claims`` are the claims of the workload's namespace by name.
    """
    spec = workload.get("spec") or {}
    for template in spec.get("volumeClaimTemplates") or []:
        if match.class_matches((template.get("spec") or {}).get("storageClassName")):
            return True
    pod_spec = ((spec.get("template") or {}).get("spec")) or {}
    for volume in pod_spec.get("volumes") or []:
        claim_ref = volume.get("persistentVolumeClaim")
        if claim_ref:
            claim = claims.get(claim_ref.get("claimName", ""))
            if claim is not None and match.claim_matches(claim):
                return True
        ephemeral = volume.get("ephemeral")
        if ephemeral:
            template_spec = (ephemeral.get("volumeClaimTemplate") or {}).get("spec") or {}
            if match.class_matches(template_spec.get("storageClassName")):
                return True
    return False


def selector_string(workload: Mapping[str, Any]) -> str | None:
    """The workload's pod selector as a label selector string (matchLabels only); None if empty."""
    labels = (((workload.get("spec") or {}).get("selector")) or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None


# ---- the plan ----------------------------------------------------------------------------------


def _timed_out(o: Observed) -> bool:
    return o.step_started is not None and o.now - o.step_started > o.timeout


def _ours(o: Observed, w: WorkloadView) -> bool:
    return w.remembered is not None and w.owner == o.upgrade


def plan_deletion(o: Observed) -> Step:
    """Deleting the upgrade gives back what it holds: scaled-down workloads, then maintenance."""
    for w in sorted(o.workloads, key=lambda w: w.key):
        if _ours(o, w):
            assert w.remembered is not None
            return ScaleUp(w, w.remembered)
    if o.cluster is not None and o.cluster.maintenance == o.maintenance_value:
        return ClearMaintenance()
    return Release()


def plan(o: Observed) -> Step:
    if o.deleting:
        return plan_deletion(o)
    if not o.has_finalizer:
        return AddFinalizer()
    if o.step in ("Completed", "Failed"):
        return Done()
    if o.cluster is None:
        return Wait("the StorageCluster was not found", seconds=10.0)
    held = o.cluster.maintenance
    if held is not None and held != o.maintenance_value:
        return Wait(f"the StorageCluster is in maintenance for {held}", seconds=10.0)
    if o.step is None:
        return Advance("PullImage")
    if o.step == "PullImage":
        return _pull(o)
    if o.step == "PauseClusterCtrl":
        return _pause(o)
    if o.step == "ScaleDown":
        return _scale_down(o)
    if o.step == "RollNodes":
        return _roll(o)
    return _scale_up(o)


def _pull(o: Observed) -> Step:
    if not o.pull_job_exists:
        return CreatePullJob()
    if o.pull_job_failure is not None:
        return Fail(f"the pre-pull NodeJob failed: {o.pull_job_failure}")
    if not o.pull_job_completed:
        if _timed_out(o):
            return Fail(f"the image {o.new_image} was not pulled on every node within {o.timeout}")
        return Wait(f"pulling {o.new_image} on every storage node")
    return Advance("PauseClusterCtrl")


def _pause(o: Observed) -> Step:
    assert o.cluster is not None
    if o.pull_job_exists:
        return DeletePullJob()
    if o.cluster.maintenance != o.maintenance_value:
        return SetMaintenance()
    if not o.cluster.reports_maintenance:
        return Wait("waiting for the StorageCluster to report maintenance")
    return Advance("ScaleDown")


def _scale_down(o: Observed) -> Step:
    users = sorted((w for w in o.workloads if w.uses_cluster or _ours(o, w)), key=lambda w: w.key)
    for w in users:
        if w.remembered is None or w.replicas != 0:
            return ScaleDown(w, w.remembered if w.remembered is not None else w.replicas)
    left = sum(w.pods for w in users)
    if left:
        if _timed_out(o):
            return Fail(f"{left} pod(s) of the scaled-down workloads still exist after {o.timeout}")
        return Wait(f"waiting for {left} pod(s) of {len(users)} workload(s) to go", seconds=1.0)
    recorded = tuple(
        WorkloadStatus.model_validate(
            {"kind": w.kind, "namespace": w.namespace, "name": w.name, "replicas": w.remembered or 0}
        )
        for w in users
    )
    return Advance("RollNodes", recorded)


def node_progress(o: Observed) -> tuple[int, int]:
    """Node pods running the new image and ready, and all node pods wanted."""
    ds = o.daemon_set
    if ds is None:
        return 0, 0
    ready = sum(1 for p in ds.pods if p.image == o.new_image and p.ready and not p.deleting)
    return ready, ds.desired


def _roll(o: Observed) -> Step:
    ds = o.daemon_set
    if ds is None:
        if _timed_out(o):
            return Fail("the StorageCluster's node DaemonSet does not exist")
        return Wait("the StorageCluster's node DaemonSet does not exist")
    if ds.image != o.new_image:
        return PatchDaemonSet(o.new_image)
    if ds.observed_generation < ds.generation:
        return Wait("waiting for the DaemonSet controller to see the new image", seconds=1.0)
    if ds.on_delete:
        old = sorted(p.name for p in ds.pods if p.image != o.new_image and not p.deleting)
        if old:
            return DeleteNodePod(old[0])
    ready, desired = node_progress(o)
    stale = [p.name for p in ds.pods if p.image != o.new_image]
    if ready < desired or stale:
        if _timed_out(o):
            return Fail(f"only {ready}/{desired} node pods run {o.new_image} and are ready after {o.timeout}")
        return Wait(f"{ready}/{desired} node pods run {o.new_image} and are ready")
    return Advance("ScaleUp")


def _scale_up(o: Observed) -> Step:
    assert o.cluster is not None
    for w in sorted(o.workloads, key=lambda w: w.key):
        if _ours(o, w):
            assert w.remembered is not None
            return ScaleUp(w, w.remembered)
    if o.cluster.node_image != o.new_image:
        return SetClusterImage(o.new_image)
    return Advance("Completed")


def next_step(step: UpgradeStep) -> UpgradeStep:
    return ORDER[ORDER.index(step) + 1]


def scaled_down(
    workloads: Sequence[Mapping[str, Any]], upgrade: str | None = None
) -> list[tuple[str, str, str, int]]:
    """(kind, namespace, name, replicas) of every workload an upgrade scaled down (or ``upgrade``'s)."""
    out = []
    for w in workloads:
        meta = w.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        value = annotations.get(REPLICAS_ANNOTATION)
        if value is None or not str(value).isdigit():
            continue
        if upgrade is not None and annotations.get(OWNER_ANNOTATION) != upgrade:
            continue
        kind, namespace, name = (
            str(w.get("kind", "")),
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
        )
        out.append((kind, namespace, name, int(value)))
    return sorted(out)


# ---- the status -----------------------------------------------------------------------------------

ENTER_EVENTS: dict[str, tuple[str, str]] = {
    "PullImage": ("PullImage", "Pulling the new container image {image} on every storage node"),
    "PauseClusterCtrl": (
        "PauseClusterCtrl",
        "Pausing the cluster controller and enabling cluster maintenance mode on {cluster}",
    ),
    "ScaleDown": (
        "UpgradeInit",
        "Upgrade of cluster {cluster} started: scaling down the workloads using its volumes",
    ),
    "RollNodes": ("RollNodes", "{count} workload(s) scaled down; rolling the node pods to {image}"),
    "ScaleUp": ("ScaleUp", "Every node pod runs {image}; scaling the workloads back up"),
    "Completed": (
        "UpgradeComplete",
        "Cluster {cluster} upgraded to {image}. "
        "Delete the upgrade object to disable cluster maintenance mode",
    ),
}


def restore_command(namespace: str, name: str) -> str:
    return f"kustos storage restore-workloads {name} -n {namespace}"


def _set(
    status: StorageUpgradeStatus, type_: str, value: bool, reason: str, message: str,
    generation: int | None, now: datetime,
) -> list[Condition]:  # fmt: skip
    return set_model_condition(
        Condition, status.conditions, type_, value, reason, message[:1000], generation, now
    )


def failed(
    previous: StorageUpgradeStatus, upgrade: str, what: str, now: datetime, generation: int | None,
    reason: str = "UpgradeFailed",
) -> StorageUpgradeStatus:  # fmt: skip
    """Failed for good: the message says how to give the workloads back."""
    namespace, _, name = upgrade.partition("/")
    message = (
        f"{what}. The cluster stays in maintenance; scaled-down workloads keep their replica counts "
        f"in the {REPLICAS_ANNOTATION} annotation: `{restore_command(namespace, name)}` "
        "scales them back (deleting this upgrade does too)"
    )
    result = previous.model_copy(deep=True)
    result.step = "Failed"
    result.message = message[:2000]
    result.completion_time = rfc3339(now)
    result.conditions = _set(result, "Failed", True, reason, result.message, generation, now)
    return result


def wait_message(o: Observed, step: Wait) -> str:
    if o.cluster is None and o.cluster_problem:
        return o.cluster_problem
    return step.reason + (o.pull_job_progress if o.step == "PullImage" else "")


def enter_message(o: Observed, step: Advance, workloads: int) -> tuple[str, str]:
    """The Event reason and message of entering ``step.to``."""
    assert o.cluster is not None
    reason, template = ENTER_EVENTS[step.to]
    return reason, template.format(image=o.new_image, cluster=o.cluster.name, count=workloads)


def status(
    o: Observed, step: Step, when: datetime, failure: ReconcileError | None = None
) -> StorageUpgradeStatus:
    """The whole status after ``step`` (acted on, unless ``failure`` says it failed)."""
    result = o.previous.model_copy(deep=True)
    now = rfc3339(when)
    if failure is not None:
        result.message = f"{type(step).__name__} failed: {failure.message}"[:2000]
        result.conditions = _set(result, "Degraded", True, failure.reason, result.message, o.generation, when)
        return result
    if any(c.type == "Degraded" and c.status == "True" for c in result.conditions):
        result.conditions = _set(result, "Degraded", False, "AsExpected", "", o.generation, when)
    match step:
        case Wait():
            result.message = wait_message(o, step)
            if o.cluster is None and o.cluster_problem:
                # Said where tools look (``kubectl wait``), not only in the message and an Event.
                result.conditions = _set(
                    result, "Completed", False, "ClusterNotFound", o.cluster_problem, o.generation, when
                )
            if o.daemon_set is not None:
                ready, desired = node_progress(o)
                result.nodes_ready = f"{ready}/{desired}"
        case Fail(reason=reason):
            return failed(result, o.upgrade, reason, when, o.generation)
        case Advance():
            assert o.cluster is not None
            if step.to == "PullImage":
                result.start_time = result.start_time or now
                result.cluster = o.cluster.name
                result.previous_image = o.cluster.node_image
            if step.to == "RollNodes":
                result.workloads = list(step.workloads)
            if step.to == "Completed":
                # The planner completes only once no workload carries this upgrade's annotation.
                for recorded in result.workloads:
                    recorded.restored = True
            _, message = enter_message(o, step, len(result.workloads))
            result.step = step.to
            result.step_start_time = now
            result.message = message
            if step.to == "Completed":
                result.completion_time = now
                result.conditions = _set(
                    result, "Completed", True, "UpgradeComplete", message, o.generation, when
                )
            else:
                result.conditions = _set(result, "Completed", False, step.to, message, o.generation, when)
        case ScaleUp(workload=w) if not o.deleting:
            for recorded in result.workloads:
                if (recorded.kind, recorded.namespace, recorded.name) == w.key:
                    recorded.restored = True
    return result


def notes(o: Observed, step: Step, result: StorageUpgradeStatus) -> list[Note]:
    """The Events of a step taken (a failed one has its condition): entering a step, failing
    for good, a missing cluster (when that is news)."""
    match step:
        case Wait() if o.cluster is None and o.cluster_problem and result.message != o.previous.message:
            return [Note("ClusterNotFound", o.cluster_problem, WARNING)]
        case Fail():
            return [Note("UpgradeFailed", (result.message or "")[:1000], WARNING)]
        case Advance():
            reason, message = enter_message(o, step, len(result.workloads))
            return [Note(reason, message)]
        case ScaleUp(workload=w, replicas=replicas):
            return [Note("WorkloadRestored", f"{w.kind} {w.namespace}/{w.name} scaled back to {replicas}")]
        case ClearMaintenance() if o.cluster is not None:
            return [Note("MaintenanceOff", f"Cluster {o.cluster.name} left maintenance mode")]
    return []


def rejection_notes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Note]:
    """An invalid spec's Event, once: when the status says it anew."""
    failed = next((c for c in new.get("conditions") or [] if c.get("type") == "Failed"), None) or {}
    if failed.get("reason") != "InvalidSpec" or new.get("message") == old.get("message"):
        return []
    return [Note("InvalidSpec", str(new.get("message") or ""), WARNING)]
