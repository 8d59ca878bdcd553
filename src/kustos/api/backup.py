"""EtcdBackup and where backups go: a PVC or an S3-compatible bucket (SPEC F-ETCD-7)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kustos.api import refs
from kustos.api.common import CRON_PATTERN, HTTP_URL_PATTERN, QUANTITY_PATTERN, Condition, Duration
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, PrinterColumn, Rule, kube_schema, list_map


class S3Storage(KubeModel):
    """An S3-compatible bucket."""

    endpoint: str = Field(pattern=HTTP_URL_PATTERN)
    """The S3 endpoint URL, like https://s3.eu-west-1.amazonaws.com or http://minio.backup:9000."""
    bucket: str = Field(min_length=3, max_length=63)
    """The bucket; it must exist."""
    prefix: str = ""
    """Key prefix for this cluster's snapshots (kustos adds <namespace>/<cluster>/)."""
    region: str = "us-east-1"
    """The bucket's region."""
    path_style: bool = True
    """Address the bucket in the path (most self-hosted servers) rather than the host name."""
    credentials_secret: str
    """A Secret in the cluster's namespace with keys accessKeyId and secretAccessKey."""


class PVCStorage(KubeModel):
    """A PersistentVolumeClaim that keeps snapshots as files."""

    claim_name: str | None = None
    """An existing claim; when unset kustos creates <cluster>-backups and never deletes it."""
    size: str = Field(default="10Gi", pattern=QUANTITY_PATTERN)
    """Size of the claim kustos creates."""
    storage_class_name: str | None = None
    """StorageClass of the claim kustos creates; the cluster's default when unset."""


class BackupStorage(KubeModel):
    """Exactly one place to keep snapshots."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[Rule("has(self.s3) != has(self.pvc)", "set exactly one of s3 and pvc")]
        )
    )

    s3: S3Storage | None = None
    """An S3-compatible bucket."""
    pvc: PVCStorage | None = None
    """A PersistentVolumeClaim."""


class BackupSchedule(KubeModel):
    """Scheduled backups of an EtcdCluster."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule("has(self.interval) != has(self.schedule)", "set exactly one of interval and schedule")
            ]
        )
    )

    interval: Duration | None = None
    """Take a backup this often, like 30m or 6h."""
    schedule: str | None = Field(default=None, pattern=CRON_PATTERN)
    """Or a cron schedule in UTC, like "0 */6 * * *"."""
    keep: int = Field(default=5, ge=1, le=1000)
    """How many scheduled backups to keep; the oldest beyond that are deleted."""
    storage: BackupStorage | None = None
    """Where backups go; a <cluster>-backups claim in the default StorageClass when unset."""


class EtcdBackupSpec(KubeModel):
    """One snapshot of an EtcdCluster, taken now."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(rules=[Rule("self == oldSelf", "an EtcdBackup's spec cannot change")])
    )

    cluster_name: str = Field(min_length=1)
    """The EtcdCluster, in the same namespace."""
    storage: BackupStorage | None = None
    """Where the snapshot goes; the cluster's spec.backup.storage when unset."""


class EtcdBackupStatus(KubeModel):
    phase: Literal["Pending", "Running", "Succeeded", "Failed"] | None = None
    """Where the backup is."""
    location: str | None = None
    """Where the snapshot is: s3://bucket/key or pvc://claim/path."""
    storage: BackupStorage | None = None
    """The storage it went to, resolved when it started: what a restore reads it back from."""
    member: str | None = None
    """The member the snapshot was streamed from."""
    revision: int | None = None
    """The etcd revision the snapshot contains (at least)."""
    size: int | None = None
    """Bytes."""
    sha256: str | None = None
    """Checksum of the stored file."""
    start_time: str | None = None
    completion_time: str | None = None
    duration: str | None = None
    """How long it took, like 1.52s."""
    attempts: int = 0
    """Attempts so far; failures are retried with backoff."""
    next_attempt_time: str | None = None
    """When the next attempt starts after a failure."""
    message: str | None = None
    """What happened last."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Succeeded, Failed."""


class EtcdBackup(CustomResource[EtcdBackupSpec, EtcdBackupStatus]):
    """A snapshot of an EtcdCluster, verified and stored (on demand, or by the cluster's schedule)."""

    crd = CRDInfo.of(
        refs.ETCD_BACKUPS,
        short_names=("etcdbackup",),
        categories=("kustos",),
        printer_columns=(
            PrinterColumn("CLUSTER", ".spec.clusterName"),
            PrinterColumn("PHASE", ".status.phase"),
            PrinterColumn("REVISION", ".status.revision", "integer"),
            PrinterColumn("SIZE", ".status.size", "integer"),
            PrinterColumn("LOCATION", ".status.location", priority=1),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
