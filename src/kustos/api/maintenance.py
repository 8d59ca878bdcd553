"""MaintenancePolicy: how kustos keeps a cluster healthy when nodes die (SPEC F-MAINT-1..8).

Every switch of EKCO's configuration, with its default (seed 004), plus kustos's fencing
choices. One policy named ``default`` (cluster-scoped); the CLI's ``purge-node`` reads the
same model from a YAML file.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from kustos.api import refs
from kustos.api.common import Condition, Duration
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, list_map

POLICY_NAME = "default"
FENCED_ANNOTATION = "kustos.dev/fenced"
"""Written on a Node by a fencing agent (value: RFC 3339 time) once it has powered the node off."""
IMAGE_OVERRIDE_PATTERN = r"^[^=\s]+=[^=\s]+$"


def _ip_address(value: str) -> str:
    ipaddress.ip_address(value)  # a ValueError names the field through pydantic
    return value


class FencingPolicy(KubeModel):
    """What confirms that a node which stopped reporting can no longer run its pods."""

    provider: bool = True
    """Ask the cloud provider: an instance it reports stopped or gone is fenced."""
    annotation: bool = True
    """Accept the kustos.dev/fenced annotation a fencing agent writes on the Node."""
    after_toleration: bool = False
    """Treat a node unreachable for longer than nodeUnreachableToleration as fenced. Unsafe for
    a node that is merely partitioned (it may still run a copy of the pod); EKCO's behaviour."""


BUILT_IN_SCALABLE = ("Deployment", "StatefulSet")


class ScaledResource(KubeModel):
    """A workload scaled up to its desired replicas as Ready nodes allow (auto-resource scaling)."""

    api_version: str = Field(default="apps/v1", pattern=r"^([a-z0-9.-]+/)?v[0-9a-z]+$")
    """apps/v1 for a Deployment or StatefulSet, else the custom resource's group/version."""
    kind: str = Field(min_length=1)
    """Deployment, StatefulSet, or a custom resource's kind."""
    resource: str | None = Field(default=None, pattern=r"^[a-z0-9.-]+$")
    """A custom resource's plural (prometheuses); Deployments and StatefulSets need none."""
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    replicas: int = Field(ge=1)
    """The replicas wanted once there are enough nodes; never more."""
    replicas_path: str = Field(default="spec.replicas", pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
    """Where the object keeps its replica count, dotted (a custom resource's may differ)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Only Ready, schedulable nodes with these labels count (every Ready, schedulable node when empty)."""

    @model_validator(mode="after")
    def _resource_of_a_custom_kind(self) -> ScaledResource:
        if not (self.api_version == "apps/v1" and self.kind in BUILT_IN_SCALABLE) and not self.resource:
            raise ValueError(f"resource (the plural) is needed for {self.api_version} {self.kind}")
        return self


class MaintenancePolicySpec(KubeModel):
    """The switches of node maintenance; EKCO's names where it has one, with its defaults."""

    node_unreachable_toleration: Duration = "1h"
    """How long a Node must be unreachable before it is considered dead (purge, legacy clear)."""
    min_ready_master_node_count: int = Field(default=2, ge=0)
    """Purge never leaves fewer Ready control-plane nodes than this (the dead node not counted)."""
    min_ready_worker_node_count: int = Field(default=0, ge=0)
    """Purge never leaves fewer Ready worker nodes than this (the dead node not counted)."""
    should_disable_clear_nodes: bool = False
    """Do not move pods off dead nodes."""
    should_enable_purge_nodes: bool = False
    """Remove dead nodes from the cluster (Rook, control plane, etcd member, Node)."""
    fencing: FencingPolicy = Field(default_factory=FencingPolicy)
    """What counts as proof that a dead node is down before its pods are started elsewhere."""
    legacy_clear: bool = False
    """Clear as EKCO does without fencing: force-delete pods Terminating for 30 s on a node past
    its toleration. Risks two copies of a pod on a node that is only partitioned."""
    rook_should_use_all_nodes: bool = True
    """Rook uses every node: kustos neither adds nodes to the CephClusters' storage.nodes (nor
    removes them on a purge) nor scales pool replication, mons and mgrs."""
    rook_should_disable_reconcile_mds_placement: bool = Field(
        default=False, alias="rookShouldDisableReconcileMDSPlacement"
    )
    """Leave CephFilesystem MDS placement alone (else strict anti-affinity from two Ready nodes)."""
    rook_should_disable_reconcile_ceph_csi_resources: bool = Field(
        default=False, alias="rookShouldDisableReconcileCephCSIResources"
    )
    """Leave Ceph CSI resource requests and limits alone (else Rook's recommended ones from three
    Ready nodes, in rook-ceph-operator-config)."""
    rook_namespace: str = "rook-ceph"
    """Where Rook, its CephCluster and its toolbox run."""
    rook_storage_nodes_label: str = Field(default="", pattern=r"^([^=\s]+=[^=\s]*)?$")
    """key=value: only Ready nodes with this label join storage.nodes (every Ready node when empty)."""
    rook_storage_node_devices: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """The devices of a node added to storage.nodes (its ``devices``, by name: sdb, nvme0n1)."""
    rook_storage_node_device_filter: str | None = Field(default=None, min_length=1)
    """The ``deviceFilter`` regular expression of a node added to storage.nodes."""
    min_ceph_pool_replication: int = Field(default=1, ge=1)
    """Ceph pools never go below this many replicas (unless rookShouldUseAllNodes)."""
    max_ceph_pool_replication: int = Field(default=3, ge=1)
    """Ceph pools rise with the Ready storage nodes up to this many replicas."""
    should_disable_reboot_services: bool = True
    """Do not install the shutdown and startup service (deploy/reboot/) on nodes."""
    should_disable_restart_failed_envoy_pods: bool = False
    """Do not delete Envoy pods whose envoy container stays not ready."""
    envoy_pods_not_ready_duration: Duration = "5m"
    """How long an envoy container may be not ready (its pod running) before the pod is deleted."""
    envoy_pod_selector: str = "app=envoy"
    """The label selector (key=value[,key=value]) of the Envoy pods."""
    envoy_container_name: str = "envoy"
    """The container whose readiness counts."""
    pod_image_overrides: list[Annotated[str, Field(pattern=IMAGE_OVERRIDE_PATTERN)]] = Field(
        default_factory=list
    )
    """Container image rewrites for new pods, each original=override."""
    minio_should_disable_management: bool = False
    """Leave MinIO alone: no move of its single-replica Deployment to the six-replica
    StatefulSet (docs/maintenance-extras.md)."""
    minio_namespace: str = Field(default="minio", min_length=1)
    """Where MinIO's Deployment, Service and credentials are (EKCO's minio_namespace)."""
    minio_storage_class: str = Field(default="openebs-localpv", min_length=1)
    """The local storage class of the StatefulSet's volumes; MinIO is not moved until it exists."""
    kotsadm_should_disable_management: bool = False
    """Leave kotsadm alone: no scaling of its database StatefulSet to three replicas."""
    kotsadm_namespace: str = Field(default="default", min_length=1)
    """Where kotsadm runs (EKCO: the default namespace)."""
    etcd_certificates_secret: str | None = None
    """namespace/name of a Secret with kubeadm's etcd client certificates (ca.crt, healthcheck-client
    .crt and .key) for a stacked etcd; else certificatesDir is read."""
    certificates_dir: str = "/etc/kubernetes/pki"
    """kubeadm's certificates directory (etcd/ca.crt, etcd/healthcheck-client.crt and .key)."""
    enable_internal_load_balancer: bool = False
    """Run HAProxy as a static pod on every node, listening on localhost (internalLoadBalancerPort)
    and forwarding to every control-plane node's API server; its configuration follows the
    control-plane nodes as they join and leave (docs/maintenance-extras.md)."""
    internal_load_balancer_port: int = Field(default=6444, ge=1, le=65535)
    """The port HAProxy listens on."""
    internal_load_balancer_bind_address: Annotated[str, AfterValidator(_ip_address)] = Field(
        default="127.0.0.1", pattern=r"^[0-9a-fA-F.:]+$"
    )
    """The address HAProxy listens on (EKCO: every address; here loopback unless set)."""
    internal_load_balancer_haproxy_image: str = Field(default="haproxy:lts-alpine", pattern=r"^\S+$")
    """The HAProxy image of the static pod (EKCO's default)."""
    host_task_namespace: str = "kube-system"
    """Where the pods that write files on the nodes run (EKCO: kurl)."""
    host_task_image: str | None = Field(default=None, pattern=r"^\S+$")
    """The image of those pods; the operator's own image when unset."""
    rotate_certs: bool = True
    """Renew kubeadm's control-plane certificates on each control-plane node before they expire,
    one node at a time (docs/maintenance-extras.md)."""
    rotate_certs_check_interval: Duration = "24h"
    """How often each control-plane node's certificates are looked at (EKCO's default)."""
    rotate_certs_threshold: Duration = "720h"
    """Renew the certificates that expire within this (EKCO's rotate_certs_ttl, 30 days)."""
    auto_resource_scaling: list[ScaledResource] = Field(default_factory=list)
    """Workloads scaled up to their desired replicas as Ready nodes join: one replica per
    eligible node, never above the desired count, never below what the object says."""

    @model_validator(mode="after")
    def _replication_bounds(self) -> MaintenancePolicySpec:
        if self.min_ceph_pool_replication > self.max_ceph_pool_replication:
            raise ValueError(
                f"minCephPoolReplication ({self.min_ceph_pool_replication}) is above "
                f"maxCephPoolReplication ({self.max_ceph_pool_replication})"
            )
        return self


class MaintenanceAction(KubeModel):
    """One thing the controller did or refused."""

    time: str = Field(json_schema_extra={"format": "date-time"})
    """When (RFC 3339)."""
    node: str
    """The node it concerned."""
    action: str
    """Clear, Purge, ReleaseClaim, RestartEnvoy, ... in CamelCase."""
    outcome: Literal["Done", "Refused", "Failed"]
    """Done, Refused (a guard said no) or Failed (will be retried)."""
    message: str = ""
    """What was done, or why not."""


class PurgeDeletion(KubeModel):
    """A Node a purge is deleting, recorded before it asks: the purge's end is then recorded
    even when the operator stops between the deletion and its record."""

    node: str
    uid: str
    """The Node's, as it was when its deletion was decided (a Node of that name registered
    later is another)."""
    time: str = Field(json_schema_extra={"format": "date-time"})
    """When its deletion was decided (RFC 3339)."""


class InternalLoadBalancerStatus(KubeModel):
    """Where the internal load balancer's configuration is, on the nodes."""

    servers: list[str] = Field(default_factory=list)
    """The API servers HAProxy forwards to, each node=host:port."""
    nodes_updated: str | None = None
    """Nodes whose files match the servers over the nodes that should have them, like 3/5."""
    message: str = ""
    """What is done or awaited."""


class ScalingState(KubeModel):
    """Where one auto-scaled workload is."""

    workload: str
    """Kind namespace/name."""
    desired: int
    replicas: int | None = None
    """What the object says now (None: not readable, see message)."""
    nodes: int = 0
    """Ready, schedulable nodes that count for it."""
    message: str = ""
    """Done, or what waits for nodes."""


class RookStatus(KubeModel):
    """Where Rook's following of the nodes is (rookShouldUseAllNodes off: the counts too)."""

    ready_storage_nodes: int | None = None
    """Ready nodes listed in the CephClusters' storage.nodes."""
    listed_storage_nodes: int | None = None
    """Nodes listed in storage.nodes (a CephBlockPool lowers only to this many replicas)."""
    pool_replication: int | None = None
    """The replicas pools rise to: the Ready storage nodes between min and maxCephPoolReplication."""
    message: str = ""
    """Up to date, the next change, or what a pool change waits for (Ceph's health)."""


MinioPhase = Literal[
    "Disabled",
    "Waiting",
    "CreatingStatefulSet",
    "WaitingForStatefulSet",
    "Copying",
    "Verified",
    "Switched",
    "Migrated",
]


class MinioStatus(KubeModel):
    """Where the move of MinIO's Deployment to its StatefulSet is (one phase per pass)."""

    phase: MinioPhase
    """Waiting (for nodes, the storage class, ...), CreatingStatefulSet, WaitingForStatefulSet,
    Copying (MinIO's Service has no endpoints: offline), Verified, Switched (the Service selects
    the StatefulSet), Migrated (the data moved and verified, the Service switched, the Deployment
    and its data gone; the message says how many replicas are ready, and where)."""
    message: str = ""
    objects: int | None = None
    """Objects in the old MinIO at the last copy pass."""
    copied: int | None = None
    """Of those, present in the new MinIO with an equal checksum."""


class KotsadmState(KubeModel):
    """kotsadm's database StatefulSet, scaled to three once three nodes are Ready."""

    workload: str
    replicas: int
    message: str = ""


class CertificateRotationStatus(KubeModel):
    """Where the rotation of kubeadm's certificates is (rotateCerts)."""

    nodes_checked: str | None = None
    """Control-plane nodes checked within rotateCertsCheckInterval over all of them, like 2/3."""
    renewing: str | None = None
    """The node whose renewal pod runs now (one at a time)."""
    message: str = ""
    """The last node's outcome, or what is awaited."""


class MaintenancePolicyStatus(KubeModel):
    """What node maintenance did last and what it refused."""

    observed_generation: int | None = None
    dead_nodes: list[str] = Field(default_factory=list)
    """Nodes past their toleration or fenced, by name."""
    last_action: MaintenanceAction | None = None
    """The newest action, done or refused."""
    last_refusal: MaintenanceAction | None = None
    """The newest refusal, kept until a later action on that node succeeds."""
    purge_deletions: list[PurgeDeletion] = Field(default_factory=list)
    """Nodes whose purge has every other step done and deletes them next; each stays until
    the Node is gone and the purge is recorded done, or the node is Ready again."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Ready (the policy is valid and applied), Degraded (an action keeps failing)."""
    internal_load_balancer: InternalLoadBalancerStatus | None = None
    """The internal load balancer (enableInternalLoadBalancer), while it is on."""
    auto_resource_scaling: list[ScalingState] = Field(default_factory=list)
    """Each workload of spec.autoResourceScaling: scaled, or waiting for nodes."""
    rook: RookStatus | None = None
    """Rook following the nodes, while a CephCluster is in rookNamespace."""
    minio: MinioStatus | None = None
    """The move of MinIO to its highly available StatefulSet, while management is on."""
    kotsadm: KotsadmState | None = None
    """kotsadm's database, while it exists and management is on."""
    certificate_rotation: CertificateRotationStatus | None = None
    """kubeadm's certificates on the control-plane nodes (rotateCerts), while it is on."""


class MaintenancePolicy(CustomResource[MaintenancePolicySpec, MaintenancePolicyStatus]):
    """Node maintenance for the whole cluster; only the one named default is acted on."""

    crd = CRDInfo.of(
        refs.MAINTENANCE_POLICIES,
        short_names=("mp",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("PURGE", ".spec.shouldEnablePurgeNodes", "boolean"),
            PrinterColumn("TOLERATION", ".spec.nodeUnreachableToleration"),
            PrinterColumn("LAST", ".status.lastAction.action"),
            PrinterColumn("NODE", ".status.lastAction.node"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
