"""MinIO and kotsadm high availability (EKCO's feature, SPEC F-MAINT-12), pure.

kURL installs MinIO as one Deployment (``minio``, its data on one claim) behind the Service
``minio``. Once at least three nodes are Ready and the local storage class exists, the data
moves to a six-replica distributed MinIO StatefulSet (``ha-minio``, one volume per replica,
spread over the nodes), one phase per pass:

1. create the StatefulSet and its headless Service; wait until all six replicas are ready;
2. point the Service at nothing (EKCO's ``doesnotexist`` selector): MinIO is offline from
   here, so no client writes to the old copy while it is copied;
3. copy every object, a batch per pass (the copy skips what is already there, so a pass
   interrupted or an operator restarted resumes where the objects say);
4. verify: the same keys on both sides, each with an equal checksum (ETag, else SHA-256);
   recorded as the phase ``Verified`` in the policy's status;
5. point the Service at the StatefulSet: MinIO is online again;
6. delete the old Deployment and its claim: the phase ``Migrated``, which says the data moved and
   MinIO is the StatefulSet, not that every replica is ready (the message says how many are).

Before the copy and after the move, the replicas are kept spread over the nodes, one replica
moved per pass (minio_spread.py).

EKCO does the same steps, but expects kURL to have created ``ha-minio`` at zero replicas,
copies everything in one long call in the background and never verifies; it also scales
kotsadm's rqlite database to three (never the kotsadm Deployment: its API does not run as
several replicas), as kustos does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kustos.api.maintenance import KotsadmState, MaintenancePolicySpec, MinioStatus
from kustos.maintenance import minio_spread
from kustos.maintenance.minio_spread import MoveReplica, Spread

DEPLOYMENT = "minio"
SERVICE = "minio"
STATEFULSET = "ha-minio"
HEADLESS_SERVICE = "ha-minio-hl"
REPLICAS = 6
MIN_READY_NODES = 3
PORT = 9000
DATA_PATH = "/export"
DATA_VOLUME = "data"
"""The claim template's name: replica ha-minio-N's claim is data-ha-minio-N."""
DEFAULT_SIZE = "10Gi"
STATEFULSET_LABELS = {"app": STATEFULSET}
INHERITED_POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "imagePullSecrets",
    "securityContext",
    "serviceAccountName",
    "priorityClassName",
)
"""What the replicas take from the old pod's spec: where MinIO may run (a node pool's label and
taint), how its image is pulled, and as whom it runs."""
MANAGED_BY = "app.kubernetes.io/managed-by"
DISABLED_SELECTOR = {"doesnotexist": "doesnotexist"}
"""What EKCO sets on the Service while the data moves: it selects no pod."""
ACCESS_KEY_VARIABLES = ("MINIO_ROOT_USER", "MINIO_ACCESS_KEY")
SECRET_KEY_VARIABLES = ("MINIO_ROOT_PASSWORD", "MINIO_SECRET_KEY")
POLL = 5.0
HEALTH_PATH = "/minio/health/cluster"
READY_PATH = "/minio/health/cluster/read"

KOTSADM_DATABASE = "kotsadm-rqlite"
KOTSADM_REPLICAS = 3
BOOTSTRAP_EXPECT = "-bootstrap-expect"


@dataclass(frozen=True)
class Credential:
    """Where the old MinIO's container finds a key: a literal value or a Secret's key."""

    value: str | None = None
    secret: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class DeploymentView:
    uid: str
    template: Mapping[str, Any]
    """Its pod template (the StatefulSet's is made from it)."""
    claims: tuple[str, ...] = ()
    """The claims its pods mount: the old data."""
    size: str = DEFAULT_SIZE
    """Its first claim's requested size (each new replica gets as much)."""
    source: str | None = None
    """host:port of a Running pod of it (the copy's source)."""


@dataclass(frozen=True)
class StatefulSetView:
    replicas: int
    ready: int
    target: str | None = None
    """host:port of a ready pod of it (the copy's target: any replica serves every object)."""
    healthy: bool = False
    """MinIO's cluster health check answers 200 at the target: it has write quorum (EKCO asks the
    same before its copy). Asked only once every replica is ready."""
    spread: Spread = field(default_factory=Spread)
    """Where the replicas run, where they may, and whether MinIO can spare the one to move."""


@dataclass(frozen=True)
class MinioView:
    namespace: str
    deployment: DeploymentView | None = None
    statefulset: StatefulSetView | None = None
    selector: Mapping[str, str] | None = None
    """The Service's selector (None: no Service)."""
    storage_class: bool = False
    ready_nodes: int = 0
    problem: str = ""
    """Why MinIO could not be observed (then nothing is done)."""


@dataclass(frozen=True)
class KotsadmView:
    namespace: str
    replicas: int | None = None
    """kotsadm-rqlite's replicas (None: no such StatefulSet)."""
    args: tuple[str, ...] = ()
    """Its first container's arguments (-bootstrap-expect follows the replicas)."""
    ready_nodes: int = 0


# ---- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateStatefulSet:
    namespace: str
    objects: tuple[dict[str, Any], ...]
    """The headless Service and the StatefulSet, applied in that order."""


@dataclass(frozen=True)
class SetServiceSelector:
    namespace: str
    selector: Mapping[str, str]
    current: Mapping[str, str]
    """The selector read (the patch is guarded by it)."""
    why: str


@dataclass(frozen=True)
class CopyObjects:
    namespace: str
    source: str
    target: str
    access_key: Credential
    secret_key: Credential


@dataclass(frozen=True)
class Copied:
    """What one copy pass did (the act's account of a ``CopyObjects``)."""

    namespace: str
    objects: int
    copied: int
    verified: bool
    message: str


@dataclass(frozen=True)
class RemoveOldMinio:
    namespace: str
    uid: str
    claims: tuple[str, ...]


@dataclass(frozen=True)
class ScaleKotsadm:
    namespace: str
    current: int
    to: int
    args: tuple[str, ...]


MinioStep = (
    CreateStatefulSet
    | SetServiceSelector
    | CopyObjects
    | Copied
    | RemoveOldMinio
    | MoveReplica
    | ScaleKotsadm
)


@dataclass(frozen=True)
class Waiting:
    """No step: the phase and what it waits for."""

    phase: str
    message: str
    poll: bool = False
    """Look again soon (a StatefulSet coming up), not only on the next event."""


@dataclass(frozen=True)
class Decision:
    step: MinioStep | None
    waiting: Waiting | None = None
    extra: dict[str, int] = field(default_factory=dict)


# ---- the StatefulSet -----------------------------------------------------------------------


def credentials(template: Mapping[str, Any]) -> tuple[Credential, Credential] | None:
    """The access and secret keys the old MinIO's first container is given (None: not found)."""
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    env = {item.get("name"): item for item in containers[0].get("env") or []}

    def one(names: Sequence[str]) -> Credential | None:
        for name in names:
            item = env.get(name)
            if item is None:
                continue
            if "value" in item:
                return Credential(value=str(item["value"]))
            ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") and ref.get("key"):
                return Credential(secret=str(ref["name"]), key=str(ref["key"]))
        return None

    access, secret = one(ACCESS_KEY_VARIABLES), one(SECRET_KEY_VARIABLES)
    return (access, secret) if access is not None and secret is not None else None


def server_urls(namespace: str) -> str:
    """Distributed MinIO's expansion of the six replicas' stable DNS names."""
    return (
        f"http://{STATEFULSET}-{{0...{REPLICAS - 1}}}.{HEADLESS_SERVICE}.{namespace}.svc.cluster.local:"
        f"{PORT}{DATA_PATH}"
    )


def statefulset_objects(
    namespace: str, deployment: DeploymentView, storage_class: str
) -> tuple[dict[str, Any], ...]:
    """The headless Service (DNS names before the replicas are ready: distributed MinIO waits for
    its peers) and the StatefulSet, from the old Deployment's first container (image,
    credentials, resources, security context) and its pod's placement (INHERITED_POD_FIELDS)."""
    pod = deployment.template.get("spec") or {}
    old = pod.get("containers") or [{}]
    first = old[0]
    container: dict[str, Any] = {
        "name": "minio",
        "image": first.get("image", "minio/minio"),
        "command": ["minio", "server", "--address", f":{PORT}", server_urls(namespace)],
        "env": list(first.get("env") or []),
        "ports": [{"name": "api", "containerPort": PORT}],
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": DATA_PATH}],
        # Ready is serving: MinIO's /minio/health/ready answers 200 before its server has loaded
        # its object layer (a replica just moved answered "Server not initialized yet" through the
        # Service); the cluster read check answers 200 only once it has, with read quorum.
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": PORT},
            "periodSeconds": 2,
        },
    }
    for key in ("resources", "securityContext"):
        if first.get(key):
            container[key] = first[key]
    inherited = {key: pod[key] for key in INHERITED_POD_FIELDS if pod.get(key)}
    labels = dict(STATEFULSET_LABELS)
    ours = {**labels, MANAGED_BY: "kustos"}
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": HEADLESS_SERVICE, "namespace": namespace, "labels": ours},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels,
            "ports": [{"name": "api", "port": PORT, "targetPort": PORT}],
        },
    }
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": STATEFULSET, "namespace": namespace, "labels": ours},
        "spec": {
            "serviceName": HEADLESS_SERVICE,
            "replicas": REPLICAS,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **inherited,
                    "containers": [container],
                    # Two replicas per node on three nodes: any one node lost keeps four of six
                    # drives, MinIO's quorum.
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels},
                        # A node whose taints the replicas do not tolerate (a control plane, another
                        # pool's node) can never take one. Counted (Ignore) it would be a domain
                        # holding none forever, and maxSkew 1 would cap every other node at one
                        # replica: the rest Pending. Honor's price is a node tainted not-ready for a
                        # moment being left out as well (three and three on two nodes); the
                        # rebalance (minio_spread.py) moves replicas back once it is Ready.
                        "nodeTaintsPolicy": "Honor",
                    }],
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                            "labelSelector": {"matchLabels": labels}},
                    }]}},
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": DATA_VOLUME},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": storage_class,
                    "resources": {"requests": {"storage": deployment.size}},
                },
            }],
        },
    }  # fmt: skip
    return headless, statefulset


# ---- the decision --------------------------------------------------------------------------


def plan_minio(spec: MaintenancePolicySpec, view: MinioView, previous: MinioStatus | None) -> Decision:
    ns = view.namespace
    if spec.minio_should_disable_management:
        return Decision(None, Waiting("Disabled", "minioShouldDisableManagement is set"))
    if view.problem:
        return Decision(None, Waiting("Waiting", view.problem, poll=True))
    old, new, selector = view.deployment, view.statefulset, view.selector
    if old is None:
        if new is None:
            return Decision(None)
        if selector is not None and dict(selector) != STATEFULSET_LABELS:
            # The old MinIO is gone (its removal may have been interrupted): MinIO is the StatefulSet.
            return Decision(
                SetServiceSelector(ns, STATEFULSET_LABELS, selector, "the old Deployment is gone")
            )
        return _settled(ns, new)
    if new is None:
        if view.ready_nodes < MIN_READY_NODES:
            return Decision(
                None, Waiting("Waiting", f"{view.ready_nodes} Ready node(s), {MIN_READY_NODES} needed")
            )
        if not view.storage_class:
            return Decision(
                None, Waiting("Waiting", f"storage class {spec.minio_storage_class} does not exist")
            )
        if credentials(old.template) is None:
            return Decision(None, Waiting("Waiting", (
                f"Deployment {ns}/{DEPLOYMENT} gives its container no {ACCESS_KEY_VARIABLES[0]} or "
                f"{ACCESS_KEY_VARIABLES[1]} and matching secret key: the copy could not log in"
            )))  # fmt: skip
        return Decision(CreateStatefulSet(ns, statefulset_objects(ns, old, spec.minio_storage_class)))
    if selector is not None and dict(selector) == STATEFULSET_LABELS:
        return Decision(RemoveOldMinio(ns, old.uid, old.claims))
    if new.ready < REPLICAS or new.target is None:
        return Decision(
            None, Waiting("WaitingForStatefulSet", f"{new.ready} of {REPLICAS} replicas ready", poll=True)
        )
    if selector is None:
        return Decision(None, Waiting("Waiting", f"Service {ns}/{SERVICE} does not exist"))
    if not new.healthy and dict(selector) != DISABLED_SELECTOR:
        # Not offline for a copy that cannot be written: the old MinIO keeps serving meanwhile.
        return Decision(None, Waiting("WaitingForStatefulSet", (
            f"{REPLICAS} replicas ready, but {new.target} does not report the cluster healthy "
            f"({HEALTH_PATH}): no write quorum yet"
        ), poll=True))  # fmt: skip
    if dict(selector) != DISABLED_SELECTOR:
        # Spread before the copy, while moving a replica costs no data. Not while MinIO is offline
        # for the copy: that ends first, and the move after it.
        move = minio_spread.plan(ns, new.spread, REPLICAS)
        if isinstance(move, MoveReplica):
            return Decision(move)
        if move is not None:
            return Decision(None, Waiting("WaitingForStatefulSet", move, poll=True))
    verified = previous is not None and previous.phase == "Verified"
    if dict(selector) == DISABLED_SELECTOR and verified:
        return Decision(
            SetServiceSelector(ns, STATEFULSET_LABELS, selector, "every object copied and verified")
        )
    if dict(selector) != DISABLED_SELECTOR:
        return Decision(
            SetServiceSelector(ns, DISABLED_SELECTOR, selector, "no writes while the data is copied")
        )
    if old.source is None:
        return Decision(
            None,
            Waiting("Copying", f"no Running pod of Deployment {ns}/{DEPLOYMENT} to copy from", poll=True),
        )
    keys = credentials(old.template)
    assert keys is not None  # checked before the StatefulSet was made; a change shows here
    return Decision(CopyObjects(ns, old.source, new.target, *keys))


def _settled(ns: str, new: StatefulSetView) -> Decision:
    """The move is done: MinIO is the StatefulSet. Its replicas are kept spread; the message says
    how many are ready and where (read again while one is not, or a move waits)."""
    move = minio_spread.plan(ns, new.spread, REPLICAS)
    if isinstance(move, MoveReplica):
        return Decision(move)
    where = minio_spread.summary(new.spread, REPLICAS)
    message = f"MinIO runs as StatefulSet {ns}/{STATEFULSET}: {where}" + (f"; {move}" if move else "")
    unsettled = move is not None or new.ready < REPLICAS
    return Decision(None, Waiting("Migrated", message, poll=unsettled))


def plan_kotsadm(spec: MaintenancePolicySpec, view: KotsadmView) -> ScaleKotsadm | None:
    """kotsadm-rqlite to three replicas once three nodes are Ready (never down: EKCO neither)."""
    if spec.kotsadm_should_disable_management or view.replicas is None:
        return None
    if view.ready_nodes < MIN_READY_NODES or view.replicas >= KOTSADM_REPLICAS:
        return None
    return ScaleKotsadm(
        view.namespace, view.replicas, KOTSADM_REPLICAS, bootstrap_args(view.args, KOTSADM_REPLICAS)
    )


def bootstrap_args(args: Sequence[str], replicas: int) -> tuple[str, ...]:
    """rqlite's -bootstrap-expect follows the replicas (as EKCO rewrites it)."""
    return tuple(f"{BOOTSTRAP_EXPECT}={replicas}" if a.startswith(BOOTSTRAP_EXPECT) else a for a in args)


# ---- the status ----------------------------------------------------------------------------


def minio_status(
    decision: Decision, step: object, previous: MinioStatus | None, failure: str | None = None
) -> MinioStatus | None:
    """The policy's status.minio after this pass (``step`` the act's account, e.g. ``Copied``;
    ``failure`` what the act raised)."""
    keep = previous.model_copy() if previous is not None else None
    if failure is not None:
        if not isinstance(decision.step, CopyObjects):
            return keep
        # Whatever the phase before (a replica that was briefly unready), MinIO is offline now,
        # for a copy that failed and is tried again.
        counts = {"objects": keep.objects, "copied": keep.copied} if keep else {}
        message = f"the copy failed and is tried again (MinIO stays offline meanwhile): {failure}"
        return MinioStatus(phase="Copying", message=message[:500], **counts)
    match step:
        case Copied(_, objects, copied, verified, message):
            return MinioStatus(phase="Verified" if verified else "Copying", message=message[:500],
                               objects=objects, copied=copied)  # fmt: skip
        case CreateStatefulSet(ns, _):
            return MinioStatus(phase="CreatingStatefulSet", message=f"created StatefulSet {ns}/{STATEFULSET}")
        case SetServiceSelector(ns, selector, _, why):
            if dict(selector) == DISABLED_SELECTOR:
                return MinioStatus(phase="Copying", message=f"Service {ns}/{SERVICE} selects no pod: {why}")
            counts = {"objects": keep.objects, "copied": keep.copied} if keep else {}
            message = f"Service {ns}/{SERVICE} selects the StatefulSet: {why}"
            return MinioStatus(phase="Switched", message=message, **counts)
        case RemoveOldMinio(ns, _, claims):
            counts = {"objects": keep.objects, "copied": keep.copied} if keep else {}
            return MinioStatus(phase="Migrated", message=(
                f"deleted Deployment {ns}/{DEPLOYMENT} and its claim(s) {', '.join(claims) or '(none)'}"
            ), **counts)  # fmt: skip
        case MoveReplica():
            # The phase is the move's progress, which a replica's move does not change.
            counts = {"objects": keep.objects, "copied": keep.copied} if keep else {}
            phase = keep.phase if keep else "WaitingForStatefulSet"
            return MinioStatus(phase=phase, message=minio_spread.describe(step)[:500], **counts)
    if decision.waiting is None:
        return keep  # another step this pass, a failure, or MinIO not there
    counts = {"objects": keep.objects, "copied": keep.copied} if keep else {}
    waiting = {"phase": decision.waiting.phase, "message": decision.waiting.message[:500]}
    return MinioStatus.model_validate({**waiting, **counts})


def kotsadm_status(
    spec: MaintenancePolicySpec, view: KotsadmView, step: ScaleKotsadm | None
) -> KotsadmState | None:
    if spec.kotsadm_should_disable_management or view.replicas is None:
        return None
    workload = f"StatefulSet {view.namespace}/{KOTSADM_DATABASE}"
    if step is not None:
        return KotsadmState(
            workload=workload, replicas=step.to, message=f"scaled from {step.current} to {step.to}"
        )
    if view.replicas >= KOTSADM_REPLICAS:
        return KotsadmState(workload=workload, replicas=view.replicas, message="highly available")
    return KotsadmState(workload=workload, replicas=view.replicas, message=(
        f"waiting for nodes: {view.ready_nodes} Ready, {MIN_READY_NODES} needed"
    ))  # fmt: skip


def describe(step: MinioStep) -> tuple[str, str]:
    """(action, message) for the policy's lastAction."""
    match step:
        case CreateStatefulSet(ns, _):
            return "MinioStatefulSet", f"created StatefulSet {ns}/{STATEFULSET} ({REPLICAS} replicas)"
        case SetServiceSelector(ns, selector, _, why):
            where = "no pod" if dict(selector) == DISABLED_SELECTOR else f"StatefulSet {STATEFULSET}"
            return "MinioService", f"Service {ns}/{SERVICE} now selects {where}: {why}"
        case CopyObjects(ns, source, target, _, _):
            return "MinioCopy", f"copying {ns}'s objects from {source} to {target}"
        case Copied(_, _, _, verified, message):
            return ("MinioVerified" if verified else "MinioCopy"), message
        case MoveReplica():
            return "MinioRebalance", minio_spread.describe(step)
        case RemoveOldMinio(ns, _, claims):
            return (
                "MinioRemoveOld",
                f"deleted Deployment {ns}/{DEPLOYMENT} and claim(s) {', '.join(claims) or '(none)'}",
            )
        case ScaleKotsadm(ns, current, to, _):
            return (
                "KotsadmScale",
                f"scaled StatefulSet {ns}/{KOTSADM_DATABASE} from {current} to {to} replicas",
            )
