"""The kwokctl configuration of the dev cluster: binaries, timings, nodes and stages.

kwok simulates every pod except those the pod process runner owns (pods whose
images are all allow-listed). For those, kwok only hands out the pod IP from the
node's loopback range and removes the pod at the end of its grace period; the
runner starts the real processes and writes the rest of the status.

kwok's own default stages are read from the kwok module source that the build
fetched (so they always match the kwok version we run) and extended with the
runner exclusion; kwokctl only adds its defaults when a config holds no Stage.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kustos.devcluster.binaries import GOMOD_DIR, KWOK_VERSION, binary_path
from kustos.devcluster.network import SERVICE_CIDR, ClusterNetwork
from kustos.devcluster.podspec import RUNNER_IMAGE_PREFIXES

# True for pods the runner owns: the same rule as podspec.pod_is_runner_owned.
RUNNER_POD = (
    "any(((.spec.initContainers // []) + (.spec.containers // []))[]; .image | "
    + " or ".join(f'startswith("{prefix}")' for prefix in RUNNER_IMAGE_PREFIXES)
    + ")"
)

MANAGED_LABEL = "kustos.dev/kwok-managed"
# Written by the kwok cloud provider (kustos.nodes.cloud.kwok) on the nodes it creates.
READY_AT_ANNOTATION = "kustos.dev/kwok-ready-at"
NEVER_READY_ANNOTATION = "kustos.dev/kwok-never-ready"

_UPSTREAM_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


@dataclass(frozen=True)
class Timings:
    """Node-failure timings. None keeps the Kubernetes defaults (40 s grace, 300 s tolerations)."""

    node_monitor_grace_seconds: int | None = None
    node_monitor_period_seconds: int | None = None
    node_lease_seconds: int | None = None
    toleration_seconds: int | None = None

    @classmethod
    def fast(cls) -> Timings:
        """What tests use: a dead node is Unknown in about 10 s, its pods evicted 10 s later."""
        return cls(
            node_monitor_grace_seconds=8,
            node_monitor_period_seconds=1,
            node_lease_seconds=4,
            toleration_seconds=10,
        )


def kwok_source_dir() -> Path:
    """The kwok module's source in Go's module cache (downloaded again if cleaned)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{KWOK_VERSION}"],
        cwd=GOMOD_DIR / "kwok",
        env={**_go_env()},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Path(json.loads(out)["Dir"])


def _go_env() -> dict[str, str]:
    return {**os.environ, "GOTOOLCHAIN": "local"}


def _runner_expression(runner: bool) -> dict[str, Any]:
    return {"key": RUNNER_POD, "operator": "In" if runner else "NotIn", "values": ["true"]}


def stages(source: Path) -> list[dict[str, Any]]:
    """kwok's default stages, pods of the runner excluded, plus the runner's two stages."""
    result: list[dict[str, Any]] = []
    for rel in _UPSTREAM_STAGES:
        stage = yaml.safe_load((source / rel).read_text())
        if stage["metadata"]["name"] == "node-initialize":
            # Nodes of the kwok cloud provider boot on their own schedule (the stage below).
            selector = stage["spec"].setdefault("selector", {})
            selector.setdefault("matchExpressions", []).extend(
                {"key": f'.metadata.annotations["{key}"]', "operator": "DoesNotExist"}
                for key in (READY_AT_ANNOTATION, NEVER_READY_ANNOTATION)
            )
        if stage["spec"]["resourceRef"]["kind"] == "Pod":
            selector = stage["spec"].setdefault("selector", {})
            selector.setdefault("matchExpressions", []).append(_runner_expression(False))
        result.append(stage)
    ip_template = (
        "{{ $hostIPs := NodeIPsWith .spec.nodeName }}\n"
        "{{ with $hostIPs }}\nhostIP: {{ index . 0 | Quote }}\nhostIPs:\n"
        "{{ range . }}\n- ip: {{ . | Quote }}\n{{ end }}\n{{ end }}\n"
        "{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) "
        '( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}\n'
        "{{ with $podIPs }}\npodIP: {{ index . 0 | Quote }}\npodIPs:\n"
        "{{ range . }}\n- ip: {{ . | Quote }}\n{{ end }}\n{{ end }}\n"
    )
    pod_ref = {"apiGroup": "v1", "kind": "Pod"}
    result.append(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "kustos-runner-pod-network"},
            "spec": {
                "resourceRef": pod_ref,
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                        {"key": ".status.podIP", "operator": "DoesNotExist"},
                        _runner_expression(True),
                    ]
                },
                "next": {"statusTemplate": ip_template},
            },
        }
    )
    # A safety net: the runner deletes its pods as soon as their processes are gone;
    # this removes them at the end of the grace period if no runner is there to do it.
    result.append(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "kustos-runner-pod-delete"},
            "spec": {
                "resourceRef": pod_ref,
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "Exists"},
                        _runner_expression(True),
                    ]
                },
                "delay": {
                    "durationMilliseconds": 0,
                    "durationFrom": {"jq": {"expression": ".metadata.deletionTimestamp"}},
                },
                "next": {"delete": True},
            },
        }
    )
    # A node the kwok cloud provider created becomes Ready at its kustos.dev/kwok-ready-at
    # moment (the boot time it was given), or never with kustos.dev/kwok-never-ready.
    boot = dict(next(s for s in result if s["metadata"]["name"] == "node-initialize"))
    result.append(
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": "kustos-node-boot"},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Node"},
                "selector": {
                    "matchExpressions": [
                        {
                            "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                            "operator": "NotIn",
                            "values": ["True"],
                        },
                        {"key": f'.metadata.annotations["{READY_AT_ANNOTATION}"]', "operator": "Exists"},
                        {
                            "key": f'.metadata.annotations["{NEVER_READY_ANNOTATION}"]',
                            "operator": "DoesNotExist",
                        },
                    ]
                },
                "delay": {
                    "durationMilliseconds": 0,
                    "durationFrom": {"jq": {"expression": f'.metadata.annotations["{READY_AT_ANNOTATION}"]'}},
                },
                "next": boot["spec"]["next"],
            },
        }
    )
    return result


PORT_OPTIONS = (
    "etcdPort",
    "etcdPeerPort",
    "kubeApiserverPort",
    "kwokControllerPort",
    "kubeControllerManagerPort",
    "kubeSchedulerPort",
)


def kubernetes_service_ip() -> str:
    """The first address of the Service range: the API server gives it to ``kubernetes``."""
    return str(ipaddress.ip_network(SERVICE_CIDR).network_address + 1)


def kwokctl_config(
    timings: Timings,
    source: Path,
    slot: int,
    ports: dict[str, int] | None = None,
    network: ClusterNetwork | None = None,
    audit_policy: Path | None = None,
    kubelet_client: tuple[Path, Path] | None = None,
) -> list[dict[str, Any]]:
    """The multi-document config handed to ``kwokctl create cluster -c``.

    ``ports`` pins the components' ports; kwokctl's own choice races when two clusters
    start at the same moment (a test session beside ``dev up``). With a ``network`` the
    API server also answers on its gateway (pods reach it there, and it advertises that
    address for the ``kubernetes`` Service), calls webhook Services at their endpoints'
    pod IPs, and kwok hands out addresses of its range. With an ``audit_policy`` the API
    server writes its audit log to ``logs/audit.log`` in the cluster's kwok directory.
    With ``kubelet_client`` (certificate, key) it reaches real kubelets (logs, exec) at
    their InternalIP, the only address a dev cluster's real node has that is not a name.
    """
    options: dict[str, Any] = {
        "runtime": "binary",
        "kubeVersion": binary_path("kube-apiserver").name.split("-")[-1],
        "etcdBinary": str(binary_path("etcd")),
        "etcdctlBinary": str(binary_path("etcdctl")),
        "etcdutlBinary": str(binary_path("etcdutl")),
        "kubeApiserverBinary": str(binary_path("kube-apiserver")),
        "kubeControllerManagerBinary": str(binary_path("kube-controller-manager")),
        "kubeSchedulerBinary": str(binary_path("kube-scheduler")),
        "kwokControllerBinary": str(binary_path("kwok")),
        "kubectlBinary": str(binary_path("kubectl")),
        "bindAddress": "127.0.0.1",
        "heartbeatFactor": 1,
        # Logs: what `kubectl logs` of a simulated pod prints; Exec: what exec in one runs.
        "enableCRDs": ["Logs", "ClusterLogs", "Exec", "ClusterExec"],
        **(ports or {}),
    }
    if timings.node_lease_seconds is not None:
        options["nodeLeaseDurationSeconds"] = timings.node_lease_seconds
    if timings.node_monitor_period_seconds is not None:
        options["kubeControllerManagerNodeMonitorPeriodMilliseconds"] = (
            timings.node_monitor_period_seconds * 1000
        )
    if timings.node_monitor_grace_seconds is not None:
        options["kubeControllerManagerNodeMonitorGracePeriodMilliseconds"] = (
            timings.node_monitor_grace_seconds * 1000
        )
    # Appended, not an override: kwokctl sets no range of its own, and an override that
    # matches nothing is dropped (the API server then used its default 10.0.0.0/24).
    apiserver_args: list[dict[str, Any]] = [{"key": "service-cluster-ip-range", "value": SERVICE_CIDR}]
    kwok_cidr = f"127.{slot}.255.0/24"
    if network is not None:
        # kwokctl writes 127.0.0.1 into every kubeconfig, so the API server binds every
        # address (client certificates are still required) and advertises the gateway.
        apiserver_args += [
            {"key": "bind-address", "value": "0.0.0.0", "override": True},
            {"key": "advertise-address", "value": network.gateway},
            # Webhook and aggregated API Services are called at an endpoint (a pod IP,
            # reachable through the bridge), not at the ClusterIP: there is no kube-proxy.
            {"key": "enable-aggregator-routing", "value": "true"},
        ]
        # The gateway, and the ``kubernetes`` Service's ClusterIP that pods on real nodes
        # connect to (in-cluster clients verify it, as kubeadm's certificates allow).
        options["kubeApiserverCertSANs"] = [network.gateway, kubernetes_service_ip()]
        kwok_cidr = network.node_cidr(255)
    if audit_policy is not None:
        options["kubeAuditPolicy"] = str(audit_policy)
    if kubelet_client is not None:
        certificate, key = kubelet_client
        apiserver_args += [
            {"key": "kubelet-preferred-address-types", "value": "InternalIP,Hostname"},
            {"key": "kubelet-client-certificate", "value": str(certificate)},
            {"key": "kubelet-client-key", "value": str(key)},
        ]
    if timings.toleration_seconds is not None:
        for kind in ("not-ready", "unreachable"):
            apiserver_args.append(
                {
                    "key": f"default-{kind}-toleration-seconds",
                    "value": str(timings.toleration_seconds),
                }
            )
    kwok_server: list[dict[str, Any]] = []
    if kubelet_client is not None and ports and "kwokControllerPort" in ports:
        # The API server now reaches every node at its InternalIP (a real kubelet's only
        # usable address); kwok's nodes have 127.<slot>.0.<i>, so kwok's kubelet API (logs,
        # exec of simulated and runner pods) listens on every address, not 127.0.0.1 alone.
        kwok_server.append(
            {"key": "server-address", "value": f"0.0.0.0:{ports['kwokControllerPort']}", "override": True}
        )
    patches = [
        {"name": "kube-apiserver", "extraArgs": apiserver_args},
        # Without leader election they survive an API server restart instead of exiting.
        {
            "name": "kube-controller-manager",
            "extraArgs": [{"key": "leader-elect", "value": "false"}],
        },
        {"name": "kube-scheduler", "extraArgs": [{"key": "leader-elect", "value": "false"}]},
        {
            "name": "kwok-controller",
            "extraArgs": [
                {"key": "manage-all-nodes", "value": "false", "override": True},
                {"key": "manage-nodes-with-label-selector", "value": f"{MANAGED_LABEL}=true"},
                {"key": "node-ip", "value": "127.0.0.1", "override": True},
                *kwok_server,
            ],
        },
    ]
    return [
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": options,
            "componentsPatches": patches,
        },
        {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                "cidr": kwok_cidr,
                "manageAllNodes": False,
                "manageNodesWithLabelSelector": f"{MANAGED_LABEL}=true",
                # kwok does not apply its defaults to a config that names options: state them.
                "enableDebuggingHandlers": True,  # serves kubectl logs
                "enableProfilingHandler": False,
                "enableContentionProfiling": False,
                "enablePodsOnNodeSyncListPager": True,
                "podPlayStageParallelism": 4,
                "nodePlayStageParallelism": 4,
                "nodeLeaseParallelism": 4,
                "podsOnNodeSyncParallelism": 1,
            },
        },
        *stages(source),
    ]


# Who the audit log records: service accounts only (the operator runs as one; the control
# plane and the tests use certificates), at Metadata level (verb, resource, name, user, the
# response code and the authorizer's decision; never a request or response body).
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # ResponseStarted stays: a watch still open when the log is read shows there.
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def node_manifest(
    name: str, slot: int, index: int, control_plane: bool, network: ClusterNetwork | None = None
) -> dict[str, Any]:
    """A kwok node with its own pod range and zone: ``<cluster range>.<index>.0/24`` of the
    pod network, or without one a loopback range (127.<slot>.<index>.0/24).

    ``slot`` keeps dev clusters that run at the same time (``dev up`` beside a test
    session) out of each other's addresses.

    One zone per node keeps kube-controller-manager out of its zone-disruption mode
    when a test takes several of a handful of nodes down.
    """
    labels = {
        MANAGED_LABEL: "true",
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": name,
    }
    taints = []
    if control_plane:
        labels["node-role.kubernetes.io/control-plane"] = ""
        taints.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
    else:
        labels["node-role.kubernetes.io/worker"] = ""
    if not (1 <= slot <= 254 and 1 <= index <= 254):
        raise ValueError(f"node slot/index out of range: {slot}/{index}")
    # With a pod network the node's pods live on the bridge; without, on loopback addresses.
    cidr = network.node_cidr(index) if network is not None else f"127.{slot}.{index}.0/24"
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        # The kwok cloud provider's providerID: node maintenance asks it whether a stopped
        # node is really down (fencing), as it would ask a cloud.
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": taints, "providerID": f"kwok://{name}"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": f"127.{slot}.0.{index}"}],
            "allocatable": capacity,
            "capacity": capacity,
        },
    }
