"""Envoy restarts (SPEC F-MAINT, issue #16 item 5): the planner. Pure: no I/O, no clock.

Contour's Envoy pods can get stuck with the envoy container running but never ready again
(a known issue under resource contention: EKCO, seed 004, "Contour"). The kubelet does not
restart a container for failing its readiness probe, only for its liveness probe, so such a
pod stays up and useless. Like EKCO, kustos deletes an Envoy pod whose envoy container has been
not ready for longer than ``envoyPodsNotReadyDuration`` while the pod itself is running, so its
DaemonSet or Deployment starts a fresh one. Unlike EKCO:

- the not-ready time is kustos's own record, an annotation on the pod
  (``kustos.dev/envoy-not-ready-since``), written the first time kustos sees the container not
  ready, so a restarted operator (or a new leader) keeps counting instead of starting over,
  and a pod whose other containers flap is not judged by the pod-wide ContainersReady time;
  a container that restarted meanwhile counts from its own start;
- one pod at a time: no pod is deleted while another selected pod is still terminating, so a
  fleet-wide problem (a bad configuration every Envoy rejects) never takes all of them down at
  once;
- the pod is deleted with its own grace period (EKCO forces 0), so Contour's shutdown-manager
  can drain it; a not-ready Envoy receives no traffic anyway;
- a pod on a lost node is left alone: its status is stale and its kubelet cannot act
  (clearing such pods is the node-maintenance controller's job).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kustos.runtime import objects
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_rfc3339

NOT_READY_ANNOTATION = "kustos.dev/envoy-not-ready-since"
"""RFC 3339 time kustos first saw the pod's envoy container not ready (removed once ready)."""

TERMINATING_RECHECK = 5.0  # seconds between looks while a restarted pod is still terminating
MAX_WAIT = 300.0  # a deadline further away is looked at again after this, in case the clock jumped

# A label key (optional DNS prefix, then a name) and value, as Kubernetes validates them.
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")


class SelectorError(ValueError):
    """The policy's envoyPodSelector cannot be parsed (the message names the field)."""


def parse_selector(text: str) -> dict[str, str]:
    """``app=envoy,tier=edge`` (``==`` also accepted) -> labels every selected pod carries."""
    result: dict[str, str] = {}
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise SelectorError(f"spec.envoyPodSelector: {text!r} is not key=value[,key=value]")
    for part in parts:
        key, sep, value = part.partition("==") if "==" in part else part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or "!" in key or "=" in value:
            raise SelectorError(
                f"spec.envoyPodSelector: {part!r} is not key=value (only equality is supported)"
            )
        if not _KEY.match(key):
            raise SelectorError(f"spec.envoyPodSelector: {key!r} is not a valid label key")
        if not _VALUE.match(value):
            raise SelectorError(f"spec.envoyPodSelector: {value!r} is not a valid label value")
        result[key] = value
    return result


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class EnvoyPod:
    """What the planner needs of one selected pod."""

    namespace: str
    name: str
    uid: str
    running: bool
    """Phase Running and not being deleted."""
    deleting: bool
    node_lost: bool = False
    has_container: bool = True
    """The pod has a container of the policy's envoyContainerName."""
    container_running: bool = False
    container_ready: bool = False
    container_started: datetime | None = None
    """When the current incarnation of the envoy container started."""
    marked: datetime | None = None
    """The annotation's time; None when absent or unreadable."""
    annotated: bool = False
    """The annotation is present (readable or not)."""
    selected: bool = True
    """The pod matches the selector (False: an annotated pod no longer selected)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def stuck(self) -> bool:
        """Counting: the pod runs on a live node and its envoy container runs, not ready."""
        return (
            self.selected
            and self.running
            and not self.node_lost
            and self.has_container
            and self.container_running
            and not self.container_ready
        )

    def not_ready_since(self) -> datetime | None:
        """Since when the current container has been not ready, as far as kustos knows."""
        if self.marked is None:
            return None
        if self.container_started is not None and self.container_started > self.marked:
            return self.container_started
        return self.marked


@dataclass(frozen=True)
class Observed:
    enabled: bool
    duration: timedelta
    pods: tuple[EnvoyPod, ...]
    now: datetime
    selector_error: str | None = None
    container: str = "envoy"


# ---- steps -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """Record on the pod that its envoy container is not ready, from ``since`` on."""

    pod: EnvoyPod
    since: datetime


@dataclass(frozen=True)
class Unmark:
    """The envoy container is ready again (or the annotation is unreadable): remove the record."""

    pod: EnvoyPod


@dataclass(frozen=True)
class Restart:
    """Delete the pod: its envoy container has been not ready for ``not_ready_for``."""

    pod: EnvoyPod
    not_ready_for: timedelta


@dataclass(frozen=True)
class Invalid:
    """The policy cannot be acted on; ``message`` names the field."""

    message: str


Step = Mark | Unmark | Restart | Invalid | Wait | Done


def describe(delta: timedelta) -> str:
    """``5m3s``, ``1h0m5s``, ``12s``: Go's style, whole seconds."""
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def plan(o: Observed) -> Step:
    """The one thing to do now; bookkeeping (marks) before restarts, one restart at a time."""
    if not o.enabled:
        return Done()
    if o.selector_error:
        return Invalid(o.selector_error)
    pods = sorted(o.pods, key=lambda p: p.key)
    for pod in pods:
        if pod.stuck and pod.marked is None:
            return Mark(pod, o.now)
        if (
            pod.annotated
            and not pod.deleting
            and (not pod.selected or pod.container_ready or pod.marked is None)
        ):
            return Unmark(pod)
    due: list[tuple[datetime, EnvoyPod]] = []
    for pod in pods:
        since = pod.not_ready_since()
        if pod.stuck and since is not None:
            due.append((since + o.duration, pod))
    if not due:
        return Done()
    due.sort(key=lambda item: (item[0], item[1].key))
    deadline, first = due[0]
    if deadline <= o.now:
        terminating = [p.key for p in pods if p.deleting]
        if terminating:
            return Wait(
                f"envoy pod {terminating[0]} is still terminating; one restart at a time",
                TERMINATING_RECHECK,
            )
        since = first.not_ready_since() or o.now
        return Restart(first, o.now - since)
    seconds = (deadline - o.now).total_seconds()
    return Wait(
        f"envoy container of {first.key} not ready; restarted in {describe(deadline - o.now)} "
        "unless it recovers",
        min(max(seconds, 1.0), MAX_WAIT),
    )


def event_message(step: Restart, container: str, duration: timedelta) -> str:
    return (
        f"container {container} of pod {step.pod.key} not ready for "
        f"{describe(step.not_ready_for)} (envoyPodsNotReadyDuration {describe(duration)}) while the "
        "pod runs: deleted so that its controller starts a fresh one"
    )


# ---- reading pods -----------------------------------------------------------------------------


def _parse_time(text: str | None) -> datetime | None:
    try:
        moment = parse_rfc3339(text)
    except ValueError:
        return None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def envoy_pod(pod: Mapping[str, Any], container: str, node_lost: bool) -> EnvoyPod:
    """The planner's view of a pod (a cache dict)."""
    status = pod.get("status") or {}
    statuses = {s.get("name"): s for s in status.get("containerStatuses") or []}
    spec_names = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
    mine = statuses.get(container) or {}
    running_state = (mine.get("state") or {}).get("running")
    annotation = objects.annotations(pod).get(NOT_READY_ANNOTATION)
    deleting = objects.deleting(pod)
    return EnvoyPod(
        namespace=objects.namespace(pod) or "",
        name=objects.name(pod),
        uid=objects.uid(pod) or "",
        running=status.get("phase") == "Running" and not deleting,
        deleting=deleting,
        node_lost=node_lost,
        has_container=container in spec_names,
        container_running=running_state is not None,
        container_ready=bool(mine.get("ready")),
        container_started=_parse_time((running_state or {}).get("startedAt")),
        marked=_parse_time(annotation),
        annotated=annotation is not None,
    )


__all__ = [
    "NOT_READY_ANNOTATION",
    "EnvoyPod",
    "Invalid",
    "Mark",
    "Observed",
    "Restart",
    "SelectorError",
    "Step",
    "Unmark",
    "describe",
    "envoy_pod",
    "event_message",
    "matches",
    "parse_selector",
    "plan",
]
