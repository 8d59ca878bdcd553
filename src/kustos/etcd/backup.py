"""Backups, the pure part: where a backup goes, which member it streams from, the agent
pod that takes it, the retry backoff and the schedule (no I/O here)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from cronsim import CronSim

from kustos.api.backup import BackupSchedule, BackupStorage, EtcdBackup, PVCStorage
from kustos.api.etcd import EtcdCluster
from kustos.etcd.certs import CLIENT_DIR, client_secret_name
from kustos.etcd.pods import CLUSTER_LABEL
from kustos.runtime.times import parse_duration

Obj = dict[str, Any]

BACKUP_LABEL = "kustos.dev/backup"
SCHEDULED_LABEL = "kustos.dev/scheduled"
AGENT_CONTAINER = "snapshot"
MAX_ATTEMPTS = 5
BACKUP_MOUNT = "/backups"
SCRATCH_MOUNT = "/scratch"


def storage_for(backup: EtcdBackup, cluster: EtcdCluster) -> BackupStorage:
    """The backup's own storage, else the cluster's schedule's, else the cluster's default claim."""
    if backup.spec.storage is not None:
        return backup.spec.storage
    if cluster.spec.backup is not None and cluster.spec.backup.storage is not None:
        return cluster.spec.backup.storage
    return BackupStorage(pvc=PVCStorage())


def claim_name(cluster: str, pvc: PVCStorage) -> str:
    return pvc.claim_name or f"{cluster}-backups"


def default_claim(cluster: EtcdCluster, pvc: PVCStorage) -> Obj:
    """The claim kustos creates for a cluster's backups: not owned, so it outlives the cluster."""
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": pvc.size}}}
    if pvc.storage_class_name:
        spec["storageClassName"] = pvc.storage_class_name
    name = cluster.metadata["name"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name(name, pvc), "namespace": cluster.metadata["namespace"],
                     "labels": {CLUSTER_LABEL: name, BACKUP_LABEL: "storage"}},
        "spec": spec,
    }  # fmt: skip


def source_member(cluster: EtcdCluster) -> tuple[str, str] | None:
    """(name, client URL) of a healthy voting member, a follower when there is one."""
    members = [m for m in (cluster.status.members if cluster.status else []) if m.healthy and not m.learner]
    members = [m for m in members if m.client_url]
    if not members:
        return None
    chosen = min(members, key=lambda m: (m.leader, m.name))
    return chosen.name, chosen.client_url


def retry_delay(attempts: int) -> timedelta:
    """After the n-th failed attempt: 10 s, 20 s, 40 s ... at most 5 minutes."""
    return timedelta(seconds=min(10 * 2 ** max(0, attempts - 1), 300))


def agent_pod_name(backup: str, attempt: int) -> str:
    return f"{backup}-snapshot-{attempt}"


def agent_pod(
    backup: EtcdBackup, cluster: EtcdCluster, storage: BackupStorage, member: tuple[str, str], attempt: int,
    image: str,
) -> Obj:  # fmt: skip
    """A pod running ``kustos etcd snapshot`` once, owned by the EtcdBackup."""
    namespace, name = backup.metadata["namespace"], backup.metadata["name"]
    cluster_name = cluster.metadata["name"]
    member_name, endpoint = member
    args = ["kustos", "etcd", "snapshot", "--endpoint", endpoint, "--name", name, "--cluster", cluster_name,
            "--member", member_name]  # fmt: skip
    labels = backup.metadata.get("labels") or {}
    if labels.get(SCHEDULED_LABEL) == "true" and cluster.spec.backup is not None:
        args += ["--keep", str(cluster.spec.backup.keep)]
    container: Obj = {"name": AGENT_CONTAINER, "image": image, "command": args, "volumeMounts": []}
    volumes: list[Obj] = []
    if storage.pvc is not None:
        claim = claim_name(cluster_name, storage.pvc)
        directory = f"{BACKUP_MOUNT}/{namespace}/{cluster_name}"
        container["command"] += [
            "--dir",
            directory,
            "--location-prefix",
            f"pvc://{claim}/{namespace}/{cluster_name}",
        ]
        container["volumeMounts"].append({"name": "backups", "mountPath": BACKUP_MOUNT})
        volumes.append({"name": "backups", "persistentVolumeClaim": {"claimName": claim}})
    else:
        s3 = storage.s3
        assert s3 is not None
        prefix = "/".join(p for p in (s3.prefix.strip("/"), namespace, cluster_name) if p)
        container["command"] += [
            "--s3-endpoint", s3.endpoint, "--s3-bucket", s3.bucket, "--s3-prefix", prefix,
            "--s3-region", s3.region, "--s3-path-style" if s3.path_style else "--no-s3-path-style",
            "--scratch", SCRATCH_MOUNT,
        ]  # fmt: skip
        container["env"] = s3_credentials_env(s3.credentials_secret)
        container["volumeMounts"].append({"name": "scratch", "mountPath": SCRATCH_MOUNT})
        volumes.append({"name": "scratch", "emptyDir": {}})
    mount_client_tls(cluster, container, volumes)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": agent_pod_name(name, attempt),
            "namespace": namespace,
            "labels": {BACKUP_LABEL: name, CLUSTER_LABEL + "-backup": cluster_name},
            "ownerReferences": [{
                "apiVersion": EtcdBackup.crd.api_version, "kind": "EtcdBackup", "name": name,
                "uid": backup.metadata["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {"restartPolicy": "Never", "containers": [container], "volumes": volumes},
    }  # fmt: skip


def mount_client_tls(cluster: EtcdCluster, container: Obj, volumes: list[Obj]) -> None:
    """For a TLS cluster: the operator's client certificate and the members' CA, mounted into an
    agent container whose command takes --cacert/--cert/--key."""
    if cluster.spec.tls is None:
        return
    container["command"] += ["--cacert", f"{CLIENT_DIR}/ca.crt", "--cert", f"{CLIENT_DIR}/tls.crt",
                             "--key", f"{CLIENT_DIR}/tls.key"]  # fmt: skip
    container.setdefault("volumeMounts", []).append(
        {"name": "etcd-client-tls", "mountPath": CLIENT_DIR, "readOnly": True}
    )
    volumes.append({"name": "etcd-client-tls", "secret": {"secretName": client_secret_name(cluster)}})


def s3_credentials_env(secret: str) -> list[Obj]:
    """The S3 client's credentials, from the Secret's accessKeyId and secretAccessKey."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for env, key in (("AWS_ACCESS_KEY_ID", "accessKeyId"), ("AWS_SECRET_ACCESS_KEY", "secretAccessKey"))
    ]


def next_scheduled(schedule: BackupSchedule, last: datetime) -> datetime:
    """When the next scheduled backup is due, after one taken (or the cluster created) at ``last``."""
    if schedule.interval:
        return last + parse_duration(schedule.interval)
    assert schedule.schedule is not None
    return next(CronSim(schedule.schedule, last))


def scheduled_backup(cluster: EtcdCluster, name: str) -> Obj:
    """An EtcdBackup the schedule creates; not owned by the cluster, so its record outlives it."""
    return {
        "apiVersion": EtcdBackup.crd.api_version,
        "kind": "EtcdBackup",
        "metadata": {
            "name": name,
            "namespace": cluster.metadata["namespace"],
            "labels": {CLUSTER_LABEL: cluster.metadata["name"], SCHEDULED_LABEL: "true"},
        },
        "spec": {"clusterName": cluster.metadata["name"]},
    }


def expired(backups: list[Obj], keep: int) -> list[Obj]:
    """Scheduled backups beyond the newest ``keep`` successes, and beyond the newest ``keep``
    failures: failures never push a good backup out, and a running one is never deleted."""
    old: list[Obj] = []
    for phase in ("Succeeded", "Failed"):
        done = [b for b in backups if (b.get("status") or {}).get("phase") == phase]
        done.sort(key=lambda b: (b["metadata"].get("creationTimestamp", ""), b["metadata"]["name"]))
        old += done[: max(0, len(done) - keep)]
    return old
