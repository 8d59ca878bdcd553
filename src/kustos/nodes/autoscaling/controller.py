"""The AutoscalingStrategy controller (see planner): pause and restore the cluster-autoscaler."""

from __future__ import annotations

from typing import Any

from kustos.api.autoscaling import PAUSED_ANNOTATION, AutoscalingStrategy
from kustos.api.nodeimage import NodeImage
from kustos.nodes.autoscaling import planner
from kustos.nodes.autoscaling.planner import Observed, Pause, Restore
from kustos.runtime import objects
from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, record
from kustos.runtime.resources import DEPLOYMENTS

STRATEGIES = AutoscalingStrategy.crd.ref
NODEIMAGES = NodeImage.crd.ref


class AutoscalingReconciler:
    def __init__(self, manager: Manager, deps: Deps) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock = deps.clock
        self.cloud = deps.cloud
        self.strategies = manager.informer(STRATEGIES)
        self.images = manager.informer(NODEIMAGES)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.strategies.get(key)
        if raw is None or objects.deleting(raw):
            return None
        spec = raw.get("spec") or {}
        namespace = spec.get("deploymentNamespace", "kube-system")
        name = spec.get("deploymentName", "cluster-autoscaler")
        deployment = await self.api.get(DEPLOYMENTS, namespace, name)
        saved_text = objects.annotations(deployment).get(PAUSED_ANNOTATION) if deployment else None
        replicas = int(((deployment or {}).get("spec") or {}).get("replicas", 1))
        o = Observed(
            enabled=bool(spec.get("enabled", True)),
            rolling_out=bool(planner.in_flight(self.images.list(), provider=self.cloud is not None)),
            deployment_exists=deployment is not None,
            replicas=replicas,
            saved=int(saved_text) if saved_text and saved_text.isdigit() else None,
        )
        step = planner.plan(o)
        notes: list[Note] = []
        status: dict[str, Any] = dict(raw.get("status") or {})
        match step:
            case Pause():
                # One patch: the saved replicas and the 0 land together.
                patch = {
                    "metadata": {"annotations": {PAUSED_ANNOTATION: str(step.save)}},
                    "spec": {"replicas": 0},
                }
                await self.api.patch(DEPLOYMENTS, namespace, name, patch)
                status.update(paused=True, savedReplicas=step.save, replicas=0)
                notes.append(Note("AutoscalerPaused", f"{namespace}/{name} held at 0 (was {step.save})"))
            case Restore():
                patch = {
                    "metadata": {"annotations": {PAUSED_ANNOTATION: None}},
                    "spec": {"replicas": step.replicas},
                }
                await self.api.patch(DEPLOYMENTS, namespace, name, patch)
                status.update(paused=False, savedReplicas=None, replicas=step.replicas)
                notes.append(
                    Note("AutoscalerRestored", f"{namespace}/{name} back to {step.replicas} replica(s)")
                )
            case _:
                status.update(paused=o.saved is not None, savedReplicas=o.saved, replicas=replicas)
        exists = o.deployment_exists
        reason = "AsExpected" if exists else "DeploymentMissing"
        message = "" if exists else f"Deployment {namespace}/{name} not found"
        status["conditions"] = set_condition(
            status.get("conditions"), "Degraded", not exists, reason, message, objects.generation(raw),
            self.clock.now(),
        )  # fmt: skip
        await record(self.api, STRATEGIES, raw, status, self.manager.events, notes=notes)
        return Result(requeue_after=30.0)


def _all(reconciler: AutoscalingReconciler) -> Any:
    def keys(_obj: dict[str, Any]) -> list[str]:
        return [objects.key(s) for s in reconciler.strategies.list()]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = AutoscalingReconciler(manager, deps)
    controller = Controller("autoscalingstrategy", STRATEGIES, reconciler.reconcile, workers=1)
    controller.watch(NODEIMAGES, _all(reconciler))
    manager.add_controller(controller)
