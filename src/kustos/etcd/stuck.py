"""Why a pod the etcd family made cannot start or run, in plain words with the next step
(pure: the pod, its claim, its Warning events and the time in; a ``Stuck`` or None out; but
``volume_stuck``, which reads the events of a pod whose volumes are not mounted).

Without this a member whose image cannot be pulled reads "seed member latest-0 is
starting" forever. What the kubelet, the scheduler and the volume controller already said
is in the objects: a container's waiting reason, the PodScheduled condition's message, the
claim's phase; the attach-detach controller and the kubelet say why a volume does not
attach or mount only in Events on the pod (FailedAttachVolume, FailedMount). A short grace
keeps a moment's state (a scheduler retry while a node comes up, a claim a provisioner is
about to bind) out of the conditions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from kustos.images import pull_advice
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import EVENTS
from kustos.runtime.times import parse_rfc3339

Obj = Mapping[str, Any]

IMAGE_PULL = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
# Unschedulable or a Pending claim for this long is not a scheduler's retry or a provisioner
# about to bind.
PENDING_GRACE = timedelta(seconds=10)
# One restart can be a member racing its own addition; a second is a crash loop.
CRASH_RESTARTS = 2
LOG_LINES = 5
LOG_TAIL = 400  # lines read from a crashing container's log to find LOG_LINES that say why

# The Warning events that say a scheduled pod's volume did not attach (the attach-detach
# controller) or mount (the kubelet), and the reason each is said with.
VOLUME_EVENTS = {"FailedAttachVolume": "VolumeAttachFailed", "FailedMount": "VolumeMountFailed"}

# NoSpareNode: an Unschedulable replacement of a member leaving a draining node (status.py).
REASONS = (
    "ImagePullFailed", "CrashLoopBackOff", "Unschedulable", "VolumePending", *VOLUME_EVENTS.values(),
    "NoSpareNode",
)  # fmt: skip


@dataclass(frozen=True)
class Stuck:
    pod: str
    reason: str  # one of REASONS
    message: str  # what is wrong and what to do, naming the pod
    container: str = ""  # CrashLoopBackOff: whose log the controller adds (``with_log``)
    # CrashLoopBackOff while the next try runs: the crash's log is its previous run's.
    previous_log: bool = field(default=False, compare=False)


def classify(pod: Obj, claim: Obj | None, now: datetime, what: str = "member pod") -> Stuck | None:
    """Why ``pod`` cannot start or run (``claim``: the PersistentVolumeClaim it mounts, if any)."""
    if objects.deleting(pod):
        return None
    name = objects.name(pod)
    status = pod.get("status") or {}
    # A restore's seed runs its fetch and restore as init containers: they are said the same way.
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in IMAGE_PULL:
            detail = waiting.get("message") or reason
            image = str(container.get("image", ""))
            # A member's image is spec.repository at spec.version: say whether that repository
            # has every release, and which one does.
            advice = pull_advice(image.rsplit(":", 1)[0]) if what == "member pod" else (
                "check that the nodes can reach the registry")  # fmt: skip
            return Stuck(name, "ImagePullFailed", (
                f"{what} {name} cannot pull image {image} ({reason}: {detail}); {advice}"
            ))  # fmt: skip
        ended_with = crash_exit(container, now)
        if ended_with is not None:
            code = ended_with.get("exitCode")
            ended = f"exit code {code}, " if code is not None else ""
            # No restart count in the message: it would make every restart news (an Event, a write).
            return Stuck(name, "CrashLoopBackOff", (
                f"{what} {name} keeps crashing ({ended}restarted {CRASH_RESTARTS} times or more); "
                f"check spec.extraArgs and `kubectl logs {name} --previous`"
            ), container=str(container.get("name") or ""),
               previous_log="running" in (container.get("state") or {}))  # fmt: skip
    if status.get("phase", "Pending") != "Pending" or objects.pod_node(pod):
        return None
    if claim is not None and (claim.get("status") or {}).get("phase", "Pending") == "Pending":
        created = parse_rfc3339((claim.get("metadata") or {}).get("creationTimestamp"))
        if created is not None and now - created >= PENDING_GRACE:
            claim_name = objects.name(claim)
            storage_class = (claim.get("spec") or {}).get("storageClassName") or "the default class"
            return Stuck(name, "VolumePending", (
                f"{what} {name} waits for its volume {claim_name}, which is Pending (storage class "
                f"{storage_class}): check that the class exists and its provisioner runs "
                f"(`kubectl describe pvc {claim_name}`), or set spec.storage.storageClassName"
            ))  # fmt: skip
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if (
        scheduled is not None
        and scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
    ):
        since = parse_rfc3339(scheduled.get("lastTransitionTime"))
        if since is not None and now - since >= PENDING_GRACE:
            said = (scheduled.get("message") or "no node fits").rstrip(".")
            return Stuck(name, "Unschedulable", (
                f"{what} {name} cannot be scheduled: {said}; add or free nodes that match "
                "spec.pod (nodeSelector, tolerations, affinity, resources), or relax it"
            ))  # fmt: skip
    return None


def crash_exit(container: Obj, now: datetime) -> Obj | None:
    """The ``terminated`` record of a crash loop's last crash, or None if ``container`` is not
    in one. Between two back-offs the kubelet reports the crash itself (``terminated``) and then
    a few moments of the next try (``running``): both are the same loop, or the STUCK column and
    the Degraded condition would blink at every restart."""
    if int(container.get("restartCount") or 0) < CRASH_RESTARTS:
        return None
    state = container.get("state") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    if ((state.get("waiting") or {}).get("reason")) == "CrashLoopBackOff":
        return last
    terminated = state.get("terminated")
    if terminated is not None:
        return terminated if terminated.get("exitCode") != 0 else None
    running = state.get("running")
    if running is None or container.get("ready") or not last or last.get("exitCode") == 0:
        return None
    started = parse_rfc3339(running.get("startedAt"))
    return last if started is not None and now - started < PENDING_GRACE else None


def waiting_for_volumes(pod: Obj, now: datetime) -> bool:
    """Scheduled, yet its sandbox not made for PENDING_GRACE: the kubelet attaches and mounts a
    pod's volumes before it makes the sandbox (PodReadyToStartContainers) and pulls images, so
    this is a volume (or the pod network) that is not ready."""
    status = pod.get("status") or {}
    if objects.deleting(pod) or not objects.pod_node(pod) or status.get("phase", "Pending") != "Pending":
        return False
    sandbox = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "PodReadyToStartContainers"), None
    )
    if sandbox is None or sandbox.get("status") != "False":
        return False
    since = parse_rfc3339(sandbox.get("lastTransitionTime"))
    return since is not None and now - since >= PENDING_GRACE


def volume_failure(pod: Obj, events: Sequence[Obj], what: str = "member pod") -> Stuck | None:
    """The newest FailedAttachVolume or FailedMount event of ``pod``, said with the next step."""
    said = [e for e in events if e.get("type") == "Warning" and e.get("reason") in VOLUME_EVENTS]
    if not said:
        return None
    latest = max(said, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    name, node = objects.name(pod), objects.pod_node(pod)
    message = str(latest.get("message") or latest["reason"]).strip().rstrip(".")
    if latest["reason"] == "FailedAttachVolume":
        return Stuck(name, "VolumeAttachFailed", (
            f"{what} {name} cannot start: its volume does not attach to node {node} ({message}); "
            "check the volume's CSI driver (its controller and attacher), that the volume is in the "
            f"node's zone and not attached elsewhere (`kubectl get volumeattachments`)"
        ))  # fmt: skip
    return Stuck(name, "VolumeMountFailed", (
        f"{what} {name} cannot start: its volume does not mount on node {node} ({message}); "
        f"check the volume's driver on {node} and the PersistentVolume (`kubectl describe pod {name}`)"
    ))  # fmt: skip


async def volume_stuck(api: Api, pod: Obj, now: datetime, what: str = "member pod") -> Stuck | None:
    """``volume_failure`` of a pod ``waiting_for_volumes``, from its Warning events (None while
    it waits for no such reason, or when the events cannot be read)."""
    if not waiting_for_volumes(pod, now):
        return None
    selector = f"involvedObject.uid={objects.uid(pod)},type=Warning"
    try:
        events = await api.list_objects(EVENTS, objects.namespace(pod), field_selector=selector)
    except ReconcileError:
        return None
    return volume_failure(pod, events, what)


# Lines that say why a process stopped; etcd prints a bad flag's error first, then its whole
# usage text, and a fatal start error as a JSON line with "level":"fatal".
TELLING = re.compile(r"error|fatal|panic|not defined|invalid|failed|cannot|unknown", re.IGNORECASE)


def with_log(stuck: Stuck, log: str) -> Stuck:
    """A crash loop's message with the last lines its container printed that say why
    (the last lines at all when none does)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    telling = [line for line in lines if TELLING.search(line)]
    lines = (telling or lines)[-LOG_LINES:]
    if not lines:
        return stuck
    tail = " | ".join(line[:300] for line in lines)
    return replace(stuck, message=f"{stuck.message}; last log lines: {tail}")


def summary(stuck: tuple[Stuck, ...] | list[Stuck]) -> str:
    return "; ".join(s.message for s in stuck)[:1000]
