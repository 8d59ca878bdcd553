"""Evictions of member pods, seen as they are asked: the trace of an eviction the budget refuses.

A drainer that does not cordon (the descheduler, a custom autoscaler, a script calling the
Eviction API) asks to evict a member; the EtcdCluster's budget refuses it (with
``spec.disruption.migrate`` it allows no eviction: ``disruption.py``) and Kubernetes keeps
no record of the refusal: no Event, no condition, nothing a watch could see. So the
operator looks at the request itself. A validating webhook on the ``pods/eviction``
subresource runs before the API server consults the budget; it never denies, and it
annotates the member pod (``pods.EVICTION_ANNOTATION``, the time asked). The pod's watch then
wakes the EtcdCluster's reconcile, which treats the member as on a draining node
(``observe.draining_node``): a replacement joins elsewhere first, then the member leaves and
its pod is deleted; the drainer's next retry finds it gone.

The cluster-autoscaler and karpenter taint the node before they evict
(``observe.REMOVAL_TAINTS``), so they are seen without this; the webhook is for the rest.

Why fail open, and why ``sideEffects: NoneOnDryRun``: an operator that is down must never
block an eviction of any pod in the cluster; and a server-side dry run
(``kubectl drain --dry-run=server``) must not move a member, so the handler records
nothing for it, and says so to the API server, which then calls it for dry runs too.
The Eviction object carries no labels, so no objectSelector can narrow the calls to member
pods: the handler looks the pod up in the operator's cache of member pods, and answers any
other pod at once.
"""

from __future__ import annotations

import logging
from typing import Any

from kustos.etcd.observe import eviction_requested
from kustos.etcd.pods import CLUSTER_LABEL, EVICTION_ANNOTATION
from kustos.runtime import objects
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import Informer, InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.resources import PODS
from kustos.runtime.times import rfc3339
from kustos.runtime.webhook import AdmissionResponse, Webhook

log = logging.getLogger(__name__)

Obj = dict[str, Any]

EVICTION_NAME = "eviction.etcdcluster.kustos.dev"
EVICTION_PATH = "/validate-v1-pod-eviction-etcd"

RULES: list[Obj] = [
    {
        "operations": ["CREATE"],
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods/eviction"],
        "scope": "Namespaced",
    }
]


def to_record(request: Obj, pod: Obj | None) -> bool:
    """Whether this eviction request is one to record on ``pod`` (the cached member pod it
    names, None when it names no member pod): not a dry run, a live member not yet marked."""
    if request.get("dryRun") or pod is None or objects.deleting(pod):
        return False
    return not eviction_requested(pod)


def eviction_webhook(manager: Manager, deps: Deps, pods: Informer) -> Webhook:
    async def handle(request: Obj) -> AdmissionResponse:
        namespace, name = str(request.get("namespace") or ""), str(request.get("name") or "")
        pod = pods.get(f"{namespace}/{name}")
        if not to_record(request, pod):
            return AdmissionResponse.allow()
        patch = {"metadata": {"annotations": {EVICTION_ANNOTATION: rfc3339(deps.clock.now())}}}
        try:
            await manager.api.patch(PODS, namespace, name, patch)
        except ReconcileError as err:  # gone meanwhile, or the API server is busy: the eviction goes on
            log.warning("could not record the eviction asked of member pod %s/%s: %s", namespace, name, err)
        else:
            log.info("eviction asked of member pod %s/%s: the operator will move it", namespace, name)
        return AdmissionResponse.allow()

    return Webhook(
        EVICTION_NAME, EVICTION_PATH, "validating", RULES, handle, failure_policy="Ignore",
        side_effects="NoneOnDryRun", timeout_seconds=5,
    )  # fmt: skip


def register(manager: Manager, deps: Deps) -> None:
    """Serve the eviction webhook beside the EtcdCluster validators (``webhook.register``)."""
    if not manager.options.webhooks_reachable:
        return  # webhook.register says why
    pods = manager.informer(PODS, InformerOptions(label_selector=CLUSTER_LABEL))
    manager.add_webhook(eviction_webhook(manager, deps, pods))


__all__ = ["EVICTION_NAME", "EVICTION_PATH", "eviction_webhook", "register", "to_record"]
