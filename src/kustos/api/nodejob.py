"""NodeJob: run one container on every selected node until each prints a word (SPEC F-JOB-1)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.common import Condition
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map

DEFAULT_LABEL_SELECTOR = "daemonset-job=true"
# key=value pairs, comma separated, with Kubernetes' rules for label keys and values.
_LABEL_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
_LABEL_KEY = _LABEL_PREFIX + r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
LABEL_SELECTOR_PATTERN = rf"^{_LABEL_KEY}={_LABEL_VALUE}(,{_LABEL_KEY}={_LABEL_VALUE})*$"


class NodeSelectorRequirement(KubeModel):
    """One requirement on a node's labels (or, in matchFields, on its fields), as in a pod spec."""

    key: str = Field(min_length=1)
    """The label key (in matchFields: the field, metadata.name)."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the key's value relates to values."""
    values: list[str] = Field(default_factory=list)
    """One or more for In and NotIn, none for Exists and DoesNotExist, one integer for Gt and Lt."""


class NodeSelectorTerm(KubeModel):
    """Nodes that meet every requirement of the term."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    """Requirements on the node's labels."""
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)
    """Requirements on the node's fields (metadata.name)."""


class Toleration(KubeModel):
    """A taint the job's pods tolerate, as in a pod spec."""

    key: str = ""
    """The taint key; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists: any value; Equal: the value must match."""
    value: str = ""
    """The taint value (Equal)."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """The taint effect; empty tolerates every effect."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated; forever when unset."""


class NodeJobSpec(KubeModel):
    """What to run, where, and the word that says it is done."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule("self == oldSelf", "a NodeJob's spec cannot change; create a new NodeJob"),
                Rule(
                    "has(self.hostPath) == has(self.mountPath)",
                    "set hostPath and mountPath together",
                    field_path=".mountPath",
                ),
            ]
        )
    )

    image: str = Field(min_length=1, pattern=r"^\S+$")
    """The container image the job runs on every selected node."""
    command: list[str] = Field(default_factory=list)
    """The container's entrypoint; the image's own when empty."""
    args: list[str] = Field(default_factory=list)
    """Arguments for the entrypoint."""
    host_path: str | None = Field(default=None, pattern=r"^/")
    """A directory on the node that is mounted into the container (with mountPath)."""
    mount_path: str | None = Field(default=None, pattern=r"^/")
    """Where hostPath appears inside the container."""
    completion_word: str = Field(min_length=1, pattern=r"^\S+$")
    """The word a pod prints to its log once its node's work is done (like done)."""
    label_selector: str = Field(default=DEFAULT_LABEL_SELECTOR, pattern=LABEL_SELECTOR_PATTERN)
    """Labels put on the job's pods, key=value[,key=value]; they select the pods."""
    node_selector_terms: list[NodeSelectorTerm] = Field(default_factory=list)
    """Nodes to run on: a node matching any one term; every node when empty."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate, besides those every DaemonSet pod tolerates."""


class NodeProgress(KubeModel):
    """How far the job is on one node."""

    name: str
    """The node."""
    pod: str = ""
    """The job's pod on the node, once there is one."""
    state: Literal["Pending", "Running", "Done"] = "Pending"
    """Pending (no running pod yet), Running (no completion word yet) or Done."""
    done_time: str | None = None
    """When the completion word was first seen (RFC 3339)."""


class NodeJobStatus(KubeModel):
    """Per-node progress and whether every selected node is done."""

    phase: Literal["Pending", "Running", "Completed", "Failed"] | None = None
    """Pending, Running, Completed, or Failed (an invalid spec)."""
    completed: bool = False
    """True once every selected node printed the completion word; it stays true."""
    progress: str | None = None
    """Done nodes over selected nodes, like 2/3."""
    nodes: list[NodeProgress] = Field(default_factory=list, json_schema_extra=list_map("name"))
    """Every selected node (and every node that finished), with its progress."""
    daemon_set: str | None = None
    """The DaemonSet that runs the job's pods."""
    start_time: str | None = None
    completion_time: str | None = None
    message: str | None = None
    """What happened last."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Completed, Degraded."""


class NodeJob(CustomResource[NodeJobSpec, NodeJobStatus]):
    """A container run once on every selected node, done when each pod's log shows a word."""

    crd = CRDInfo.of(
        refs.NODE_JOBS,
        short_names=("nj",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("PROGRESS", ".status.progress", description="Done nodes over selected nodes"),
            PrinterColumn("COMPLETED", ".status.completed", "boolean"),
            PrinterColumn("PHASE", ".status.phase"),
            PrinterColumn("IMAGE", ".spec.image", priority=1),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
