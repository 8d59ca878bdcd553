"""Allow-listed pods run as real processes in their own namespaces on their pod IPs (SPEC F-DEV-2)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import node_manifest
from tests.integration import handwritten_etcd as demo
from tests.integration.conftest import Kubectl
from tests.integration.kube import is_ready, wait_until

pytestmark = pytest.mark.process_runner(
    "tests the process runner itself, which kwok nodes' allow-listed pods still run on"
)


def etcdctl(ip: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary_path("etcdctl")), f"--endpoints=http://{ip}:2379", "--command-timeout=5s", *args],
        capture_output=True, text=True, check=check, timeout=30,
    )  # fmt: skip


def single_member(name: str, **kwargs: Any) -> dict[str, Any]:
    return demo.etcd_pod(name, [f"--initial-cluster={name}=http://$(POD_IP):2380"], **kwargs)


async def ready_pod(kubectl: Kubectl, name: str, timeout: float = 60) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        pod = kubectl.get("pod", name)
        return pod if is_ready(pod) else None

    return await wait_until(ready, f"pod {name} Ready", timeout=timeout, cluster=kubectl.cluster,
                            namespace=kubectl.namespace)  # fmt: skip


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")", 1)[1].split()[0] != "Z"


async def test_etcd_pod_runs_answers_logs_and_stops_on_delete(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    kubectl.apply(single_member("solo"))
    pod = await ready_pod(kubectl, "solo")
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in dev_cluster.network.cidr and ip != dev_cluster.network.gateway

    health = etcdctl(ip, "endpoint", "health")
    assert "is healthy" in health.stdout + health.stderr
    etcdctl(ip, "put", "greeting", "hello")
    assert etcdctl(ip, "get", "greeting", "--print-value-only").stdout.strip() == "hello"

    # The process's own output, through the API (pods/log), as kubectl logs shows it. kwok
    # learns of the pod's log file through a watch, so the first read may come early.
    async def logs() -> str | None:
        text = kubectl("logs", "solo", check=False)
        return text if "serving client traffic" in text else None

    await wait_until(logs, "etcd's own log lines through kubectl logs", timeout=30)
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    pid = dev_cluster.container_pid(kubectl.namespace, "solo", "etcd")
    assert pid is not None and process_alive(pid)
    kubectl("delete", "pod", "solo", "--wait=true", "--timeout=30s")

    async def stopped() -> bool:
        return not process_alive(pid)

    await wait_until(stopped, "the etcd process to stop after its pod was deleted", timeout=15)
    assert etcdctl(ip, "endpoint", "health", check=False).returncode != 0


async def test_three_hand_written_pods_form_a_cluster_and_elect_a_leader(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    def pod_ip(name: str) -> str:
        for _ in range(240):
            ip = kubectl("get", "pod", name, "-o", "jsonpath={.status.podIP}", check=False)
            if ip:
                return ip
            time.sleep(0.25)
        raise AssertionError(f"{name} got no IP")

    names = demo.deploy(kubectl, pod_ip, namespace=kubectl.namespace, token=kubectl.namespace)
    pods = [await ready_pod(kubectl, n, timeout=90) for n in names]
    ips = [p["status"]["podIP"] for p in pods]
    assert len({p["spec"]["nodeName"] for p in pods}) == 3, "anti-affinity spreads members over nodes"

    endpoints = ",".join(f"http://{ip}:2379" for ip in ips)
    status = subprocess.run(
        [str(binary_path("etcdctl")), f"--endpoints={endpoints}", "endpoint", "status", "-w", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    statuses = json.loads(status.stdout)
    leaders = {s["Status"]["leader"] for s in statuses}
    cluster_ids = {s["Status"]["header"]["cluster_id"] for s in statuses}
    assert len(statuses) == 3 and len(leaders) == 1 and len(cluster_ids) == 1
    assert next(iter(leaders)) in {s["Status"]["header"]["member_id"] for s in statuses}
    members = json.loads(etcdctl(ips[0], "member", "list", "-w", "json").stdout)["members"]
    assert sorted(m["name"] for m in members) == sorted(names)


async def test_pvc_backed_etcd_keeps_its_data_across_pod_recreation(kubectl: Kubectl) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    pod = single_member("durable", volume={"persistentVolumeClaim": {"claimName": "data"}})
    kubectl.apply(claim, pod)
    first = await ready_pod(kubectl, "durable")
    etcdctl(first["status"]["podIP"], "put", "survivor", "still-here")
    assert kubectl.get("pvc", "data")["status"]["phase"] == "Bound"

    kubectl("delete", "pod", "durable", "--wait=true", "--timeout=30s")
    kubectl.apply(pod)
    second = await ready_pod(kubectl, "durable")
    # The volume is pinned to its node, so the scheduler puts the pod back there.
    assert second["spec"]["nodeName"] == first["spec"]["nodeName"]
    value = etcdctl(second["status"]["podIP"], "get", "survivor", "--print-value-only")
    assert value.stdout.strip() == "still-here"


async def test_a_new_image_restarts_the_container_in_place_keeping_its_empty_dir(
    kubectl: Kubectl,
) -> None:
    """As a kubelet does: the one mutable field of a container restarts it, same pod, same volumes."""
    old, new = ETCD_VERSIONS[-2:]
    kubectl.apply(single_member("inplace", version=old))
    first = await ready_pod(kubectl, "inplace")
    ip = first["status"]["podIP"]
    etcdctl(ip, "put", "kept", "across-images")

    new_image = demo.etcd_image(new)
    patch = {"spec": {"containers": [{"name": "etcd", "image": new_image}]}}
    kubectl("patch", "pod", "inplace", "--type=strategic", "-p", json.dumps(patch))

    async def restarted() -> dict[str, Any] | None:
        pod = kubectl.get("pod", "inplace")
        state = pod["status"]["containerStatuses"][0]
        return pod if state["image"] == new_image and is_ready(pod) else None

    second = await wait_until(restarted, f"the container running {new_image}", timeout=60,
                              cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert second["status"]["containerStatuses"][0]["restartCount"] == 1
    version = json.loads(etcdctl(ip, "endpoint", "status", "-w", "json").stdout)[0]["Status"]["version"]
    assert version == new.lstrip("v")
    assert etcdctl(ip, "get", "kept", "--print-value-only").stdout.strip() == "across-images"


async def test_crashed_container_is_reported_and_restarted(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    kubectl.apply(single_member("crashy"))
    await ready_pod(kubectl, "crashy")
    ns = kubectl.namespace

    dev_cluster.crash_container(ns, "crashy", "etcd", stay_down=True)

    async def down() -> bool:
        pod = kubectl.get("pod", "crashy")
        state = pod["status"]["containerStatuses"][0]
        return not is_ready(pod) and "running" not in state["state"]

    await wait_until(
        down, "the crashed member reported not ready", timeout=20, cluster=dev_cluster, namespace=ns
    )
    # The pod object stays: the member is dead but nothing deleted it.
    assert kubectl.get("pod", "crashy")["metadata"].get("deletionTimestamp") is None

    dev_cluster.release_container(ns, "crashy", "etcd")
    pod = await ready_pod(kubectl, "crashy")
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert etcdctl(pod["status"]["podIP"], "endpoint", "health", check=False).returncode == 0


async def test_init_containers_run_first_in_order(kubectl: Kubectl) -> None:
    pod = single_member("initd")
    script = "echo {0} >> /var/lib/etcd/order"
    pod["spec"]["initContainers"] = [
        {
            "name": f"init-{i}",
            "image": demo.etcd_image(),
            "command": ["/bin/sh", "-c", script.format(i)],
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
        }
        for i in (1, 2)
    ]
    main = pod["spec"]["containers"][0]
    main["readinessProbe"] = {
        "exec": {
            "command": [
                "/bin/sh",
                "-c",
                'test "$(cat /var/lib/etcd/order)" = "$(printf \'1\\n2\')"',
            ]
        },
        "periodSeconds": 1,
    }
    kubectl.apply(pod)
    ready = await ready_pod(kubectl, "initd")
    statuses = ready["status"]["initContainerStatuses"]
    assert [s["state"]["terminated"]["exitCode"] for s in statuses] == [0, 0]


async def test_an_image_that_is_not_built_is_reported_not_run(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    kubectl.apply(single_member("old", version="v3.4.0"))

    async def reported() -> str | None:
        statuses = kubectl.get("pod", "old")["status"].get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting.get("message") if waiting.get("reason") == "ErrImagePull" else None

    message = await wait_until(reported, "ErrImagePull for an etcd that is not built", timeout=20,
                               cluster=dev_cluster, namespace=kubectl.namespace)  # fmt: skip
    assert all(v.lstrip("v") in message or v in message for v in ETCD_VERSIONS)


def one_shot(name: str, script: str, **container: Any) -> dict[str, Any]:
    """A pod whose one container runs ``script`` once (restartPolicy Never)."""
    main = {"name": "main", "image": demo.etcd_image(), "command": ["/bin/sh", "-c", script], **container}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [main]}}  # fmt: skip


async def test_a_pod_off_the_pod_network_is_reported_not_run(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    """A node whose podCIDR is outside the pod network (a loopback range): its pod would run
    where nothing reaches, so it waits, saying why."""
    name = f"{dev_cluster.config.name}-offnet"
    dev_cluster.kubectl("apply", "-f", "-", input_text=json.dumps(
        node_manifest(name, dev_cluster.slot, 250, control_plane=False)))  # fmt: skip
    try:
        pod = one_shot("offnet", "sleep 60")
        pod["spec"]["nodeName"] = name
        kubectl.apply(pod)

        async def waiting() -> dict[str, Any] | None:
            statuses = kubectl.get("pod", "offnet")["status"].get("containerStatuses") or []
            return statuses[0]["state"].get("waiting") if statuses else None

        state = await wait_until(waiting, "the pod off the network reported", timeout=30)
        ip = kubectl.get("pod", "offnet")["status"]["podIP"]
        assert ipaddress.ip_address(ip) not in dev_cluster.network.cidr
        assert state["reason"] == "ContainerCreating"
        assert f"IP {ip}" in state["message"] and str(dev_cluster.network.cidr) in state["message"], state
        assert dev_cluster.container_pid(kubectl.namespace, "offnet", "main") is None
    finally:
        dev_cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)


async def test_node_down_kills_its_processes(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    kubectl.apply(single_member("doomed"))
    pod = await ready_pod(kubectl, "doomed")
    pid = dev_cluster.container_pid(kubectl.namespace, "doomed", "etcd")
    assert pid is not None
    node = pod["spec"]["nodeName"]
    dev_cluster.take_node_down(node)
    try:

        async def killed() -> bool:
            return not process_alive(pid)

        await wait_until(killed, f"processes on {node} killed", timeout=15)
    finally:
        dev_cluster.bring_node_up(node)
    # A node that comes back restarts its pods' containers, as a rebooted kubelet would.
    pod = await ready_pod(kubectl, "doomed", timeout=60)
    assert etcdctl(pod["status"]["podIP"], "endpoint", "health", check=False).returncode == 0


def probe_script(lines: list[str]) -> str:
    """A shell command that prints what the container sees, then runs etcd (a Ready pod)."""
    return (
        "; ".join(lines)
        + "; exec etcd --data-dir=/var/lib/etcd/d --listen-client-urls=http://0.0.0.0:2379 "
        + ("--advertise-client-urls=http://localhost:2379")
    )


async def test_a_pod_gets_what_a_kubelet_gives_it(kubectl: Kubectl, dev_cluster: DevCluster) -> None:
    """resolv.conf, /etc/hosts, hostname, service account token, KUBERNETES_SERVICE_*, downward API
    files: each from the pod's own namespaces, and the token works against the API server."""
    ns = kubectl.namespace
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sub"},
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "kubelet"},
                  "ports": [{"name": "client", "port": 2379}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "seer", "labels": {"app": "kubelet"}},
         "spec": {"hostname": "seer", "subdomain": "sub",
                  "containers": [{"name": "etcd", "image": demo.etcd_image(), "command": ["/bin/sh", "-c"],
                                  "args": [probe_script([
                                      "cat /etc/resolv.conf /etc/hosts", "echo host=$(hostname)",
                                      f"echo ns=$(cat {token_dir}/namespace)",
                                      f"echo ca=$(head -c 27 {token_dir}/ca.crt)",
                                      f"echo token=$(wc -c < {token_dir}/token)",
                                      "echo api=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
                                      "echo labels=$(cat /var/lib/etcd/info/labels)",
                                  ])],
                                  "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"},
                                                   {"name": "info", "mountPath": "/var/lib/etcd/info"}]}],
                  "volumes": [{"name": "data", "emptyDir": {}},
                              {"name": "info", "downwardAPI": {"items": [{"path": "labels",
                                  "fieldRef": {"fieldPath": "metadata.labels['app']"}}]}}]}},
    )  # fmt: skip
    pod = await ready_pod(kubectl, "seer")
    ip = pod["status"]["podIP"]

    async def printed() -> str | None:
        text = kubectl("logs", "seer", check=False)
        return text if "labels=" in text else None

    text = await wait_until(printed, "what the container printed", timeout=30)
    gateway = dev_cluster.network.gateway
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in text
    assert f"nameserver {gateway}" in text and "options ndots:5" in text
    assert f"{ip}\tseer.sub.{ns}.svc.cluster.local seer" in text
    assert "host=seer" in text and f"ns={ns}" in text and "ca=-----BEGIN CERTIFICATE-----" in text
    assert "labels=kubelet" in text
    token_length = int(text.split("token=")[1].split()[0])
    assert token_length > 100
    api_host, api_port = text.split("api=")[1].split()[0].split(":")
    assert api_host == gateway
    # The host's /etc/resolv.conf and hostname are untouched.
    assert socket.gethostname() != "seer"
    # The token is a real one of the pod's service account: the API server knows who it is.
    token_file = next((dev_cluster.state_dir / "pods").glob(f"{ns}_seer_*/volumes/kube-api-access-*/token"))
    review = kubectl.cluster.kubectl("create", "-f", "-", "-o", "json", input_text=json.dumps(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
         "spec": {"token": token_file.read_text()}}))  # fmt: skip
    user = json.loads(review)["status"]["user"]
    assert user["username"] == f"system:serviceaccount:{ns}:default"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["seer"]
    assert int(api_port) > 0


async def test_cluster_dns_serves_services_headless_pods_and_pod_records(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    """From the host (this session resolves through CoreDNS) and from inside a pod (etcdctl
    by name), as any client in the cluster; EndpointSlices hold the pod IP."""
    ns = kubectl.namespace
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "named"},
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "named"},
                  "ports": [{"name": "client", "port": 2379}]}},
    )  # fmt: skip
    pod = single_member("named-0")
    pod["metadata"]["labels"] = {"app": "named"}
    pod["spec"].update(hostname="named-0", subdomain="named")
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["etcdctl", f"--endpoints=http://named-0.named.{ns}.svc.cluster.local:2379",
                             "endpoint", "health"]},
        "periodSeconds": 1,
    }  # fmt: skip
    kubectl.apply(pod)
    ready = await ready_pod(kubectl, "named-0")  # its exec probe resolved its own name inside the pod
    ip = ready["status"]["podIP"]
    dashed = ip.replace(".", "-")
    for name in (f"named-0.named.{ns}.svc.cluster.local", f"named.{ns}.svc.cluster.local",
                 f"{dashed}.{ns}.pod.cluster.local"):  # fmt: skip
        assert socket.gethostbyname(name) == ip, name
    slices = kubectl.get("endpointslices", None, "-l", "kubernetes.io/service-name=named")["items"]
    assert [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]] == [ip]
    assert etcdctl(f"named-0.named.{ns}.svc.cluster.local", "endpoint", "health").returncode == 0


async def test_two_pods_listen_on_the_same_wildcard_port(kubectl: Kubectl) -> None:
    """Each pod has its own network namespace: 0.0.0.0:2379 twice, each on its own IP."""
    for name in ("twin-a", "twin-b"):
        kubectl.apply(single_member(name))
    a, b = await ready_pod(kubectl, "twin-a"), await ready_pod(kubectl, "twin-b")
    assert a["status"]["podIP"] != b["status"]["podIP"]
    etcdctl(a["status"]["podIP"], "put", "who", "a")
    assert etcdctl(b["status"]["podIP"], "get", "who", "--print-value-only").stdout.strip() == ""


async def test_a_partitioned_node_keeps_its_processes_and_heals(
    kubectl: Kubectl, dev_cluster: DevCluster
) -> None:
    island = single_member("island")
    island["spec"]["tolerations"] = [
        {
            "key": f"node.kubernetes.io/{k}",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 600,
        }
        for k in ("unreachable", "not-ready")
    ]
    kubectl.apply(island)
    pod = await ready_pod(kubectl, "island")
    ip, node = pod["status"]["podIP"], pod["spec"]["nodeName"]
    pid = dev_cluster.container_pid(kubectl.namespace, "island", "etcd")
    assert pid is not None
    dev_cluster.partition_node(node)
    try:
        await asyncio.sleep(1)
        assert etcdctl(ip, "endpoint", "health", check=False).returncode != 0

        async def unknown() -> bool:
            conditions = kubectl.get("node", node)["status"]["conditions"]
            return any(c["type"] == "Ready" and c["status"] == "Unknown" for c in conditions)

        await wait_until(unknown, f"{node} Unknown: its heartbeat stopped", timeout=30)
        assert process_alive(pid)
    finally:
        dev_cluster.heal_node(node)
    pod = await ready_pod(kubectl, "island", timeout=60)
    assert etcdctl(ip, "endpoint", "health", check=False).returncode == 0
    assert dev_cluster.container_pid(kubectl.namespace, "island", "etcd") == pid, "restarted, not healed"
