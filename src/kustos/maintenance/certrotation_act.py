"""The certificate rotation's observe and act for the maintenance controller (``certrotation``
decides): the control-plane nodes and renewal pods from the controller's caches, the pod
created, and a finished renewal checked against the node's API server and recorded."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.etcd import kubeadm
from kustos.maintenance import certrotation
from kustos.maintenance.certrotation import (
    CHECKED_ANNOTATION,
    TASK,
    TASK_LABEL,
    CertRotationView,
    Checked,
    ControlPlaneNode,
    FinishRenewal,
    RemoveRenewalPod,
    RenewalPod,
    StartRenewal,
)
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import NORMAL, WARNING, EventRecorder
from kustos.runtime.resources import NODES, PODS
from kustos.runtime.times import parse_rfc3339

log = logging.getLogger(__name__)

TASK_INDEX = "maintenance-rotate-certs"
PROBE_TIMEOUT = 5.0


def task_index(pod: dict[str, Any]) -> Iterable[str]:
    """Renewal pods, all under one key."""
    return (TASK,) if objects.labels(pod).get(TASK_LABEL) == TASK else ()


def renewal_pod_view(pod: dict[str, Any]) -> RenewalPod:
    state = pod.get("status") or {}
    message = ""
    for container in state.get("containerStatuses") or []:
        # Terminated: the command's last line says what it did; waiting: why it has not started.
        found = (container.get("state") or {}).get("terminated") or (container.get("state") or {}).get(
            "waiting"
        )
        lines = str((found or {}).get("message") or "").strip().splitlines()
        message = lines[-1] if lines else message
    return RenewalPod(
        namespace=str(objects.namespace(pod)),
        name=objects.name(pod),
        uid=str(objects.uid(pod)),
        node=objects.annotations(pod).get(certrotation.NODE_ANNOTATION) or objects.pod_node(pod) or "",
        phase=str(state.get("phase") or "Pending"),
        message=message[:500],
        created=parse_rfc3339((pod.get("metadata") or {}).get("creationTimestamp")),
        deleting=objects.deleting(pod),
    )


def view(
    nodes: Iterable[dict[str, Any]],
    pods_on: Any,
    renewal_pods: Iterable[dict[str, Any]],
    image: str,
    policy: dict[str, Any],
) -> CertRotationView:
    """``pods_on(node)``: the pods the cache has on that node."""
    control_plane = []
    for node in nodes:
        if not objects.is_control_plane(node):
            continue
        name = objects.name(node)
        control_plane.append(
            ControlPlaneNode(
                name=name,
                ready=objects.node_ready(node),
                apiserver=kubeadm.apiserver_endpoint(pods_on(name)),
                checked=Checked.parse(objects.annotations(node).get(CHECKED_ANNOTATION)),
            )
        )
    meta = policy.get("metadata") or {}
    owner = {"apiVersion": str(policy.get("apiVersion")), "kind": str(policy.get("kind")),
             "name": str(meta.get("name")), "uid": str(meta.get("uid"))}  # fmt: skip
    return CertRotationView(
        nodes=tuple(control_plane),
        pods=tuple(renewal_pod_view(p) for p in renewal_pods),
        image=image,
        owner=owner,
    )


def served_certificate(address: str, timeout: float = 5.0) -> tuple[bytes, str]:
    """The certificate the API server at ``host:port`` serves (DER) and its /readyz answer's
    status line. Not verified: which certificate it serves is the question."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no trust store loaded: nothing is verified
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw,
        context.wrap_socket(raw) as conn,
    ):
        der = conn.getpeercert(binary_form=True) or b""
        conn.sendall(b"GET /readyz HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
        status = conn.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    return der, status


async def check_apiserver(endpoint: str, spec: MaintenancePolicySpec, now: datetime) -> str:
    """The node's API server answers /readyz on a certificate outside the threshold, or raise."""
    from cryptography import x509  # here: cryptography costs the operator ~8 MiB resident

    try:
        der, answer = await asyncio.wait_for(
            asyncio.to_thread(served_certificate, endpoint), PROBE_TIMEOUT * 2
        )
    except (OSError, TimeoutError) as err:
        raise ReconcileError("ApiServerUnreachable", f"the API server at {endpoint}: {err}") from err
    served = x509.load_der_x509_certificate(der)
    if " 200 " not in f"{answer} ":
        raise ReconcileError("ApiServerNotReady", f"the API server at {endpoint} answers {answer!r}")
    expires = served.not_valid_after_utc.isoformat(timespec="seconds")
    if certrotation.served_within(served.not_valid_after_utc, spec, now):
        raise ReconcileError(
            "CertificateNotRenewed", f"the API server at {endpoint} serves a certificate expiring {expires}"
        )
    return f"serves a certificate valid until {expires}"


async def act(
    api: Api, events: EventRecorder, spec: MaintenancePolicySpec, step: certrotation.CertStep, now: datetime
) -> None:
    match step:
        case StartRenewal(node, pod):
            log.info("step: StartRenewal on %s", node)
            try:
                await api.create(PODS, pod)
            except ApiStatusError as err:
                if not err.conflict:
                    raise
        case FinishRenewal(pod, apiserver, outcome, message):
            log.info("step: FinishRenewal on %s: %s %s", pod.node, outcome, message)
            if outcome == "Renewed" and apiserver:
                # Before the next node: this node's API server is back, on a certificate that lasts.
                message = f"{message}; {await check_apiserver(apiserver, spec, now)}"
            checked = Checked(now, outcome, message, pod.uid)
            patch = {"metadata": {"annotations": {CHECKED_ANNOTATION: checked.text()}}}
            try:
                patched = await api.patch(NODES, None, pod.node, patch)
            except ApiStatusError as err:
                if not err.not_found:
                    raise
            else:
                ok = outcome == "Renewed"
                reason = "CertificatesChecked" if ok else "CertificateRotationFailed"
                await events.record({"apiVersion": "v1", "kind": "Node", **patched},
                                    NORMAL if ok else WARNING, reason, message[:1000])  # fmt: skip
            await api.delete(PODS, pod.namespace, pod.name, uid=pod.uid)
        case RemoveRenewalPod(pod, why):
            log.info("step: RemoveRenewalPod %s/%s (%s)", pod.namespace, pod.name, why)
            await api.delete(PODS, pod.namespace, pod.name, uid=pod.uid)
