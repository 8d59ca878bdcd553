"""The internal load balancer (enableInternalLoadBalancer) in front of the dev cluster's API server.

The operator (the chart's identity) runs the writer DaemonSet; the dev cluster's pod runner runs
its pods as real processes on every kwok node, writing into each node's host directory. Two
control-plane Nodes are added, each with an "API server" on its InternalIP (a loopback address
here): a TCP forwarder to the real kube-apiserver on port 6443, so there are two endpoints to
one API. A real HAProxy (Debian's package) then plays the static pod on one worker: the test is
that node's kubelet, running the container command the written manifest says (the image is the
local binary, the volumes the node's directories). Then API servers die, their Nodes go and a
new one joins, while kubectl keeps asking through the load balancer: no request fails twice in
a row (one in flight to a dying server may end in EOF), and
the configuration HAProxy serves follows the Nodes.

HAProxy listens on a free loopback port, not 6444 (test sessions run side by side on this
machine); the default's 6444 is a unit test's.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from kustos.devcluster.binaries import binary_path
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import node_manifest
from kustos.devcluster.ports import free_port
from kustos.maintenance.internallb import (
    CONFIG_FILE,
    CONTAINER_CONFIG_DIR,
    HAPROXY_DIR,
    MANIFEST_FILE,
    MANIFESTS_DIR,
    MASTER_SOCKET,
    RUN_DIR,
    WRITER_NAME,
)
from kustos.maintenance.internallb_node import master_command
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator

pytestmark = pytest.mark.process_runner(
    "the load balancer's pods on kwok control-plane nodes; its HAProxy and API servers run as processes"
)

FIRST_INDEX = 221


class Forwarder:
    """An "API server" on ``host:6443``: every connection piped to the real one. ``stop`` closes
    the listener and every open connection, as a dying API server would."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.host, self.target = host, target
        self.loop = asyncio.new_event_loop()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10), f"forwarder on {host} did not start"

    def _run(self, started: threading.Event) -> None:
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, self.host, 6443))
        started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        async def close() -> None:
            if self.server is not None:
                self.server.close()
            for writer in list(self.writers):
                writer.close()

        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


class Prober:
    """kubectl through the load balancer, again and again, counting what fails."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.ok = 0
        self.failures: list[str] = []
        self.dropped: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def once(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv, capture_output=True, text=True, timeout=30, check=False)

    def _run(self) -> None:
        while not self.stopping.is_set():
            result = self.once()
            if result.returncode != 0:
                # A request in flight to an API server that dies ends in EOF (HAProxy redispatches
                # new connections, not a half-answered one); a client retries it. An outage is a
                # retry that fails too.
                self.dropped.append(f"{time.strftime('%H:%M:%S')} {result.stderr.strip()}")
                result = self.once()
            if result.returncode == 0:
                self.ok += 1
            else:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {result.stderr.strip()}")
            time.sleep(0.2)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(40)


def node_root(cluster: DevCluster, node: str) -> Path:
    """Where the pod runner keeps a node's host paths (devcluster/sandbox.py)."""
    return cluster.state_dir / "nodes" / node / "hostpath"


def control_plane_node(cluster: DevCluster, index: int) -> tuple[str, str]:
    name = f"{cluster.config.name}-lb-{index}"
    # Its pods on the bridge (a range of the pod network), its InternalIP a loopback address.
    node = node_manifest(name, cluster.slot, index, control_plane=True, network=cluster.network)
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(node))
    return name, node["status"]["addresses"][0]["address"]


def policy_status(cluster: DevCluster) -> dict[str, Any]:
    text = cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json")
    return dict(json.loads(text).get("status") or {})


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


async def test_kubectl_through_the_internal_load_balancer_survives_api_servers_coming_and_going(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    cluster = kubectl.cluster
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    api = urlparse(kubeconfig["clusters"][0]["cluster"]["server"])
    target = (str(api.hostname), int(api.port or 443))
    port = free_port()
    forwarders: dict[str, Forwarder] = {}
    nodes: list[str] = []
    haproxy: asyncio.subprocess.Process | None = None
    try:
        for index in (FIRST_INDEX, FIRST_INDEX + 1):
            name, ip = control_plane_node(cluster, index)
            nodes.append(name)
            forwarders[name] = Forwarder(ip, target)
        a, b = nodes
        kubectl.apply({
            "apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
            "spec": {"enableInternalLoadBalancer": True, "internalLoadBalancerPort": port,
                     "hostTaskNamespace": kubectl.namespace},
        })  # fmt: skip

        # Every node gets the files; pick a worker to be the node whose kubelet we play.
        worker = sorted(n for n, control in cluster.config.node_names() if not control)[0]
        config_file = node_root(cluster, worker) / HAPROXY_DIR.lstrip("/") / CONFIG_FILE

        async def serves(*names: str, gone: tuple[str, ...] = ()) -> bool:
            text = config_file.read_text() if config_file.exists() else ""
            return all(f"server {n} " in text for n in names) and not any(
                f"server {n} " in text for n in gone
            )

        await wait_until(
            lambda: serves(a, b), f"{worker}'s HAProxy configuration naming {a} and {b}", timeout=120
        )
        check = await asyncio.create_subprocess_exec(
            str(binary_path("haproxy")), "-c", "-f", str(config_file), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said, _ = await check.communicate()
        assert check.returncode == 0, said.decode()

        manifest_file = node_root(cluster, worker) / MANIFESTS_DIR.lstrip("/") / MANIFEST_FILE

        async def written() -> bool:
            return manifest_file.exists()

        await wait_until(written, "the static pod manifest", timeout=30)
        manifest = yaml.safe_load(manifest_file.read_text())
        # A Pod the API server accepts as it is.
        cluster.kubectl("create", "--dry-run=server", "-f", str(manifest_file))

        # The kubelet's part: the container's command, its volumes being the node's directories.
        # The master socket's full path is longer than a Unix address holds here, so HAProxy runs
        # in that directory and names it relatively (the writer reaches it the same way).
        container = manifest["spec"]["containers"][0]
        run_dir = node_root(cluster, worker) / RUN_DIR.lstrip("/")
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = [str(binary_path("haproxy"))] + [
            arg.replace(f"{RUN_DIR}/", "unix@").replace(CONTAINER_CONFIG_DIR, str(config_file.parent))
            for arg in container["command"][1:]
        ]
        assert f"unix@{MASTER_SOCKET},mode,600" in argv
        log = (tmp_path / "haproxy.log").open("wb")
        haproxy = await asyncio.create_subprocess_exec(*argv, cwd=run_dir, stdout=log, stderr=log)

        prober = Prober([
            str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig),
            "--server", f"https://127.0.0.1:{port}", "--tls-server-name", str(api.hostname),
            "--request-timeout", "10s", "get", "--raw", "/readyz",
        ])  # fmt: skip

        async def answers() -> bool:
            return (await asyncio.to_thread(prober.once)).returncode == 0

        await wait_until(answers, f"kubectl through 127.0.0.1:{port}", timeout=30)

        status = policy_status(cluster)["internalLoadBalancer"]
        assert f"{a}={forwarders[a].host}:6443" in status["servers"], status

        with prober:
            # API server b dies: HAProxy's checks and redispatch keep kubectl whole.
            forwarders.pop(b).stop()
            await asyncio.sleep(3)
            # Its Node goes: every node's configuration is rewritten, and HAProxy reloaded.
            cluster.kubectl("delete", "node", b)
            await wait_until(lambda: serves(a, gone=(b,)), f"{b} out of the configuration", timeout=120)
            # A control-plane node joins, with an API server of its own.
            c, ip = control_plane_node(cluster, FIRST_INDEX + 2)
            nodes.append(c)
            forwarders[c] = Forwarder(ip, target)
            await wait_until(lambda: serves(a, c), f"{c} in the configuration", timeout=120)
            # API server a dies and its Node goes: c alone carries the traffic.
            forwarders.pop(a).stop()
            cluster.kubectl("delete", "node", a)
            await wait_until(lambda: serves(c, gone=(a, b)), f"{a} out of the configuration", timeout=120)
            await asyncio.sleep(3)

        assert prober.failures == [], prober.failures
        assert prober.ok > 10
        # The running HAProxy took each new configuration by reloads, not restarts.
        proc = master_command(run_dir / MASTER_SOCKET, "show proc")
        master = next(line for line in proc.splitlines() if " master " in line)
        assert "[failed: 0]" in master and int(master.split()[2]) >= 3, proc
        assert haproxy.returncode is None

        async def rolled_out() -> bool:
            found = policy_status(cluster).get("internalLoadBalancer") or {}
            counts = str(found.get("nodesUpdated") or "0/1").split("/")
            servers = found.get("servers") or []
            return bool(servers) and counts[0] == counts[1] and not any(a in s for s in servers)

        await wait_until(rolled_out, "the status saying every node has the files", timeout=120)

        # Switched off: the writer goes, the files stay (kubelets may point at the balancer).
        cluster.kubectl("patch", "maintenancepolicy", "default", "--type=merge",
                        "-p", json.dumps({"spec": {"enableInternalLoadBalancer": False}}))  # fmt: skip

        async def writer_gone() -> bool:
            return not cluster.kubectl("get", "daemonset", WRITER_NAME, "-n", kubectl.namespace,
                                       "--ignore-not-found", "-o", "name").strip()  # fmt: skip

        await wait_until(writer_gone, "the writer DaemonSet deleted", timeout=60)
        assert config_file.exists() and manifest_file.exists()
        assert "internalLoadBalancer" not in policy_status(cluster)
    finally:
        if haproxy is not None and haproxy.returncode is None:
            haproxy.terminate()
            await haproxy.wait()
        for forwarder in forwarders.values():
            forwarder.stop()
        for name in nodes:
            cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)
