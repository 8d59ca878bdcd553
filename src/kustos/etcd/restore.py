"""Restoring seeds, the pure part: where a snapshot is read from, and the pod that restores it.

A restoring seed is an ordinary member pod (``member_pod``) with two init containers:
``fetch-snapshot`` puts the snapshot in a scratch emptyDir, then ``restore`` (the etcd
image of the cluster's version) runs ``etcdutl snapshot restore`` into the member's empty
data directory; restore refuses a snapshot whose SHA-256 trailer does not match. From a
surviving member, ``fetch-snapshot`` is ``etcdctl snapshot save`` (the etcd image, gRPC:
etcd's own speed); from a backup it is the operator's image (``kustos etcd
fetch-snapshot``), which reads a claim or a bucket and checks the SHA-256 the backup
recorded. The same seed serves disaster recovery
(F-ETCD-8) and ``spec.restore`` (a new cluster from a backup).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kustos.api.backup import BackupStorage, EtcdBackup, S3Storage
from kustos.api.etcd import EtcdCluster
from kustos.etcd.backup import log_in_as_root, mount_client_tls, s3_credentials_env, save_command
from kustos.etcd.planner import pod_name
from kustos.etcd.pods import DATA_DIR, cluster_token, image, member_pod, member_urls, restricted
from kustos.etcd.recovery import BUMP_REVISION, Source

Obj = dict[str, Any]

FETCH_CONTAINER = "fetch-snapshot"
RESTORE_CONTAINER = "restore"
RESTORE_MOUNT = "/restore"
# A survivor's stream that stalls fails the fetch (then the next source is tried); 5 min moves an
# 8 GiB database (etcd's largest recommended quota) at 28 MB/s, a fifth of etcd's own speed.
SURVIVOR_FETCH_TIMEOUT = timedelta(minutes=5)
BACKUPS_MOUNT = "/backups"
SNAPSHOT_FILE = f"{RESTORE_MOUNT}/snapshot.db"
RESTORED_FROM_ANNOTATION = "kustos.dev/restored-from"


@dataclass(frozen=True)
class SnapshotSource:
    """Exactly one of: a member's client URL, a file on a claim, an S3 object."""

    description: str
    member_url: str | None = None
    claim: str | None = None
    path: str | None = None  # inside the claim
    s3: S3Storage | None = None
    key: str | None = None
    sha256: str | None = None


def member_source(source: Source, client_url: str) -> SnapshotSource:
    return SnapshotSource(source.describe(), member_url=client_url)


def backup_source(backup: EtcdBackup, fallback: BackupStorage | None) -> SnapshotSource | str:
    """Where a succeeded backup's snapshot can be read back, or why it cannot."""
    status = backup.status
    name = backup.metadata["name"]
    if status is None or status.phase != "Succeeded" or not status.location:
        return f"EtcdBackup {name} has not succeeded"
    storage = status.storage or backup.spec.storage or fallback
    revision = f" at revision {status.revision}" if status.revision is not None else ""
    description = f"backup {name}{revision}"
    scheme, _, rest = status.location.partition("://")
    where, _, path = rest.partition("/")
    if scheme == "pvc":
        return SnapshotSource(description, claim=where, path=path, sha256=status.sha256)
    if scheme == "s3":
        if storage is None or storage.s3 is None or storage.s3.bucket != where:
            return f"EtcdBackup {name} is in bucket {where}, but no S3 storage settings name it"
        return SnapshotSource(description, s3=storage.s3, key=path, sha256=status.sha256)
    return f"EtcdBackup {name} has a location kustos cannot read: {status.location}"


def fetch_args(source: SnapshotSource) -> list[str]:
    args = ["kustos", "etcd", "fetch-snapshot", "--out", SNAPSHOT_FILE]
    if source.member_url:
        args += ["--endpoint", source.member_url]
    elif source.claim:
        args += ["--file", f"{BACKUPS_MOUNT}/{source.path}"]
    elif source.s3 is not None and source.key:
        s3 = source.s3
        style = "--s3-path-style" if s3.path_style else "--no-s3-path-style"
        args += ["--s3-endpoint", s3.endpoint, "--s3-bucket", s3.bucket, "--s3-key", source.key,
                 "--s3-region", s3.region, style]  # fmt: skip
    if source.sha256:
        args += ["--sha256", source.sha256]
    return args


def restore_args(name: str, peer: str, token: str) -> list[str]:
    """etcdutl's restore into the member's (empty) data directory, revisions bumped."""
    return [
        "snapshot", "restore", SNAPSHOT_FILE,
        f"--data-dir={DATA_DIR}", f"--name={name}", f"--initial-cluster={name}={peer}",
        f"--initial-advertise-peer-urls={peer}", f"--initial-cluster-token={token}",
        f"--bump-revision={BUMP_REVISION}", "--mark-compacted",
    ]  # fmt: skip


def restore_seed_pod(
    cluster: EtcdCluster, index: int, version: str, epoch: int, source: SnapshotSource, agent_image: str
) -> Obj:
    """Seed pod ``index`` of ``epoch``: fetch the snapshot, restore it, then run etcd on it."""
    name = pod_name(cluster.metadata["name"], index)
    peer, _ = member_urls(cluster, name)
    token = cluster_token(cluster, epoch)
    pod = member_pod(cluster, index, "new", [(name, peer)], version, epoch=epoch)
    spec = pod["spec"]
    pod_ip_env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    fetch: Obj = {
        "name": FETCH_CONTAINER,
        "image": image(cluster, version) if source.member_url else agent_image,
        "command": save_command(source.member_url, SNAPSHOT_FILE, SURVIVOR_FETCH_TIMEOUT)
        if source.member_url
        else fetch_args(source),
        "volumeMounts": [{"name": "restore", "mountPath": RESTORE_MOUNT}],
    }
    if source.claim:
        spec["volumes"].append(
            {"name": "backups", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}}
        )
        fetch["volumeMounts"].append({"name": "backups", "mountPath": BACKUPS_MOUNT, "readOnly": True})
    if source.s3 is not None:
        fetch["env"] = s3_credentials_env(source.s3.credentials_secret)
    if source.member_url:  # streamed from a member of a TLS cluster: the operator's client certificate
        mount_client_tls(cluster, fetch, spec["volumes"])
        log_in_as_root(cluster, fetch)
    restore: Obj = {
        "name": RESTORE_CONTAINER,
        "image": image(cluster, version),
        "command": ["etcdutl"],
        "args": restore_args(name, peer, token),
        "env": pod_ip_env,
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "restore", "mountPath": RESTORE_MOUNT},
        ],
    }
    spec["initContainers"] = [fetch, restore]
    spec["volumes"].append({"name": "restore", "emptyDir": {}})
    pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION] = source.description
    return restricted(pod)


def restore_failed(pod: Obj, failures: int) -> bool:
    """An init container that failed ``failures`` times, or a pod that failed outright."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return True
    for init in status.get("initContainerStatuses") or []:
        last = (init.get("lastState") or {}).get("terminated") or (init.get("state") or {}).get("terminated")
        if last and last.get("exitCode") and int(init.get("restartCount") or 0) >= failures:
            return True
    return False
