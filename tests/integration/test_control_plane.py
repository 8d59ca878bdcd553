"""The dev cluster is a real Kubernetes: scheduler, controllers, garbage collector, node
lifecycle (SPEC F-DEV-1)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.cluster import DevCluster, DevClusterConfig, DevClusterError
from tests.integration.api_reads import ReadingCluster
from tests.integration.conftest import WORKERS, Kubectl
from tests.integration.kube import condition, is_ready, wait_until


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
            },
        },
    }


async def test_deployment_pods_are_scheduled_and_run(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    kubectl.apply(deployment("web", 6))

    async def all_running() -> list[dict[str, Any]] | None:
        pods = kubectl.get("pods", None, "-l", "app=web")["items"]
        ok = len(pods) == 6 and all(p["status"].get("phase") == "Running" and is_ready(p) for p in pods)
        return pods if ok else None

    pods = await wait_until(
        all_running, "6 running web pods", cluster=dev_cluster, namespace=kubectl.namespace
    )
    nodes = {p["spec"]["nodeName"] for p in pods}
    # The real scheduler spread them over workers, and never onto the tainted control plane.
    assert nodes <= {f"{dev_cluster.config.name}-worker-{i + 1}" for i in range(WORKERS)}
    assert len(nodes) > 1
    ips = [p["status"]["podIP"] for p in pods]
    # Simulated pods take their IPs from the same node ranges as real ones.
    assert all(ipaddress.ip_address(ip) in dev_cluster.network.cidr for ip in ips) and len(set(ips)) == len(
        ips
    )

    async def counted() -> bool:  # the Deployment's status follows its pods a moment later
        return kubectl.get("deployment", "web")["status"].get("readyReplicas") == 6

    await wait_until(counted, "the Deployment to count 6 ready replicas", timeout=30)


async def test_daemonset_places_one_pod_per_matching_node(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    kubectl.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {
                        "nodeSelector": {"node-role.kubernetes.io/worker": ""},
                        "containers": [{"name": "agent", "image": "busybox:1.36"}],
                    },
                },
            },
        }
    )

    async def one_per_worker() -> bool:
        pods = kubectl.get("pods", None, "-l", "app=agent")["items"]
        nodes = sorted(p["spec"].get("nodeName", "") for p in pods if is_ready(p))
        return len(pods) == WORKERS and len(set(nodes)) == WORKERS

    await wait_until(
        one_per_worker, "one agent pod per worker", cluster=dev_cluster, namespace=kubectl.namespace
    )

    async def counted() -> bool:  # the DaemonSet's status follows its pods a moment later
        return kubectl.get("daemonset", "agent")["status"].get("numberReady") == WORKERS

    await wait_until(counted, "the DaemonSet to count one ready pod per worker", timeout=30)


async def test_garbage_collector_deletes_what_an_owner_owned(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    kubectl.apply(deployment("owned", 2))

    async def two_pods() -> bool:
        return len(kubectl.get("pods", None, "-l", "app=owned")["items"]) == 2

    await wait_until(two_pods, "2 pods of the deployment", cluster=dev_cluster, namespace=kubectl.namespace)
    assert kubectl.get("replicasets", None, "-l", "app=owned")["items"]
    kubectl("delete", "deployment", "owned", "--wait=false")

    async def all_gone() -> bool:
        rs = kubectl.get("replicasets", None, "-l", "app=owned")["items"]
        pods = kubectl.get("pods", None, "-l", "app=owned")["items"]
        return not rs and not pods

    await wait_until(
        all_gone, "replica set and pods collected", cluster=dev_cluster, namespace=kubectl.namespace
    )


async def test_a_node_taken_down_becomes_unknown_and_tainted(dev_cluster: DevCluster) -> None:
    node = f"{dev_cluster.config.name}-worker-{WORKERS}"
    dev_cluster.take_node_down(node)
    try:

        async def unreachable() -> bool:
            obj = json.loads(dev_cluster.kubectl("get", "node", node, "-o", "json"))
            taints = {t["key"] for t in obj["spec"].get("taints") or []}
            return condition(obj, "Ready") == "Unknown" and "node.kubernetes.io/unreachable" in taints

        # Timings.fast(): 4 s lease, 8 s grace, 1 s monitor period.
        await wait_until(
            unreachable,
            f"{node} Unknown with the unreachable taint",
            timeout=30,
            cluster=dev_cluster,
        )
    finally:
        dev_cluster.bring_node_up(node)

    async def ready_again() -> bool:
        obj = json.loads(dev_cluster.kubectl("get", "node", node, "-o", "json"))
        return condition(obj, "Ready") == "True"

    await wait_until(ready_again, f"{node} Ready again", timeout=30, cluster=dev_cluster)


async def test_the_cluster_survives_an_api_server_restart(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    """Clients, kwok and the node agent reconnect: a pod created afterwards runs as usual."""
    dev_cluster.restart_component("kube-apiserver", down_seconds=2)

    async def answers() -> bool:
        return dev_cluster.kubectl("get", "--raw", "/readyz", check=False).strip() == "ok"

    await wait_until(answers, "kube-apiserver ready after its restart", timeout=60)
    kubectl.apply(deployment("after-restart", 1))

    async def running() -> bool:
        pods = kubectl.get("pods", None, "-l", "app=after-restart")["items"]
        return len(pods) == 1 and is_ready(pods[0])

    await wait_until(
        running, "a new pod running after the restart", cluster=dev_cluster, namespace=kubectl.namespace
    )


def running(pid: int) -> bool:
    """Alive and not a zombie (what this session started and has not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_second_cluster_gets_its_own_network_and_leaves_nothing_behind(dev_cluster: DevCluster) -> None:
    """Two clusters side by side (different names) never share a range, bridge or namespace;
    ``stop`` removes the bridge, every pod namespace and veth, CoreDNS and every process."""
    other = DevCluster(DevClusterConfig(name=f"{dev_cluster.config.name}-b", worker_nodes=1))
    try:
        other.start(timeout=120)
        mine, theirs = dev_cluster.network, other.network
        assert not mine.cidr.overlaps(theirs.cidr)
        assert mine.bridge != theirs.bridge and mine.netns_prefix != theirs.netns_prefix
        dns = json.loads(other.kubectl("get", "--raw", "/api/v1/namespaces/default/services/kubernetes"))
        assert dns["metadata"]["name"] == "kubernetes"
        pids = [c["pid"] for c in other.status()["components"] if c["running"]]
        assert any(c["name"] == "kustos-coredns" for c in other.status()["components"])
    finally:
        other.stop()
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    names = {link["ifname"] for link in json.loads(links)}
    assert theirs.bridge not in names and mine.bridge in names
    assert not theirs.namespaces()
    assert not [pid for pid in pids if running(pid)]
    assert not other.state_dir.exists()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert f"inet {theirs.firewall_table}\n" not in tables and f"inet {mine.firewall_table}\n" in tables


def reaches(port: int, host: str, netns: str | None = None) -> bool:
    """A TCP connection to host:port opens within 3 s (from inside ``netns`` if named)."""
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout=3)"
    inside = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*inside, sys.executable, "-c", probe], capture_output=True).returncode == 0


def test_kwoks_kubelet_api_is_closed_to_all_but_loopback(dev_cluster: DevCluster) -> None:
    """kwok's kubelet API listens on every address, asks for no credentials, and its exec runs
    commands on this host: a pod (the cluster's bridge, as any other machine) cannot connect to
    it, while the API server, on every address too, answers there."""
    options = next(yaml.safe_load_all((dev_cluster.state_dir / "kwokctl.yaml").read_text()))["options"]
    kwok, api_server = options["kwokControllerPort"], options["kubeApiserverPort"]
    network = dev_cluster.network
    outsider, address = f"fence-{uuid.uuid4().hex[:8]}", str(network.cidr.network_address + 254 * 256 + 250)
    try:
        for argv in network.pod_up_commands(outsider, address):
            subprocess.run(argv, check=True, capture_output=True)
        assert reaches(api_server, network.gateway, network.netns(outsider))
        assert not reaches(kwok, network.gateway, network.netns(outsider))
        assert reaches(kwok, "127.0.0.1") and reaches(kwok, network.gateway)
    finally:
        network.pod_down(outsider)


def test_dev_up_without_the_capabilities_fails_in_one_line_naming_them(tmp_path: Path) -> None:
    """Root without CAP_NET_ADMIN and CAP_SYS_ADMIN (as in an unprivileged container)."""
    drop = ["setpriv", "--inh-caps=-net_admin,-sys_admin", "--bounding-set=-net_admin,-sys_admin"]
    result = subprocess.run(
        [*drop, sys.executable, "-m", "kustos.cli", "dev", "up", "--name", "nocaps", "--no-sample"],
        capture_output=True, text=True, check=False, timeout=60,
        env={**os.environ, "KUSTOS_CACHE": str(tmp_path), "COLUMNS": "300"},
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "missing CAP_NET_ADMIN and CAP_SYS_ADMIN" in lines[0], result.stdout
    assert not (tmp_path / "clusters" / "nocaps").exists()


def test_the_tests_in_process_reads_print_what_kubectl_prints(
    crds: None, kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    """The suite's ``kubectl get -o json`` polls are served in-process (api_reads.py): each read
    here, answered both ways, is the same objects, and a missing object fails the same way."""
    assert isinstance(dev_cluster, ReadingCluster)
    names = {"app": "reads"}
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "one", "labels": names},
            "data": {"k": "ü"},
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "two"}, "data": {"k": "v"}},
    )
    namespace = ["-n", kubectl.namespace]
    reads = [
        [*namespace, "get", "configmap", "one", "-o", "json"],
        [*namespace, "get", "cm", "-l", "app=reads", "-o", "json"],
        [*namespace, "get", "configmaps", "--field-selector", "metadata.name=two", "-o", "json"],
        ["get", "namespace", kubectl.namespace, "-o", "json"],
        ["get", "crd", "etcdclusters.kustos.dev", "-o", "json"],
        ["get", "priorityclasses", "-o", "json"],
    ]
    for args in reads:
        served, printed = dev_cluster.kubectl(*args), DevCluster.kubectl(dev_cluster, *args)
        assert json.loads(served) == json.loads(printed), args
    assert json.loads(dev_cluster.kubectl(*reads[1]))["items"][0]["data"] == {"k": "ü"}
    missing = [*namespace, "get", "configmap", "three", "-o", "json"]
    assert dev_cluster.kubectl(*missing, "--ignore-not-found") == DevCluster.kubectl(
        dev_cluster, *missing, "--ignore-not-found"
    )
    for read in (dev_cluster.kubectl, lambda *args: DevCluster.kubectl(dev_cluster, *args)):
        with pytest.raises(DevClusterError, match=r'\(NotFound\): configmaps "three" not found'):
            read(*missing)
