"""Rotation of kubeadm's control-plane certificates (EKCO's ``rotateCerts``, SPEC F-MAINT-9), pure.

Every ``rotateCertsCheckInterval`` each kubeadm control-plane node (one whose kube-apiserver
static pod carries kubeadm's advertise-address annotation; kwok's or a managed control plane
has none, and nothing of theirs is renewed) gets a short-lived pod pinned to it, mounting the
node's /etc/kubernetes, that runs ``kustos maintenance certs`` (``certs_cli``): the
certificates within ``rotateCertsThreshold`` of expiry are renewed, the static pods restarted,
and the pod ends once the node's API server answers on its renewed certificate. The
controller then checks from its side that the API server answers on a certificate outside the
threshold, records the outcome on the Node (``CHECKED_ANNOTATION``) with an Event, deletes the
pod, and only then starts the next node: one node at a time, as EKCO, so that the API servers
never all restart together.

Here: the views, the node pod, the steps, ``plan`` and ``status``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from kustos.api.maintenance import CertificateRotationStatus, MaintenancePolicySpec
from kustos.runtime.times import parse_duration, parse_rfc3339, rfc3339

CHECKED_ANNOTATION = "kustos.dev/certificates-checked"
"""On each Node: JSON {time, outcome, message, pod} of its last check (one parser: ``Checked``)."""
TASK_LABEL = "kustos.dev/task"
TASK = "rotate-certs"
NODE_ANNOTATION = "kustos.dev/node"
KUBERNETES_DIR = "/etc/kubernetes"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""Where the renewal pod's command writes what it did or why it failed: the kubelet reports it
as the container's termination message, which the controller records."""
RENEWAL_TIMEOUT = timedelta(minutes=10)
"""A pod not finished by then failed (its node's API server never came back, an image pull)."""
RETRY_AFTER_FAILURE = timedelta(minutes=10)
"""A node whose check failed is tried again this soon (or at the check interval, if sooner)."""


@dataclass(frozen=True)
class Checked:
    """A node's last check, as its annotation holds it."""

    time: datetime
    outcome: Literal["Renewed", "Failed"]
    message: str
    pod: str = ""
    """The uid of the pod that did it: that pod is not recorded twice."""

    def text(self) -> str:
        return json.dumps({"time": rfc3339(self.time), "outcome": self.outcome, "message": self.message[:500],
                           "pod": self.pod}, sort_keys=True)  # fmt: skip

    @classmethod
    def parse(cls, text: str | None) -> Checked | None:
        """None for no annotation or one that cannot be read (the node is then due)."""
        try:
            data = json.loads(text or "")
            when = parse_rfc3339(data["time"])
            outcome = data["outcome"]
        except (ValueError, KeyError, TypeError):
            return None
        if when is None or outcome not in ("Renewed", "Failed"):
            return None
        return cls(when, outcome, str(data.get("message", "")), str(data.get("pod", "")))


@dataclass(frozen=True)
class ControlPlaneNode:
    name: str
    ready: bool
    apiserver: str | None
    """host:port from kubeadm's annotation on its kube-apiserver pod; None: not kubeadm's."""
    checked: Checked | None = None


@dataclass(frozen=True)
class RenewalPod:
    namespace: str
    name: str
    uid: str
    node: str
    phase: str
    message: str = ""
    """The container's termination message (the command's last line), or while it waits why."""
    created: datetime | None = None
    deleting: bool = False


@dataclass(frozen=True)
class CertRotationView:
    nodes: tuple[ControlPlaneNode, ...] = ()
    pods: tuple[RenewalPod, ...] = ()
    image: str = ""
    """The operator's own image: the pods run ``kustos``."""
    owner: Mapping[str, str] | None = None
    """The policy, as the pods' owner reference (apiVersion, kind, name, uid)."""


@dataclass(frozen=True)
class StartRenewal:
    """Create the renewal pod on ``node``."""

    node: str
    pod: dict[str, Any]


@dataclass(frozen=True)
class FinishRenewal:
    """Check the node's API server (when the pod succeeded), record on the Node, delete the pod."""

    pod: RenewalPod
    apiserver: str | None
    outcome: Literal["Renewed", "Failed"]
    message: str


@dataclass(frozen=True)
class RemoveRenewalPod:
    pod: RenewalPod
    why: str


CertStep = StartRenewal | FinishRenewal | RemoveRenewalPod


def pod_name(node: str) -> str:
    """kustos-rotate-certs-<node>, shortened with a digest when the node's name is long."""
    name = f"kustos-rotate-certs-{node}"
    if len(name) <= 63:
        return name
    return f"{name[:46]}-{hashlib.sha256(node.encode()).hexdigest()[:16]}"


def renewal_pod(
    spec: MaintenancePolicySpec, node: ControlPlaneNode, image: str, owner: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The pod that renews ``node``'s certificates: pinned by nodeName (every taint tolerated,
    as the static pods it restarts run there), owned by the policy ``owner`` (apiVersion, kind,
    name, uid), root for the files under /etc/kubernetes (not privileged: no capability is
    needed), no API access. Pod network: it reaches the API server where kubeadm advertises it
    (the operator's admission policy allows no host network)."""
    command = ["kustos", "maintenance", "certs", "--kubernetes-dir", KUBERNETES_DIR,
               "--threshold", spec.rotate_certs_threshold,
               "--summary-file", TERMINATION_MESSAGE_PATH]  # fmt: skip
    if node.apiserver:
        command += ["--apiserver", node.apiserver]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node.name),
            "namespace": spec.host_task_namespace,
            "labels": {TASK_LABEL: TASK, "app.kubernetes.io/managed-by": "kustos"},
            "annotations": {NODE_ANNOTATION: node.name},
            **({"ownerReferences": [dict(owner)]} if owner else {}),
        },
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {
                    "name": "renew",
                    "image": spec.host_task_image or image,
                    "command": command,
                    # root owns the files it rewrites: no capability beyond that is needed.
                    "securityContext": {"runAsUser": 0, "allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}},
                    "terminationMessagePath": TERMINATION_MESSAGE_PATH,
                    # A failure before the command could write its line (an import error): the log's end.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [{"name": "kubernetes", "mountPath": KUBERNETES_DIR}],
                }
            ],
            "volumes": [{"name": "kubernetes", "hostPath": {"path": KUBERNETES_DIR, "type": "Directory"}}],
        },
    }  # fmt: skip


def due(spec: MaintenancePolicySpec, node: ControlPlaneNode, now: datetime) -> bool:
    if node.checked is None:
        return True
    interval = parse_duration(spec.rotate_certs_check_interval)
    if node.checked.outcome == "Failed":
        interval = min(interval, RETRY_AFTER_FAILURE)
    return now - node.checked.time >= interval


def plan(spec: MaintenancePolicySpec, view: CertRotationView, now: datetime) -> CertStep | None:
    """The one step, or None (nothing due, or a renewal pod at work: its change wakes us)."""
    nodes = {n.name: n for n in view.nodes}
    pods = sorted(view.pods, key=lambda p: (p.node, p.name))
    for pod in pods:
        if pod.deleting:
            return None  # one at a time: the next node waits until this pod is gone
        node = nodes.get(pod.node)
        if not spec.rotate_certs:
            return RemoveRenewalPod(pod, "rotateCerts is off")
        if node is None or node.apiserver is None:
            return RemoveRenewalPod(pod, f"node {pod.node} is no longer a kubeadm control-plane node")
        if node.checked is not None and node.checked.pod == pod.uid:
            return RemoveRenewalPod(pod, "recorded on its node")
        if pod.phase == "Succeeded":
            return FinishRenewal(pod, node.apiserver, "Renewed", pod.message or "done")
        if pod.phase == "Failed":
            return FinishRenewal(pod, node.apiserver, "Failed", pod.message or "the renewal pod failed")
        if pod.created is not None and now - pod.created > RENEWAL_TIMEOUT:
            said = f": {pod.message}" if pod.message else ""
            late = f"the renewal pod did not finish in {RENEWAL_TIMEOUT} ({pod.phase}{said})"
            return FinishRenewal(pod, node.apiserver, "Failed", late)
        return None
    if not spec.rotate_certs:
        return None
    kubeadm = sorted((n for n in view.nodes if n.apiserver is not None and n.ready), key=lambda n: n.name)
    failed = [n for n in kubeadm if n.checked is not None and n.checked.outcome == "Failed"]
    if failed:
        # Only the failed node is retried: its API server may be down, so no other restarts now.
        return (
            StartRenewal(failed[0].name, renewal_pod(spec, failed[0], view.image, view.owner))
            if due(spec, failed[0], now)
            else None
        )
    for node in kubeadm:
        if due(spec, node, now):
            return StartRenewal(node.name, renewal_pod(spec, node, view.image, view.owner))
    return None


def next_check(spec: MaintenancePolicySpec, view: CertRotationView, now: datetime) -> timedelta | None:
    """How long until a node is due (None: no kubeadm control-plane node, or rotation off)."""
    if not spec.rotate_certs:
        return None
    waits = []
    for node in view.nodes:
        if node.apiserver is None or node.checked is None:
            continue
        interval = parse_duration(spec.rotate_certs_check_interval)
        if node.checked.outcome == "Failed":
            interval = min(interval, RETRY_AFTER_FAILURE)
        waits.append(max(timedelta(0), node.checked.time + interval - now))
    return min(waits) if waits else None


def describe(step: CertStep) -> tuple[str, str, str]:
    """(node, action, message) for the status's lastAction and the policy's Event."""
    match step:
        case StartRenewal(node, pod):
            return (
                node,
                "RotateCerts",
                f"started pod {pod['metadata']['name']} to renew what expires within the threshold",
            )
        case FinishRenewal(pod, _, "Renewed", message):
            return pod.node, "RotateCerts", f"{message}; the API server answers on its certificate"
        case FinishRenewal(pod, _, _, message):
            return pod.node, "RotateCerts", message if message.startswith("failed") else f"failed: {message}"
        case RemoveRenewalPod(pod, why):
            return pod.node, "RotateCertsCleanup", f"deleted pod {pod.namespace}/{pod.name}: {why}"
    raise AssertionError(step)


def status(
    spec: MaintenancePolicySpec, view: CertRotationView, now: datetime
) -> CertificateRotationStatus | None:
    if not spec.rotate_certs:
        return None
    kubeadm = [n for n in view.nodes if n.apiserver is not None]
    if not kubeadm:
        return CertificateRotationStatus(message="no kubeadm control-plane node: nothing to rotate")
    fresh = [
        n
        for n in kubeadm
        if n.checked is not None and n.checked.outcome == "Renewed" and not due(spec, n, now)
    ]
    running = sorted(p.node for p in view.pods if not p.deleting)
    latest = max((n for n in kubeadm if n.checked is not None), key=lambda n: n.checked.time,  # type: ignore[union-attr]
                 default=None)  # fmt: skip
    message = ""
    if latest is not None and latest.checked is not None:
        message = f"{latest.name}: {latest.checked.outcome}: {latest.checked.message}"[:500]
    return CertificateRotationStatus(
        nodes_checked=f"{len(fresh)}/{len(kubeadm)}",
        renewing=running[0] if running else None,
        message=message,
    )


def served_within(not_after: datetime, spec: MaintenancePolicySpec, now: datetime) -> bool:
    """Whether a served certificate still expires within the threshold (a renewal that did not take)."""
    return not_after - now <= parse_duration(spec.rotate_certs_threshold)


__all__: Sequence[str] = (
    "CHECKED_ANNOTATION",
    "TASK",
    "TASK_LABEL",
    "CertRotationView",
    "CertStep",
    "Checked",
    "ControlPlaneNode",
    "FinishRenewal",
    "RemoveRenewalPod",
    "RenewalPod",
    "StartRenewal",
    "describe",
    "next_check",
    "plan",
    "renewal_pod",
    "served_within",
    "status",
)  # fmt: skip
