"""The AutoscalingStrategy controller (see planner): pause and restore the cluster-autoscaler."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kustos.api.autoscaling import PAUSED_ANNOTATION, AutoscalingStrategy
from kustos.api.nodeimage import NodeImage
from kustos.nodes.autoscaling import planner
from kustos.nodes.autoscaling.planner import Observed, Pause, Restore, Step
from kustos.runtime import objects
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note
from kustos.runtime.resources import DEPLOYMENTS

STRATEGIES = AutoscalingStrategy.crd.ref
NODEIMAGES = NodeImage.crd.ref
RESYNC = 30.0
Obj = dict[str, Any]


class AutoscalingReconciler(FamilyReconciler[AutoscalingStrategy, Observed, Step]):
    model = AutoscalingStrategy

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.cloud = deps.cloud
        self.strategies = self.cache
        self.images = manager.informer(NODEIMAGES)

    async def observe(self, obj: AutoscalingStrategy, now: datetime) -> Observed:
        spec = obj.spec
        deployment = await self.api.get(DEPLOYMENTS, spec.deployment_namespace, spec.deployment_name)
        saved_text = objects.annotations(deployment).get(PAUSED_ANNOTATION) if deployment else None
        return Observed(
            enabled=spec.enabled,
            rolling_out=bool(planner.in_flight(self.images.list(), provider=self.cloud is not None)),
            deployment_exists=deployment is not None,
            replicas=int(((deployment or {}).get("spec") or {}).get("replicas", 1)),
            saved=int(saved_text) if saved_text and saved_text.isdigit() else None,
            deployment=f"{spec.deployment_namespace}/{spec.deployment_name}",
            previous=obj.status.model_dump(by_alias=True, exclude_none=True) if obj.status else {},
            generation=objects.generation(obj),
        )

    def plan(self, observed: Observed) -> Step:
        return planner.plan(observed)

    async def act(self, obj: AutoscalingStrategy, observed: Observed, step: Step, notes: list[Note]) -> Step:
        namespace, name = obj.spec.deployment_namespace, obj.spec.deployment_name
        match step:
            case Pause():
                # One patch: the saved replicas and the 0 land together.
                patch = {
                    "metadata": {"annotations": {PAUSED_ANNOTATION: str(step.save)}},
                    "spec": {"replicas": 0},
                }
                await self.api.patch(DEPLOYMENTS, namespace, name, patch)
                notes.append(Note("AutoscalerPaused", f"{namespace}/{name} held at 0 (was {step.save})"))
            case Restore():
                patch = {
                    "metadata": {"annotations": {PAUSED_ANNOTATION: None}},
                    "spec": {"replicas": step.replicas},
                }
                await self.api.patch(DEPLOYMENTS, namespace, name, patch)
                notes.append(
                    Note("AutoscalerRestored", f"{namespace}/{name} back to {step.replicas} replica(s)")
                )
        return step

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        return RESYNC


def _all(reconciler: AutoscalingReconciler) -> Any:
    def keys(_obj: dict[str, Any]) -> list[str]:
        return [objects.key(s) for s in reconciler.strategies.list()]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = AutoscalingReconciler(manager, deps)
    controller = Controller("autoscalingstrategy", STRATEGIES, reconciler.reconcile, workers=1)
    controller.watch(NODEIMAGES, _all(reconciler))
    manager.add_controller(controller)
