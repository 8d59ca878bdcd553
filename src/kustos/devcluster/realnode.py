"""Real Kubernetes nodes beside the kwok nodes: a kubelet with its own containerd and runc.

What a real kubelet enforces (security contexts, read-only root filesystems, probes,
volumes, signals) no process runner can prove, so the dev cluster can run workers
that are real: each has its own containerd (socket, root, state), kubelet (ports,
root directory, cgroup root) and CNI configuration whose pod range is a /24 of the
cluster's bridge network (see ``network``). Images come from OCI archives imported
into each node's containerd; nothing is pulled.

Three things this machine needs (found the hard way, issue 20):

- no CAP_SYS_RESOURCE: runc fails ("can't get final child's PID from pipe: EOF")
  unless containerd restricts OOM score adjustments and the kubelet asks for 0;
- cgroup v1 (hybrid): the kubelet needs ``failCgroupV1: false``, the cgroupfs driver
  and a cgroup root of its own, created in every v1 hierarchy;
- the API server reaches kubelets (logs, exec) at their InternalIP with a client
  certificate (``kwokconfig.kwokctl_config``).

Teardown must leave nothing behind even after a killed run: ``cleanup`` kills every
process in the node's cgroups, unmounts everything under its directories, removes
its cgroups and shim sockets. Everything of a node is found from its directory and
names, not from a process that may be gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kustos.devcluster import binaries
from kustos.devcluster.imagestore import link_preloaded, private_containerd
from kustos.devcluster.network import SERVICE_CIDR, ClusterNetwork, short_hash
from kustos.devcluster.pids import alive, read_pid
from kustos.devcluster.ports import free_ports

CGROUP_ROOT = Path("/sys/fs/cgroup")
# containerd's shims put their sockets here whatever containerd's state directory is.
SHIM_SOCKET_DIR = Path("/run/containerd/s")
K8S_NAMESPACE = "k8s.io"
# Real nodes carry this label (kwok nodes carry type=kwok): tests and samples select them.
REAL_NODE_LABEL = "kustos.dev/real-node"
# Node indices of the pod network (``ClusterNetwork.node_cidr``) that real nodes use:
# kwok nodes count from 1, the kwok cloud provider's range is 255.
FIRST_REAL_INDEX = 200


class RealNodeError(RuntimeError):
    """A real node could not start or stop; the message says which log to read."""


@dataclass(frozen=True)
class RealNode:
    """One real worker node of a dev cluster, addressed by its directory and names."""

    cluster: str
    name: str
    index: int
    directory: Path

    # ---- names and paths ----------------------------------------------------------

    @property
    def tag(self) -> str:
        return short_hash(f"{self.cluster}/{self.name}")

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup (in every v1 hierarchy, or the unified one): kubelet's cgroupRoot."""
        return f"/kustos-{self.tag}"

    @property
    def containerd_dir(self) -> Path:
        return self.directory / "containerd"

    @property
    def containerd_root(self) -> Path:
        return self.containerd_dir / "root"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "sock"

    @property
    def netns_dir(self) -> Path:
        """Where containerd's CRI mounts its pods' network namespaces (``netns_mounts_under_state_dir``)."""
        return self.containerd_dir / "state" / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def kubelet_dir(self) -> Path:
        return self.directory / "kubelet"

    @property
    def cni_conf_dir(self) -> Path:
        return self.directory / "cni" / "net.d"

    @property
    def bin_dir(self) -> Path:
        """Plain-named links to the cached programs: what containerd finds on its PATH (the
        shim, runc) and the CNI plugins by their own names."""
        return self.directory / "bin"

    @property
    def log_dir(self) -> Path:
        return self.directory / "logs"

    def log(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.directory / f"{component}.pid"

    # ---- configuration (pure) -----------------------------------------------------

    def containerd_config(self, pause_image: str) -> str:
        """containerd's TOML: private root, state and sockets; CRI with runc and our CNI."""
        state = self.containerd_dir / "state"
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        lines = [
            "version = 3",
            *private_containerd(self.containerd_dir),
            f"[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"{pause_image}\"",
            f"[{runtime}]",
            # No CAP_SYS_RESOURCE here: runc cannot lower a score below containerd's own.
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            "  cdi_spec_dirs = []",
            f"[{runtime}.cni]",
            f'  bin_dirs = ["{self.bin_dir}"]',
            f'  conf_dir = "{self.cni_conf_dir}"',
            f"[{runtime}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runtime}.containerd.runtimes.runc.options]",
            f'  BinaryName = "{self.bin_dir / "runc"}"',
            f'  Root = "{state / "runc"}"',
            "  SystemdCgroup = false",
        ]
        return "\n".join(lines) + "\n"

    def cni_config(self, network: ClusterNetwork) -> dict[str, Any]:
        """The bridge plugin on the cluster's bridge; addresses from this node's /24 with the
        whole range's prefix, so pods reach the other nodes' pods and the gateway directly."""
        node_cidr = network.node_cidr(self.index)
        base = node_cidr.rsplit(".", 1)[0]
        return {
            "cniVersion": "1.0.0",
            "name": f"kustos-{network.tag}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": network.bridge,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.directory / "cni" / "ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": str(network.cidr),
                                    "rangeStart": f"{base}.2",
                                    "rangeEnd": f"{base}.254",
                                    "gateway": network.gateway,
                                }
                            ]
                        ],
                        # Services' ClusterIPs are answered on the host (kube-proxy).
                        "routes": [{"dst": SERVICE_CIDR, "gw": network.gateway}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def kubelet_config(
        self, network: ClusterNetwork, client_ca: Path, ports: tuple[int, int]
    ) -> dict[str, Any]:
        port, healthz_port = ports
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": network.gateway,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,
            # No CAP_SYS_RESOURCE: the kubelet cannot give itself a lower score.
            "oomScoreAdj": 0,
            "failSwapOn": False,
            "clusterDomain": "cluster.local",
            "clusterDNS": [network.gateway],
            "resolvConf": str(self.directory / "resolv.conf"),
            "podLogsDir": str(self.directory / "pod-logs"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(client_ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "serializeImagePulls": False,
            # A shared CI machine's disk is not this node's: evict on nothing but a full disk.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "staticPodPath": "",
            "registerNode": True,
            "nodeStatusReportFrequency": "10s",
            "nodeStatusUpdateFrequency": "2s",
            # The Lease is renewed every quarter of this: 2 s. The default (40 s, renewed every 10 s,
            # and the status reported every 10 s) outlasts the tests' node-monitor grace of 8 s
            # (kwokconfig.Timings.fast): under load the node lifecycle controller found every real
            # node NotReady for moments, tainted it not-ready and marked its pods NotReady.
            "nodeLeaseDurationSeconds": 8,
            "shutdownGracePeriod": "0s",
            "maxPods": 30,
        }

    def kubelet_argv(self, kubeconfig: Path, network: ClusterNetwork) -> list[str]:
        # node-role.kubernetes.io/* is refused from a kubelet: the cluster sets it afterwards.
        labels = {
            REAL_NODE_LABEL: "true",
            "type": "real",
            "topology.kubernetes.io/zone": self.name,
        }
        return [
            str(binaries.binary_path("kubelet")),
            f"--config={self.directory / 'kubelet.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.directory / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={network.gateway}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
        ]

    # ---- lifecycle ----------------------------------------------------------------

    def start(
        self,
        network: ClusterNetwork,
        kubeconfig: Path,
        client_ca: Path,
        images: Sequence[Path],
        pause_image: str,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        """Start containerd, import ``images``, start the kubelet (Ready is the caller's wait)."""
        for directory in (self.log_dir, self.cni_conf_dir, self.bin_dir, self.containerd_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._link_programs()
        self._create_cgroups()
        (self.directory / "resolv.conf").write_text(f"nameserver {network.gateway}\n")
        (self.directory / "containerd.toml").write_text(self.containerd_config(pause_image))
        (self.cni_conf_dir / "10-kustos.conflist").write_text(json.dumps(self.cni_config(network), indent=2))
        # A new node's root starts as links to the images imported once (imagestore); a node
        # started again on its own directory imports them (what it has is kept), as does one
        # whose directory is on another filesystem than the cache.
        linked = not self.containerd_root.exists() and link_preloaded(images, self.containerd_root)
        self._spawn("containerd", [str(binaries.binary_path("containerd")), "--config",
                                   str(self.directory / "containerd.toml")])  # fmt: skip
        what = f"containerd of {self.name}; see {self.log('containerd')}"
        _wait_for(self.containerd_socket.exists, 30, what)
        for archive in () if linked else images:
            self.ctr("images", "import", str(archive))
        kubelet_port, healthz_port = free_ports(2, "0.0.0.0")
        config = self.kubelet_config(network, client_ca, (kubelet_port, healthz_port))
        (self.directory / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self._spawn("kubelet", self.kubelet_argv(kubeconfig, network))
        log(f"started real node {self.name} (containerd and kubelet; logs in {self.log_dir})")

    def ctr(self, *args: str) -> str:
        result = subprocess.run(
            [str(binaries.binary_path("ctr")), "--address", str(self.containerd_socket),
             "-n", K8S_NAMESPACE, *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args[:2])} on {self.name}: {result.stderr.strip()}")
        return result.stdout

    def crictl(self, *args: str, check: bool = True) -> str:
        result = subprocess.run(
            [str(binaries.binary_path("crictl")), "--runtime-endpoint", f"unix://{self.containerd_socket}",
             "--timeout", "20s", *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise RealNodeError(f"crictl {' '.join(args[:2])} on {self.name}: {result.stderr.strip()}")
        return result.stdout

    def kill_container(self, namespace: str, pod: str, container: str) -> int:
        """SIGKILL a container's process as the runtime sees it (the shim's child), as the OOM
        killer or a crash would end it; the kubelet restarts it by the pod's policy."""
        running = self.crictl(
            "ps", "--name", f"^{container}$", "--label", f"io.kubernetes.pod.name={pod}",
            "--label", f"io.kubernetes.pod.namespace={namespace}", "-q",
        ).split()  # fmt: skip
        if not running:
            raise RealNodeError(f"no running container {container} of {namespace}/{pod} on {self.name}")
        pid = int(json.loads(self.crictl("inspect", running[0]))["info"]["pid"])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return pid

    def is_running(self, component: str) -> bool:
        return alive(read_pid(self.pid_file(component)))

    def stop_kubelet(self) -> None:
        _stop(self.pid_file("kubelet"))

    def start_kubelet(self, kubeconfig: Path, network: ClusterNetwork) -> None:
        if not self.is_running("kubelet"):
            self._spawn("kubelet", self.kubelet_argv(kubeconfig, network))

    def stop_containers(self) -> None:
        """What a powered-off machine's containers do: stop. Pods and their sandboxes are
        removed through the runtime (CNI releases the addresses), then anything left in the
        node's cgroups is killed."""
        if self.is_running("containerd"):
            self.crictl("rmp", "--all", "--force", check=False)
        self._kill_cgroupprocesses()

    def set_pod_links(self, up: bool, bridge: str) -> None:
        """A partition: the bridge ports of this node's pods down (containers run on), or up.

        Each pod's eth0 names its host-side peer by interface index (``link_index``). Only a
        port of the cluster's ``bridge`` is ever touched: an index read in the wrong namespace
        once took the host's own uplink down, and the machine lost its default route with it."""
        if not self.netns_dir.is_dir():
            return
        for netns in self.netns_dir.iterdir():
            index = ""
            # ``ip`` asks the kernel through the namespace (/sys here would be the host's).
            result = subprocess.run(
                ["nsenter", f"--net={netns}", "ip", "-j", "link", "show", "eth0"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            with contextlib.suppress(ValueError, IndexError, KeyError):
                index = str(json.loads(result.stdout)[0]["link_index"])
            if result.returncode != 0 or not index.isdigit():
                continue
            for link in Path("/sys/class/net").iterdir():
                with contextlib.suppress(OSError):
                    if (link / "ifindex").read_text().strip() == index and _port_of(link, bridge):
                        subprocess.run(["ip", "link", "set", link.name, "up" if up else "down"],
                                       capture_output=True, check=False)  # fmt: skip

    def stop(self) -> None:
        """Stop the kubelet, every container, containerd; then ``cleanup``."""
        self.stop_kubelet()
        self.stop_containers()
        _stop(self.pid_file("containerd"))
        self.cleanup()

    def cleanup(self) -> None:
        """Remove everything of this node even if its processes were killed: processes in its
        cgroups, shims, mounts under its directory, its cgroups and the shims' sockets."""
        for component in ("kubelet", "containerd"):
            _kill(self.pid_file(component))
        self._kill_shims()
        self._kill_cgroupprocesses()
        self._remove_shim_sockets()
        unmount_under(self.directory)
        self._remove_cgroups()

    # ---- internals ----------------------------------------------------------------

    def _spawn(self, component: str, argv: list[str]) -> None:
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        with self.log(component).open("ab") as sink:
            process = subprocess.Popen(
                argv, stdout=sink, stderr=sink, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        self.pid_file(component).write_text(str(process.pid))

    def _link_programs(self) -> None:
        links = {
            "containerd-shim-runc-v2": binaries.binary_path("containerd-shim-runc-v2"),
            "runc": binaries.binary_path("runc"),
            **{plugin: binaries.binary_path(f"cni-{plugin}") for plugin in binaries.CNI_PLUGINS},
        }
        for name, target in links.items():
            link = self.bin_dir / name
            link.unlink(missing_ok=True)
            link.symlink_to(target)

    def _cgroup_dirs(self) -> list[Path]:
        """The node's cgroup in every hierarchy this host mounts (v1 controllers and the
        unified or systemd ones; named hierarchies included, as the kubelet checks them)."""
        return [h / self.cgroup_root.lstrip("/") for h in cgroup_hierarchies()]

    def _create_cgroups(self) -> None:
        for directory in self._cgroup_dirs():
            directory.mkdir(exist_ok=True)
            # A new v1 cpuset has no CPUs or memory nodes: nothing could join it.
            for name in ("cpuset.cpus", "cpuset.mems"):
                own, parent = directory / name, directory.parent / name
                if own.exists() and not own.read_text().strip():
                    own.write_text(parent.read_text())

    def _kill_cgroupprocesses(self) -> None:
        """SIGKILL every process in the node's cgroups (containers and anything they forked),
        until none is left: a freezer would be tidier, but not every host has one."""
        for _ in range(50):
            pids = {pid for d in self._cgroup_dirs() for pid in _cgroup_pids(d)}
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _kill_shims(self) -> None:
        """Shims live outside the node's cgroups; they name the node's socket in their argv."""
        address = str(self.containerd_socket)
        for _ in range(50):
            shims = [
                pid
                for pid, argv in processes()
                if argv and "containerd-shim" in argv[0] and any(address in a for a in argv) and alive(pid)
            ]
            if not shims:
                return
            for pid in shims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)

    def _remove_shim_sockets(self) -> None:
        """A shim's socket is ``/run/containerd/s/sha256(<containerd socket>/<namespace>/<id>)``;
        the ids are the task directories containerd leaves in its state."""
        tasks = self.containerd_dir / "state" / "io.containerd.runtime.v2.task"
        if not tasks.is_dir():
            return
        for namespace in tasks.iterdir():
            for task in namespace.iterdir() if namespace.is_dir() else ():
                for suffix in ("", "-debug"):
                    path = f"{self.containerd_socket}/{namespace.name}/{task.name}{suffix}"
                    digest = hashlib.sha256(path.encode()).hexdigest()
                    (SHIM_SOCKET_DIR / digest).unlink(missing_ok=True)

    def _remove_cgroups(self) -> None:
        for directory in self._cgroup_dirs():
            if not directory.is_dir():
                continue
            # Deepest first: a cgroup goes only once its children have.
            for child in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if child.is_dir():
                    with contextlib.suppress(OSError):
                        child.rmdir()
            with contextlib.suppress(OSError):
                directory.rmdir()

    def leftovers(self) -> list[str]:
        """What of this node still exists on the machine (empty after ``cleanup``)."""
        found = [f"cgroup {d}" for d in self._cgroup_dirs() if d.exists()]
        found += [f"mount {m}" for m in mounts_under(self.directory)]
        address = str(self.containerd_socket)
        for pid, argv in processes():
            if any(address in a or str(self.directory) in a for a in argv) and alive(pid):
                found.append(f"process {pid}: {' '.join(argv)[:120]}")
        return found


def real_node(cluster: str, state_dir: Path, index: int) -> RealNode:
    """Real node ``index`` of a cluster: ``<cluster>-real-<index>`` in ``<state>/real/<index>``.

    Short directory names: unix socket paths (containerd's, the kubelet's) stop at 107 bytes."""
    if not 1 <= index <= 255 - FIRST_REAL_INDEX - 1:
        raise ValueError(f"real node index out of range: {index}")
    return RealNode(
        cluster, f"{cluster}-real-{index}", FIRST_REAL_INDEX + index, state_dir / "real" / str(index)
    )


def cgroup_hierarchies() -> list[Path]:
    """Every cgroup hierarchy mounted under /sys/fs/cgroup (v1 controllers, named ones and
    the unified one of a hybrid host; just the root on a pure v2 host)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    hierarchies = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount_point = Path(fields[4])
        kind = fields[fields.index("-") + 1]
        if kind in ("cgroup", "cgroup2") and mount_point.parent == CGROUP_ROOT:
            hierarchies.append(mount_point)
    # cpu,cpuacct mounted once and linked twice is one hierarchy.
    return sorted(set(hierarchies))


def mounts_under(directory: Path) -> list[str]:
    """Mount points at or below ``directory``, deepest first (the order to unmount them)."""
    prefix = str(directory.resolve()) if directory.exists() else str(directory)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def unmount_under(directory: Path) -> None:
    """Detach every mount below ``directory`` (lazily: a busy one goes when released)."""
    for _ in range(5):
        points = mounts_under(directory)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _cgroup_pids(directory: Path) -> set[int]:
    pids: set[int] = set()
    if not directory.is_dir():
        return pids
    for procs in directory.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def processes() -> list[tuple[int, list[str]]]:
    """Every process of the machine with its argv (what ``ps`` shows, read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
    return found


def _stop(pid_file: Path, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; reap it if it is our child."""
    pid = read_pid(pid_file)
    if alive(pid):
        assert pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
    _kill(pid_file)


def _kill(pid_file: Path) -> None:
    pid = read_pid(pid_file)
    if alive(pid):
        assert pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    pid_file.unlink(missing_ok=True)


def _wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise RealNodeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _port_of(link: Path, bridge: str) -> bool:
    """True when the host interface ``link`` (under /sys/class/net) is a port of ``bridge``."""
    master = link / "master"
    return master.exists() and master.resolve().name == bridge
