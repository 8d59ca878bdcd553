"""The StorageCluster controller: observe (caches, the secrets, the EtcdCluster it names, the
Kubernetes version), plan (planner.plan), act one step, record the status and an Event.

Generated objects live in spec.namespace and at cluster scope, out of reach of owner
references: each carries ``kustos.dev/storage-cluster: <namespace>.<name>``, the informers
here select on that label across all namespaces, and a finalizer holds the StorageCluster
until everything labelled with it is gone.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from kustos.api.etcd import EtcdCluster
from kustos.api.storage import StorageCluster
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import is_true, now_rfc3339, set_condition
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.informer import Informer, InformerOptions, ResourceRef
from kustos.runtime.manager import Manager, ManagerOptions
from kustos.runtime.resources import NODES, PODS
from kustos.storage import manifests, names, planner
from kustos.storage.images import KubeVersion, parse_kube_version
from kustos.storage.planner import ClusterSummary, Observed, PodView, Step

log = logging.getLogger(__name__)

STORAGECLUSTERS = ResourceRef(StorageCluster.crd.group, StorageCluster.crd.version, "storageclusters",
                              "StorageCluster")  # fmt: skip
ETCDCLUSTERS = ResourceRef(EtcdCluster.crd.group, EtcdCluster.crd.version, "etcdclusters", "EtcdCluster")

# Every kind a StorageCluster generates: (apiVersion, kind) -> REST coordinates.
OWNED: dict[str, ResourceRef] = {
    "Namespace": ResourceRef("", "v1", "namespaces", "Namespace", namespaced=False),
    "ServiceAccount": ResourceRef("", "v1", "serviceaccounts", "ServiceAccount"),
    "ClusterRole": ResourceRef("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    "ClusterRoleBinding": ResourceRef(
        "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
    ),
    "Secret": ResourceRef("", "v1", "secrets", "Secret"),
    "ConfigMap": ResourceRef("", "v1", "configmaps", "ConfigMap"),
    "CSIDriver": ResourceRef("storage.k8s.io", "v1", "csidrivers", "CSIDriver", namespaced=False),
    "StorageClass": ResourceRef("storage.k8s.io", "v1", "storageclasses", "StorageClass", namespaced=False),
    "Service": ResourceRef("", "v1", "services", "Service"),
    "Ingress": ResourceRef("networking.k8s.io", "v1", "ingresses", "Ingress"),
    "DaemonSet": ResourceRef("apps", "v1", "daemonsets", "DaemonSet"),
    "StatefulSet": ResourceRef("apps", "v1", "statefulsets", "StatefulSet"),
    "Deployment": ResourceRef("apps", "v1", "deployments", "Deployment"),
}
SECRETS = OWNED["Secret"]

STEADY_RESYNC = 15.0
UNSEEN = "?"  # not a namespace/name: the cluster-wide cache has not seen this StorageCluster yet
AFTER_STEP = 0.2


def ref_for(obj: dict[str, Any]) -> ResourceRef:
    base = OWNED[obj["kind"]]
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    if (group, version) == (base.group, base.version) or not version:
        return base
    return ResourceRef(group, version, base.plural, base.kind, base.namespaced)


def _labelled() -> InformerOptions:
    return InformerOptions(namespace="", label_selector=names.CLUSTER_LABEL)


def _pod_ready(pod: dict[str, Any]) -> bool:
    """Ready, or every container ready: the node lifecycle controller marks a lost node's pods
    NotReady and not every kubelet (kwok's, for one) flips the condition back, so the
    containers' own readiness (and, separately, the node's) is what counts."""
    status = pod.get("status") or {}
    if any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        return True
    containers = status.get("containerStatuses") or []
    return bool(containers) and status.get("phase") == "Running" and all(c.get("ready") for c in containers)


def _node_ready(node: dict[str, Any] | None) -> bool:
    if node is None:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def cluster_key_to_object_key(value: str) -> str:
    """``namespace.name`` (the label) -> ``namespace/name`` (the queue key)."""
    namespace, _, name = value.partition(".")
    return f"{namespace}/{name}"


class StorageClusterReconciler:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.api = manager.api
        self.clusters = manager.informer(STORAGECLUSTERS)
        # Every StorageCluster in the Kubernetes cluster: only one may be active.
        self.all_clusters = manager.informer(STORAGECLUSTERS, InformerOptions(namespace=""))
        self.owned: dict[str, Informer] = {
            kind: manager.informer(ref, _labelled()) for kind, ref in OWNED.items()
        }
        self.pods = manager.informer(PODS, _labelled())
        self.nodes = manager.informer(NODES)
        self.etcd_clusters = manager.informer(ETCDCLUSTERS)
        self._kube_version: KubeVersion | None = None

    # ---- observe -----------------------------------------------------------------------

    async def kube_version(self) -> KubeVersion:
        """GET /version, once per process (a control-plane upgrade restarts operators anyway)."""
        if self._kube_version is None:
            response = await self.manager.clients.raw.get("/version")
            response.raise_for_status()
            self._kube_version = parse_kube_version(response.json())
            log.info("Kubernetes version %s.%s", *self._kube_version)
        return self._kube_version

    def _active_elsewhere(self, cluster: StorageCluster) -> str | None:
        summaries = []
        for raw in self.all_clusters.list():
            meta = raw["metadata"]
            summaries.append(
                ClusterSummary(
                    key=f"{meta['namespace']}/{meta['name']}",
                    created=str(meta.get("creationTimestamp", "")),
                    was_active=is_true((raw.get("status") or {}).get("conditions"), "Active"),
                    deleting=bool(meta.get("deletionTimestamp")),
                )
            )
        mine = f"{cluster.metadata['namespace']}/{cluster.metadata['name']}"
        if not any(s.key == mine for s in summaries):
            return UNSEEN  # the cluster-wide cache has not caught up yet: judge on the next pass
        active = planner.choose_active(summaries)
        return active if active is not None and active != mine else None

    async def _secret_data(self, name: str, namespace: str) -> dict[str, str] | None:
        if not name:
            return None
        secret = await self.api.get(SECRETS, namespace, name)
        return None if secret is None else dict(secret.get("data") or {})

    async def _kv_endpoints(self, cluster: StorageCluster) -> tuple[tuple[str, ...], str | None]:
        """The key-value endpoints, or why they are not known yet."""
        kv = cluster.spec.kv_backend
        if kv.backend != "etcd":
            return (), None
        if kv.etcd_cluster_ref is None:
            return tuple(a.strip() for a in kv.address.split(",") if a.strip()), None
        namespace = kv.etcd_cluster_ref.namespace or cluster.metadata["namespace"]
        raw = self.etcd_clusters.get(f"{namespace}/{kv.etcd_cluster_ref.name}")
        if raw is None:
            raw = await self.api.get(ETCDCLUSTERS, namespace, kv.etcd_cluster_ref.name)
        if raw is None:
            return (), f"waiting for EtcdCluster {namespace}/{kv.etcd_cluster_ref.name}"
        members = (raw.get("status") or {}).get("members") or []
        urls = tuple(sorted(m["clientUrl"] for m in members if m.get("clientUrl") and not m.get("learner")))
        if not urls:
            return (), f"waiting for members of EtcdCluster {namespace}/{kv.etcd_cluster_ref.name}"
        return urls, None

    def _current(
        self, key: str
    ) -> tuple[dict[planner.ObjKey, str], dict[planner.ObjKey, Any], dict[str, Any] | None]:
        """Live labelled objects (not being deleted) -> applied hash, workloads -> their
        images, and the node DaemonSet."""
        current: dict[planner.ObjKey, str] = {}
        images: dict[planner.ObjKey, Any] = {}
        daemonset = None
        for informer in self.owned.values():
            for obj in informer.list():
                meta = obj["metadata"]
                if (meta.get("labels") or {}).get(names.CLUSTER_LABEL) != key or meta.get(
                    "deletionTimestamp"
                ):
                    continue
                obj = {**obj, "kind": obj.get("kind") or informer.resource.kind}
                current[planner.key_of(obj)] = planner.hash_of(obj)
                if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
                    images[planner.key_of(obj)] = planner.template_images(obj)
                if (
                    obj["kind"] == "DaemonSet"
                    and (meta.get("labels") or {}).get("app.kubernetes.io/component") == "node"
                ):
                    daemonset = obj
        return current, images, daemonset

    def _pods(self, key: str) -> tuple[PodView, ...]:
        views = []
        for pod in self.pods.list():
            labels = pod["metadata"].get("labels") or {}
            if labels.get(names.CLUSTER_LABEL) != key or labels.get("app.kubernetes.io/component") != "node":
                continue
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            containers = (pod.get("spec") or {}).get("containers") or []
            image = next(
                (c.get("image", "") for c in containers if c.get("name") == names.node_container_name), ""
            )
            views.append(
                PodView(
                    name=pod["metadata"]["name"],
                    node=node,
                    phase=str((pod.get("status") or {}).get("phase") or ""),
                    ready=_pod_ready(pod),
                    node_ready=_node_ready(self.nodes.get(node)) if node else False,
                    deleting=bool(pod["metadata"].get("deletionTimestamp")),
                    image=image,
                )
            )
        return tuple(views)

    async def observe(self, raw: dict[str, Any], cluster: StorageCluster) -> Observed:
        meta, spec = cluster.metadata, cluster.spec
        key = names.cluster_key(cluster)
        deleting = bool(meta.get("deletionTimestamp"))
        current, images, daemonset = self._current(key)
        old_status = raw.get("status") or {}
        common: dict[str, Any] = {
            "generation": int(meta.get("generation") or 0),
            "deleting": deleting,
            "has_finalizer": names.FINALIZER in (meta.get("finalizers") or []),
            "pause": spec.pause,
            "maintenance": (meta.get("annotations") or {}).get(names.MAINTENANCE_ANNOTATION),
            "current": current,
            "current_images": images,
            "pods": self._pods(key),
            "desired_scheduled": None
            if daemonset is None
            else int((daemonset.get("status") or {}).get("desiredNumberScheduled") or 0),
            "previous_phase": old_status.get("phase"),
            "previous_conditions": tuple(old_status.get("conditions") or []),
            "node_image": _node_image(daemonset),
        }
        if deleting:
            return Observed(**common)
        active_elsewhere = self._active_elsewhere(cluster)
        if active_elsewhere == UNSEEN:
            return Observed(**common, waiting="waiting to see every StorageCluster in the cluster")
        if active_elsewhere is not None:
            return Observed(**common, active_elsewhere=active_elsewhere)
        own_namespace = meta["namespace"]
        secret_data = await self._secret_data(
            spec.secret_ref_name, spec.secret_ref_namespace or own_namespace
        )
        etcd_tls = await self._secret_data(
            spec.tls_etcd_secret_ref_name, spec.tls_etcd_secret_ref_namespace or own_namespace
        )
        endpoints, waiting = await self._kv_endpoints(cluster)
        existing = await self.api.get(OWNED["Namespace"], None, spec.namespace)
        foreign = (
            existing is not None
            and (existing["metadata"].get("labels") or {}).get(names.CLUSTER_LABEL) != key
        )
        inputs = manifests.Inputs(
            cluster=cluster, kube_version=await self.kube_version(), kv_endpoints=endpoints,
            secret_data=secret_data, etcd_tls_data=etcd_tls, foreign_namespace=foreign,
        )  # fmt: skip
        refusals = tuple(manifests.refusals(inputs))
        desired = tuple(manifests.desired(inputs)) if not refusals else ()
        return Observed(**common, refusals=refusals, waiting=waiting, desired=desired, kv_endpoints=endpoints)

    # ---- reconcile ---------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        raw = self.clusters.get(key)
        if raw is None:
            return None
        try:
            cluster = StorageCluster.model_validate(raw)
        except ValidationError as err:
            await self._reject(raw, f"invalid spec: {err}")
            return None
        observed = await self.observe(raw, cluster)
        step = planner.plan(observed)
        if not isinstance(step, planner.Done | planner.Wait):
            log.info("step: %s", planner.describe(step))
        requeue = await self.act(raw, observed, step)
        if not isinstance(step, planner.RemoveFinalizer):
            await self._record(key, raw, observed, step)
        return Result(requeue_after=requeue)

    async def act(self, raw: dict[str, Any], o: Observed, step: Step) -> float:
        match step:
            case planner.Done():
                return STEADY_RESYNC
            case planner.Wait(seconds=seconds):
                return seconds
            case planner.Inactive():
                if _news(o, "Active", "False", planner.describe(step)):
                    await self._event(raw, WARNING, "AnotherClusterActive", planner.describe(step))
                return STEADY_RESYNC
            case planner.Refuse():
                if _news(o, "SpecValid", "False", planner.describe(step)):
                    await self._event(raw, WARNING, "InvalidSpec", planner.describe(step))
                return STEADY_RESYNC
            case planner.Hold(reason=reason, message=message):
                if _news(o, "Maintenance", "True", message):
                    event = "Maintenance" if reason == "StorageUpgrade" else "Paused"
                    await self._event(raw, NORMAL, event, message)
                return STEADY_RESYNC
            case planner.AddFinalizer():
                await self.api.add_finalizer(STORAGECLUSTERS, raw, names.FINALIZER)
            case planner.Apply(objects=objects):
                for obj in objects:
                    await self.api.apply(ref_for(obj), obj)
                await self._event(raw, NORMAL, "Applied", planner.describe(step))
            case planner.Prune(keys=keys) | planner.Cleanup(keys=keys):
                for kind, namespace, name in keys:
                    ref = OWNED[kind]
                    await self.api.delete(ref, namespace or None, name)
                reason = "Pruned" if isinstance(step, planner.Prune) else "CleaningUp"
                await self._event(raw, NORMAL, reason, planner.describe(step))
                return 1.0
            case planner.RemoveFinalizer():
                try:
                    await self.api.remove_finalizer(STORAGECLUSTERS, raw, names.FINALIZER)
                except ApiStatusError as err:
                    if not err.not_found:
                        raise
                return STEADY_RESYNC
        return AFTER_STEP

    async def _event(self, raw: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self.manager.events.record(raw, type_, reason, message)

    async def _reject(self, raw: dict[str, Any], message: str) -> None:
        status = dict(raw.get("status") or {})
        status["phase"] = "Pending"
        status["conditions"] = set_condition(
            status.get("conditions"), "SpecValid", False, "InvalidSpec", message[:1000],
            raw["metadata"].get("generation"),
        )  # fmt: skip
        await self.api.replace_status(STORAGECLUSTERS, raw, status)
        await self._event(raw, WARNING, "InvalidSpec", message[:500])

    async def _record(self, key: str, raw: dict[str, Any], o: Observed, step: Step) -> None:
        fresh = self.clusters.get(key) or raw
        old = dict(fresh.get("status") or {})
        payload = planner.status(o, step, now_rfc3339())
        payload["observedGeneration"] = fresh["metadata"].get("generation")
        if payload.get("phase") != old.get("phase") and old.get("phase"):
            await self._event(raw, NORMAL, "PhaseChanged", f"{old.get('phase')} -> {payload['phase']}")
        if payload != old:
            try:
                await self.api.replace_status(STORAGECLUSTERS, fresh, payload)
            except ApiStatusError as err:  # a conflict, or gone: the next pass writes it
                log.debug("status not written: %s", err)


def _news(o: Observed, type_: str, status: str, message: str) -> bool:
    """Whether the status does not say this yet (an Event per transition, not per pass)."""
    current = next((c for c in o.previous_conditions if c.get("type") == type_), None)
    return current is None or current.get("status") != status or current.get("message") != message


def _node_image(daemonset: dict[str, Any] | None) -> str | None:
    if daemonset is None:
        return None
    containers = daemonset.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    return next((c.get("image") for c in containers if c.get("name") == names.node_container_name), None)


def _by_label(obj: dict[str, Any]) -> list[str]:
    value = (obj["metadata"].get("labels") or {}).get(names.CLUSTER_LABEL)
    return [cluster_key_to_object_key(value)] if value else []


def _referencing(reconciler: StorageClusterReconciler) -> Any:
    """An EtcdCluster change wakes every StorageCluster whose kvBackend names it."""

    def keys(etcd: dict[str, Any]) -> list[str]:
        namespace, name = etcd["metadata"].get("namespace"), etcd["metadata"]["name"]
        found = []
        for raw in reconciler.clusters.list():
            ref = ((raw.get("spec") or {}).get("kvBackend") or {}).get("etcdClusterRef") or {}
            if (
                ref.get("name") == name
                and (ref.get("namespace") or raw["metadata"]["namespace"]) == namespace
            ):
                found.append(f"{raw['metadata']['namespace']}/{raw['metadata']['name']}")
        return found

    return keys


def _on_node(reconciler: StorageClusterReconciler) -> Any:
    """A Node change wakes every StorageCluster with a node pod there."""

    def keys(node: dict[str, Any]) -> list[str]:
        name = node["metadata"]["name"]
        return sorted({
            key
            for pod in reconciler.pods.list() if (pod.get("spec") or {}).get("nodeName") == name
            for key in _by_label(pod)
        })  # fmt: skip

    return keys


def _all_others(reconciler: StorageClusterReconciler) -> Any:
    """Any StorageCluster change anywhere may change which one is active: wake the local ones."""

    def keys(_obj: dict[str, Any]) -> list[str]:
        return [f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in reconciler.clusters.list()]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    from kustos.storage.webhook import scheduler_webhook  # the webhook reads this controller's caches

    reconciler = StorageClusterReconciler(manager)
    controller = Controller("storagecluster", STORAGECLUSTERS, reconciler.reconcile, workers=2)
    for ref in OWNED.values():
        controller.watch(ref, _by_label, _labelled())
    controller.watch(PODS, _by_label, _labelled())
    controller.watch(NODES, _on_node(reconciler))
    controller.watch(ETCDCLUSTERS, _referencing(reconciler))
    controller.watch(STORAGECLUSTERS, _all_others(reconciler), InformerOptions(namespace=""))
    manager.add_controller(controller)
    if webhook_reachable(manager.options):
        manager.add_webhook(scheduler_webhook(manager, reconciler.clusters))
    else:
        log.warning(
            "the StorageCluster scheduler webhook is off: the API server could not reach it "
            "(give kustos run --webhook-url, or run it in the cluster behind a webhook Service)"
        )


def webhook_reachable(options: ManagerOptions) -> bool:
    """Whether a webhook configuration can say where we are: without a URL or a Service the
    API server refuses the configuration, and the operator must still run (kustos dev up)."""
    return bool(options.webhook_url or options.webhook_service)


__all__ = ["OWNED", "STORAGECLUSTERS", "StorageClusterReconciler", "register", "webhook_reachable"]
