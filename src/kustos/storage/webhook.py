"""The scheduler webhook (SPEC F-STOR-6): pods that use a StorageCluster's volumes get its
scheduler, which places them next to their data; unless the cluster sets disableScheduler.

A mutating webhook on pod creation. It fails open (failurePolicy Ignore): when the operator
cannot answer, pods keep the default scheduler rather than not being created at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kustos.api.storage import StorageCluster
from kustos.runtime import objects
from kustos.runtime.conditions import is_true
from kustos.runtime.deps import Deps
from kustos.runtime.informer import Informer
from kustos.runtime.manager import Manager
from kustos.runtime.resources import CLAIMS
from kustos.runtime.webhook import AdmissionResponse, Webhook
from kustos.storage import names

log = logging.getLogger(__name__)

Obj = dict[str, Any]

WEBHOOK_NAME = "scheduler.storage.kustos.dev"
WEBHOOK_PATH = "/mutate-v1-pod-storage-scheduler"
DEFAULT_SCHEDULERS = ("", "default-scheduler")
CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)


def claim_names(pod: Obj) -> list[str]:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return [v["persistentVolumeClaim"]["claimName"] for v in volumes if v.get("persistentVolumeClaim")]


def claim_matches(claim: Obj, cluster: StorageCluster) -> bool:
    """Whether a PVC is of the cluster's StorageClass (or provisioned by its driver)."""
    meta = claim.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    storage_class = (claim.get("spec") or {}).get("storageClassName") or annotations.get(CLASS_ANNOTATION)
    if storage_class == names.storage_class(cluster):
        return True
    return any(annotations.get(a) == names.provisioner(cluster) for a in PROVISIONER_ANNOTATIONS)


def scheduling_clusters(raw_clusters: Iterable[Obj]) -> list[StorageCluster]:
    """Active, live StorageClusters that want their scheduler set."""
    result = []
    for raw in raw_clusters:
        if objects.deleting(raw):
            continue
        if not is_true((raw.get("status") or {}).get("conditions"), "Active"):
            continue
        try:
            cluster = StorageCluster.model_validate(raw)
        except ValueError:
            continue
        if not cluster.spec.disable_scheduler:
            result.append(cluster)
    return result


def mutation(pod: Obj, scheduler: str) -> list[Obj] | None:
    """The JSON patch that sets the scheduler, or None when the pod chose one itself."""
    current = (pod.get("spec") or {}).get("schedulerName") or ""
    if current == scheduler or current not in DEFAULT_SCHEDULERS:
        return None
    return [{"op": "add", "path": "/spec/schedulerName", "value": scheduler}]


def scheduler_webhook(manager: Manager, clusters: Informer) -> Webhook:
    async def handle(request: Obj) -> AdmissionResponse:
        pod = request.get("object") or {}
        claims = claim_names(pod)
        if not claims:
            return AdmissionResponse.allow()
        candidates = scheduling_clusters(clusters.list())
        if not candidates:
            return AdmissionResponse.allow()
        namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
        for claim_name in claims:
            claim = await manager.api.get(CLAIMS, namespace, claim_name)
            if claim is None:
                continue
            for cluster in candidates:
                if claim_matches(claim, cluster):
                    patch = mutation(pod, names.scheduler_name(cluster))
                    return AdmissionResponse.mutate(patch) if patch else AdmissionResponse.allow()
        return AdmissionResponse.allow()

    return Webhook(
        name=WEBHOOK_NAME,
        path=WEBHOOK_PATH,
        kind="mutating",
        rules=[
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        handler=handle,
        failure_policy="Ignore",
    )


def register(manager: Manager, deps: Deps) -> None:
    """Serve the webhook from the start, whether or not the StorageCluster controller has loaded
    (kustos.controllers): the chart's configuration sends it every pod's creation."""
    del deps  # it reads the StorageClusters' cache and the claims, nothing else
    if not manager.options.webhooks_reachable:
        log.warning(
            "the StorageCluster scheduler webhook is off: the API server could not reach it "
            "(give kustos run --webhook-url, or run it in the cluster behind a webhook Service)"
        )
        return
    manager.add_webhook(scheduler_webhook(manager, manager.informer(StorageCluster.crd.ref)))


__all__ = ["WEBHOOK_NAME", "claim_matches", "mutation", "register", "scheduler_webhook"]
