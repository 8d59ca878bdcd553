"""Manifests of what an EtcdCluster owns: member pods, their claims, and the two Services."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd.certs import secure_member_pod
from kustos.etcd.defragmentation import compaction_args, parse_quantity
from kustos.etcd.planner import dns_name, peer_service, pod_name
from kustos.images import NONROOT_UID, etcd_image
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.expectations import Expectations
from kustos.runtime.resources import CLAIMS, PODS

Obj = dict[str, Any]

CLUSTER_LABEL = "kustos.dev/cluster"
MEMBER_LABEL = "kustos.dev/member"
MEMBER_ID_ANNOTATION = "kustos.dev/member-id"
VERSION_ANNOTATION = "kustos.dev/etcd-version"
# When an eviction of a member pod was first asked (evictions.py): it is moved like one on a
# cordoned node. The pod goes with it.
EVICTION_ANNOTATION = "kustos.dev/eviction-requested"
EPOCH_LABEL = "kustos.dev/epoch"  # which rebuild of the cluster a member pod belongs to
DATA_DIR = "/var/lib/etcd"


def labels(cluster: EtcdCluster) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "etcd",
        "app.kubernetes.io/instance": cluster.metadata["name"],
        "app.kubernetes.io/managed-by": "kustos",
        CLUSTER_LABEL: cluster.metadata["name"],
    }


def owned_metadata(cluster: EtcdCluster, name: str, extra_labels: dict[str, str] | None = None) -> Obj:
    """An object of the cluster's: in its namespace, with kustos's labels, owned by it (so it is
    deleted with it)."""
    return {
        "name": name,
        "namespace": cluster.metadata["namespace"],
        "labels": {**labels(cluster), **(extra_labels or {})},
        "ownerReferences": [owner_reference(cluster)],
    }


def owner_reference(cluster: EtcdCluster) -> Obj:
    return {
        "apiVersion": EtcdCluster.crd.api_version,
        "kind": EtcdCluster.crd.kind,
        "name": cluster.metadata["name"],
        "uid": cluster.metadata["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def image(cluster: EtcdCluster, version: str) -> str:
    return etcd_image(cluster.spec.repository, version)


def current_version(cluster: EtcdCluster) -> str | None:
    """The version every member last reported running (None before they all answered once)."""
    return cluster.status.current_version if cluster.status else None


def member_urls(cluster: EtcdCluster, name: str) -> tuple[str, str]:
    """(peer URL, client URL) a member advertises; ``$(POD_IP)`` expands in the container."""
    if cluster.spec.addressing == "dns":
        host = dns_name(cluster.metadata["name"], cluster.metadata["namespace"], name)
    else:
        host = "$(POD_IP)"
    scheme = scheme_of(cluster)
    return f"{scheme}://{host}:2380", f"{scheme}://{host}:2379"


def scheme_of(cluster: EtcdCluster) -> str:
    return "https" if cluster.spec.tls is not None else "http"


def claim_name(pod: str) -> str:
    return f"{pod}-data"


def cluster_token(cluster: EtcdCluster, epoch: int) -> str:
    """The --initial-cluster-token of an epoch: a rebuilt cluster gets a new cluster ID."""
    uid = str(cluster.metadata["uid"])
    return uid if epoch == 0 else f"{uid}-{epoch}"


def pod_epoch(pod: Obj) -> int:
    """The epoch a member pod or claim belongs to (those from before any rebuild, or claims made
    before claims were labelled, have no label: 0)."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(EPOCH_LABEL, "0")
    return int(value) if str(value).isdigit() else 0


MiB = 1024 * 1024
# etcd's suggested maximum backend quota.
MAX_QUOTA = 8 * 1024 * MiB


def backend_quota(volume_bytes: int) -> int:
    """etcd's --quota-backend-bytes for a member volume: half of what the WAL (five 64 MiB
    files and snapshots, ~256 MiB) leaves, because a defragmentation writes a whole new copy
    of the database beside the old one; at most etcd's suggested 8 GiB. So NOSPACE (which
    the operator recovers) comes before the disk is full (which it cannot)."""
    return max(16 * MiB, min(MAX_QUOTA, (volume_bytes - 256 * MiB) // 2))


GiB = 1024 * MiB
# etcd's own default --quota-backend-bytes.
DEFAULT_QUOTA = 2 * GiB


def quota_source(cluster: EtcdCluster) -> tuple[int, str]:
    """The backend quota members run with, and where it comes from: ``extraArgs``, ``volume``
    (derived from spec.storage.size) or ``default`` (etcd's own)."""
    spec = cluster.spec
    for arg in spec.extra_args:
        if arg.startswith("--quota-backend-bytes="):
            value = arg.split("=", 1)[1]
            if value.isdigit():
                return int(value), "extraArgs"
    if spec.storage.type == "pvc":
        return backend_quota(int(parse_quantity(spec.storage.size))), "volume"
    return DEFAULT_QUOTA, "default"


def volume_for(quota: int) -> int:
    """The smallest volume (whole GiB) whose derived quota (``backend_quota``) is ``quota``."""
    return -(-(2 * quota + 256 * MiB) // GiB) * GiB


# Live data (what compaction and defragmentation leave) above this share of the quota brings
# the NOSPACE alarm back soon after every recovery: the quota, and the volume, are too small.
FULL_SHARE = 0.5


def space_shortage(cluster: EtcdCluster, data: int) -> str | None:
    """What to give the cluster when ``data`` bytes (a member's database in use once compacted
    and defragmented) fill more than FULL_SHARE of its quota: a quota twice the data, and for
    a quota derived from the volume, the volume size that derives it. None: it fits."""
    quota, source = quota_source(cluster)
    if data <= quota * FULL_SHARE:
        return None
    needed = max(2 * data, 16 * MiB)
    said = (
        f"the data left after compaction and defragmentation ({data / MiB:.0f} MiB) fills "
        f"{100 * data / quota:.0f}% of the backend quota ({quota / MiB:.0f} MiB"
    )
    if source == "volume" and needed > MAX_QUOTA:
        return (
            f"{said}, derived from spec.storage.size {cluster.spec.storage.size}): NOSPACE will come "
            f"back, and a quota of {needed / MiB:.0f} MiB is beyond the {MAX_QUOTA // GiB} GiB that etcd "
            "suggests and kustos derives from any volume: less data, or --quota-backend-bytes in "
            "spec.extraArgs"
        )
    if source == "volume":
        size = volume_for(needed)
        return (
            f"{said}, derived from spec.storage.size {cluster.spec.storage.size}): the volume is too small, "
            f"NOSPACE will come back; a volume of at least {size // GiB}Gi is needed (spec.storage.size, "
            f"a quota of {needed / MiB:.0f} MiB), or less data"
        )
    where = "--quota-backend-bytes in spec.extraArgs" if source == "extraArgs" else "etcd's default quota"
    return (
        f"{said}, {where}): NOSPACE will come back; a quota of at least {needed} bytes is needed "
        f"(--quota-backend-bytes={needed}, on a volume of at least {volume_for(needed) // GiB}Gi), "
        "or less data"
    )


def quota_args(cluster: EtcdCluster) -> list[str]:
    """The backend quota derived from the volume (PVC storage), unless extraArgs sets one."""
    spec = cluster.spec
    if spec.storage.type != "pvc" or any(a.startswith("--quota-backend-bytes") for a in spec.extra_args):
        return []
    return [f"--quota-backend-bytes={backend_quota(parse_quantity(spec.storage.size))}"]


def member_pod(
    cluster: EtcdCluster,
    index: int,
    state: str,
    initial_cluster: list[tuple[str, str]],
    version: str,
    epoch: int = 0,
    avoid_nodes: Sequence[str] = (),
    member_id: int | None = None,
) -> Obj:
    """Member pod ``<cluster>-<index>``; ``initial_cluster`` lists (name, peer URL) of the
    members it starts with, itself included (its own URL from ``member_urls``). It is never
    scheduled on ``avoid_nodes`` (``away_from``). ``member_id``: the member it already is (one
    back on its volume), recorded at its creation rather than by a pass of its own."""
    name = pod_name(cluster.metadata["name"], index)
    peer, client = member_urls(cluster, name)
    spec = cluster.spec
    args = [
        f"--name={name}",
        f"--data-dir={DATA_DIR}",
        f"--listen-client-urls={scheme_of(cluster)}://0.0.0.0:2379",
        f"--listen-peer-urls={scheme_of(cluster)}://0.0.0.0:2380",
        f"--advertise-client-urls={client}",
        f"--initial-advertise-peer-urls={peer}",
        "--initial-cluster=" + ",".join(f"{n}={url}" for n, url in initial_cluster),
        f"--initial-cluster-state={state}",
        f"--initial-cluster-token={cluster_token(cluster, epoch)}",
        *compaction_args(spec.maintenance),
        *quota_args(cluster),
        *spec.extra_args,
    ]
    container: Obj = {
        "name": "etcd",
        "image": image(cluster, version),
        "command": ["etcd"],
        "args": args,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [
            {"name": "client", "containerPort": 2379},
            {"name": "peer", "containerPort": 2380},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": 2379},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
    }
    if spec.pod.resources:
        container["resources"] = spec.pod.resources
    if spec.storage.type == "pvc":
        volume: Obj = {"name": "data", "persistentVolumeClaim": {"claimName": claim_name(name)}}
    else:
        volume = {"name": "data", "emptyDir": {}}
    pod_spec: Obj = {
        "hostname": name,
        "subdomain": peer_service(cluster.metadata["name"]),
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        # etcd never calls the API server: no token in its pod to steal, and none for the
        # kubelet to request before the member can start (a round trip in every replacement).
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [volume],
    }
    if spec.pod.node_selector:
        pod_spec["nodeSelector"] = spec.pod.node_selector
    if spec.pod.tolerations:
        pod_spec["tolerations"] = spec.pod.tolerations
    affinity = away_from(spec.pod.affinity or _anti_affinity(cluster), avoid_nodes)
    if affinity:
        pod_spec["affinity"] = affinity
    annotations = {**spec.pod.annotations, VERSION_ANNOTATION: version}
    if member_id is not None:
        annotations[MEMBER_ID_ANNOTATION] = f"{member_id:x}"
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": cluster.metadata["namespace"],
            "labels": {**spec.pod.labels, **labels(cluster), MEMBER_LABEL: name, EPOCH_LABEL: str(epoch)},
            "annotations": annotations,
            "ownerReferences": [owner_reference(cluster)],
        },
        "spec": pod_spec,
    }
    return restricted(secure_member_pod(cluster, pod) if spec.tls is not None else pod)


def restricted(pod: Obj) -> Obj:
    """``pod`` made to pass the restricted Pod Security Standard, which many namespaces enforce:
    non-root (etcd's images and kustos's run as ``NONROOT_UID``), no privilege escalation, no
    capabilities, the runtime's seccomp profile. ``fsGroup`` makes a claim's volume writable by
    that id (a fresh local volume is root's 0755; kubelet sets its group once, ``OnRootMismatch``,
    so a large data directory is not walked on every restart and one root wrote is taken over).
    Every container, init containers included: call it after adding one."""
    spec = pod["spec"]
    spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": NONROOT_UID,
        "runAsGroup": NONROOT_UID,
        "fsGroup": NONROOT_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return pod


def away_from(affinity: Obj | None, nodes: Sequence[str]) -> Obj | None:
    """``affinity`` (the user's or ours, left unchanged) that also keeps the pod off ``nodes``.

    The replacement of a member asked to leave by an eviction alone (no cordon, no taint: a
    descheduler, a custom autoscaler) must not land on that member's node: nothing else tells
    the scheduler that node is being emptied, a preferred anti-affinity lets it pick the node
    when every node holds a member pod (one still terminating counts), and the replacement
    there is evicted in turn. Each of the user's node selector terms (they are ORed) gets the
    exclusion."""
    if not nodes:
        return affinity
    exclusion = {"key": "metadata.name", "operator": "NotIn", "values": sorted(set(nodes))}
    result = copy.deepcopy(affinity) if affinity else {}
    node_affinity = result.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*(term.get("matchFields") or []), exclusion]} for term in terms
    ]
    return result


def _anti_affinity(cluster: EtcdCluster) -> Obj | None:
    mode = cluster.spec.pod.anti_affinity
    if mode == "none":
        return None
    term = {
        "labelSelector": {"matchLabels": {CLUSTER_LABEL: cluster.metadata["name"]}},
        "topologyKey": "kubernetes.io/hostname",
    }
    if mode == "required":
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }


def member_claim(cluster: EtcdCluster, pod: str, epoch: int = 0) -> Obj:
    """A member's volume; owned by the cluster so it outlives pods but not the cluster. Labelled
    with its epoch: the volumes of members from before a rebuild are never collected."""
    storage = cluster.spec.storage
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage.size}}}
    if storage.storage_class_name:
        spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": owned_metadata(cluster, claim_name(pod), {MEMBER_LABEL: pod, EPOCH_LABEL: str(epoch)}),
        "spec": spec,
    }


def disruption_budget(cluster: EtcdCluster, min_available: int) -> Obj:
    """The cluster's PodDisruptionBudget over its member pods (``disruption.min_available``
    says why the number moves); owned by the cluster, so it goes with it."""
    name = cluster.metadata["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owned_metadata(cluster, name),
        "spec": {
            "minAvailable": min_available,
            "selector": {
                "matchLabels": {CLUSTER_LABEL: name},
                "matchExpressions": [{"key": MEMBER_LABEL, "operator": "Exists"}],
            },
            "unhealthyPodEvictionPolicy": "IfHealthyBudget",
        },
    }


def services(cluster: EtcdCluster) -> list[Obj]:
    """The client Service and the headless peer Service that gives members DNS names."""
    name = cluster.metadata["name"]
    meta = {"namespace": cluster.metadata["namespace"], "labels": labels(cluster),
            "ownerReferences": [owner_reference(cluster)]}  # fmt: skip
    selector = {CLUSTER_LABEL: name}
    client: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            **meta,
            "name": f"{name}-client",
            "annotations": cluster.spec.client_service.annotations,
        },
        "spec": {
            "type": cluster.spec.client_service.type,
            "selector": selector,
            "ports": [{"name": "client", "port": 2379, "targetPort": 2379}],
        },
    }
    peer: Obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {**meta, "name": peer_service(name)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # members must find each other before they are ready
            "selector": selector,
            "ports": [
                {"name": "client", "port": 2379, "targetPort": 2379},
                {"name": "peer", "port": 2380, "targetPort": 2380},
            ],
        },
    }
    return [client, peer]


# Answers that say the API server stored nothing: a pod (or claim) it refused never existed.
REFUSALS = frozenset({400, 403, 404, 422})


class PodRefused(ReconcileError):
    """The API server refused a member pod or its claim (admission: Pod Security, a quota, a
    policy). Nothing of that name was ever made, so the retry may use the same member index."""

    def __init__(self, pod: str, refusal: ApiStatusError) -> None:
        super().__init__(f"the API server refused pod {pod}: {refusal}", "PodRefused")
        self.pod = pod


async def submit_pod(
    api: Api, cluster: EtcdCluster, manifest: Obj, expected: Expectations, claim_exists: bool = False
) -> None:
    """Create a member pod (and its claim first, with PVC storage, unless ``claim_exists``: a
    member back on its volume waits for no request); one that exists is fine.

    The creation is expected BEFORE it is made: the informer may deliver the pod before the
    create call returns. A failed create, or a pod that already existed, is expected no more.
    A refusal raises ``PodRefused``.
    """
    owner, name = objects.key(cluster), manifest["metadata"]["name"]
    try:
        if cluster.spec.storage.type == "pvc" and not claim_exists:
            await api.apply(CLAIMS, member_claim(cluster, name, pod_epoch(manifest)))
        expected.expect(owner, name)
        await api.create(PODS, manifest)
    except BaseException as err:
        expected.seen(owner, name)
        if isinstance(err, ApiStatusError) and err.conflict:
            return
        if isinstance(err, ApiStatusError) and err.code in REFUSALS:
            raise PodRefused(name, err) from err
        raise
