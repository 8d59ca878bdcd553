"""Observe and act for MinIO's move and kotsadm's database (the planner is maintenance/minio.py).

MinIO is reached at its pods' addresses, not its Services': the old Service selects no pod
while the data moves, and the operator need not run where ClusterIPs route.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import httpx2 as httpx  # the API client's httpx2: one HTTP stack loaded, not two

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.maintenance import minio, minio_copy, minio_spread
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import Informer
from kustos.runtime.resources import (
    CLAIMS,
    DEPLOYMENTS,
    PODS,
    SECRETS,
    SERVICES,
    STATEFULSETS,
    STORAGE_CLASSES,
)
from kustos.runtime.transport import H11Transport

log = logging.getLogger(__name__)
Obj = dict[str, Any]
COPY_BUDGET = 10.0
"""Seconds of copying per pass: the pass records its progress, and the next one goes on."""


def _matches(obj: Obj, selector: dict[str, str]) -> bool:
    labels = objects.labels(obj)
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _address(pod: Obj) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return f"{ip}:{minio.PORT}" if ip else None


def _pods(pods: Informer, namespace: str) -> list[Obj]:
    return [p for p in pods.list() if objects.namespace(p) == namespace and not objects.deleting(p)]


def ready_nodes(nodes: Iterable[Obj]) -> int:
    return sum(1 for n in nodes if objects.node_ready(n) and not objects.node_unschedulable(n))


async def observe_minio(
    api: Api,
    spec: MaintenancePolicySpec,
    pods: Informer,
    statefulsets: Informer,
    claims: Informer,
    nodes: Sequence[Obj],
    now: datetime,
) -> minio.MinioView | None:
    """None when management is off (nothing is read)."""
    if spec.minio_should_disable_management:
        return None
    ns = spec.minio_namespace
    deployment = await api.get(DEPLOYMENTS, ns, minio.DEPLOYMENT)
    statefulset = statefulsets.get(f"{ns}/{minio.STATEFULSET}")
    if deployment is None and statefulset is None:
        return minio.MinioView(ns)
    found = await api.list_objects(SERVICES, ns, field_selector=f"metadata.name={minio.SERVICE}")
    selector = dict((found[0].get("spec") or {}).get("selector") or {}) if found else None
    in_namespace = _pods(pods, ns)
    old = None
    if deployment is not None:
        template = ((deployment.get("spec") or {}).get("template")) or {}
        match = dict(((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})
        names = tuple(
            str(v["persistentVolumeClaim"]["claimName"])
            for v in (template.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")
        )
        first = claims.get(f"{ns}/{names[0]}") if names else None
        size = (((first or {}).get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        running = [
            p
            for p in in_namespace
            if _matches(p, match) and (p.get("status") or {}).get("phase") == "Running"
        ]
        old = minio.DeploymentView(
            uid=str(objects.uid(deployment)), template=template, claims=names,
            size=str(size or minio.DEFAULT_SIZE), source=next((a for a in map(_address, running) if a), None),
        )  # fmt: skip
    new = None
    if statefulset is not None:
        replicas = [p for p in in_namespace if _matches(p, minio.STATEFULSET_LABELS)]
        ready = [p for p in replicas if objects.pod_ready(p)]
        target = next((a for a in map(_address, sorted(ready, key=objects.name)) if a), None)
        count = int((statefulset.get("status") or {}).get("readyReplicas") or 0)
        new = minio.StatefulSetView(
            replicas=int((statefulset.get("spec") or {}).get("replicas") or 0),
            ready=count,
            target=target,
            healthy=bool(deployment and target and count >= minio.REPLICAS and await _healthy(target)),
            spread=await _spread(statefulset, replicas, claims, nodes, target, now),
        )
    storage_class = bool(
        statefulset is None
        and await api.list_objects(
            STORAGE_CLASSES, field_selector=f"metadata.name={spec.minio_storage_class}"
        )
    )
    return minio.MinioView(ns, old, new, selector, storage_class, ready_nodes(nodes))


async def _spread(
    statefulset: Obj,
    pods: list[Obj],
    claims: Informer,
    nodes: Sequence[Obj],
    target: str | None,
    now: datetime,
) -> minio_spread.Spread:
    """Where the replicas run and may run; MinIO is asked only about a replica the planner would
    move (whether the cluster can spare its server, and whether a drive heals)."""
    ns = str(objects.namespace(statefulset))
    template = ((statefulset.get("spec") or {}).get("template") or {}).get("spec") or {}
    replicas = []
    for pod in sorted(pods, key=objects.name):
        claim = claims.get(f"{ns}/{minio.DATA_VOLUME}-{objects.name(pod)}")
        replicas.append(minio_spread.Replica(
            name=objects.name(pod), uid=str(objects.uid(pod)), node=objects.pod_node(pod),
            ready=objects.pod_ready(pod), address=_address(pod),
            claim=objects.name(claim) if claim else None, claim_uid=objects.uid(claim) if claim else None,
            claim_deleting=bool(claim and objects.deleting(claim)), started=objects.running_since(pod),
        ))  # fmt: skip
    spread = minio_spread.Spread(tuple(replicas), minio_spread.eligible_nodes(nodes, template), now=now)
    picked = minio_spread.candidate(spread, minio.REPLICAS)
    if picked is None or picked[0].address is None or target is None:
        return spread
    healthy, healing = await _cluster_check(target, minio.HEALTH_PATH)
    spare, _ = await _cluster_check(picked[0].address, minio_spread.MAINTENANCE_CHECK)
    return dataclasses.replace(spread, spare=healthy and spare, healing=healing)


async def _cluster_check(address: str, path: str) -> tuple[bool, int]:
    """MinIO's cluster check at one server: (200, the drives it says heal). 503 (412 asked with
    maintenance=true) when the cluster has, or would have, no write quorum."""
    try:
        async with httpx.AsyncClient(timeout=3.0, transport=H11Transport()) as client:
            response = await client.get(f"http://{address}{path}")
    except httpx.HTTPError as err:
        log.info("MinIO at %s does not answer %s: %s", address, path, err)
        return False, 0
    healing = response.headers.get(minio_spread.HEALING_HEADER, "0")
    return response.status_code == 200, int(healing) if healing.isdigit() else 0


async def _healthy(target: str) -> bool:
    """MinIO's cluster check: 200 when the cluster has write quorum, 503 when not."""
    healthy, _ = await _cluster_check(target, minio.HEALTH_PATH)
    return healthy


def observe_kotsadm(
    spec: MaintenancePolicySpec, statefulsets: Informer, nodes: int
) -> minio.KotsadmView | None:
    if spec.kotsadm_should_disable_management:
        return None
    ns = spec.kotsadm_namespace
    found = statefulsets.get(f"{ns}/{minio.KOTSADM_DATABASE}")
    if found is None:
        return minio.KotsadmView(ns, ready_nodes=nodes)
    spec_ = found.get("spec") or {}
    containers = ((spec_.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    replicas = spec_.get("replicas")
    return minio.KotsadmView(ns, 1 if replicas is None else int(replicas),
                             tuple(str(a) for a in containers[0].get("args") or []), nodes)  # fmt: skip


async def _credential(api: Api, namespace: str, credential: minio.Credential) -> str:
    if credential.value is not None:
        return credential.value
    secret = await api.get(SECRETS, namespace, str(credential.secret))
    data = ((secret or {}).get("data") or {}).get(str(credential.key))
    if data is None:
        raise ReconcileError(
            f"Secret {namespace}/{credential.secret} has no key {credential.key}: MinIO's credentials",
            reason="MinioCredentialsMissing",
        )
    return base64.b64decode(data).decode()


async def act(api: Api, step: minio.MinioStep) -> minio.MinioStep:
    """Take one step; a copy returns what it did (``Copied``)."""
    match step:
        case minio.CreateStatefulSet(ns, made):
            log.info("step: CreateStatefulSet %s/%s", ns, minio.STATEFULSET)
            for obj in made:
                await api.apply(SERVICES if obj["kind"] == "Service" else STATEFULSETS, obj)
        case minio.SetServiceSelector(ns, selector, current, why):
            log.info("step: SetServiceSelector %s/%s to %s (%s)", ns, minio.SERVICE, dict(selector), why)
            # Guarded by the selector read: a person's change meanwhile is not overwritten.
            guarded = [{"op": "test", "path": "/spec/selector", "value": dict(current)},
                       {"op": "replace", "path": "/spec/selector", "value": dict(selector)}]  # fmt: skip
            await api.patch(SERVICES, ns, minio.SERVICE, guarded, kind="json")
        case minio.CopyObjects(ns, source, target, access, secret):
            log.info("step: CopyObjects %s from %s to %s", ns, source, target)
            keys = await _credential(api, ns, access), await _credential(api, ns, secret)
            try:
                result = await asyncio.to_thread(_copy, source, target, *keys)
            except Exception as err:  # boto3's and botocore's errors, the verification's
                raise ReconcileError(
                    f"copying MinIO's objects: {err}"[:1000], reason="MinioCopyFailed"
                ) from err
            return minio.Copied(ns, result.objects, result.in_place, result.verified, result.message)
        case minio_spread.MoveReplica(ns, pod, uid, claim, claim_uid, node, _):
            log.info("step: MoveReplica %s/%s off node %s (claim %s)", ns, pod, node, claim)
            # The claim first: it stays (kubernetes.io/pvc-protection) until its pod is gone, and the
            # StatefulSet makes neither again before it is; deleted after the pod, a new pod could
            # mount the old claim, still pinned to this node, in between.
            if claim:
                await api.delete(CLAIMS, ns, claim, uid=claim_uid)
            await api.delete(PODS, ns, pod, uid=uid)
        case minio.RemoveOldMinio(ns, uid, claims):
            log.info("step: RemoveOldMinio %s (claims %s)", ns, ", ".join(claims))
            await api.delete(DEPLOYMENTS, ns, minio.DEPLOYMENT, uid=uid)
            for claim in claims:
                await api.delete(CLAIMS, ns, claim)
        case minio.ScaleKotsadm(ns, current, to, args):
            log.info("step: ScaleKotsadm %s from %d to %d", ns, current, to)
            patch: list[Obj] = [{"op": "test", "path": "/spec/replicas", "value": current},
                                {"op": "replace", "path": "/spec/replicas", "value": to}]  # fmt: skip
            if args:
                patch.append(
                    {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": list(args)}
                )
            try:
                await api.patch(STATEFULSETS, ns, minio.KOTSADM_DATABASE, patch, kind="json")
            except ApiStatusError as err:
                if not err.not_found:
                    raise
    return step


def _copy(source: str, target: str, access_key: str, secret_key: str) -> minio_copy.CopyResult:
    return minio_copy.copy_pass(
        minio_copy.client(f"http://{source}", access_key, secret_key),
        minio_copy.client(f"http://{target}", access_key, secret_key),
        COPY_BUDGET,
    )
