"""The local control plane (F-DEV-1): start, inspect, break and stop it from Python.

kwokctl (binary runtime, every binary local) runs etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok on 127.0.0.1; the node agent
(runner and provisioner) runs beside them. Everything a cluster has lives in one
state directory, so ``stop`` can remove all of it and a second ``start`` of a
running cluster just reports it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from kustos.devcluster import binaries
from kustos.devcluster.kwokconfig import (
    AUDIT_POLICY,
    MANAGED_LABEL,
    PORT_OPTIONS,
    Timings,
    kwok_source_dir,
    kwokctl_config,
    node_manifest,
)
from kustos.devcluster.network import (
    SERVICE_ACCOUNT_DIR,
    ClusterNetwork,
    claim_network,
    missing_privileges,
    operator_resolv_conf,
)
from kustos.devcluster.paths import cache_root, clusters_root
from kustos.devcluster.pids import alive, pid_files, read_pid
from kustos.devcluster.ports import free_ports
from kustos.devcluster.provisioner import storage_class_manifest
from kustos.devcluster.realnode import RealNode, RealNodeError, real_node
from kustos.devcluster.runner import sandbox_dir
from kustos.devcluster.sandbox import HOLD_SUFFIX, PID_SUFFIX

DEFAULT_NAME = "kustos"
# What runs beside the control plane, in the order it is stopped: the operator (started by
# `kustos dev up`) before the agent that runs its pods, and the cluster DNS.
BACKGROUND = ("operator", "agent", "coredns", "kube-proxy")
# Annotation on a node whose pods are cut off from the network (processes alive).
PARTITIONED_ANNOTATION = "kustos.dev/partitioned"


class DevClusterError(RuntimeError):
    """The dev cluster could not do what was asked; the message says what and where to look."""


def require_privileges() -> None:
    """What a dev cluster needs before anything is built or started, said in one line."""
    missing = missing_privileges()
    if missing:
        raise DevClusterError(
            f"kustos dev up needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN for pod network "
            f"and mount namespaces; missing {missing}"
        )


@dataclass(frozen=True)
class DevClusterConfig:
    """How many nodes, which timings, and restart backoff for runner-run containers."""

    name: str = DEFAULT_NAME
    control_plane_nodes: int = 1
    worker_nodes: int = 3
    # Workers run by a kubelet with containerd and runc (``realnode``), beside the kwok ones.
    real_nodes: int = 0
    timings: Timings = field(default_factory=Timings)
    restart_backoff: tuple[float, float] = (1.0, 30.0)
    state_dir: Path | None = None

    def node_names(self) -> list[tuple[str, bool]]:
        """The kwok nodes: (name, control plane?)."""
        names = [(f"{self.name}-control-plane-{i + 1}", True) for i in range(self.control_plane_nodes)]
        names += [(f"{self.name}-worker-{i + 1}", False) for i in range(self.worker_nodes)]
        return names


class DevCluster:
    """One local control plane and its node agent, addressed by its state directory."""

    def __init__(self, config: DevClusterConfig | None = None) -> None:
        self.config = config or DevClusterConfig()
        self.state_dir = self.config.state_dir or clusters_root() / self.config.name

    # ---- paths ---------------------------------------------------------------------

    @property
    def kwok_workdir(self) -> Path:
        return self.state_dir / "kwok"

    @property
    def exec_path(self) -> Path:
        """A directory on kwok's PATH: the programs a kwok ``Exec``/``ClusterExec`` (local)
        runs when something execs in a simulated pod (e.g. a fake ``ceph`` for Rook's toolbox).
        Created empty; tests put their programs here."""
        return self.state_dir / "exec-path"

    @property
    def cluster_dir(self) -> Path:
        return self.kwok_workdir / "clusters" / self.config.name

    @property
    def kubeconfig(self) -> Path:
        return self.cluster_dir / "kubeconfig.yaml"

    @property
    def kubectl_path(self) -> Path:
        return binaries.binary_path("kubectl")

    @property
    def network_file(self) -> Path:
        return self.state_dir / "network.json"

    @property
    def network(self) -> ClusterNetwork:
        """The pod network: its range, bridge and gateway (where the API server and DNS answer)."""
        return ClusterNetwork.from_file(self.network_file)

    @property
    def dns_server(self) -> str:
        """CoreDNS's address: the bridge's gateway, port 53."""
        return self.network.gateway

    @property
    def resolv_conf(self) -> Path:
        """A resolv.conf naming the cluster DNS, for processes on the host that resolve
        cluster names (the operator: see ``network.operator_argv``)."""
        path = self.state_dir / "resolv.conf"
        if not path.exists():
            path.write_text(operator_resolv_conf(self.dns_server))
        return path

    @property
    def agent_log(self) -> Path:
        return self.state_dir / "agent.log"

    def ensure_background(self, name: str, argv: list[str]) -> None:
        """Run ``argv`` beside the cluster (pid in ``<name>.pid``, output in ``<name>.log``)
        unless it already runs; ``stop`` stops it, gracefully first."""
        pid_file = self.state_dir / f"{name}.pid"
        if alive(read_pid(pid_file)):
            return
        with (self.state_dir / f"{name}.log").open("ab") as sink:
            process = subprocess.Popen(
                argv, stdout=sink, stderr=sink, stdin=subprocess.DEVNULL, start_new_session=True
            )
        pid_file.write_text(str(process.pid))

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: every request by a service account (``AUDIT_POLICY``)."""
        return self.cluster_dir / "logs" / "audit.log"

    def component_log(self, component: str) -> Path:
        return self.cluster_dir / "logs" / f"{component}.log"

    # ---- lifecycle -----------------------------------------------------------------

    @property
    def ready_marker(self) -> Path:
        return self.state_dir / "ready"

    def is_running(self) -> bool:
        """Fully started (not half-way through a start that failed) and answering."""
        return self.ready_marker.is_file() and self._api_answers()

    def start(
        self,
        log: Callable[[str], None] = lambda _: None,
        timeout: float = 120,
        kustos_image: Path | None = None,
    ) -> None:
        """Start the control plane, nodes and agent; do nothing if it already runs. Real nodes
        import ``kustos_image`` (an archive; by default this tree's, when it is built)."""
        if self.is_running():
            self._ensure_coredns()
            self._ensure_agent()
            log(f"dev cluster {self.config.name} is already running")
            return
        require_privileges()
        if self.state_dir.exists():
            log(f"removing the remains of a stopped dev cluster at {self.state_dir}")
            self.stop()
        binaries.build(log=log)
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "config.json").write_text(json.dumps(asdict(self.config), default=str, indent=2))
        slot = self._claim_slot()
        network = claim_network(self.config.name, self.network_file, clusters_root())
        # Where pods' service account tokens are bind-mounted in their mount namespaces.
        SERVICE_ACCOUNT_DIR.mkdir(parents=True, exist_ok=True)
        config_file = self.state_dir / "kwokctl.yaml"
        audit_policy = self.state_dir / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
        ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
        config = kwokctl_config(
            self.config.timings, kwok_source_dir(), slot, ports, network, audit_policy,
            kubelet_client=(self.pki_dir / "admin.crt", self.pki_dir / "admin.key"),
        )  # fmt: skip
        # kwok's kubelet API listens on every address (kwokctl_config) and asks for no
        # credentials, and its exec runs commands on this host: loopback alone reaches it (the
        # API server calls the kwok nodes at their 127.x addresses).
        try:
            binaries.ensure_debian_tools(("nftables",), log=log)
        except binaries.BuildError as err:
            raise DevClusterError(str(err)) from err
        network.loopback_only(ports["kwokControllerPort"])
        config_file.write_text(yaml.safe_dump_all(config, sort_keys=False))
        log("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok ...")
        self._kwokctl(
            "-c", str(config_file), "create", "cluster", "--runtime", "binary",
            "--kubeconfig", str(self.state_dir / "kwokctl-kubeconfig.yaml"),
            "--wait", f"{int(timeout)}s", "--timeout", f"{int(timeout)}s",
        )  # fmt: skip
        self._wait_for(self._api_answers, timeout, "the API server to answer")
        self._create_base_objects()
        self._ensure_coredns()
        self._ensure_agent()
        real = range(1, self.config.real_nodes + 1)
        self.start_real_nodes(real, log, kustos_image=kustos_image, wait=False)
        self._wait_for(self._nodes_ready, timeout, "every node to be Ready")
        for node in self.real_nodes():
            self._label_worker(node.name)
        self.ready_marker.write_text(self.kubeconfig.as_posix())
        log(f"dev cluster {self.config.name} is up in {time.monotonic() - started:.1f}s")

    def stop(self) -> None:
        """Stop what runs beside the cluster (the operator, the agent and with it every pod
        process) and the control plane; remove all state."""
        for name in BACKGROUND:
            self._stop_background(name)
        if (self.state_dir / "kube-proxy.log").exists():  # it ran: its tables stay behind
            remove_proxy_tables()
        # Before the API server goes: a kubelet that loses it cannot stop its pods in order.
        for node in self.real_nodes():
            node.stop()
        if self.cluster_dir.exists():
            with contextlib.suppress(DevClusterError):
                self._kwokctl(
                    "delete",
                    "cluster",
                    "--kubeconfig",
                    str(self.state_dir / "kwokctl-kubeconfig.yaml"),
                )
        self._kill_leftovers()
        if self.network_file.exists():
            with contextlib.suppress(OSError, ValueError, KeyError):
                ClusterNetwork.from_file(self.network_file).cleanup()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # ---- real nodes ----------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.cluster_dir / "pki"

    def real_nodes(self) -> list[RealNode]:
        """The real nodes this cluster has (running or the remains of a killed run)."""
        root = self.state_dir / "real"
        indices = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []
        return [real_node(self.config.name, self.state_dir, i) for i in indices]

    def real_node_named(self, name: str) -> RealNode | None:
        return next((n for n in self.real_nodes() if n.name == name), None)

    def start_real_node(
        self,
        index: int,
        log: Callable[[str], None] = lambda _: None,
        wait: bool = True,
        timeout: float = 120,
        kustos_image: Path | None = None,
    ) -> RealNode:
        """Start real node ``index`` (containerd, preloaded images, kubelet); with ``wait``,
        until its Node is Ready. ``kustos_image``: the archive of kustos's image to import;
        by default this tree's, once `kustos dev build` (or `dev up`) has built it."""
        from kustos.devcluster import kustosimage
        from kustos.devcluster.nodeimages import PAUSE_IMAGE, node_image_archives

        node = real_node(self.config.name, self.state_dir, index)
        node.directory.mkdir(parents=True, exist_ok=True)
        self._ensure_kube_proxy(node.name, log)
        kustos_image = kustos_image or kustosimage.archive_path()
        images = [*node_image_archives(), *([kustos_image] if kustos_image.is_file() else [])]
        try:
            node.start(self.network, self.kubeconfig, self.pki_dir / "ca.crt", images, PAUSE_IMAGE, log)
        except RealNodeError as err:
            raise DevClusterError(str(err)) from err
        if wait:
            what = f"real node {node.name} to be Ready (kubelet log: {node.log('kubelet')})"
            self._wait_for(lambda: self._node_ready(node.name), timeout, what)
            self._label_worker(node.name)
        return node

    def start_real_nodes(
        self,
        indices: Sequence[int],
        log: Callable[[str], None] = lambda _: None,
        timeout: float = 120,
        kustos_image: Path | None = None,
        wait: bool = True,
    ) -> list[RealNode]:
        """Start several real nodes: the first alone (it starts the host's kube-proxy), the
        others side by side (importing kustos's image is most of a node's start); with
        ``wait``, until every one is Ready."""
        if not indices:
            return []
        first = self.start_real_node(indices[0], log, wait=False, kustos_image=kustos_image)
        with ThreadPoolExecutor(max(1, len(indices) - 1)) as pool:
            others = list(pool.map(
                lambda i: self.start_real_node(i, log, wait=False, kustos_image=kustos_image), indices[1:]
            ))  # fmt: skip
        nodes = [first, *others]
        for node in nodes if wait else ():
            what = f"real node {node.name} to be Ready (kubelet log: {node.log('kubelet')})"
            self._wait_for(functools.partial(self._node_ready, node.name), timeout, what)
            self._label_worker(node.name)
        return nodes

    def _ensure_kube_proxy(self, node: str, log: Callable[[str], None]) -> None:
        """kube-proxy (nftables) for the host, so pods on real nodes reach ClusterIPs (issue 20): every
        real node shares the host's network namespace, so one serves them all. A pod's
        packet to a ClusterIP reaches the host through the gateway route (``cni_config``)
        and is translated there; a Service whose endpoint is on the host (``kubernetes``)
        answers locally."""
        # nftables: installed by ``start`` (the kwok port's table).
        # A Service whose endpoints are pods is translated to a pod IP on the host and must
        # leave by the bridge it came in by: forwarding on the bridge alone (the host's
        # ip_forward stays 0; pods have no default route, so nothing leaves the machine).
        # The setting goes with the bridge.
        Path(f"/proc/sys/net/ipv4/conf/{self.network.bridge}/forwarding").write_text("1")
        ports = free_ports(2)
        self.ensure_background("kube-proxy", [
            str(binaries.binary_path("kube-proxy")), "--proxy-mode=nftables",
            f"--kubeconfig={self.kubeconfig}", f"--hostname-override={node}",
            f"--cluster-cidr={self.network.cidr}", "--conntrack-max-per-core=0",
            f"--healthz-bind-address=127.0.0.1:{ports[0]}", f"--metrics-bind-address=127.0.0.1:{ports[1]}",
        ])  # fmt: skip

    def stop_kube_proxy(self) -> None:
        """Stop the host's kube-proxy and remove its tables (the last real node is gone)."""
        self._stop_background("kube-proxy")
        remove_proxy_tables()

    def _label_worker(self, node: str) -> None:
        """The role a kubelet may not give itself (``--node-labels`` refuses node-role.*)."""
        self.kubectl("label", "node", node, "node-role.kubernetes.io/worker=", "--overwrite")

    def remove_real_node(self, node: RealNode) -> None:
        """Stop it, leave nothing of it on the machine, and delete its Node."""
        node.stop()
        shutil.rmtree(node.directory, ignore_errors=True)
        self.kubectl("delete", "node", node.name, "--ignore-not-found", "--wait=false")

    def _node_ready(self, name: str) -> bool:
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        return self.kubectl("get", "node", name, "-o", jsonpath, check=False).strip() == "True"

    # ---- what tests do to it -------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        result = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input_text,
            check=False,
        )
        if check and result.returncode != 0:
            raise DevClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def wait_established(self, crd: str, timeout: float = 30) -> None:
        """Until a just-applied CRD serves (``kubectl wait`` fails while it has no status yet)."""
        jsonpath = "jsonpath={.status.conditions[?(@.type=='Established')].status}"

        def established() -> bool:
            return self.kubectl("get", "crd", crd, "-o", jsonpath, check=False).strip() == "True"

        self._wait_for(established, timeout, f"CRD {crd} to be established")

    def take_node_down(self, node: str) -> None:
        """kwok stops heartbeating the node and the agent kills its processes (a partitioned
        node too: powering it off is how a fencing agent ends a partition). A real node's
        kubelet stops and its containers with it: the Node goes NotReady as a real one does."""
        real = self.real_node_named(node)
        if real is not None:
            real.stop_kubelet()
            real.stop_containers()
            return
        patch = {"metadata": {"labels": {MANAGED_LABEL: None}, "annotations": {PARTITIONED_ANNOTATION: None}}}
        self.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch))

    def bring_node_up(self, node: str) -> None:
        real = self.real_node_named(node)
        if real is not None:
            real.set_pod_links(up=True, bridge=self.network.bridge)
            real.start_kubelet(self.kubeconfig, self.network)
            return
        self.kubectl("label", "node", node, f"{MANAGED_LABEL}=true", "--overwrite")

    def partition_node(self, node: str) -> None:
        """Cut the node off as a network partition would: its pods' links go down (their
        processes keep running), kwok stops its heartbeat and the agent writes nothing for it.
        A real node's kubelet stops (no heartbeat) and its pods' links go down; containers run on."""
        real = self.real_node_named(node)
        if real is not None:
            real.stop_kubelet()
            real.set_pod_links(up=False, bridge=self.network.bridge)
            return
        patch = {
            "metadata": {"labels": {MANAGED_LABEL: None}, "annotations": {PARTITIONED_ANNOTATION: "true"}}
        }
        self.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch))

    def heal_node(self, node: str) -> None:
        """End a partition: links up, heartbeat back; the agent catches up with what changed
        meanwhile (pods deleted while it could not hear are stopped then)."""
        real = self.real_node_named(node)
        if real is not None:
            self.bring_node_up(node)
            return
        patch = {
            "metadata": {"labels": {MANAGED_LABEL: "true"}, "annotations": {PARTITIONED_ANNOTATION: None}}
        }
        self.kubectl("patch", "node", node, "--type", "merge", "-p", json.dumps(patch))

    def crash_container(self, namespace: str, pod: str, container: str, stay_down: bool = True) -> int:
        """SIGKILL a container's process; with ``stay_down`` it is not restarted until released
        (the process runner's pods only: a real node's kubelet restarts by the pod's policy)."""
        real = self._real_node_of(namespace, pod)
        if real is not None:
            if stay_down:
                raise DevClusterError(
                    f"{namespace}/{pod} is on real node {real.name}: its kubelet restarts the "
                    "container; stay_down is the process runner's"
                )
            try:
                return real.kill_container(namespace, pod, container)
            except RealNodeError as err:
                raise DevClusterError(str(err)) from err
        directory = self._sandbox_dir(namespace, pod)
        if stay_down:
            (directory / f"{container}{HOLD_SUFFIX}").touch()
        pid = int((directory / f"{container}{PID_SUFFIX}").read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return pid

    def release_container(self, namespace: str, pod: str, container: str) -> None:
        (self._sandbox_dir(namespace, pod) / f"{container}{HOLD_SUFFIX}").unlink(missing_ok=True)

    def container_pid(self, namespace: str, pod: str, container: str) -> int | None:
        pid_file = self._sandbox_dir(namespace, pod) / f"{container}{PID_SUFFIX}"
        return int(pid_file.read_text()) if pid_file.exists() else None

    def restart_component(self, component: str, down_seconds: float = 0.0) -> None:
        """Stop one control-plane component and start it again with its saved command line."""
        saved = self._saved_components()
        spec = next((c for c in saved if c["name"] == component), None)
        if spec is None:
            raise DevClusterError(f"no component {component}; have {[c['name'] for c in saved]}")
        work_dir = Path(spec["workDir"])
        pid_file = work_dir / "pids" / f"{Path(spec['binary']).stem}.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)
        time.sleep(down_seconds)
        env = {**os.environ, **{e["name"]: e.get("value", "") for e in spec.get("envs") or []}}
        with self.component_log(component).open("ab") as sink:
            process = subprocess.Popen(
                [spec["binary"], *spec.get("args", [])],
                cwd=work_dir, stdout=sink, stderr=sink, env=env, start_new_session=True,
            )  # fmt: skip
        pid_file.write_text(str(process.pid))

    def status(self) -> dict[str, Any]:
        """Components with their pids, and nodes with their readiness."""
        components = []
        for spec in self._saved_components() if self.cluster_dir.exists() else []:
            pid_file = Path(spec["workDir"]) / "pids" / f"{Path(spec['binary']).stem}.pid"
            pid = read_pid(pid_file)
            components.append({"name": spec["name"], "pid": pid, "running": alive(pid)})
        for name in reversed(BACKGROUND):
            pid = read_pid(self.state_dir / f"{name}.pid")
            if pid is not None:
                components.append({"name": f"kustos-{name}", "pid": pid, "running": alive(pid)})
        nodes: list[dict[str, Any]] = []
        if self.is_running():
            listing = json.loads(self.kubectl("get", "nodes", "-o", "json"))
            for node in listing["items"]:
                ready = next(
                    (c["status"] for c in node["status"].get("conditions", []) if c["type"] == "Ready"),
                    "Unknown",
                )
                roles = [k.split("/")[-1] for k in node["metadata"]["labels"] if k.startswith("node-role")]
                nodes.append({"name": node["metadata"]["name"], "ready": ready, "roles": roles})
        network = None
        if self.network_file.exists():
            net = self.network
            network = {"cidr": str(net.cidr), "bridge": net.bridge, "gateway": net.gateway}
        return {"name": self.config.name, "kubeconfig": str(self.kubeconfig),
                "components": components, "nodes": nodes, "network": network}  # fmt: skip

    # ---- internals -----------------------------------------------------------------

    def _kwokctl(self, *args: str) -> str:
        self.exec_path.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "KWOK_WORKDIR": str(self.kwok_workdir),
            # kwokctl looks for kubectl on PATH first: make it ours, not whatever is installed.
            # kwok inherits the PATH: exec in a simulated pod finds exec_path's programs.
            "PATH": f"{_shim_dir()}:{self.exec_path}:{os.environ.get('PATH', '')}",
        }
        result = subprocess.run(
            [str(binaries.binary_path("kwokctl")), "--name", self.config.name, *args],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise DevClusterError(f"kwokctl {' '.join(args[:3])} failed:\n{tail}")
        return result.stdout

    def _api_answers(self) -> bool:
        try:
            server, context = self._api_access()
            response = httpx.get(f"{server}/readyz", verify=context, timeout=2)
        except (httpx.HTTPError, OSError, KeyError, ValueError, ssl.SSLError):
            return False
        return response.status_code == 200

    def _api_access(self) -> tuple[str, ssl.SSLContext]:
        config = yaml.safe_load(self.kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        base = self.kubeconfig.parent
        context = ssl.create_default_context(cafile=str(base / cluster["certificate-authority"]))
        context.load_cert_chain(base / user["client-certificate"], base / user["client-key"])
        return cluster["server"], context

    def _nodes_ready(self) -> bool:
        listing = json.loads(self.kubectl("get", "nodes", "-o", "json", check=False) or "{}")
        items = listing.get("items", [])
        expected = len(self.config.node_names()) + len(self.real_nodes())
        return len(items) >= expected and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            for n in items
        )

    @property
    def slot(self) -> int:
        """This cluster's address slot: its pods live in 127.<slot>.0.0/16."""
        return int((self.state_dir / "slot").read_text())

    def _claim_slot(self) -> int:
        """The lowest slot no other dev cluster on this machine holds."""
        taken = set()
        for other in clusters_root().glob("*/slot"):
            if other.parent != self.state_dir:
                with contextlib.suppress(ValueError, OSError):
                    taken.add(int(other.read_text()))
        slot = next(s for s in range(1, 255) if s not in taken)
        (self.state_dir / "slot").write_text(str(slot))
        return slot

    def _create_base_objects(self) -> None:
        documents = [
            node_manifest(name, self.slot, index + 1, control_plane, self.network)
            for index, (name, control_plane) in enumerate(self.config.node_names())
        ]
        documents.append(storage_class_manifest())
        self.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(documents))

    def _ensure_coredns(self) -> None:
        """CoreDNS on the gateway, port 53: cluster.local from the API, nothing forwarded."""
        corefile = self.state_dir / "Corefile"
        corefile.write_text(corefile_text(self.dns_server, self.kubeconfig))
        self.ensure_background("coredns", [str(binaries.binary_path("coredns")), "-conf", str(corefile)])
        self._wait_for(self._dns_answers, 30, f"CoreDNS to answer on {self.dns_server}:53")

    def _dns_answers(self) -> bool:
        """A query for the API server's Service name gets an answer (so the plugin has synced)."""
        query = _dns_query("kubernetes.default.svc.cluster.local")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.5)
            try:
                sock.sendto(query, (self.dns_server, 53))
                answer = sock.recv(512)
            except OSError:
                return False
        return len(answer) > 12 and answer[3] & 0x0F == 0 and int.from_bytes(answer[6:8], "big") > 0

    def _ensure_agent(self) -> None:
        low, high = self.config.restart_backoff
        self.ensure_background("agent", [
            sys.executable, "-m", "kustos.devcluster.agent",
            "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state_dir),
            "--restart-backoff", str(low), str(high),
        ])  # fmt: skip

    def _stop_background(self, name: str) -> None:
        pid_file = self.state_dir / f"{name}.pid"
        pid = read_pid(pid_file)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid, 20):
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 5)
        pid_file.unlink(missing_ok=True)

    def _kill_leftovers(self) -> None:
        """Anything still holding a pid file under the state dir (a crashed agent's pods)."""
        for pid_file in pid_files(self.state_dir):
            pid = read_pid(pid_file)
            if alive(pid):
                assert pid is not None
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def _saved_components(self) -> list[dict[str, Any]]:
        saved = yaml.safe_load_all((self.cluster_dir / "kwok.yaml").read_text())
        for document in saved:
            if document and document.get("kind") == "KwokctlConfiguration":
                return list(document.get("components") or [])
        return []

    def _real_node_of(self, namespace: str, pod: str) -> RealNode | None:
        """The real node a pod is bound to; None on a kwok node (asked only when real nodes exist)."""
        if not self.real_nodes():
            return None
        node = self.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.spec.nodeName}")
        return self.real_node_named(node.strip())

    def _sandbox_dir(self, namespace: str, pod: str) -> Path:
        uid = self.kubectl("get", "pod", pod, "-n", namespace, "-o", "jsonpath={.metadata.uid}")
        meta = {"metadata": {"namespace": namespace, "name": pod, "uid": uid}}
        return sandbox_dir(self.state_dir / "pods", meta)

    def _wait_for(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.25)
        raise DevClusterError(
            f"timed out after {timeout:.0f}s waiting for {what}; logs: {self.cluster_dir / 'logs'}"
        )


def remove_proxy_tables() -> None:
    """kube-proxy's nftables tables (one per address family and machine) outlive it."""
    for family in ("ip", "ip6"):
        subprocess.run(["nft", "delete", "table", family, "kube-proxy"], capture_output=True, check=False)


def _shim_dir() -> Path:
    """A directory of plain-named links to the default versions (kubectl, etcdctl)."""
    shim = cache_root() / "shims"
    shim.mkdir(parents=True, exist_ok=True)
    for name in ("kubectl", "etcdctl", "etcdutl"):
        link = shim / name
        target = binaries.binary_path(name)
        if not link.is_symlink() or link.readlink() != target:
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    return shim


def corefile_text(address: str, kubeconfig: Path) -> str:
    """cluster.local and reverse lookups from the kubernetes plugin; every other name gets
    NXDOMAIN from here (nothing is forwarded off the machine), so a name that does not
    exist reads "Name or service not known", as behind a real cluster DNS."""
    return (
        f"cluster.local in-addr.arpa ip6.arpa:53 {{\n"
        f"    bind {address}\n"
        "    errors\n"
        f"    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods verified\n"
        "        ttl 5\n"
        "    }\n"
        "}\n"
        f".:53 {{\n"
        f"    bind {address}\n"
        "    template ANY ANY {\n"
        "        rcode NXDOMAIN\n"
        "    }\n"
        "}\n"
    )


def _dns_query(name: str) -> bytes:
    """A minimal DNS query (A, recursion desired) for ``name``."""
    header = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00"
    return header + labels + b"\x00\x01\x00\x01"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            return True
        time.sleep(0.1)
    return False


def running_clusters() -> Sequence[str]:
    root = clusters_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []
