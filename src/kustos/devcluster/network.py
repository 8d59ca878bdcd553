"""Pod networking of the dev cluster: one bridge per cluster, one network namespace per pod.

What a CNI plugin does on a real node, with ``ip``: every real pod gets a network
namespace joined by a veth pair to the cluster's bridge in the host namespace. The
cluster's pod range is a private /16 picked at start so that it overlaps no route of
the host; node ``i`` owns ``<range>.i.0/24`` and the bridge holds ``<range>.0.1``, the
gateway, where the API server and CoreDNS answer. Pods get no default route and the
host does not forward: traffic stays on this machine.

Names are derived from the cluster's name (a short hash), so two dev clusters never
share a bridge, a veth or a namespace, and ``cleanup`` finds a killed run's remains.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
# Second octets of 10.x.0.0/16 we pick from: not the Service range (10.96/16), not the
# top of 10/8 where hosts often put resolvers.
_CANDIDATE_OCTETS = tuple(o for o in range(64, 250) if o != 96)
SERVICE_CIDR = "10.96.0.0/16"


class NetworkError(RuntimeError):
    """A namespace, link or address could not be set up; the message has ip's words."""


def missing_privileges() -> str | None:
    """What keeps us from creating namespaces and links, in a few words, or None.

    The effective capabilities decide, not the uid: root in a container may lack them."""
    try:
        status = Path("/proc/self/status").read_text()
        effective = int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff")), 16
        )
    except (OSError, StopIteration, ValueError):
        effective = 0
    missing = [
        name for name, bit in (("CAP_NET_ADMIN", 12), ("CAP_SYS_ADMIN", 21)) if not effective >> bit & 1
    ]
    return " and ".join(missing) if missing else None


def short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def host_routes() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination the host routes (all tables), the default route excepted."""
    listing = json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]")
    networks = []
    for route in listing:
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("type") in ("broadcast",):
            continue
        with contextlib.suppress(ValueError):
            networks.append(ipaddress.ip_network(dst, strict=False))
    return [n for n in networks if isinstance(n, ipaddress.IPv4Network)]


def pick_range(
    taken: Sequence[ipaddress.IPv4Network], routes: Sequence[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network:
    """The first candidate /16 that overlaps no host route and no other dev cluster's range."""
    for octet in _CANDIDATE_OCTETS:
        candidate = ipaddress.IPv4Network(f"10.{octet}.0.0/16")
        if any(candidate.overlaps(other) for other in (*taken, *routes)):
            continue
        return candidate
    raise NetworkError("no free private /16 in 10.64.0.0-10.249.0.0 for the pod network")


@dataclass(frozen=True)
class ClusterNetwork:
    """One dev cluster's pod network: its range, bridge and the names of its pods' links."""

    cluster: str
    cidr: ipaddress.IPv4Network

    @property
    def tag(self) -> str:
        return short_hash(self.cluster)

    @property
    def bridge(self) -> str:
        return f"kbr{self.tag}"  # 11 characters: link names stop at 15

    @property
    def gateway(self) -> str:
        return str(self.cidr.network_address + 1)

    @property
    def netns_prefix(self) -> str:
        return f"kustos-{self.tag}-"

    def node_cidr(self, index: int) -> str:
        if not 1 <= index <= 255:
            raise ValueError(f"node index out of range: {index}")
        octets = str(self.cidr.network_address).split(".")
        return f"{octets[0]}.{octets[1]}.{index}.0/24"

    def netns(self, pod_uid: str) -> str:
        return f"{self.netns_prefix}{pod_uid}"

    def veth(self, pod_uid: str) -> str:
        return f"kv{short_hash(self.cluster + pod_uid, 10)}"

    def to_json(self) -> str:
        return json.dumps({"cluster": self.cluster, "cidr": str(self.cidr)})

    @classmethod
    def from_file(cls, path: Path) -> ClusterNetwork:
        data = json.loads(path.read_text())
        return cls(data["cluster"], ipaddress.IPv4Network(data["cidr"]))

    # ---- the bridge ------------------------------------------------------------------

    def create_bridge(self) -> None:
        if self.bridge_exists():
            ip("link", "del", self.bridge)
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.cidr.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def bridge_exists(self) -> bool:
        return Path(f"/sys/class/net/{self.bridge}").exists()

    # ---- pods --------------------------------------------------------------------------

    def pod_up_commands(self, pod_uid: str, pod_ip: str) -> list[list[str]]:
        """The ``ip`` invocations that give a pod its namespace, link and address."""
        ns, veth = self.netns(pod_uid), self.veth(pod_uid)
        # The MAC follows from the IP (as Docker does): a new pod that gets a freed IP has
        # the old one's MAC too, so no neighbour cache points at a dead link.
        mac = "02:42:" + ":".join(f"{int(o):02x}" for o in pod_ip.split("."))
        return [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "address", mac, "netns", ns],
            ["ip", "link", "set", veth, "master", self.bridge, "up"],
            ["ip", "-n", ns, "addr", "add", f"{pod_ip}/{self.cidr.prefixlen}", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]

    def pod_down(self, pod_uid: str) -> None:
        """Remove a pod's veth pair and namespace (the kernel frees a namespace lazily, so the
        link goes explicitly and its name is free again at once)."""
        if Path(f"/sys/class/net/{self.veth(pod_uid)}").exists():
            ip("link", "del", self.veth(pod_uid), check=False)
        remove_netns(self.netns(pod_uid))

    def set_pod_link(self, pod_uid: str, up: bool) -> None:
        """A partition: the pod's bridge port down (processes alive, unreachable), or back up."""
        ip("link", "set", self.veth(pod_uid), "up" if up else "down", check=False)

    def namespaces(self) -> list[str]:
        if not NETNS_DIR.is_dir():
            return []
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(self.netns_prefix))

    # ---- the host's firewall -------------------------------------------------------------

    @property
    def firewall_table(self) -> str:
        return f"kustos-{self.tag}"

    def loopback_only(self, port: int) -> None:
        """Drop what reaches the host's ``port`` by any link but loopback: from other machines and
        from this cluster's pods (its bridge). A connection from the host itself to any of its
        addresses comes in by loopback and passes."""
        self._remove_firewall()
        rules = (
            f"table inet {self.firewall_table} {{\n chain input {{\n"
            "  type filter hook input priority filter; policy accept;\n"
            f'  iifname != "lo" tcp dport {port} drop\n }}\n}}\n'
        )
        subprocess.run(["nft", "-f", "-"], input=rules, text=True, capture_output=True, check=True)

    def _remove_firewall(self) -> None:
        if shutil.which("nft"):
            delete = ["nft", "delete", "table", "inet", self.firewall_table]
            subprocess.run(delete, capture_output=True, check=False)

    def cleanup(self) -> None:
        """Kill what still runs in this cluster's pod namespaces, remove them, the bridge and the
        firewall table."""
        self._remove_firewall()
        for ns in self.namespaces():
            for pid in netns_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            remove_netns(ns)
        if self.bridge_exists():
            for link in json.loads(ip("-j", "link", "show", "master", self.bridge, check=False) or "[]"):
                ip("link", "del", link["ifname"], check=False)
            ip("link", "del", self.bridge, check=False)


def netns_pids(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def remove_netns(ns: str) -> None:
    if (NETNS_DIR / ns).exists():
        ip("netns", "del", ns, check=False)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock across processes: two clusters starting at once pick distinct ranges,
    and one session imports the real nodes' shared images while the others wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def claim_network(cluster: str, state_file: Path, clusters_root: Path) -> ClusterNetwork:
    """Pick and record this cluster's range and create its bridge, under a machine-wide lock."""
    with locked(clusters_root / ".network.lock"):
        taken = []
        for other in clusters_root.glob("*/network.json"):
            if other != state_file:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    taken.append(ClusterNetwork.from_file(other).cidr)
        network = ClusterNetwork(cluster, pick_range(taken, host_routes()))
        state_file.write_text(network.to_json())
        network.create_bridge()
    return network


# ---- what a pod's processes run inside ------------------------------------------------

# Joins the pod's network namespace, then a private mount and UTS namespace in which the
# pod's resolv.conf, hosts and service account token are bind-mounted where programs look
# for them and the hostname is the pod's; then execs the container's command (same pid).
_ENTER = (
    'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && '
    'if [ -n "$4" ]; then mount --bind "$4" /run/secrets/kubernetes.io/serviceaccount; fi && '
    'hostname "$3" && shift 4 && exec "$@"'
)
SERVICE_ACCOUNT_DIR = Path("/run/secrets/kubernetes.io/serviceaccount")


def enter_pod_argv(
    netns: str, resolv_conf: Path, hosts: Path, hostname: str, token_dir: Path | None, argv: Sequence[str]
) -> list[str]:
    """``argv`` run the way a container runtime would start it in the pod's namespaces."""
    return [
        "nsenter", f"--net={NETNS_DIR / netns}", "--",
        "unshare", "--mount", "--uts", "--propagation", "private", "--",
        "sh", "-c", _ENTER, "sh", str(resolv_conf), str(hosts), hostname, str(token_dir or ""), *argv,
    ]  # fmt: skip


def resolv_conf(namespace: str, nameserver: str) -> str:
    """What a kubelet writes for ``dnsPolicy: ClusterFirst``."""
    search = f"{namespace}.svc.cluster.local svc.cluster.local cluster.local"
    return f"search {search}\nnameserver {nameserver}\noptions ndots:5\n"


def hosts_file(pod_ip: str, hostname: str, subdomain: str | None, namespace: str) -> str:
    """What a kubelet writes: localhost, and the pod's own names on its IP."""
    names = [hostname]
    if subdomain:
        names.insert(0, f"{hostname}.{subdomain}.{namespace}.svc.cluster.local")
    return (
        "# Kubernetes-managed hosts file (kustos dev cluster).\n"
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        f"{pod_ip}\t{' '.join(names)}\n"
    )


def operator_argv(resolv_conf_file: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` in the host network but a private mount namespace whose resolver is CoreDNS.

    The operator reaches the API server on the host and resolves cluster names (member
    DNS names) through the cluster DNS, as it would in a pod.
    """
    return [
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-c", 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"', "sh",
        str(resolv_conf_file), *argv,
    ]  # fmt: skip


def operator_resolv_conf(nameserver: str, namespace: str = "default") -> str:
    return resolv_conf(namespace, nameserver)
