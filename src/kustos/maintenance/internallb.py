"""The internal load balancer (EKCO's ``enableInternalLoadBalancer``, SPEC F-MAINT-10), pure.

Every node runs HAProxy as a static pod listening on localhost:6444 and forwarding to every
control-plane node's API server, so a kubelet (or anything on the node) pointed at
``https://localhost:6444`` keeps reaching the API while control-plane nodes come and go.

How the files reach the nodes: a DaemonSet (``kustos-internal-lb``) whose init container
(``kustos internal-lb write``) renders the HAProxy configuration and the static pod manifest
from its arguments, writes them on the node and has a running HAProxy reload through its
master socket. The servers are in the pod template, so a control-plane node that joins or
leaves changes the template and the DaemonSet controller rolls the new files out one node at
a time (maxUnavailable 1): a node whose HAProxy refuses the new configuration stops the rollout
there, with the failed pod to look at. A DaemonSet, rather than EKCO's one pod per node
created and awaited by the operator, also covers a node that joins later without the
operator doing anything. Its main container only idles, so that the pod's readiness says its
node has the current files.

Here: the API servers (``ApiServer``), the HAProxy configuration, the static pod, the
DaemonSet, and the plan's piece (``plan``, ``status``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from kustos.api.maintenance import InternalLoadBalancerStatus, MaintenancePolicySpec

APISERVER_PORT = 6443
"""Where a control-plane node's API server listens when kubeadm's annotation does not say."""
HAPROXY_DIR = "/etc/haproxy"
CONFIG_FILE = "haproxy.cfg"
MANIFESTS_DIR = "/etc/kubernetes/manifests"
MANIFEST_FILE = "haproxy.yaml"
"""EKCO's paths: kustos takes over EKCO's static pod rather than running a second HAProxy on
the same port."""
RUN_DIR = "/var/run/kustos-haproxy"
MASTER_SOCKET = "master.sock"
"""HAProxy's master CLI (master-worker mode): the writer asks for a reload there."""
CONTAINER_CONFIG_DIR = "/usr/local/etc/haproxy"
WRITER_NAME = "kustos-internal-lb"
COMPONENT_LABEL = "app.kubernetes.io/name"
CONFIG_HASH_ANNOTATION = "kustos.dev/internal-lb-config"
"""On the writer DaemonSet and its pods: the digest of everything they write."""
HARD_STOP_AFTER = "1m"
"""How long an old HAProxy process may keep its connections (watches) after a reload."""


@dataclass(frozen=True, order=True)
class ApiServer:
    """One API server HAProxy forwards to: its control-plane node and address."""

    node: str
    host: str
    port: int = APISERVER_PORT

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.node}={self.address}"

    @classmethod
    def parse(cls, text: str) -> ApiServer:
        """``node=host:port`` (``[v6]:port`` for IPv6), as the writer's arguments carry it."""
        node, sep, endpoint = text.partition("=")
        if not sep or not node:
            raise ValueError(f"{text!r}: expected node=host:port")
        host, port = split_endpoint(endpoint)
        return cls(node, host, port)


def split_endpoint(endpoint: str, default_port: int = APISERVER_PORT) -> tuple[str, int]:
    """``10.0.0.1:6443`` -> (``10.0.0.1``, 6443); ``[fd00::1]:6443``; a bare host takes the default."""
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port = rest.removeprefix(":")
    elif endpoint.count(":") == 1:
        host, _, port = endpoint.partition(":")
    else:
        host, port = endpoint, ""
    if not host:
        raise ValueError(f"{endpoint!r}: no host")
    number = int(port) if port else default_port
    if not 0 < number < 65536:
        raise ValueError(f"{endpoint!r}: port {number} out of range")
    return host, number


def api_servers(control_plane: Mapping[str, str], annotated: Mapping[str, str]) -> tuple[ApiServer, ...]:
    """Each control-plane node's API server, sorted: kubeadm's advertise-address annotation on
    its kube-apiserver pod when there is one (``annotated``: node -> host:port), else its
    InternalIP (``control_plane``: node -> IP, "" when it reports none) on 6443, as EKCO."""
    found = []
    for node, ip in control_plane.items():
        endpoint = annotated.get(node)
        try:
            host, port = split_endpoint(endpoint) if endpoint else (ip, APISERVER_PORT)
        except ValueError:
            host, port = ip, APISERVER_PORT
        if host:
            found.append(ApiServer(node, host, port))
    return tuple(sorted(found))


def _bind(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def render_config(servers: Sequence[ApiServer], bind_address: str = "127.0.0.1", port: int = 6444) -> str:
    """HAProxy's configuration: TCP on ``bind_address:port`` to every server, round robin.

    Each server is health-checked with ``GET /readyz`` over TLS (readable without credentials,
    Kubernetes' system:public-info-viewer); a server that fails twice gets no new connections,
    and a connection refused goes to another server (``option redispatch``), so a dying API
    server costs a client nothing but a retry inside HAProxy.
    """
    lines = [
        "# Written by kustos (MaintenancePolicy enableInternalLoadBalancer): do not edit, it is",
        "# rewritten whenever control-plane nodes join or leave.",
        "global",
        "    log stdout format raw local0 notice",
        f"    hard-stop-after {HARD_STOP_AFTER}",
        "",
        "defaults",
        "    log global",
        "    mode tcp",
        "    maxconn 20000",
        "    option dontlognull",
        "    option redispatch",
        "    retries 3",
        "    timeout queue 1m",
        "    timeout connect 10s",
        "    timeout client 86400s",
        "    timeout server 86400s",
        "    timeout tunnel 86400s",
        "",
        "frontend kubernetes-api",
        f"    bind {_bind(bind_address, port)}",
        "    option tcplog",
        "    default_backend kubernetes-api-servers",
        "",
        "backend kubernetes-api-servers",
        "    option httpchk GET /readyz HTTP/1.0",
        "    option log-health-checks",
        "    balance roundrobin",
        "    default-server check check-ssl verify none inter 1s fall 2 rise 3",
    ]
    lines += [f"    server {s.node} {s.address}" for s in sorted(servers)]
    return "\n".join(lines) + "\n"


def static_pod(image: str, port: int, bind_address: str = "127.0.0.1") -> dict[str, Any]:
    """The static pod that runs HAProxy in master-worker mode (``-W``), its master socket on the
    host so the writer can ask for a reload without restarting it (connections survive)."""
    host = "127.0.0.1" if bind_address in ("0.0.0.0", "::", "127.0.0.1") else bind_address
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "haproxy",
            "namespace": "kube-system",
            "labels": {COMPONENT_LABEL: "kustos-haproxy", "app.kubernetes.io/managed-by": "kustos"},
        },
        "spec": {
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "containers": [
                {
                    "name": "haproxy",
                    "image": image,
                    "command": [
                        "haproxy",
                        "-W",
                        "-db",
                        "-S",
                        f"{RUN_DIR}/{MASTER_SOCKET},mode,600",
                        "-f",
                        f"{CONTAINER_CONFIG_DIR}/{CONFIG_FILE}",
                    ],
                    "livenessProbe": {
                        "tcpSocket": {"host": host, "port": port},
                        "periodSeconds": 10,
                        "failureThreshold": 8,
                    },
                    # The image runs as haproxy; the master socket is made in a root-owned host
                    # directory. Root without capabilities can write its own directories.
                    "securityContext": {
                        "runAsUser": 0,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "config", "mountPath": CONTAINER_CONFIG_DIR, "readOnly": True},
                        {"name": "run", "mountPath": RUN_DIR},
                    ],
                }
            ],
            # Directories, not the file: the writer replaces the file by a rename, which a
            # bind mount of the file itself would never show.
            "volumes": [
                {"name": "config", "hostPath": {"path": HAPROXY_DIR, "type": "DirectoryOrCreate"}},
                {"name": "run", "hostPath": {"path": RUN_DIR, "type": "DirectoryOrCreate"}},
            ],
        },
    }


def manifest_text(image: str, port: int, bind_address: str = "127.0.0.1") -> str:
    return "# Written by kustos (MaintenancePolicy enableInternalLoadBalancer).\n" + yaml.safe_dump(
        static_pod(image, port, bind_address), sort_keys=False
    )


@dataclass(frozen=True)
class Settings:
    """Everything the writer pods are told: a change of any of it is a rollout."""

    servers: tuple[ApiServer, ...]
    port: int
    bind_address: str
    haproxy_image: str
    writer_image: str
    namespace: str

    @classmethod
    def of(cls, spec: MaintenancePolicySpec, servers: Sequence[ApiServer], writer_image: str) -> Settings:
        return cls(tuple(sorted(servers)), spec.internal_load_balancer_port,
                   spec.internal_load_balancer_bind_address, spec.internal_load_balancer_haproxy_image,
                   spec.host_task_image or writer_image, spec.host_task_namespace)  # fmt: skip

    def digest(self) -> str:
        text = "\n".join(
            [
                *map(str, self.servers),
                str(self.port),
                self.bind_address,
                self.haproxy_image,
                self.writer_image,
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def writer_args(self) -> list[str]:
        args = [
            "--port",
            str(self.port),
            "--bind-address",
            self.bind_address,
            "--haproxy-image",
            self.haproxy_image,
        ]
        for server in self.servers:
            args += ["--server", str(server)]
        return args


def writer_daemonset(settings: Settings, owner: Mapping[str, Any]) -> dict[str, Any]:
    """The DaemonSet that puts the files on every node (every taint tolerated, as a static pod
    runs wherever a kubelet does), owned by the policy."""
    labels = {COMPONENT_LABEL: WRITER_NAME, "app.kubernetes.io/managed-by": "kustos"}
    digest = settings.digest()
    mounts = [
        {"name": "haproxy", "mountPath": "/host" + HAPROXY_DIR},
        {"name": "manifests", "mountPath": "/host" + MANIFESTS_DIR},
        {"name": "run", "mountPath": "/host" + RUN_DIR},
    ]
    root = {"runAsUser": 0, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": WRITER_NAME,
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {CONFIG_HASH_ANNOTATION: digest},
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {CONFIG_HASH_ANNOTATION: digest}},
                "spec": {
                    "priorityClassName": "system-node-critical",
                    "tolerations": [{"operator": "Exists"}],
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 1,
                    "initContainers": [
                        {
                            "name": "write",
                            "image": settings.writer_image,
                            "command": [
                                "kustos",
                                "internal-lb",
                                "write",
                                "--haproxy-dir",
                                "/host" + HAPROXY_DIR,
                                "--manifests-dir",
                                "/host" + MANIFESTS_DIR,
                                "--run-dir",
                                "/host" + RUN_DIR,
                                *settings.writer_args(),
                            ],
                            "securityContext": root,
                            "volumeMounts": mounts,
                        }
                    ],
                    "containers": [
                        {
                            "name": "idle",
                            "image": settings.writer_image,
                            "command": ["kustos", "internal-lb", "idle"],
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "resources": {"requests": {"cpu": "1m", "memory": "16Mi"}},
                        }
                    ],
                    "volumes": [
                        {"name": "haproxy", "hostPath": {"path": HAPROXY_DIR, "type": "DirectoryOrCreate"}},
                        {
                            "name": "manifests",
                            "hostPath": {"path": MANIFESTS_DIR, "type": "DirectoryOrCreate"},
                        },
                        {"name": "run", "hostPath": {"path": RUN_DIR, "type": "DirectoryOrCreate"}},
                    ],
                },
            },
        },
    }


# ---- the plan's piece -----------------------------------------------------------------------


@dataclass(frozen=True)
class WriterView:
    """The writer DaemonSet as it is."""

    namespace: str
    digest: str
    desired: int = 0
    updated: int = 0
    ready: int = 0
    current: bool = True
    """The DaemonSet controller has seen its latest spec (observedGeneration)."""


@dataclass(frozen=True)
class LoadBalancerView:
    servers: tuple[ApiServer, ...] = ()
    writer: WriterView | None = None
    writer_image: str = ""
    """The operator's own image (the writer's unless hostTaskImage says otherwise)."""


@dataclass(frozen=True)
class ApplyLoadBalancer:
    """Create or update the writer DaemonSet: new files for every node."""

    settings: Settings


@dataclass(frozen=True)
class RemoveLoadBalancer:
    """Delete the writer DaemonSet (switched off, or moved to another namespace). The files on
    the nodes stay: kubelets may point at localhost:6444."""

    namespace: str
    why: str


def plan(
    spec: MaintenancePolicySpec, view: LoadBalancerView
) -> ApplyLoadBalancer | RemoveLoadBalancer | None:
    writer = view.writer
    if not spec.enable_internal_load_balancer:
        if writer is not None:
            return RemoveLoadBalancer(writer.namespace, "enableInternalLoadBalancer is off")
        return None
    if writer is not None and writer.namespace != spec.host_task_namespace:
        return RemoveLoadBalancer(writer.namespace, f"hostTaskNamespace is {spec.host_task_namespace}")
    if not view.servers:
        return None
    settings = Settings.of(spec, view.servers, view.writer_image)
    if writer is None or writer.digest != settings.digest():
        return ApplyLoadBalancer(settings)
    return None


def status(spec: MaintenancePolicySpec, view: LoadBalancerView) -> InternalLoadBalancerStatus | None:
    if not spec.enable_internal_load_balancer:
        return None
    servers = [str(s) for s in view.servers]
    if not servers:
        return InternalLoadBalancerStatus(
            message="waiting for a control-plane node with an address (InternalIP or kubeadm's annotation)"
        )
    writer = view.writer
    digest = Settings.of(spec, view.servers, view.writer_image).digest()
    if writer is None or writer.digest != digest or writer.namespace != spec.host_task_namespace:
        return InternalLoadBalancerStatus(
            servers=servers, message="writing the new configuration to the nodes"
        )
    done = min(writer.updated, writer.ready) if writer.current else 0
    nodes = f"{done}/{writer.desired}"
    if writer.current and done == writer.desired:
        port = spec.internal_load_balancer_port
        message = f"HAProxy on {nodes} nodes forwards localhost:{port} to every API server"
    else:
        message = (
            f"rolling the configuration out, one node at a time: {nodes} done "
            f"(a node stuck here: see its {WRITER_NAME} pod in {writer.namespace})"
        )
    return InternalLoadBalancerStatus(servers=servers, nodes_updated=nodes, message=message)
