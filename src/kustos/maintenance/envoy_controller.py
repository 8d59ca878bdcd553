"""The Envoy restart controller (``envoyrestart``): observe, plan (``envoy.plan``), act one step.

One key, ``default``: the MaintenancePolicy of that name (absent: the defaults) says whether
Envoy restarts are on, which pods are Envoy pods and how long their envoy container may stay
not ready. A change to a selected pod, or to the policy, wakes it; a pending deadline is a
re-queue. What it counts lives on the pods (``envoy.NOT_READY_ANNOTATION``), written with the
pod's resourceVersion as a precondition so a stale cache never restarts the count.

It records no status (``policy_follower``: the policy's status belongs to the node-maintenance
controller, and the policy may be absent). What it does is an Event on the pod and one on the
policy (when there is one); unusable settings are a Warning Event on the policy and a
``TerminalError`` (the policy's next change wakes it).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.maintenance import POLICY_NAME, MaintenancePolicy, MaintenancePolicySpec
from kustos.maintenance import envoy
from kustos.maintenance.policy_follower import PolicyFollower
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError, TerminalError
from kustos.runtime.events import WARNING
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note
from kustos.runtime.resources import NODES, PODS
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_duration, rfc3339

log = logging.getLogger(__name__)

POLICIES = MaintenancePolicy.crd.ref
NAME = "envoyrestart"
AFTER_STEP = 0.2  # seconds: the next pass after a step, once the watch has shown its effect


class EnvoyRestartReconciler(PolicyFollower[envoy.Observed, envoy.Step]):
    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.policies = self.cache
        self.pods = manager.informer(PODS)
        self.nodes = manager.informer(NODES)
        self.restarted: str | None = None
        """The uid of the pod deleted last: until the cache shows it terminating (or gone), it
        counts as terminating, so a lagging cache never lets a second restart through."""

    def selector(self) -> dict[str, str] | None:
        """The Envoy pod selector of the policy as cached (None: unusable), for the pod watch."""
        raw = self.policies.get(POLICY_NAME)
        try:
            spec = MaintenancePolicy.model_validate(raw).spec if raw is not None else MaintenancePolicySpec()
            return envoy.parse_selector(spec.envoy_pod_selector)
        except (ValidationError, envoy.SelectorError):
            return None

    async def observe(self, policy: MaintenancePolicy, now: datetime) -> envoy.Observed:
        spec = policy.spec
        enabled = not spec.should_disable_restart_failed_envoy_pods
        problem = None
        try:
            selector = envoy.parse_selector(spec.envoy_pod_selector)
        except envoy.SelectorError as err:
            problem = str(err)
            selector = {}
        pods: list[envoy.EnvoyPod] = []
        if problem is None and enabled:
            for pod in self.pods.list():
                if not envoy.matches(selector, objects.labels(pod)):
                    if envoy.NOT_READY_ANNOTATION in objects.annotations(pod):
                        # No longer selected (relabelled, or the selector changed): forget it.
                        view = envoy.envoy_pod(pod, spec.envoy_container_name, False)
                        pods.append(replace(view, selected=False))
                    continue
                node = objects.pod_node(pod)
                lost = node is not None and objects.node_lost(self.nodes.get(node))
                view = envoy.envoy_pod(pod, spec.envoy_container_name, lost)
                if view.uid == self.restarted and not view.deleting:
                    view = replace(view, deleting=True, running=False)
                pods.append(view)
        return envoy.Observed(
            enabled=enabled,
            duration=parse_duration(spec.envoy_pods_not_ready_duration),
            pods=tuple(pods),
            now=now,
            selector_error=problem,
            container=spec.envoy_container_name,
        )

    def plan(self, observed: envoy.Observed) -> envoy.Step:
        return envoy.plan(observed)

    async def act(
        self, policy: MaintenancePolicy, observed: envoy.Observed, step: envoy.Step, notes: list[Note]
    ) -> envoy.Step:
        match step:
            case Done():
                pass
            case Wait(reason=reason, seconds=seconds):
                log.debug("waiting %.0fs: %s", seconds, reason)
            case envoy.Invalid(message=message):
                raise TerminalError(f"envoy restarts: {message}", "InvalidEnvoySettings")
            case envoy.Mark(pod=pod, since=since):
                await self._annotate(pod, rfc3339(since))
            case envoy.Unmark(pod=pod):
                await self._annotate(pod, None)
            case envoy.Restart():
                await self._restart(step, observed, notes)
        return step

    def requeue_after(self, observed: envoy.Observed, step: envoy.Step) -> float | None:
        match step:
            case Done():
                return None
            case Wait(seconds=seconds):
                return seconds
        return AFTER_STEP

    # ---- act ---------------------------------------------------------------------------

    async def _annotate(self, pod: envoy.EnvoyPod, value: str | None) -> None:
        raw = self.pods.get(pod.key)
        if raw is None:
            return
        # uid and resourceVersion are preconditions: a stale cache gets a 409, not a reset count.
        patch = {
            "metadata": {
                "uid": pod.uid,
                "resourceVersion": objects.resource_version(raw),
                "annotations": {envoy.NOT_READY_ANNOTATION: value},
            }
        }
        try:
            await self.api.patch(PODS, pod.namespace, pod.name, patch)
        except ApiStatusError as err:
            if err.not_found:
                return
            raise
        log.info("step: %s %s", "Mark" if value else "Unmark", pod.key)

    async def _restart(self, step: envoy.Restart, observed: envoy.Observed, notes: list[Note]) -> None:
        pod = step.pod
        raw = self.pods.get(pod.key)
        message = envoy.event_message(step, observed.container, observed.duration)
        log.info("step: RestartEnvoy %s (%s)", pod.key, message)
        try:
            deleted = await self.api.delete(PODS, pod.namespace, pod.name, uid=pod.uid)
        except ApiStatusError as err:
            if err.conflict:  # another incarnation of the name: look again
                return
            raise ReconcileError(f"deleting envoy pod {pod.key}: {err.message}", "RestartFailed") from err
        if not deleted:
            return
        self.restarted = pod.uid
        if raw is not None:
            await self.manager.events.record(raw, WARNING, "EnvoyRestarted", message)
        notes.append(Note("EnvoyRestarted", message))  # on the policy, when there is one


def register(manager: Manager, deps: Deps) -> None:
    reconciler = EnvoyRestartReconciler(manager, deps)

    def pod_keys(pod: dict[str, Any]) -> list[str]:
        """Selected pods, and pods kustos annotated, wake the one key."""
        if envoy.NOT_READY_ANNOTATION in objects.annotations(pod):
            return [POLICY_NAME]
        selector = reconciler.selector()
        if selector is not None and envoy.matches(selector, objects.labels(pod)):
            return [POLICY_NAME]
        return []

    controller = Controller(NAME, POLICIES, reconciler.reconcile)
    controller.watch(PODS, pod_keys)
    controller.watch(NODES, lambda _node: [])  # read for node_lost: synced before the first pass
    manager.add_controller(controller)


__all__ = ["NAME", "EnvoyRestartReconciler", "register"]
