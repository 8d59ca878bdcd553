"""The StorageUpgrade controller: observe, plan (upgrade_planner.plan), act one step, record.

The step lives in the upgrade's status, each scaled-down workload carries its own
replica count in an annotation, the cluster carries the maintenance annotation, and
the pre-pull is a NodeJob: a restarted operator reads them all again and carries on.
The node DaemonSet, its pods and the workloads are read straight from the API on each
pass (they may live outside the operator's namespace and are only needed while an
upgrade runs), never from a cache.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.nodejob import NodeJob
from kustos.api.storage import StorageCluster
from kustos.api.storageupgrade import StorageUpgrade, StorageUpgradeStatus, UpgradeStep, WorkloadStatus
from kustos.runtime import faults, objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import is_true
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler, InvalidSpec
from kustos.runtime.record import Note
from kustos.runtime.resources import CLAIMS, DAEMONSETS, DEPLOYMENTS, PODS, STATEFULSETS, STORAGE_CLASSES
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_duration, parse_rfc3339
from kustos.storage import names
from kustos.storage import upgrade_planner as up
from kustos.storage.upgrade_planner import (
    ClaimView,
    ClusterView,
    DaemonSetView,
    NodePodView,
    Observed,
    VolumeMatch,
    WorkloadView,
    restore_command,
)

log = logging.getLogger(__name__)

STORAGEUPGRADES = StorageUpgrade.crd.ref
STORAGECLUSTERS = StorageCluster.crd.ref
NODEJOBS = NodeJob.crd.ref
WORKLOAD_KINDS = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS}
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"

AFTER_STEP = 0.2  # seconds: the next pass after a step, once the watch has shown its effect
Obj = dict[str, Any]

PULL_SCRIPT = "echo done; trap 'exit 0' TERM; while true; do sleep 1; done"


def pull_job_name(upgrade: str) -> str:
    return f"{upgrade}-pull"[:63].rstrip("-.")


@dataclass(frozen=True)
class Seen:
    """What a pass saw: the planner's observation, and the cluster its steps act on."""

    observed: Observed
    cluster: StorageCluster | None


class StorageUpgradeReconciler(FamilyReconciler[StorageUpgrade, Seen, up.Step]):
    model = StorageUpgrade
    plans_deletion = True  # the planner gives back what the upgrade holds, then releases it

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.upgrades = self.cache
        self.clusters = manager.informer(STORAGECLUSTERS)
        self.jobs = manager.informer(NODEJOBS)

    async def _list(
        self, ref: ResourceRef, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Straight from the API: workloads, claims and classes are read only while upgrading."""
        return await self.api.list_objects(ref, namespace if ref.namespaced else None, selector)

    async def _list_watched(self, ref: ResourceRef) -> list[dict[str, Any]]:
        """Every namespace the operator watches (each of a list, one call each), or all of them."""
        scopes: tuple[str | None, ...] = self.manager.options.namespaces or (None,)
        return [obj for scope in scopes for obj in await self._list(ref, scope)]

    # ---- observe ---------------------------------------------------------------------------

    def _cluster_of(self, upgrade: StorageUpgrade) -> tuple[StorageCluster | None, str]:
        """The cluster to upgrade, or None and why."""
        namespace = objects.namespace(upgrade)
        wanted = (upgrade.status.cluster if upgrade.status else None) or upgrade.spec.cluster_name
        candidates = [
            c for c in self.clusters.list()
            if objects.namespace(c) == namespace
            and (wanted is None or objects.name(c) == wanted)
        ]  # fmt: skip
        if not candidates:
            return None, f"StorageCluster {wanted or '(any)'} not found in namespace {namespace}"
        if len(candidates) > 1:
            return None, f"{len(candidates)} StorageClusters in namespace {namespace}: set spec.clusterName"
        try:
            return StorageCluster.model_validate(candidates[0]), ""
        except ValidationError as err:
            return None, f"StorageCluster {candidates[0]['metadata']['name']} is invalid: {err}"

    async def _daemon_set(self, cluster: StorageCluster) -> DaemonSetView | None:
        namespace, name = names.node_daemonset(cluster)
        ds = await self.api.get(DAEMONSETS, namespace, name)
        if ds is None:
            return None
        spec = ds.get("spec") or {}
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
        image = next(
            (c.get("image", "") for c in containers if c.get("name") == names.node_container_name), ""
        )
        labels = (spec.get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = []
        for pod in await self._list(PODS, namespace, selector):
            owners = pod["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == objects.uid(ds) for o in owners):
                continue
            pod_containers = (pod.get("spec") or {}).get("containers") or []
            pod_image = next(
                (c.get("image", "") for c in pod_containers if c.get("name") == names.node_container_name), ""
            )
            pods.append(
                NodePodView(objects.name(pod), pod_image, objects.pod_ready(pod), objects.deleting(pod))
            )
        status = ds.get("status") or {}
        return DaemonSetView(
            namespace=namespace,
            name=name,
            image=image,
            generation=objects.generation(ds) or 1,
            observed_generation=int(status.get("observedGeneration") or 0),
            desired=int(status.get("desiredNumberScheduled") or 0),
            on_delete=(spec.get("updateStrategy") or {}).get("type") == "OnDelete",
            pods=tuple(pods),
        )

    async def _workloads(self, cluster: StorageCluster, count_pods: bool) -> tuple[WorkloadView, ...]:
        classes = await self._list(STORAGE_CLASSES, None)
        defaults = [
            objects.name(c) for c in classes if objects.annotations(c).get(DEFAULT_CLASS_ANNOTATION) == "true"
        ]
        default_class = defaults[0] if defaults else None
        match = VolumeMatch(
            storage_class=names.storage_class(cluster),
            provisioner=names.provisioner(cluster),
            default_class=default_class,
            provisioner_of_class={objects.name(c): c.get("provisioner", "") for c in classes},
        )
        claims: dict[str, dict[str, ClaimView]] = defaultdict(dict)
        for claim in await self._list_watched(CLAIMS):
            claims[str(objects.namespace(claim))][objects.name(claim)] = up.claim_view(claim)
        views = []
        for kind, ref in WORKLOAD_KINDS.items():
            for w in await self._list_watched(ref):
                namespace = str(objects.namespace(w))
                annotations = objects.annotations(w)
                remembered = annotations.get(up.REPLICAS_ANNOTATION)
                uses = up.uses_cluster_volumes(w, claims.get(namespace, {}), match)
                if not uses and remembered is None:
                    continue
                pods = 0
                selector = up.selector_string(w)
                if count_pods and selector:
                    pods = len(await self._list(PODS, namespace, selector))
                replicas = (w.get("spec") or {}).get("replicas")
                views.append(
                    WorkloadView(
                        kind=kind, namespace=namespace, name=objects.name(w),
                        replicas=1 if replicas is None else int(replicas),
                        remembered=int(remembered) if remembered and remembered.isdigit() else None,
                        owner=annotations.get(up.OWNER_ANNOTATION), uses_cluster=uses, pods=pods,
                    )
                )  # fmt: skip
        return tuple(views)

    async def observe(self, upgrade: StorageUpgrade, now: datetime) -> Seen:
        cluster, problem = self._cluster_of(upgrade)
        status = upgrade.status or StorageUpgradeStatus()
        namespace, name = str(objects.namespace(upgrade)), objects.name(upgrade)
        deleting = objects.deleting(upgrade)
        job = self.jobs.get(f"{namespace}/{pull_job_name(name)}")
        cluster_view = None
        daemon_set = None
        workloads: tuple[WorkloadView, ...] = ()
        if cluster is not None:
            annotations = cluster.metadata.get("annotations") or {}
            conditions = [
                c.model_dump(by_alias=True) for c in (cluster.status.conditions if cluster.status else [])
            ]
            cluster_view = ClusterView(
                name=objects.name(cluster),
                node_image=cluster.spec.images.node_container,
                maintenance=annotations.get(names.MAINTENANCE_ANNOTATION),
                reports_maintenance=is_true(conditions, "Maintenance"),
            )
            active = status.step in ("ScaleDown", "RollNodes", "ScaleUp")
            if status.step == "RollNodes":
                daemon_set = await self._daemon_set(cluster)
            if active or deleting:
                workloads = await self._workloads(cluster, count_pods=status.step == "ScaleDown")
        observed = Observed(
            upgrade=f"{namespace}/{name}",
            new_image=upgrade.spec.new_image,
            step=status.step,
            now=now,
            step_started=parse_rfc3339(status.step_start_time),
            timeout=parse_duration(upgrade.spec.step_timeout),
            cluster=cluster_view,
            maintenance_value=name,
            pull_job_exists=job is not None,
            pull_job_completed=bool(job and (job.get("status") or {}).get("completed")),
            pull_job_failure=_job_failure(job),
            workloads=workloads,
            daemon_set=daemon_set,
            deleting=deleting,
            previous=status,
            generation=objects.generation(upgrade),
            cluster_problem=problem,
            pull_job_progress=_job_progress(job) if status.step == "PullImage" else "",
            has_finalizer=up.FINALIZER in _finalizers(upgrade.metadata),
        )
        return Seen(observed, cluster)

    # ---- reconcile -------------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result | None:
        """The base's pass, but for an upgrade being deleted whose spec the model refuses:
        nothing of it can be planned, so it is released (not held for ever)."""
        raw = self.cache.get(key)
        if raw is not None and objects.deleting(raw) and up.FINALIZER in _finalizers(raw):
            try:
                StorageUpgrade.model_validate(raw)
            except ValidationError:
                await self._release(raw)
                return None
        return await super().reconcile(key)

    def settled(self, upgrade: StorageUpgrade) -> bool:
        """Being deleted and released: nothing left to give back."""
        return objects.deleting(upgrade) and up.FINALIZER not in _finalizers(upgrade.metadata)

    def plan(self, seen: Seen) -> up.Step:
        step = up.plan(seen.observed)
        if isinstance(step, Wait | Done):
            log.debug("planned %s", step)
        else:
            log.info("step: %s", step)
        return step

    def status(self, seen: Seen, step: up.Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return up.status(seen.observed, step, now, failure).model_dump(by_alias=True)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        """Failed for good, saying how to give back the workloads earlier passes scaled down."""
        try:
            previous = StorageUpgradeStatus.model_validate(raw.get("status") or {})
        except ValidationError:
            previous = StorageUpgradeStatus()
        key, generation = objects.key(raw), objects.generation(raw)
        status = up.failed(previous, key, failure.message, now, generation, "InvalidSpec")
        return status.model_dump(by_alias=True)

    def requeue_after(self, seen: Seen, step: up.Step) -> float | None:
        match step:
            case Wait(seconds=seconds):
                return seconds
            case Done() | up.Fail() | up.Release() | up.Advance(to="Completed"):
                return None
        return AFTER_STEP

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """The one write, with an invalid spec's Event when it is news. A conflict on a write
        that records no new step (a workload's restored mark, a wait's message) is left to
        the next pass, which sees the same and says it again; a new step is retried."""
        old = raw.get("status") or {}
        told = [*notes, *up.rejection_notes(old, status)]
        try:
            await self.record_status(raw, status, told, announce=())
        except ApiStatusError as err:
            if not (err.conflict and status.get("step") == old.get("step")):
                raise

    # ---- act -------------------------------------------------------------------------------

    async def act(self, upgrade: StorageUpgrade, seen: Seen, step: up.Step, notes: list[Note]) -> up.Step:
        """Take ``step`` (Wait, Fail and Advance are only recorded), then say it in ``notes``."""
        await self._take(upgrade, seen.cluster, step)
        if not isinstance(step, Wait | Done | up.Fail | up.Advance):
            faults.exit_after(type(step).__name__)  # acted, not yet recorded
        o = seen.observed
        notes.extend(up.notes(o, step, up.status(o, step, o.now)))
        return step

    async def _take(self, upgrade: StorageUpgrade, cluster: StorageCluster | None, step: up.Step) -> None:
        namespace, name = str(objects.namespace(upgrade)), objects.name(upgrade)
        patch: dict[str, Any]
        match step:
            case up.AddFinalizer():
                raw = self.cache.get(objects.key(upgrade))
                if raw is not None:
                    await self.api.add_finalizer(STORAGEUPGRADES, raw, up.FINALIZER)
            case up.CreatePullJob():
                assert cluster is not None
                try:
                    await self.api.create(NODEJOBS, pull_job(upgrade, cluster))
                except ApiStatusError as err:
                    if not err.conflict:
                        raise
            case up.DeletePullJob():
                await self.api.delete(NODEJOBS, namespace, pull_job_name(name))
            case up.SetMaintenance():
                assert cluster is not None
                patch = {"metadata": {"annotations": {names.MAINTENANCE_ANNOTATION: name}}}
                await self.api.patch(STORAGECLUSTERS, namespace, objects.name(cluster), patch)
            case up.ClearMaintenance():
                assert cluster is not None
                # Guarded: only our own annotation goes, even if another upgrade took over meanwhile.
                patch_ops = [
                    {"op": "test", "path": "/metadata/annotations/kustos.dev~1maintenance", "value": name},
                    {"op": "remove", "path": "/metadata/annotations/kustos.dev~1maintenance"},
                ]
                await self.api.patch(
                    STORAGECLUSTERS, namespace, objects.name(cluster), patch_ops, kind="json"
                )
            case up.ScaleDown(workload=w, remember=remember):
                patch = {
                    "metadata": {
                        "annotations": {
                            up.REPLICAS_ANNOTATION: str(remember),
                            up.OWNER_ANNOTATION: f"{namespace}/{name}",
                        }
                    },
                    "spec": {"replicas": 0},
                }
                await self.api.patch(WORKLOAD_KINDS[w.kind], w.namespace, w.name, patch)
            case up.ScaleUp(workload=w, replicas=replicas):
                patch = {
                    "metadata": {"annotations": {up.REPLICAS_ANNOTATION: None, up.OWNER_ANNOTATION: None}},
                    "spec": {"replicas": replicas},
                }
                await self.api.patch(WORKLOAD_KINDS[w.kind], w.namespace, w.name, patch)
            case up.PatchDaemonSet(image=image):
                assert cluster is not None
                ds_namespace, ds_name = names.node_daemonset(cluster)
                patch = {
                    "spec": {
                        "template": {
                            "spec": {"containers": [{"name": names.node_container_name, "image": image}]}
                        }
                    }
                }
                await self.api.patch(DAEMONSETS, ds_namespace, ds_name, patch, kind="strategic")
            case up.DeleteNodePod(name=pod):
                assert cluster is not None
                await self.api.delete(PODS, names.node_daemonset(cluster)[0], pod)
            case up.SetClusterImage(image=image):
                assert cluster is not None
                patch = {"spec": {"images": {"nodeContainer": image}}}
                await self.api.patch(STORAGECLUSTERS, namespace, objects.name(cluster), patch)
            case up.Release():
                raw = self.cache.get(objects.key(upgrade))
                if raw is not None:
                    await self._release(raw)

    async def _release(self, raw: Obj) -> None:
        try:
            await self.api.remove_finalizer(STORAGEUPGRADES, raw, up.FINALIZER)
        except ApiStatusError as err:
            if not err.not_found:  # a stale cache: an earlier pass released it already
                raise


def pull_job(upgrade: StorageUpgrade, cluster: StorageCluster) -> dict[str, Any]:
    """The NodeJob that runs the new image once on every storage node (pulling it there)."""
    meta = upgrade.metadata
    return {
        "apiVersion": NodeJob.crd.api_version,
        "kind": "NodeJob",
        "metadata": {
            "name": pull_job_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {"app.kubernetes.io/managed-by": "kustos"},
            "ownerReferences": [
                {
                    "apiVersion": upgrade.crd.api_version,
                    "kind": upgrade.crd.kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "image": upgrade.spec.new_image,
            "command": ["sh", "-c", PULL_SCRIPT],
            "completionWord": up.COMPLETION_WORD,
            "labelSelector": f"kustos.dev/storage-upgrade={meta['name'][:63].rstrip('-._')}",
            "nodeSelectorTerms": cluster.spec.node_selector_terms,
            "tolerations": cluster.spec.tolerations,
        },
    }


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    meta = obj.get("metadata", obj)
    return list(meta.get("finalizers") or [])


def _job_failure(job: dict[str, Any] | None) -> str | None:
    status = (job or {}).get("status") or {}
    return str(status.get("message") or "invalid spec") if status.get("phase") == "Failed" else None


def _job_progress(job: dict[str, Any] | None) -> str:
    status = (job or {}).get("status") or {}
    return f" ({status['progress']} nodes: {status.get('message', '')})" if status.get("progress") else ""


def _upgrades_in_namespace(reconciler: StorageUpgradeReconciler) -> Any:
    """A StorageCluster change wakes every upgrade in its namespace."""

    def keys(cluster: dict[str, Any]) -> list[str]:
        namespace = objects.namespace(cluster)
        return [objects.key(u) for u in reconciler.upgrades.list() if objects.namespace(u) == namespace]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = StorageUpgradeReconciler(manager, deps)
    controller = Controller("storageupgrade", STORAGEUPGRADES, reconciler.reconcile, workers=2)
    controller.owns(NODEJOBS)
    controller.watch(STORAGECLUSTERS, _upgrades_in_namespace(reconciler))
    manager.add_controller(controller)


__all__ = ["STORAGEUPGRADES", "UpgradeStep", "WorkloadStatus", "pull_job", "register", "restore_command"]
