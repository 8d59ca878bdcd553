"""A tiny controller on the runtime, for the runtime's own tests.

An Example owns a ConfigMap ``<name>-mirror`` holding its message (upper-cased in
mode ``upper``); its status says Ready. The annotation ``example.kustos.dev/fail``
makes reconciles fail (to watch the backoff); a validating webhook refuses
messages that contain "forbidden". Concurrent reconciles of one key are counted
in ``example_concurrent_reconciles_total``, which must stay 0.

Examples labelled ``example.kustos.dev/base`` belong instead to ``example-base``, the same
job written on the reconciler base (``runtime/reconciler.py``): its model refuses a message
"invalid" (which the CRD schema lets through), and with the fail annotation its act step
fails after recording a new attempt number in status each pass, as an EtcdCluster whose pod
the API server refuses records a new member index.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import Counter
from pydantic import field_validator

from kustos.runtime import objects
from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result
from kustos.runtime.crd import CustomResource
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL
from kustos.runtime.informer import InformerOptions, ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note
from kustos.runtime.resources import CONFIGMAPS
from kustos.runtime.webhook import AdmissionResponse, Webhook
from tests.example.api import Example, ExampleSpec, ExampleStatus

EXAMPLES = ResourceRef("example.kustos.dev", "v1alpha1", "examples", "Example")
FAIL_ANNOTATION = "example.kustos.dev/fail"
BASE_LABEL = "example.kustos.dev/base"


class ExampleReconciler:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.examples = manager.informer(EXAMPLES)
        self.active: set[str] = set()
        self.overlaps = Counter(
            "example_concurrent_reconciles",
            "Reconciles of a key that started while another of the same key ran",
            registry=manager.metrics.registry,
        )

    async def reconcile(self, key: str) -> Result | None:
        if key in self.active:
            self.overlaps.inc()
        self.active.add(key)
        try:
            return await self._reconcile(key)
        finally:
            self.active.discard(key)

    async def _reconcile(self, key: str) -> Result | None:
        example = self.examples.get(key)
        if example is None or example["metadata"].get("deletionTimestamp"):
            return None  # the garbage collector removes what it owned
        if (example["metadata"].get("labels") or {}).get(BASE_LABEL):
            return None  # example-base's
        await asyncio.sleep(0.01)  # long enough for overlaps to show, were the queue to allow them
        meta = example["metadata"]
        if (meta.get("annotations") or {}).get(FAIL_ANNOTATION) == "true":
            raise RuntimeError("asked to fail by annotation")
        await self.manager.api.apply(CONFIGMAPS, mirror_of(example))
        status: dict[str, Any] = dict(example.get("status") or {})
        status["phase"] = "Ready"
        status["ready"] = "1/1"
        status["conditions"] = set_condition(
            status.get("conditions"), "Available", True, "MirrorApplied", "the mirror ConfigMap is current",
            meta.get("generation"),
        )  # fmt: skip
        status["observedGeneration"] = meta.get("generation")
        if status != (example.get("status") or {}):
            await self.manager.api.replace_status(EXAMPLES, example, status)
            await self.manager.events.record(example, NORMAL, "Synced", "mirror ConfigMap applied")
        return None


def mirror_of(example: dict[str, Any]) -> dict[str, Any]:
    meta = example["metadata"]
    spec = example.get("spec") or {}
    message = spec.get("message", "")
    if spec.get("mode") == "upper":
        message = message.upper()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{meta['name']}-mirror",
            "namespace": meta["namespace"],
            "labels": dict(spec.get("labels") or {}),
            "ownerReferences": [
                {
                    "apiVersion": EXAMPLES.api_version,
                    "kind": EXAMPLES.kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": {"message": message, "replicas": str(spec.get("replicas", 1))},
    }


class StrictSpec(ExampleSpec):
    @field_validator("message")
    @classmethod
    def _not_invalid(cls, message: str) -> str:
        if message == "invalid":
            raise ValueError("the message 'invalid' is refused by the model, not by the CRD schema")
        return message


class StrictExample(CustomResource[StrictSpec, ExampleStatus]):
    crd = Example.crd


@dataclass(frozen=True)
class Seen:
    attempts: int
    fail: bool
    generation: int | None


def _attempts(phase: str | None) -> int:
    prefix = "Attempt "
    return int(phase[len(prefix) :]) if phase and phase.startswith(prefix) else 0


class BaseExampleReconciler(FamilyReconciler[StrictExample, Seen, str]):
    """The example's job on the reconciler base: observe, plan, act, status and nothing else."""

    model = StrictExample
    failure_condition = "Available"
    failure_status = False

    async def observe(self, obj: StrictExample, now: datetime) -> Seen:
        fail = objects.annotations(obj).get(FAIL_ANNOTATION) == "true"
        phase = obj.status.phase if obj.status else None
        return Seen(_attempts(phase), fail, objects.generation(obj))

    def plan(self, observed: Seen) -> str:
        return "ApplyMirror"

    async def act(self, obj: StrictExample, observed: Seen, step: str, notes: list[Note]) -> str:
        if observed.fail:
            raise ReconcileError("the mirror was refused (asked by annotation)", "MirrorRefused")
        await self.api.apply(CONFIGMAPS, mirror_of(obj.model_dump(by_alias=True, mode="json")))
        return step

    def status(
        self, observed: Seen, step: str, now: datetime, failure: ReconcileError | None
    ) -> dict[str, Any]:
        if failure is not None:  # a new value each failed pass, as a reserved member index is
            conditions = set_condition(None, "Available", False, failure.reason, failure.message,
                                       observed.generation, now)  # fmt: skip
            return {"phase": f"Attempt {observed.attempts + 1}", "ready": "0/1", "conditions": conditions}
        message = "the mirror ConfigMap is current"
        generation = observed.generation
        conditions = set_condition(None, "Available", True, "MirrorApplied", message, generation, now)
        return {"phase": "Ready", "ready": "1/1", "conditions": conditions}


async def validate(request: dict[str, Any]) -> AdmissionResponse:
    message = ((request.get("object") or {}).get("spec") or {}).get("message", "")
    if "forbidden" in message:
        return AdmissionResponse.deny("spec.message must not contain the word 'forbidden'")
    return AdmissionResponse.allow()


GHOSTS = ResourceRef("example.kustos.dev", "v1alpha1", "ghosts", "Ghost")


def register_unsyncable(manager: Manager, deps: Deps) -> None:
    """A controller of a resource the API server does not serve: its cache never syncs."""

    async def nothing(_: str) -> None:
        return None

    manager.add_controller(Controller("ghost", GHOSTS, nothing))


def register(manager: Manager, deps: Deps) -> None:
    reconciler = ExampleReconciler(manager)
    controller = Controller("example", EXAMPLES, reconciler.reconcile, workers=2)
    manager.add_controller(controller.owns(CONFIGMAPS))
    only_base = InformerOptions(label_selector=BASE_LABEL)
    base = BaseExampleReconciler(manager, deps, manager.informer(EXAMPLES, only_base))
    manager.add_controller(Controller("example-base", EXAMPLES, base.reconcile, primary_options=only_base))
    manager.add_webhook(
        Webhook(
            name="vexample.example.kustos.dev",
            path="/validate-example",
            kind="validating",
            rules=[
                {
                    "operations": ["CREATE", "UPDATE"],
                    "apiGroups": [EXAMPLES.group],
                    "apiVersions": [EXAMPLES.version],
                    "resources": [EXAMPLES.plural],
                }
            ],
            handler=validate,
        )
    )
