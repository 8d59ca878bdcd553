"""EtcdCluster: an etcd cluster that kustos creates, resizes and heals (SPEC F-ETCD-1..6, 11, 12)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.backup import BackupSchedule
from kustos.api.common import CRON_PATTERN, ENDPOINT_PATTERN, QUANTITY_PATTERN, Condition, Duration
from kustos.api.etcd_auth import AuthSpec
from kustos.api.etcd_tls import TLSSpec, TLSStatus
from kustos.images import DEFAULT_ETCD_REPOSITORY, PROVEN_ETCD_VERSIONS
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map

VERSION_PATTERN = r"^3\.[0-9]+\.[0-9]+$"
# A repository, no tag or digest: host[:port]/path (the tag comes from spec.version).
REPOSITORY_PATTERN = r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$"
# The newest version the suite proves.
DEFAULT_VERSION = PROVEN_ETCD_VERSIONS[-1]
COMPACTION_RETENTION_PATTERN = r"^([0-9]+|([0-9]+(\.[0-9]+)?(ms|s|m|h))+)$"  # 10000, 1h, 30m
# The minors of etcd whose etcd downgrades its cluster to the previous minor through the
# downgrade API (added in v3.6; etcd's guides "Downgrade etcd from v3.6 to v3.5" and "from
# v3.7 to v3.6"). 3.5 has none. etcd/versions.py's rules, and the CEL rule below, use it.
DOWNGRADE_CAPABLE_MINORS = frozenset({(3, 6), (3, 7)})


def _runs(minors: set[int]) -> list[tuple[int, int]]:
    """Contiguous runs of ``minors``: {5, 6, 7, 9} -> [(5, 7), (9, 9)]."""
    runs: list[tuple[int, int]] = []
    for m in sorted(minors):
        if runs and runs[-1][1] == m - 1:
            runs[-1] = (runs[-1][0], m)
        else:
            runs.append((m, m))
    return runs


def version_path_rule() -> Rule:
    """CEL's half of versions.version_path, from the spec alone (the webhook and the controller
    compare with what the members run): a change of more than one minor must pass through
    minors the suite proves a patch of, and go down only through minors with etcd's downgrade."""
    o, n = "int(oldSelf.version.split('.')[1])", "int(self.version.split('.')[1])"
    proven = {int(v.split(".")[1]) for v in PROVEN_ETCD_VERSIONS}
    capable = {minor for _, minor in DOWNGRADE_CAPABLE_MINORS}
    up = " || ".join(f"({o} + 1 >= {lo} && {n} - 1 <= {hi})" for lo, hi in _runs(proven)) or "false"
    down = " || ".join(f"({n} + 1 >= {lo} && {o} - 1 <= {hi})" for lo, hi in _runs(proven & capable))
    well_formed = "'^3[.][0-9]+[.][0-9]+$'"
    return Rule(
        f"!has(oldSelf.version) || !has(self.version) || !oldSelf.version.matches({well_formed}) || "
        f"!self.version.matches({well_formed}) || (({n} <= {o} + 1 || {up}) && ({n} >= {o} - 1 || "
        f"({o} in {sorted(capable)} && ({down or 'false'}))))",
        "version: a change of more than one minor goes up through the newest patch kustos proves of "
        f"each minor between ({', '.join(PROVEN_ETCD_VERSIONS)}), and down one minor at a time only "
        f"through minors whose etcd has a downgrade protocol "
        f"({', '.join(f'{a}.{b}' for a, b in sorted(DOWNGRADE_CAPABLE_MINORS))})",
        field_path=".version",
    )


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


class NetworkPolicySpec(KubeModel):
    """The NetworkPolicy kept beside the cluster, so etcd lets in only its clients. It takes
    effect only where the cluster's network plugin enforces NetworkPolicy."""

    enabled: bool = True
    """Keep it (default); false deletes it and lets every pod reach the members."""
    clients: list[dict[str, Any]] = Field(
        default_factory=list, json_schema_extra={"items": {"x-kubernetes-preserve-unknown-fields": True}}
    )
    """Who else may reach the client port: NetworkPolicy peers (podSelector, namespaceSelector,
    ipBlock) as in a NetworkPolicy's ingress `from`. The members, kustos's operator and its
    backup pods are always let in; only the members reach the peer port."""


class RecoverySpec(KubeModel):
    """What to do when a majority of members is lost (disaster recovery, F-ETCD-8)."""

    automatic: bool = False
    """Rebuild the cluster in place without asking: from the surviving member with the newest
    data, else from the newest backup. When false, the operator waits for
    `kustos etcd recover NAME` (the status says what it would do)."""
    delay: Duration = "60s"
    """How long quorum must have been lost before automatic recovery starts (members on a node
    that comes back, or PVC members restarted on their volumes, often restore it by themselves)."""


class RestoreSpec(KubeModel):
    """Create the cluster from a backup instead of empty."""

    backup: str = Field(min_length=1)
    """A succeeded EtcdBackup in the same namespace (of this or another cluster)."""


class AdoptSpec(KubeModel):
    """An etcd cluster kustos did not create, to take over without downtime."""

    endpoints: list[Annotated[str, Field(pattern=ENDPOINT_PATTERN)]] = Field(min_length=1)
    """Client URLs of one or more of its members; the rest are found in its member list."""


class AutoCompactionSpec(KubeModel):
    """etcd's own automatic compaction of old revisions (its flags --auto-compaction-*)."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    "self.mode != 'revision' || self.retention.matches('^[0-9]+$')",
                    "with mode revision, retention is a number of revisions, like 10000",
                    field_path=".retention",
                )
            ]
        )
    )

    mode: Literal["periodic", "revision"] = "periodic"
    """periodic: keep `retention` worth of history (a duration; a bare number means hours);
    revision: keep the last `retention` revisions."""
    retention: str = Field(pattern=COMPACTION_RETENTION_PATTERN)
    """How much history to keep: like 1h or 30m (periodic), or 10000 (revision)."""


class DefragmentationSpec(KubeModel):
    """When the operator defragments members: one at a time, followers first, the leader last."""

    enabled: bool = True
    """Defragment members whose database is mostly free space."""
    threshold: float = Field(default=0.5, ge=0, le=1)
    """Defragment a member when this fraction of its database file is free:
    (dbSize - dbSizeInUse) / dbSize greater than the threshold."""
    min_db_size: str = Field(default="64Mi", pattern=QUANTITY_PATTERN)
    """Members whose database file is smaller than this are left alone (too little to gain)."""
    schedule: str | None = Field(default=None, pattern=CRON_PATTERN)
    """Only start defragmenting within `window` after a tick of this cron schedule (UTC),
    like "0 3 * * *"; at any time when unset."""
    window: Duration = "1h"
    """How long after each tick of `schedule` a defragmentation may start."""
    check_interval: Duration = "5m"
    """How often every member's database size is checked."""


class MaintenanceSpec(KubeModel):
    """Compaction and defragmentation of the members' databases."""

    auto_compaction: AutoCompactionSpec | None = None
    """etcd's automatic compaction; etcd's own default (none) when unset."""
    defragmentation: DefragmentationSpec = Field(default_factory=DefragmentationSpec)
    """Defragmentation by the operator."""


class DisruptionSpec(KubeModel):
    """How the cluster meets voluntary disruptions: drains, node upgrades, autoscalers."""

    migrate: bool = True
    """Move a member off a node that is cordoned or tainted for removal, by adding its
    replacement elsewhere first; the PodDisruptionBudget then allows no eviction, so drains
    wait for the move. False: the budget allows one eviction at a time while the cluster is
    healthy, and an evicted member is replaced after it has gone."""


class EtcdClusterSpec(KubeModel):
    """The etcd cluster the user wants."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule("!(has(self.restore) && has(self.adopt))", "set at most one of restore and adopt"),
                Rule(
                    "!has(oldSelf.storage) || !has(self.storage) || "
                    "oldSelf.storage.type == self.storage.type",
                    "storage.type cannot change on a live cluster",
                    field_path=".storage.type",
                ),
                Rule(
                    "has(oldSelf.restore) == has(self.restore) && "
                    "(!has(self.restore) || oldSelf.restore == self.restore)",
                    "restore is set when the cluster is created and cannot change",
                    field_path=".restore",
                ),
                Rule(
                    "!has(oldSelf.adopt) || (has(self.adopt) && oldSelf.adopt == self.adopt)",
                    "adopt is set when the cluster is created and cannot change",
                    field_path=".adopt",
                ),
                Rule(
                    "has(oldSelf.tls) == has(self.tls)",
                    "tls cannot be turned on or off on a live cluster",
                    field_path=".tls",
                ),
                Rule(
                    "!has(oldSelf.addressing) || !has(self.addressing) || "
                    "oldSelf.addressing == self.addressing",
                    "addressing cannot change on a live cluster (members' peer URLs are built from it)",
                    field_path=".addressing",
                ),
                Rule(
                    "!has(self.extraArgs) || self.extraArgs.all(a, !a.matches("
                    "'^--?(name|data-dir|initial-cluster(-state|-token)?|initial-advertise-peer-urls|"
                    "advertise-client-urls|listen-(client|peer|client-http)-urls)(=|$)'))",
                    "extraArgs cannot set a flag the operator sets (name, data-dir, initial-cluster*, "
                    "advertise and listen URLs)",
                    field_path=".extraArgs",
                ),
                # The webhook names each entry and its replacement (etcd/flags.py).
                Rule(
                    "!has(self.extraArgs) || !has(self.version) || "
                    "!self.version.matches('^3[.]([7-9]|[1-9][0-9])[.]') || "
                    "self.extraArgs.all(a, !a.matches('^--?experimental-'))",
                    "extraArgs sets an --experimental-* flag, which etcd 3.7 removed: use the flag or "
                    "--feature-gates entry it graduated to (docs/etcdcluster.md, etcd 3.7)",
                    field_path=".extraArgs",
                ),
                Rule(
                    "!has(self.extraArgs) || !has(self.version) || self.version.matches('^3[.][0-5][.]') || "
                    "self.extraArgs.all(a, "
                    "!a.matches('^--?(enable-v2|experimental-enable-v2v3|proxy(-[a-z-]+)?)(=|$)'))",
                    "extraArgs sets a flag of the v2 API or the v2 proxy, which etcd 3.6 removed",
                    field_path=".extraArgs",
                ),
                version_path_rule(),
                Rule(
                    "!has(self.version) || !self.version.matches('^3[.][0-4][.]')",
                    "version is older than 3.5.0, the oldest kustos supports",
                    field_path=".version",
                ),
            ]
        )
    )

    size: int = Field(default=3, ge=1, le=9)
    """Number of members, 1 to 9 (odd sizes tolerate failures best)."""
    version: str = Field(default=DEFAULT_VERSION, pattern=VERSION_PATTERN, max_length=16)
    """etcd version, like 3.7.3."""
    repository: str = Field(default=DEFAULT_ETCD_REPOSITORY, pattern=REPOSITORY_PATTERN)
    """Image repository, without a tag; the tag is derived from the version as the repository
    tags it: ``v3.7.3`` (gcr.io/etcd-development/etcd, quay.io/coreos/etcd, any other) or
    ``3.7.3-0`` (registry.k8s.io/etcd, which carries only the versions Kubernetes ships)."""
    addressing: Literal["dns", "podIP"] = "dns"
    """How members and the operator address members: by pod DNS name through the peer
    Service (default), or by pod IP (for clusters without DNS, like the dev cluster)."""
    client_service: ClientServiceSpec = Field(default_factory=ClientServiceSpec)
    """The client Service."""
    storage: StorageSpec = Field(default_factory=StorageSpec)
    """Member storage."""
    pod: PodPolicy = Field(default_factory=PodPolicy)
    """Member pod policy."""
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    """Who may reach the members (a NetworkPolicy)."""
    member_failure_timeout: Duration = "60s"
    """How long a member may be unhealthy before it is replaced. A deleted pod's member is
    replaced at once, or, with PVC storage, comes back on its volume once the pod is gone; the
    time a pod takes to stop within its grace period does not count."""
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"items": {"type": "string", "maxLength": 1024}},
    )
    """Extra etcd flags, like --quota-backend-bytes=4294967296."""
    backup: BackupSchedule | None = None
    """Scheduled backups."""
    recovery: RecoverySpec = Field(default_factory=RecoverySpec)
    """Disaster recovery when quorum is lost."""
    restore: RestoreSpec | None = None
    """Start from a backup (only when the cluster is created)."""
    adopt: AdoptSpec | None = None
    """Take over an existing etcd cluster (only when the cluster is created): its members are
    replaced one at a time by member pods, without downtime or data loss."""

    maintenance: MaintenanceSpec = Field(default_factory=MaintenanceSpec)
    """Automatic compaction and defragmentation."""
    disruption: DisruptionSpec = Field(default_factory=DisruptionSpec)
    """Drains and other voluntary disruptions (see docs/etcdcluster.md, Disruptions)."""
    tls: TLSSpec | None = None
    """Peer and client TLS with client certificate authentication (see docs/etcdcluster.md)."""
    auth: AuthSpec | None = None
    """etcd users and roles (see docs/etcdcluster.md, Authentication)."""


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


class StuckPod(KubeModel):
    """A pod of the cluster that cannot start or run, and why."""

    pod: str
    """The pod's name."""
    reason: str
    """ImagePullFailed, CrashLoopBackOff, Unschedulable, VolumePending, VolumeAttachFailed,
    VolumeMountFailed or NoSpareNode."""
    message: str = ""
    """What is wrong and what would fix it."""


class RecoveryStatus(KubeModel):
    """A disaster recovery: where it rebuilds from, and how far it got."""

    epoch: int
    """The epoch the rebuilt cluster's members belong to (status.epoch once it is done)."""
    phase: Literal["Running", "Succeeded", "Failed"] = "Running"
    """Running until the seed answers and the old pods are gone; Failed needs a person."""
    source_kind: Literal["member", "backup"]
    """Rebuilt from a surviving member's data, or from a backup."""
    source: str
    """The member's pod, or the EtcdBackup."""
    revision: int | None = None
    """The etcd revision of the source when it was chosen."""
    reason: str = ""
    """Why: automatic, or approved with kustos etcd recover."""
    started_at: str | None = None
    completed_at: str | None = None
    attempts: int = 0
    """Seeds started so far; a seed that cannot restore is replaced, a few times."""
    message: str | None = None
    """What happened last."""


class AdoptionStatus(KubeModel):
    """Taking over an existing cluster: which members are still the original ones."""

    phase: Literal["Migrating", "Completed"] = "Migrating"
    external_members: list[str] = Field(default_factory=list)
    """IDs (hex) of the original members, replaced one at a time."""
    endpoints: list[str] = Field(default_factory=list)
    """Their client URLs, asked until they have all left."""
    started_at: str | None = None
    completed_at: str | None = None


class DefragmentationRecord(KubeModel):
    """The last defragmentation of one member."""

    member: str
    """The member (its pod's name)."""
    started_at: str
    """When it started (RFC 3339)."""
    completed_at: str | None = None
    """When it ended (RFC 3339)."""
    db_size_before: int = 0
    """The database file's size before, in bytes."""
    db_size_after: int = 0
    """The database file's size after, in bytes."""
    reclaimed: int = 0
    """Bytes given back: dbSizeBefore - dbSizeAfter."""
    leader: bool = False
    """Whether the member was the leader when it was defragmented."""
    error: str | None = None
    """Why it failed, if it did."""


class NoSpaceRecovery(KubeModel):
    """The recovery from etcd's NOSPACE alarm under way: compact, defragment each member, disarm."""

    started_at: str
    """When the alarm was first seen (RFC 3339)."""
    compacted_revision: int = 0
    """The revision the history was compacted to (0: not yet)."""
    defragmented: list[str] = Field(default_factory=list)
    """Members defragmented since it started."""


class MaintenanceStatus(KubeModel):
    """What the maintenance controller did last (it writes only this subtree)."""

    in_progress: DefragmentationRecord | None = None
    """The defragmentation under way: a restarted operator finishes its record."""
    defragmentations: list[DefragmentationRecord] = Field(
        default_factory=list, json_schema_extra=list_map("member")
    )
    """The last defragmentation of each member."""
    no_space: NoSpaceRecovery | None = None
    """The NOSPACE alarm being recovered from."""
    message: str | None = None
    """What the controller is waiting for, or did last."""


class VersionPathStatus(KubeModel):
    """A change of spec.version across several minors, walked one version at a time
    (docs/etcdcluster.md, "Upgrades and rollbacks")."""

    source: str
    """The version every member ran when it started."""
    target: str
    """The spec.version it leads to."""
    steps: list[str] = Field(default_factory=list)
    """The versions the members run in turn, the target last."""
    step: str
    """The version the members roll to now: the next step starts once every member runs it
    and the cluster version etcd reports has reached its minor."""
    started_at: str | None = None
    """When it started (RFC 3339)."""


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
    version_path: VersionPathStatus | None = None
    """The path across minors under way, when spec.version is more than one minor away."""
    cluster_id: str | None = None
    """The etcd cluster ID, in hex."""
    next_member_index: int = 0
    """The index of the next member's pod name; never reused."""
    storage_type: str | None = None
    """The storage type the cluster was created with."""
    epoch: int = 0
    """Incremented by each disaster recovery; member pods carry the epoch they belong to."""
    recovery: RecoveryStatus | None = None
    """The recovery under way, or the last one (completedAt set)."""
    adoption: AdoptionStatus | None = None
    """The takeover of an existing cluster (spec.adopt)."""

    maintenance: MaintenanceStatus | None = None
    """Defragmentations (written by the maintenance controller)."""
    stuck: list[StuckPod] = Field(default_factory=list, json_schema_extra=list_map("pod"))
    """Pods of the cluster that cannot start or run (image pull, crash loop, unschedulable,
    volume pending), each with what to do; empty when none is."""
    observed_generation: int | None = None
    """The generation of the spec this status describes."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Available, Progressing, Degraded."""
    tls: TLSStatus | None = None
    """Certificates in use, when spec.tls is set."""


class EtcdCluster(CustomResource[EtcdClusterSpec, EtcdClusterStatus]):
    """An etcd cluster run by kustos."""

    crd = CRDInfo.of(
        refs.ETCD_CLUSTERS,
        short_names=("etcd", "etcdc"),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("READY", ".status.ready", description="Healthy members over size"),
            PrinterColumn("VERSION", ".status.currentVersion"),
            PrinterColumn("PHASE", ".status.phase"),
            PrinterColumn("STUCK", ".status.stuck[0].reason", description="Why a pod cannot start or run"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
