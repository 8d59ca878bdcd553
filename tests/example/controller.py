"""A tiny controller on the runtime, for the runtime's own tests.

An Example owns a ConfigMap ``<name>-mirror`` holding its message (upper-cased in
mode ``upper``); its status says Ready. The annotation ``example.kustos.dev/fail``
makes reconciles fail (to watch the backoff); a validating webhook refuses
messages that contain "forbidden". Concurrent reconciles of one key are counted
in ``example_concurrent_reconciles_total``, which must stay 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import Counter

from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.events import NORMAL
from kustos.runtime.informer import ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.resources import CONFIGMAPS
from kustos.runtime.webhook import AdmissionResponse, Webhook

EXAMPLES = ResourceRef("example.kustos.dev", "v1alpha1", "examples", "Example")
FAIL_ANNOTATION = "example.kustos.dev/fail"


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
        await asyncio.sleep(0.01)  # long enough for overlaps to show, were the queue to allow them
        meta = example["metadata"]
        if (meta.get("annotations") or {}).get(FAIL_ANNOTATION) == "true":
            raise RuntimeError("asked to fail by annotation")
        spec = example.get("spec") or {}
        message = spec.get("message", "")
        if spec.get("mode") == "upper":
            message = message.upper()
        mirror = {
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
        await self.manager.api.apply(CONFIGMAPS, mirror)
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
