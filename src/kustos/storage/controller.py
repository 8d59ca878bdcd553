"""The StorageCluster controller: observe (caches, the secrets, the EtcdCluster it names, the
Kubernetes version), plan (planner.plan), act one step, record the status (planner.status,
written once per pass by ``runtime.record``) and the Events of what changed.

Generated objects live in spec.namespace and at cluster scope, out of reach of owner
references: each carries ``kustos.dev/storage-cluster: <namespace>.<name>``, the informers
here select on that label across all namespaces, and a finalizer holds the StorageCluster
until everything labelled with it is gone.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.api.storage import StorageCluster
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import is_true, set_condition
from kustos.runtime.controller import Controller, KeyMapper, through_index
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import Informer, InformerOptions, ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler, InvalidSpec
from kustos.runtime.record import Note
from kustos.runtime.resources import (
    CLUSTER_ROLE_BINDINGS,
    CLUSTER_ROLES,
    CONFIGMAPS,
    CSI_DRIVERS,
    DAEMONSETS,
    DEPLOYMENTS,
    INGRESSES,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
    STATEFULSETS,
    STORAGE_CLASSES,
)
from kustos.runtime.steps import Done, Wait
from kustos.storage import manifests, names, planner
from kustos.storage.images import KubeVersion, parse_kube_version
from kustos.storage.planner import ClusterSummary, Observed, PodView, Step

log = logging.getLogger(__name__)

STORAGECLUSTERS = StorageCluster.crd.ref
ETCDCLUSTERS = EtcdCluster.crd.ref

# Every kind a StorageCluster generates: kind -> REST coordinates.
OWNED: dict[str, ResourceRef] = {
    ref.kind: ref
    for ref in (
        NAMESPACES, SERVICE_ACCOUNTS, CLUSTER_ROLES, CLUSTER_ROLE_BINDINGS, SECRETS, CONFIGMAPS,
        CSI_DRIVERS, STORAGE_CLASSES, SERVICES, INGRESSES, DAEMONSETS, STATEFULSETS, DEPLOYMENTS,
    )
}  # fmt: skip

UNSEEN = "?"  # not a namespace/name: the cluster-wide cache has not seen this StorageCluster yet
Obj = dict[str, Any]


def ref_for(obj: dict[str, Any]) -> ResourceRef:
    base = OWNED[obj["kind"]]
    group, _, version = obj.get("apiVersion", "").rpartition("/")
    if (group, version) == (base.group, base.version) or not version:
        return base
    return ResourceRef(group, version, base.plural, base.kind, base.namespaced)


def _labelled() -> InformerOptions:
    return InformerOptions(namespace="", label_selector=names.CLUSTER_LABEL)


def cluster_key_to_object_key(value: str) -> str:
    """``namespace.name`` (the label) -> ``namespace/name`` (the queue key)."""
    namespace, _, name = value.partition(".")
    return f"{namespace}/{name}"


class StorageClusterReconciler(FamilyReconciler[StorageCluster, Observed, Step]):
    model = StorageCluster
    failure_condition = "Progressing"
    plans_deletion = True  # the planner cleans up what lives out of owner references' reach

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        # The chart's node and CSI helper ClusterRoles (its Deployment names them): bound, not
        # generated. Unset (kustos run outside the chart): generated per StorageCluster.
        self.shipped_roles = manifests.shipped_roles(os.environ)
        self.clusters = self.cache
        # Every StorageCluster in the Kubernetes cluster: only one may be active.
        self.all_clusters = manager.informer(STORAGECLUSTERS, InformerOptions(namespace=""))
        self.owned: dict[str, Informer] = {
            kind: manager.informer(ref, _labelled()) for kind, ref in OWNED.items()
        }
        self.pods = manager.informer(PODS, _labelled())
        self.pods_by_cluster = self.pods.index_by_label(names.CLUSTER_LABEL)
        self.pods_by_node = self.pods.index_by_node_name()
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
            summaries.append(
                ClusterSummary(
                    key=objects.key(raw),
                    created=str(raw["metadata"].get("creationTimestamp", "")),
                    was_active=is_true((raw.get("status") or {}).get("conditions"), "Active"),
                    deleting=objects.deleting(raw),
                )
            )
        mine = objects.key(cluster)
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
        namespace = kv.etcd_cluster_ref.namespace or str(objects.namespace(cluster))
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
        for pod in self.pods.by_index(self.pods_by_cluster, key):
            if objects.labels(pod).get("app.kubernetes.io/component") != "node":
                continue
            node = objects.pod_node(pod) or ""
            containers = (pod.get("spec") or {}).get("containers") or []
            image = next(
                (c.get("image", "") for c in containers if c.get("name") == names.node_container_name), ""
            )
            views.append(
                PodView(
                    name=objects.name(pod),
                    node=node,
                    phase=str((pod.get("status") or {}).get("phase") or ""),
                    # The containers' own readiness counts: not every kubelet (kwok's) flips the
                    # Ready condition back after the node lifecycle controller set it False, and the
                    # node's readiness is judged separately.
                    ready=objects.pod_ready(pod, trust_containers=True),
                    node_ready=objects.node_ready(self.nodes.get(node)) if node else False,
                    deleting=objects.deleting(pod),
                    image=image,
                )
            )
        return tuple(views)

    async def observe(self, cluster: StorageCluster, now: datetime) -> Observed:
        meta, spec = cluster.metadata, cluster.spec
        key = names.cluster_key(cluster)
        deleting = objects.deleting(cluster)
        current, images, daemonset = self._current(key)
        raw = self.clusters.get(objects.key(cluster)) or {}
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
        foreign = existing is not None and objects.labels(existing).get(names.CLUSTER_LABEL) != key
        inputs = manifests.Inputs(
            cluster=cluster, kube_version=await self.kube_version(), kv_endpoints=endpoints,
            secret_data=secret_data, etcd_tls_data=etcd_tls, foreign_namespace=foreign,
            shipped_roles=self.shipped_roles,
        )  # fmt: skip
        refusals = tuple(manifests.refusals(inputs))
        desired = tuple(manifests.desired(inputs)) if not refusals else ()
        return Observed(**common, refusals=refusals, waiting=waiting, desired=desired, kv_endpoints=endpoints)

    # ---- plan, act, record -------------------------------------------------------------

    def plan(self, observed: Observed) -> Step:
        step = planner.plan(observed)
        if not isinstance(step, Done | Wait):
            log.info("step: %s", planner.describe(step))
        return step

    async def act(self, cluster: StorageCluster, o: Observed, step: Step, notes: list[Note]) -> Step:
        """Take ``step``. Its Events say an action was taken, not that a pass ran; the status's
        transitions have theirs (``write_status``)."""
        raw = self.clusters.get(objects.key(cluster))
        if raw is None:
            return step
        match step:
            case planner.AddFinalizer():
                await self.api.add_finalizer(STORAGECLUSTERS, raw, names.FINALIZER)
            case planner.Apply(objects=applied):
                for obj in applied:
                    await self.api.apply(ref_for(obj), obj)
                notes.append(Note("Applied", planner.describe(step)))
            case planner.Prune(keys=keys) | planner.Cleanup(keys=keys):
                for kind, namespace, name in keys:
                    await self.api.delete(OWNED[kind], namespace or None, name)
                reason = "Pruned" if isinstance(step, planner.Prune) else "CleaningUp"
                notes.append(Note(reason, planner.describe(step)))
            case planner.RemoveFinalizer():
                try:
                    await self.api.remove_finalizer(STORAGECLUSTERS, raw, names.FINALIZER)
                except ApiStatusError as err:
                    if not err.not_found:
                        raise
        return step

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        return planner.requeue_after(step)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        status = dict(raw.get("status") or {})
        status.pop("observedGeneration", None)
        status["phase"] = "Pending"
        status["conditions"] = set_condition(
            status.get("conditions"), "SpecValid", False, "InvalidSpec", failure.message[:1000],
            objects.generation(raw), now,
        )  # fmt: skip
        return status

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """Written over the freshest copy the cache has (a finalizer added this pass), with an
        Event for each transition the status shows; a conflict is left to the next pass."""
        fresh = self.fetch(objects.key(raw)) or raw
        told = notes + planner.status_notes(fresh.get("status") or {}, status)
        try:
            await self.record_status(fresh, status, told, announce=())
        except ApiStatusError as err:  # the next pass writes it (and says what changed)
            log.debug("status not written: %s", err)


def _node_image(daemonset: dict[str, Any] | None) -> str | None:
    if daemonset is None:
        return None
    containers = daemonset.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or []
    return next((c.get("image") for c in containers if c.get("name") == names.node_container_name), None)


def _by_label(obj: dict[str, Any]) -> list[str]:
    value = objects.labels(obj).get(names.CLUSTER_LABEL)
    return [cluster_key_to_object_key(value)] if value else []


def _referencing(reconciler: StorageClusterReconciler) -> Any:
    """An EtcdCluster change wakes every StorageCluster whose kvBackend names it."""

    def keys(etcd: dict[str, Any]) -> list[str]:
        namespace, name = objects.namespace(etcd), objects.name(etcd)
        found = []
        for raw in reconciler.clusters.list():
            ref = ((raw.get("spec") or {}).get("kvBackend") or {}).get("etcdClusterRef") or {}
            if ref.get("name") == name and (ref.get("namespace") or objects.namespace(raw)) == namespace:
                found.append(objects.key(raw))
        return found

    return keys


def _on_node(reconciler: StorageClusterReconciler) -> KeyMapper:
    """A Node change wakes every StorageCluster with a node pod there."""
    return through_index(reconciler.pods, reconciler.pods_by_node, objects.name, _by_label)


def _all_others(reconciler: StorageClusterReconciler) -> Any:
    """Any StorageCluster change anywhere may change which one is active: wake the local ones."""

    def keys(_obj: dict[str, Any]) -> list[str]:
        return [objects.key(c) for c in reconciler.clusters.list()]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    """The controller; its scheduler webhook is ``storage.webhook.register``'s, served from the
    start (kustos.controllers)."""
    reconciler = StorageClusterReconciler(manager, deps)
    controller = Controller("storagecluster", STORAGECLUSTERS, reconciler.reconcile, workers=2)
    for ref in OWNED.values():
        controller.watch(ref, _by_label, _labelled())
    controller.watch(PODS, _by_label, _labelled())
    controller.watch(NODES, _on_node(reconciler))
    controller.watch(ETCDCLUSTERS, _referencing(reconciler))
    controller.watch(STORAGECLUSTERS, _all_others(reconciler), InformerOptions(namespace=""))
    manager.add_controller(controller)


__all__ = ["OWNED", "STORAGECLUSTERS", "StorageClusterReconciler", "register"]
