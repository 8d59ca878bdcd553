"""EtcdCluster: an etcd cluster that kustos creates, resizes and heals (SPEC F-ETCD-1..6, 11, 12)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from kustos.api.backup import BackupSchedule
from kustos.api.common import DURATION_PATTERN, QUANTITY_PATTERN, Condition
from kustos.api.etcd_tls import TLSSpec, TLSStatus
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map

VERSION_PATTERN = r"^3\.[0-9]+\.[0-9]+$"
DEFAULT_VERSION = "3.6.16"


class ClientServiceSpec(KubeModel):
    """How clients reach the cluster."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    """The client Service's type."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations for the client Service (cloud load balancer settings, for example)."""


class StorageSpec(KubeModel):
    """Where members keep their data."""

    type: Literal["emptyDir", "pvc"] = "emptyDir"
    """emptyDir: data lives and dies with the pod; pvc: a PersistentVolumeClaim per member,
    so a member whose pod is deleted comes back with its data."""
    size: str = Field(default="1Gi", pattern=QUANTITY_PATTERN)
    """Requested size of each member's volume (pvc only)."""
    storage_class_name: str | None = None
    """StorageClass of the claims (pvc only); the cluster's default when unset."""


class PodPolicy(KubeModel):
    """Placement and resources of member pods."""

    resources: dict[str, Any] | None = Field(
        default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True)
    )
    """Container resources (requests and limits), as in a pod spec."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Nodes members may run on, by label."""
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra={"items": {"x-kubernetes-preserve-unknown-fields": True}}
    )
    """Tolerations, as in a pod spec."""
    affinity: dict[str, Any] | None = Field(
        default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True)
    )
    """Affinity, as in a pod spec; replaces the default anti-affinity when set."""
    anti_affinity: Literal["preferred", "required", "none"] = "preferred"
    """Spread members over nodes: preferred (default), required, or none."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels for member pods."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra annotations for member pods."""


class EtcdClusterSpec(KubeModel):
    """The etcd cluster the user wants."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    "!has(oldSelf.storage) || !has(self.storage) || "
                    "oldSelf.storage.type == self.storage.type",
                    "storage.type cannot change on a live cluster",
                    field_path=".storage.type",
                ),
                Rule(
                    "has(oldSelf.tls) == has(self.tls)",
                    "tls cannot be turned on or off on a live cluster",
                    field_path=".tls",
                ),
            ]
        )
    )

    size: int = Field(default=3, ge=1, le=9)
    """Number of members, 1 to 9 (odd sizes tolerate failures best)."""
    version: str = Field(default=DEFAULT_VERSION, pattern=VERSION_PATTERN)
    """etcd version, like 3.6.16."""
    repository: str = "registry.k8s.io/etcd"
    """Image repository; the tag is derived from the version."""
    addressing: Literal["dns", "podIP"] = "dns"
    """How members and the operator address members: by pod DNS name through the peer
    Service (default), or by pod IP (for clusters without DNS, like the dev cluster)."""
    client_service: ClientServiceSpec = Field(default_factory=ClientServiceSpec)
    """The client Service."""
    storage: StorageSpec = Field(default_factory=StorageSpec)
    """Member storage."""
    pod: PodPolicy = Field(default_factory=PodPolicy)
    """Member pod policy."""
    member_failure_timeout: str = Field(default="60s", pattern=DURATION_PATTERN)
    """How long a member may be unhealthy before it is replaced (a deleted pod is replaced at once)."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra etcd flags, like --quota-backend-bytes=4294967296."""
    backup: BackupSchedule | None = None
    """Scheduled backups."""
    tls: TLSSpec | None = None
    """Peer and client TLS with client certificate authentication (see docs/etcdcluster.md)."""


class MemberStatus(KubeModel):
    """One etcd member as last observed."""

    name: str
    """The member's name, equal to its pod's name."""
    id: str = ""
    """The etcd member ID, in hex."""
    pod: str = ""
    """The member's pod."""
    peer_url: str = ""
    """The URL peers reach it at."""
    client_url: str = ""
    """The URL clients reach it at."""
    healthy: bool = False
    """Whether it answered a status request."""
    leader: bool = False
    """Whether it is the raft leader."""
    learner: bool = False
    """Whether it is a learner, still catching up."""
    version: str = ""
    """The etcd version it runs."""
    unhealthy_since: str | None = None
    """When it was first seen unhealthy (RFC 3339); kept across operator restarts."""


class EtcdClusterStatus(KubeModel):
    """What the operator last observed and did."""

    phase: (
        Literal["Creating", "Running", "Scaling", "Upgrading", "Recovering", "QuorumLost", "Failed"] | None
    ) = None
    """Creating, Running, Scaling, Recovering, QuorumLost or Failed."""
    ready: str | None = None
    """Healthy voting members over size, like 3/3."""
    size: int | None = None
    """Members in the etcd membership."""
    members: list[MemberStatus] = Field(default_factory=list, json_schema_extra=list_map("name"))
    """Every member, healthy or not."""
    current_version: str | None = None
    """The etcd version the members run."""
    cluster_id: str | None = None
    """The etcd cluster ID, in hex."""
    next_member_index: int = 0
    """The index of the next member's pod name; never reused."""
    storage_type: str | None = None
    """The storage type the cluster was created with."""
    observed_generation: int | None = None
    """The generation of the spec this status describes."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Available, Progressing, Degraded."""
    tls: TLSStatus | None = None
    """Certificates in use, when spec.tls is set."""


class EtcdCluster(CustomResource[EtcdClusterSpec, EtcdClusterStatus]):
    """An etcd cluster run by kustos."""

    crd = CRDInfo(
        kind="EtcdCluster",
        plural="etcdclusters",
        short_names=("etcd", "etcdc"),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("READY", ".status.ready", description="Healthy members over size"),
            PrinterColumn("VERSION", ".status.currentVersion"),
            PrinterColumn("PHASE", ".status.phase"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
