"""Control-plane replacement with kubeadm's stacked etcd: real etcd processes listen on the
control-plane nodes' InternalIPs (127.77.x.y, loopback), with kubeadm's certificate layout
generated here and the client certificate handed to kustos in a Secret.

The test plays kubeadm and the machines: a new control-plane node gets its etcd member
added (``kubeadm join``) as soon as its Node appears, and a deleted node's etcd process
dies with its machine. kustos must remove each donor's member (quorum kept) before the
donor goes: at the end the membership is exactly the three new nodes, and no acknowledged
write is lost.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kustos.devcluster.binaries import binary_path
from kustos.etcd import tls
from kustos.etcd.client import EtcdClient, EtcdError, EtcdTLS
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.resources import SECRETS
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer
from tests.integration.kube import wait_until
from tests.integration.test_nodeimage import (  # the module's fixtures and helpers
    NEW,
    Fleet,
    all_replaced,
    api,
    apply_cluster,
    fleet,
    node_image,
    operator_running,
    start_fleet,
)

__all__ = ["api", "fleet"]  # fixtures, re-exported for pytest

CLIENT_PORT, PEER_PORT = 2379, 2380


def internal_ip(node: dict[str, object]) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:  # type: ignore[union-attr]
        if address.get("type") == "InternalIP":
            return str(address["address"])
    return ""


@dataclass
class Kubeadm:
    """kubeadm's PKI and one etcd process per control-plane node, keyed by the node's IP."""

    root: Path
    ca: tls.KeyPair = field(init=False)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        now = datetime.now(UTC)
        self.ca = tls.new_ca("etcd-ca", now)
        pki = self.root / "pki" / "etcd"
        pki.mkdir(parents=True)
        (pki / "ca.crt").write_bytes(self.ca.cert)
        client = tls.issue(self.ca, "kube-etcd-healthcheck-client", now, timedelta(days=1), server=False)
        (pki / "healthcheck-client.crt").write_bytes(client.cert)
        (pki / "healthcheck-client.key").write_bytes(client.key)

    @property
    def pki(self) -> Path:
        return self.root / "pki" / "etcd"

    @property
    def client_tls(self) -> EtcdTLS:
        return EtcdTLS(
            self.pki / "ca.crt", self.pki / "healthcheck-client.crt", self.pki / "healthcheck-client.key"
        )

    def secret(self, namespace: str) -> dict[str, object]:
        data = {f: base64.b64encode((self.pki / f).read_bytes()).decode()
                for f in ("ca.crt", "healthcheck-client.crt", "healthcheck-client.key")}  # fmt: skip
        meta = {"name": "etcd-certs", "namespace": namespace}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}

    def start(self, ip: str, name: str, initial_cluster: str, state: str) -> None:
        """etcd as kubeadm runs it: TLS on both listeners, client certificates required."""
        now = datetime.now(UTC)
        node_dir = self.root / name
        node_dir.mkdir()
        server = tls.issue(
            self.ca, name, now, timedelta(days=1), dns_names=("localhost",), ips=(ip, "127.0.0.1")
        )
        for kind, pair in (("server", server), ("peer", server)):
            (node_dir / f"{kind}.crt").write_bytes(pair.cert)
            (node_dir / f"{kind}.key").write_bytes(pair.key)
        args = [
            str(binary_path("etcd")), f"--name={name}", f"--data-dir={node_dir / 'data'}",
            f"--listen-client-urls=https://{ip}:{CLIENT_PORT}", f"--advertise-client-urls=https://{ip}:{CLIENT_PORT}",
            f"--listen-peer-urls=https://{ip}:{PEER_PORT}", f"--initial-advertise-peer-urls=https://{ip}:{PEER_PORT}",
            f"--initial-cluster={initial_cluster}", f"--initial-cluster-state={state}",
            "--initial-cluster-token=stacked", f"--cert-file={node_dir / 'server.crt'}",
            f"--key-file={node_dir / 'server.key'}", "--client-cert-auth",
            f"--trusted-ca-file={self.pki / 'ca.crt'}",
            f"--peer-cert-file={node_dir / 'peer.crt'}", f"--peer-key-file={node_dir / 'peer.key'}",
            "--peer-client-cert-auth", f"--peer-trusted-ca-file={self.pki / 'ca.crt'}",
        ]  # fmt: skip
        log = (self.root / f"{name}.log").open("ab")
        self.processes[ip] = subprocess.Popen(args, stdout=log, stderr=log)
        self.names[ip] = name

    def stop(self, ip: str) -> None:
        process = self.processes.pop(ip, None)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)

    def endpoints(self) -> list[str]:
        return [f"https://{ip}:{CLIENT_PORT}" for ip, p in self.processes.items() if p.poll() is None]

    async def join(self, ip: str, name: str) -> None:
        """``kubeadm join --control-plane``: add the member, then start it. etcd refuses an add
        until its members have been connected a while (strict reconfiguration): retried."""
        for _ in range(120):
            for endpoint in self.endpoints():
                try:
                    async with EtcdClient(endpoint, self.client_tls, timeout=5) as client:
                        added = await client.member_add([f"https://{ip}:{PEER_PORT}"])
                except (EtcdError, OSError):
                    continue
                peers = [f"{m.name or name}={m.peer_urls[0]}" for m in added.members if m.peer_urls]
                self.start(ip, name, ",".join(peers), "existing")
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"no member took {name} in")

    def close(self) -> None:
        for ip in list(self.processes):
            self.stop(ip)


@pytest.fixture
def kubeadm(tmp_path: Path) -> Iterator[Kubeadm]:
    machines = Kubeadm(tmp_path / "kubeadm")
    yield machines
    machines.close()


async def machines(fleet: Fleet, kubeadm: Kubeadm, stop: asyncio.Event) -> None:
    """New control-plane nodes join etcd; deleted ones take their etcd process with them."""
    while not stop.is_set():
        nodes = {
            internal_ip(n): objects.name(n) for n in await fleet.nodes(fleet.cp) if not objects.deleting(n)
        }
        for ip, name in nodes.items():
            if ip and ip not in kubeadm.processes:
                await kubeadm.join(ip, name)
        for ip in list(kubeadm.processes):
            if ip not in nodes:
                kubeadm.stop(ip)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)


async def members(kubeadm: Kubeadm) -> list[str]:
    for endpoint in kubeadm.endpoints():
        with contextlib.suppress(EtcdError, OSError):
            async with EtcdClient(endpoint, kubeadm.client_tls, timeout=5) as client:
                listing = await client.member_list()
            return sorted(m.peer_urls[0] for m in listing.members if m.peer_urls)
    return []


@pytest.mark.timeout(600)
async def test_a_control_plane_donor_leaves_stacked_etcd_before_it_goes(
    api: Api, fleet: Fleet, kubectl: Kubectl, kubeadm: Kubeadm, tmp_path: Path, crds: None
) -> None:
    # Slow enough boots that kubeadm's join (the member) precedes the node's readiness.
    await start_fleet(fleet, cp=3, workers=0, ready_after=3)
    first = {internal_ip(n): objects.name(n) for n in await fleet.nodes(fleet.cp)}
    initial = ",".join(f"{name}=https://{ip}:{PEER_PORT}" for ip, name in first.items())
    for ip, name in first.items():
        kubeadm.start(ip, name, initial, "new")
    await api.create(SECRETS, kubeadm.secret(kubectl.namespace))

    async def formed() -> bool:
        return len(await members(kubeadm)) == 3

    await wait_until(formed, "the stacked etcd to form", timeout=60)
    writer = Writer(kubeadm.endpoints(), tls=kubeadm.client_tls)
    writer.start()
    stop = asyncio.Event()
    simulator = asyncio.create_task(machines(fleet, kubeadm, stop))
    etcd = {"certificatesSecret": f"{kubectl.namespace}/etcd-certs", "clientPort": CLIENT_PORT}
    try:
        with operator_running(kubectl, fleet, tmp_path / "operator") as operator:
            apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, etcd=etcd))

            async def replaced() -> bool:
                writer.endpoints = kubeadm.endpoints()
                return await all_replaced(fleet, 3)

            await wait_until(replaced, "the three control-plane nodes replaced", timeout=400)
            assert "EtcdMemberRemoved" in kubectl.cluster.kubectl("get", "events", "-A")
            log = operator.log()
    finally:
        stop.set()
        await simulator
        await writer.stop()
    current = await fleet.nodes(fleet.cp)
    now = {internal_ip(n) for n in current}
    # Exactly the new nodes' members (the provider may hand a freed address out again).
    assert await members(kubeadm) == sorted(f"https://{ip}:{PEER_PORT}" for ip in now), log[-3000:]
    assert not set(first.values()) & {objects.name(n) for n in current}
    assert writer.acknowledged
    assert await writer.missing(kubeadm.endpoints()[0]) == []
