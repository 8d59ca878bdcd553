"""NodeImage: the OS image every node should run, and how nodes are replaced to get there
(SPEC F-NODE-1, issue 15).

Nodes on another image are replaced one safe step at a time: a new node (the heir) is
created first, joins and becomes Ready, inherits the old node's (the donor's) user labels
and taints, the donor is cordoned and drained (PodDisruptionBudgets honoured), its stacked
etcd member removed if it is a control-plane node, and then it is deleted with its
instance. Cluster-scoped: one NodeImage covers every ScalingGroup that names it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kustos.api import refs
from kustos.api.common import Condition, Duration
from kustos.runtime.crd import (
    CRDInfo,
    CustomResource,
    IntOrString,
    KubeModel,
    PrinterColumn,
    Rule,
    kube_schema,
    list_map,
)

# A percentage from 1% to 100% (surge) or 0% to 100% (unavailable).
SURGE_PERCENT = r"^([1-9][0-9]?|100)%$"
UNAVAILABLE_PERCENT = r"^([0-9]|[1-9][0-9]|100)%$"

# The schema says "int or string"; CEL says which ints and which strings.
_SURGE_RULE = Rule(
    f"type(self) == int ? self >= 1 : self.matches('{SURGE_PERCENT}')",
    "maxSurge must be a whole number of nodes >= 1 or a percentage from 1% to 100% "
    "(a heir is always created before its donor goes)",
)
_UNAVAILABLE_RULE = Rule(
    f"type(self) == int ? self >= 0 : self.matches('{UNAVAILABLE_PERCENT}')",
    "maxUnavailable must be a whole number of nodes >= 0 or a percentage from 0% to 100%",
)


class RolloutPolicy(KubeModel):
    """How many nodes of one role may be replaced at once."""

    max_surge: Annotated[IntOrString, Field(json_schema_extra=kube_schema(rules=[_SURGE_RULE]))] = 1
    """Heirs (new nodes) in flight at once beyond the role's node count: a number >= 1 or a
    percentage of the role's nodes (rounded up)."""
    max_unavailable: Annotated[
        IntOrString, Field(json_schema_extra=kube_schema(rules=[_UNAVAILABLE_RULE]))
    ] = 0
    """Nodes of the role that may be unavailable (not Ready, or cordoned) at once, counted
    against the role's node count: a number or a percentage (rounded down). 0 means a donor is
    cordoned only once its heir is Ready."""


class PodGate(KubeModel):
    """Pods that must all be Ready before each next step."""

    namespace: str | None = None
    """Where the pods are; every namespace when unset."""
    selector: str = Field(min_length=1)
    """A label selector, key=value[,key=value]."""
    min_ready: int = Field(default=1, ge=0)
    """At least this many pods must match (so a gate on pods that are all gone fails)."""


class HealthGates(KubeModel):
    """What must hold before each next step (a heir paired, a donor cordoned or deleted)."""

    etcd_clusters: bool = True
    """Every kustos EtcdCluster with a member on a node involved is healthy: every member
    healthy and as many as its size."""
    storage_clusters: bool = True
    """Every kustos StorageCluster is Ready."""
    pods: list[PodGate] = Field(default_factory=list)
    """User gates: pods that must be Ready."""


class StackedEtcd(KubeModel):
    """kubeadm's stacked etcd on control-plane nodes: a donor's member is removed from the
    membership (only while the remaining members keep quorum) before the node is deleted."""

    enabled: bool = True
    """Remove a control-plane donor's etcd member before deleting it."""
    certificates_secret: str | None = Field(default=None, pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$")
    """namespace/name of a Secret with ca.crt, healthcheck-client.crt and healthcheck-client.key;
    else certificatesDir is read."""
    certificates_dir: str = Field(default="/etc/kubernetes/pki", pattern=r"^/")
    """kubeadm's certificates directory (etcd/ca.crt, etcd/healthcheck-client.crt and .key)."""
    client_port: int = Field(default=2379, ge=1, le=65535)
    """The port etcd serves clients on, at each control-plane node's InternalIP."""
    scheme: Literal["https", "http"] = "https"
    """http only for tests without TLS."""


class NodeImageSpec(KubeModel):
    """The image and the rollout policy."""

    image: str = Field(min_length=1, pattern=r"^\S+$")
    """The image every node should run (as the cloud provider names it)."""
    image_version: str | None = None
    """A human-readable version of the image, shown in status."""
    control_plane: RolloutPolicy = Field(default_factory=RolloutPolicy)
    """Control-plane nodes: replaced first; workers wait while one is outdated."""
    workers: RolloutPolicy = Field(default_factory=RolloutPolicy)
    """Worker nodes."""
    drain_timeout: Duration = "10m"
    """How long a donor's drain may be blocked (a PodDisruptionBudget, unmanaged pods)."""
    on_drain_timeout: Literal["wait", "force"] = "wait"
    """wait: keep trying and name the blocking pods in status; force: delete the blocking pods
    (an Event and an annotation on the Node record it)."""
    join_timeout: Duration = "10m"
    """How long a new node may take to join and become Ready before it is deleted and tried again."""
    health_gates: HealthGates = Field(default_factory=HealthGates)
    """What must hold before each next step."""
    etcd: StackedEtcd | None = None
    """kubeadm stacked etcd on the control plane; {enabled: false} for an external etcd. Unset:
    control-plane nodes are not replaced (Degraded, reason EtcdUnset), since a replaced node's
    stacked etcd member would stay in the membership."""
    paused: bool = False
    """Take no new step (a step under way finishes)."""


class ReplacementStatus(KubeModel):
    """One donor and its heir."""

    donor: str
    """The outdated node being replaced."""
    heir: str = ""
    """The node replacing it, once paired."""
    group: str = ""
    """The ScalingGroup's groupId."""
    phase: Literal["Pairing", "WaitingForHeir", "Draining", "RemovingEtcdMember", "Deleting"] = "Pairing"
    """Where the replacement is."""
    message: str = ""
    """Why it waits, if it does."""


class NodeImageStatus(KubeModel):
    """Nodes by state, progress, the current step and why it waits."""

    up_to_date: list[str] = Field(default_factory=list)
    """Nodes on the image, not part of a replacement."""
    outdated: list[str] = Field(default_factory=list)
    """Nodes on another image, not yet donors."""
    donors: list[str] = Field(default_factory=list)
    """Outdated nodes paired with a heir."""
    heirs: list[str] = Field(default_factory=list)
    """New nodes paired with a donor."""
    pending: list[str] = Field(default_factory=list)
    """Instances created but not yet joined (their PendingNodes)."""
    obsolete: list[str] = Field(default_factory=list)
    """New nodes not needed as heirs (removed)."""
    invalid: list[str] = Field(default_factory=list)
    """Nodes kustos cannot place (no providerID, unknown group or instance)."""
    replacements: list[ReplacementStatus] = Field(default_factory=list, json_schema_extra=list_map("donor"))
    """Each donor under way."""
    progress: str | None = None
    """Up-to-date nodes over all nodes, like 7/10."""
    step: str | None = None
    """The step of the last pass (CreateHeir, Drain, ...)."""
    waiting_for: str | None = None
    """Why the rollout waits, if it does (the pods blocking a drain, the failing gate)."""
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Available (every node up to date), Progressing, Degraded, Paused."""


class NodeImage(CustomResource[NodeImageSpec, NodeImageStatus]):
    """The image every node should run; outdated nodes are replaced."""

    crd = CRDInfo.of(
        refs.NODE_IMAGES,
        short_names=("ni",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("IMAGE", ".spec.image"),
            PrinterColumn("PROGRESS", ".status.progress", description="Up-to-date nodes over all nodes"),
            PrinterColumn("STEP", ".status.step"),
            PrinterColumn("WAITING", ".status.waitingFor", description="Why the rollout waits"),
            PrinterColumn("PAUSED", ".spec.paused", "boolean", priority=1),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )


__all__ = [
    "HealthGates", "NodeImage", "NodeImageSpec", "NodeImageStatus", "PodGate", "ReplacementStatus",
    "RolloutPolicy", "StackedEtcd",
]  # fmt: skip
