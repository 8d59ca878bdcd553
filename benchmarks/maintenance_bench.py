"""Dead node -> replacement Running, with kustos's node maintenance, on the fast dev cluster.

    .venv/bin/python -m benchmarks.maintenance_bench [--runs 3] [--legacy-toleration 1m]

The settings EKCO was measured with (issue 16): ``kustos dev up --fast`` timings
(node-monitor-grace-period 8 s, default not-ready/unreachable tolerations 10 s). Two
one-replica StatefulSets whose pod runs as a real process (etcd): one without a claim
(nothing ties it to the node; EKCO's "volume without node affinity" needs a network volume
the dev cluster does not have, and the StatefulSet waits for the old pod's deletion just
the same) and one on a local-path claim pinned to the node, opted in to
``kustos.dev/release-pinned-claims``. The pod's node is stopped (heartbeat and processes);
the clock runs from that moment until the replacement is Ready on another node.

Fencing: ``provider``, the kwok cloud provider (``kustos run --cloud-provider kwok``) reports
the stopped node's instance Stopped; ``annotation``, a fencing agent that writes
``kustos.dev/fenced`` as soon as the node is tainted unreachable; ``legacy``, EKCO's
behaviour (no fencing, ``legacyClear`` after ``--legacy-toleration``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from benchmarks.etcd_bench import REPO, bench_cluster
from kustos.api.resources import RESOURCES
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig
from kustos.devcluster.kwokconfig import MANAGED_LABEL, Timings
from kustos.devcluster.network import operator_argv
from kustos.runtime.crd import render_crds
from kustos.runtime.times import rfc3339

ETCD_IMAGE = "registry.k8s.io/etcd:3.6.16-0"


def statefulset(name: str, pinned: bool) -> dict[str, Any]:
    container = {
        "name": "etcd",
        "image": ETCD_IMAGE,
        "command": ["etcd"],
        "args": [
            "--name=$(POD_NAME)",
            "--data-dir=/var/lib/etcd",
            "--listen-client-urls=http://0.0.0.0:2379",
            "--advertise-client-urls=http://$(POD_IP):2379",
            "--listen-peer-urls=http://0.0.0.0:2380",
            "--initial-advertise-peer-urls=http://$(POD_IP):2380",
            "--initial-cluster=$(POD_NAME)=http://$(POD_IP):2380",
        ],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "readinessProbe": {
            "exec": {"command": ["etcdctl", "--endpoints=http://localhost:2379", "endpoint", "health"]},
            "periodSeconds": 1,
        },
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
            ]}]
        }}},
    }  # fmt: skip
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": {"kustos.dev/release-pinned-claims": "true"}},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
    if pinned:
        body["spec"]["volumeClaimTemplates"] = [{
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }]  # fmt: skip
    else:
        spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    return body


def get(cluster: DevCluster, *args: str) -> Any:
    out = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out else None


def ready_pod(cluster: DevCluster, name: str, not_on: str | None = None) -> dict[str, Any] | None:
    pod = get(cluster, "pod", name)
    if not pod or pod["metadata"].get("deletionTimestamp"):
        return None
    if not_on is not None and pod["spec"].get("nodeName") == not_on:
        return None
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
    return pod if ready else None


def until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(what)


def start_operator(cluster: DevCluster, port: int) -> subprocess.Popen[bytes]:
    """``kustos run`` with every controller and the kwok provider, once it reports ready."""
    argv = [
        sys.executable, "-m", "kustos", "run", "--kubeconfig", str(cluster.kubeconfig),
        "--no-leader-elect", "--metrics-address", f"127.0.0.1:{port}", "--webhook-address", "127.0.0.1:0",
        "--cloud-provider", "kwok", "--log-level", "warning",
    ]  # fmt: skip
    operator = subprocess.Popen(
        operator_argv(cluster.resolv_conf, argv), env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    until(lambda: _ready(port), 120, "the operator ready")
    return operator


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def policy(cluster: DevCluster, mode: str, toleration: str) -> None:
    spec: dict[str, Any] = {"nodeUnreachableToleration": toleration}
    if mode == "legacy":
        spec |= {"legacyClear": True, "fencing": {"annotation": False, "provider": False}}
    elif mode == "annotation":
        spec |= {"fencing": {"annotation": True, "provider": False}}
    else:
        spec |= {"fencing": {"annotation": False, "provider": True}}
    body = {"apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
            "spec": spec}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))


def one_run(cluster: DevCluster, name: str, pinned: bool, mode: str) -> float:
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(statefulset(name, pinned)))
    first = until(lambda: ready_pod(cluster, f"{name}-0"), 120, f"{name}-0 Ready")
    node = first["spec"]["nodeName"]
    started = time.monotonic()
    cluster.take_node_down(node)
    try:
        if mode == "annotation":
            # The fencing agent: as soon as the node is tainted unreachable, it powers it off
            # (here it is already down) and says so.
            def unreachable() -> bool:
                n = get(cluster, "node", node)
                return any(
                    t["key"] == "node.kubernetes.io/unreachable" for t in n["spec"].get("taints") or []
                )

            until(unreachable, 120, f"{node} unreachable")
            cluster.kubectl("annotate", "node", node, f"kustos.dev/fenced={rfc3339(datetime.now(UTC))}",
                            "--overwrite")  # fmt: skip
        until(lambda: ready_pod(cluster, f"{name}-0", not_on=node), 900, f"{name}-0 elsewhere")
        return time.monotonic() - started
    finally:
        patch = {"metadata": {"labels": {MANAGED_LABEL: "true"}, "annotations": {"kustos.dev/fenced": None}}}
        cluster.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch))
        cluster.kubectl("delete", "statefulset", name, "--wait=true", check=False)
        cluster.kubectl("delete", "pvc", f"data-{name}-0", "--wait=false", check=False)

        def back() -> bool:
            n = get(cluster, "node", node)
            return any(
                c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]
            ) and not any(
                t["key"] == "node.kubernetes.io/out-of-service" for t in n["spec"].get("taints") or []
            )

        until(back, 120, f"{node} back")


def default_cluster(name: str) -> DevCluster:
    """A fresh dev cluster like ``bench_cluster``'s but with Kubernetes' default timings."""
    binaries.build()
    cluster = DevCluster(
        DevClusterConfig(name=name, worker_nodes=4, timings=Timings(), restart_backoff=(0.5, 4.0))
    )
    cluster.stop()
    cluster.start()
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=render_crds(RESOURCES))
    for resource in RESOURCES:
        cluster.wait_established(resource.crd.name)
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--legacy-toleration", default="1m")
    parser.add_argument(
        "--default-timings", action="store_true",
        help="Kubernetes' own node-failure timings (40 s grace, 300 s tolerations) instead of --fast",
    )  # fmt: skip
    parser.add_argument("--modes", nargs="*", default=["provider", "annotation", "legacy"])
    args = parser.parse_args()
    cluster = default_cluster("bench-maint") if args.default_timings else bench_cluster("bench-maint")
    operator: subprocess.Popen[bytes] | None = None
    try:
        for node in json.loads(cluster.kubectl("get", "nodes", "-o", "json"))["items"]:
            if not node["spec"].get("providerID"):  # the kwok provider's instance of the node
                name = node["metadata"]["name"]
                body = json.dumps({"spec": {"providerID": f"kwok://{name}"}})
                cluster.kubectl("patch", "node", name, "-p", body)
        operator = start_operator(cluster, port=18095)
        for mode in args.modes:
            policy(cluster, mode, args.legacy_toleration if mode == "legacy" else "1h")
            runs = args.runs if mode != "legacy" else 1
            # Legacy clear never releases a pinned claim (no fencing): that pod stays Pending.
            for pinned in (False, True) if mode != "legacy" else (False,):
                times = [
                    one_run(cluster, f"b-{mode[:3]}-{int(pinned)}-{i}", pinned, mode) for i in range(runs)
                ]
                what = "pinned local claim" if pinned else "no claim"
                figures = ", ".join(f"{t:.1f}" for t in times)
                print(f"{mode:10} {what:18} median {statistics.median(times):.1f} s ({figures})", flush=True)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        cluster.stop()


if __name__ == "__main__":
    main()
