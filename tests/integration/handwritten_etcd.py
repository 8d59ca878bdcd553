"""Hand-written etcd pods, without the operator: the proof that real etcd members run
and form a cluster on the dev cluster (F-DEV-2).

Pod IPs are only known once kwok hands them out, so the members cannot list each
other in ``--initial-cluster``; they bootstrap through etcd's v3 discovery instead,
served by a one-member etcd in its own pod.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from kustos.devcluster import nodeimages
from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path

DISCOVERY_POD = "etcd-discovery"
DEMO_LABEL = "kustos.dev/demo"


def etcd_image(version: str = ETCD_VERSIONS[-1]) -> str:
    """The image real nodes preload and the process runner maps (the default repository's)."""
    return nodeimages.etcd_image(version)


def etcd_pod(
    name: str,
    extra_args: list[str],
    version: str = ETCD_VERSIONS[-1],
    volume: dict[str, Any] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    """A plain etcd pod listening on its pod IP, ready when ``etcdctl endpoint health`` is."""
    args = [
        f"--name={name}",
        "--data-dir=/var/lib/etcd",
        "--listen-client-urls=http://0.0.0.0:2379",
        "--advertise-client-urls=http://$(POD_IP):2379",
        "--listen-peer-urls=http://0.0.0.0:2380",
        "--initial-advertise-peer-urls=http://$(POD_IP):2380",
        *extra_args,
    ]
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "etcd",
                "image": etcd_image(version),
                "command": ["etcd"],
                "args": args,
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [
                    {"name": "client", "containerPort": 2379},
                    {"name": "peer", "containerPort": 2380},
                ],
                "readinessProbe": {
                    "exec": {
                        "command": [
                            "etcdctl",
                            "--endpoints=http://localhost:2379",
                            "endpoint",
                            "health",
                        ]
                    },
                    "periodSeconds": 1,
                    "timeoutSeconds": 3,
                },
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
            }
        ],
        "volumes": [{"name": "data", **(volume or {"emptyDir": {}})}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {DEMO_LABEL: "etcd"}},
        "spec": spec,
    }


def discovery_pod() -> dict[str, Any]:
    return etcd_pod(DISCOVERY_POD, ["--initial-cluster=etcd-discovery=http://$(POD_IP):2380"])


def member_pod(name: str, discovery_ip: str, token: str) -> dict[str, Any]:
    """A member that finds its peers through discovery, on a node of its own."""
    pod = etcd_pod(
        name,
        [f"--discovery-endpoints=http://{discovery_ip}:2379", f"--discovery-token={token}"],
    )
    pod["metadata"]["labels"][DEMO_LABEL] = f"member-{token}"
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {DEMO_LABEL: f"member-{token}"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    return pod


def etcdctl(endpoint: str, *args: str) -> str:
    """Run the dev cluster's etcdctl against a pod IP (reachable from the host: loopback)."""
    result = subprocess.run(
        [str(binary_path("etcdctl")), f"--endpoints=http://{endpoint}:2379", *args],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return result.stdout


def deploy(
    kubectl: Callable[..., str],
    pod_ip: Callable[[str], str],
    namespace: str = "default",
    members: int = 3,
    token: str = "kustos-demo",
) -> list[str]:
    """Create the discovery pod, announce the cluster size, then the members; return their names."""
    import yaml

    kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump(discovery_pod()))
    discovery_ip = pod_ip(DISCOVERY_POD)
    deadline = time.monotonic() + 60
    while True:
        try:
            etcdctl(discovery_ip, "put", f"/_etcd/registry/{token}/_config/size", str(members))
            break
        except subprocess.CalledProcessError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    names = [f"etcd-demo-{i}" for i in range(members)]
    documents = [member_pod(n, discovery_ip, token) for n in names]
    kubectl("apply", "-n", namespace, "-f", "-", input_text=yaml.safe_dump_all(documents))
    return names
