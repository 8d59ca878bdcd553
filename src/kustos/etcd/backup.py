"""Backups, the manifests: where a backup goes, which member it streams from, the agent
pod that takes it and the EtcdBackup a schedule creates (no I/O here; what to do next is
``backup_planner``'s).

The agent pod has two steps. The init container ``etcdctl`` (the cluster's etcd image)
saves the snapshot over gRPC, at etcd's own speed: straight onto the backup claim (next
to its final place, so storing it is a rename) or into a scratch emptyDir for S3. Then
the ``snapshot`` container (the operator's image, ``kustos etcd snapshot --file``) checks
etcd's SHA-256 trailer, reads the revision from the file, stores it under its final name,
prunes, and prints the result line the controller reads.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kustos.api.backup import BackupStorage, EtcdBackup, PVCStorage
from kustos.api.etcd import EtcdCluster
from kustos.etcd.auth import ROOT
from kustos.etcd.authsync import PASSWORD_KEY, root_secret_name
from kustos.etcd.certs import CLIENT_DIR, client_secret_name
from kustos.etcd.pods import CLUSTER_LABEL, current_version, restricted
from kustos.etcd.pods import image as etcd_image
from kustos.etcd.snapshot import SNAPSHOT_SUFFIX

Obj = dict[str, Any]

BACKUP_LABEL = "kustos.dev/backup"
AGENT_CLUSTER_LABEL = CLUSTER_LABEL + "-backup"  # an agent pod's cluster (its NetworkPolicy lets it in)
SCHEDULED_LABEL = "kustos.dev/scheduled"
AGENT_CONTAINER = "snapshot"
SAVE_CONTAINER = "etcdctl"
BACKUP_MOUNT = "/backups"
SCRATCH_MOUNT = "/scratch"
# etcdctl's save has no timeout of its own: a member that stalls mid-stream would hold the pod
# forever. The kubelet fails the pod after this long, and the attempt is retried.
AGENT_DEADLINE_SECONDS = 6 * 3600


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


def agent_pod_name(backup: str, attempt: int) -> str:
    return f"{backup}-snapshot-{attempt}"


def agent_pod(
    backup: EtcdBackup, cluster: EtcdCluster, storage: BackupStorage, member: tuple[str, str], attempt: int,
    image: str, started: datetime,
) -> Obj:  # fmt: skip
    """A pod that saves one snapshot with etcdctl, then verifies and stores it with
    ``kustos etcd snapshot --file``; owned by the EtcdBackup. ``started`` is when this
    attempt began: the recorded duration counts from it."""
    namespace, name = backup.metadata["namespace"], backup.metadata["name"]
    cluster_name = cluster.metadata["name"]
    member_name, endpoint = member
    volumes: list[Obj] = []
    if storage.pvc is not None:
        claim = claim_name(cluster_name, storage.pvc)
        # On the claim's root (it always exists; etcdctl cannot create directories), with a name
        # retention never lists: the agent renames it into place once verified.
        spooled = f"{BACKUP_MOUNT}/.incoming_{namespace}_{cluster_name}_{name}{SNAPSHOT_SUFFIX}"
        mount: Obj = {"name": "backups", "mountPath": BACKUP_MOUNT}
        volumes.append({"name": "backups", "persistentVolumeClaim": {"claimName": claim}})
        store = ["--dir", f"{BACKUP_MOUNT}/{namespace}/{cluster_name}",
                 "--location-prefix", f"pvc://{claim}/{namespace}/{cluster_name}"]  # fmt: skip
    else:
        s3 = storage.s3
        assert s3 is not None
        spooled = f"{SCRATCH_MOUNT}/{name}{SNAPSHOT_SUFFIX}"
        mount = {"name": "scratch", "mountPath": SCRATCH_MOUNT}
        volumes.append({"name": "scratch", "emptyDir": {}})
        prefix = "/".join(p for p in (s3.prefix.strip("/"), namespace, cluster_name) if p)
        store = [
            "--s3-endpoint", s3.endpoint, "--s3-bucket", s3.bucket, "--s3-prefix", prefix,
            "--s3-region", s3.region, "--s3-path-style" if s3.path_style else "--no-s3-path-style",
        ]  # fmt: skip
    save: Obj = {
        "name": SAVE_CONTAINER,
        "image": etcd_image(cluster, current_version(cluster) or cluster.spec.version),  # proven pullable
        "command": save_command(endpoint, spooled),
        "volumeMounts": [dict(mount)],
    }
    mount_client_tls(cluster, save, volumes)
    log_in_as_root(cluster, save)
    args = ["kustos", "etcd", "snapshot", "--file", spooled, "--name", name, "--cluster", cluster_name,
            "--member", member_name, "--started", started.astimezone(UTC).isoformat(timespec="milliseconds"),
            *store]  # fmt: skip
    labels = backup.metadata.get("labels") or {}
    if labels.get(SCHEDULED_LABEL) == "true" and cluster.spec.backup is not None:
        args += ["--keep", str(cluster.spec.backup.keep)]
    container: Obj = {"name": AGENT_CONTAINER, "image": image, "command": args, "volumeMounts": [dict(mount)]}
    if storage.s3 is not None:
        container["env"] = s3_credentials_env(storage.s3.credentials_secret)
    return restricted({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": agent_pod_name(name, attempt),
            "namespace": namespace,
            "labels": {BACKUP_LABEL: name, AGENT_CLUSTER_LABEL: cluster_name},
            "ownerReferences": [{
                "apiVersion": EtcdBackup.crd.api_version, "kind": "EtcdBackup", "name": name,
                "uid": backup.metadata["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {"restartPolicy": "Never", "activeDeadlineSeconds": AGENT_DEADLINE_SECONDS,
                 "initContainers": [save], "containers": [container], "volumes": volumes},
    })  # fmt: skip


def failed_container(pod: Obj) -> str:
    """The container whose log says why an agent pod failed: etcdctl when it did not save."""
    for init in (pod.get("status") or {}).get("initContainerStatuses") or []:
        done = (init.get("state") or {}).get("terminated") or {}
        if init.get("name") == SAVE_CONTAINER and done.get("exitCode"):
            return SAVE_CONTAINER
    return AGENT_CONTAINER


def save_command(endpoint: str, path: str, timeout: timedelta | None = None) -> list[str]:
    """``etcdctl snapshot save`` from one member (gRPC); etcdctl writes ``path.part`` and renames
    it to ``path`` only once the whole stream, etcd's SHA-256 trailer included, has arrived.
    Without ``timeout`` a save never gives up (etcdctl applies --command-timeout to a save only
    when it is given): the agent pod's deadline bounds it instead."""
    bound = [f"--command-timeout={int(timeout.total_seconds())}s"] if timeout is not None else []
    return ["etcdctl", f"--endpoints={endpoint}", "--dial-timeout=10s", *bound, "snapshot", "save", path]


def mount_client_tls(cluster: EtcdCluster, container: Obj, volumes: list[Obj]) -> None:
    """For a TLS cluster: the operator's client certificate and the members' CA, mounted into an
    agent container whose command takes --cacert/--cert/--key (kustos's and etcdctl's alike)."""
    if cluster.spec.tls is None:
        return
    container["command"] += ["--cacert", f"{CLIENT_DIR}/ca.crt", "--cert", f"{CLIENT_DIR}/tls.crt",
                             "--key", f"{CLIENT_DIR}/tls.key"]  # fmt: skip
    container.setdefault("volumeMounts", []).append(
        {"name": "etcd-client-tls", "mountPath": CLIENT_DIR, "readOnly": True}
    )
    if not any(v["name"] == "etcd-client-tls" for v in volumes):
        volumes.append({"name": "etcd-client-tls", "secret": {"secretName": client_secret_name(cluster)}})


def log_in_as_root(cluster: EtcdCluster, container: Obj) -> None:
    """With spec.auth: etcdctl logs in as the operator's root, its password read from the root
    Secret into the environment (never the command line, which the pod's spec shows)."""
    if cluster.spec.auth is None:
        return
    container.setdefault("env", []).extend([
        {"name": "ETCDCTL_USER", "value": ROOT},
        {"name": "ETCDCTL_PASSWORD",
         "valueFrom": {"secretKeyRef": {"name": root_secret_name(cluster), "key": PASSWORD_KEY}}},
    ])  # fmt: skip


def s3_credentials_env(secret: str) -> list[Obj]:
    """The S3 client's credentials, from the Secret's accessKeyId and secretAccessKey."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for env, key in (("AWS_ACCESS_KEY_ID", "accessKeyId"), ("AWS_SECRET_ACCESS_KEY", "secretAccessKey"))
    ]


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


def placed_like_members(pod: Obj, cluster: EtcdCluster) -> Obj:
    """``pod`` (an agent's) given the cluster's nodeSelector and tolerations: a backup claim is a
    local volume pinned to the node of its first pod, and a restore's seed (a member) must
    mount it there, so backups run where members may run (members kept on dedicated, tainted
    nodes, for example)."""
    placement = cluster.spec.pod
    if placement.node_selector:
        pod["spec"]["nodeSelector"] = dict(placement.node_selector)
    if placement.tolerations:
        pod["spec"]["tolerations"] = list(placement.tolerations)
    return pod
