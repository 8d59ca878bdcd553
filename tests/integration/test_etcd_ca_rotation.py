"""An EtcdCluster's CA rotates without downtime (issue #22 item 4), across an operator restart
in the middle of it.

Real etcd members run by the pod runner; a writer over TLS that follows the operator-issued
client Secret (as a user's tool would) checks that every acknowledged write survives.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from kustos.etcd import tls
from kustos.etcd.client import EtcdClient, EtcdTLS, EtcdTLSError
from kustos.runtime.times import parse_rfc3339
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, etcd_cluster, running_operator, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.test_etcd_upgrade_chain import start_operator_again

pytestmark = pytest.mark.process_runner(
    "CA rotation is etcd's TLS and kustos's Secrets; TLS members on runc: test_real_nodes_lifecycle"
)


def secret_data(kubectl: Kubectl, name: str) -> dict[str, bytes]:
    data = kubectl.get("secret", name)["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


class FollowingClient:
    """A client that takes the operator-issued client Secret whenever it changes."""

    def __init__(self, kubectl: Kubectl, secret: str, directory: Path) -> None:
        self.kubectl, self.secret, self.directory = kubectl, secret, directory
        self.seen: bytes = b""
        self.generation = 0

    def refresh(self) -> EtcdTLS | None:
        data = secret_data(self.kubectl, self.secret)
        digest = data["ca.crt"] + data["tls.crt"]
        if digest == self.seen:
            return None
        self.seen, self.generation = digest, self.generation + 1
        directory = self.directory / str(self.generation)  # a new set of files, swapped at once
        directory.mkdir(parents=True)
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (directory / key).write_bytes(data[key])
        return EtcdTLS(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")


class WriterThread:
    """The writer on an event loop of its own: the test's kubectl calls block theirs, and a
    starved writer would count the test's own pauses as outages."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self.thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)

    async def _run(self) -> None:
        self.writer.start()
        await self.writer.stop_when_asked()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.writer.ask_to_stop()
        self.thread.join(timeout=30)


def served_certificate(endpoint: str) -> bytes:
    """The certificate a member serves, as PEM (no verification: we check it ourselves)."""
    url = httpx.URL(endpoint)
    pem = ssl.get_server_certificate((url.host, url.port or 2379), timeout=10)
    return pem.encode()


def serves_a_leaf_of(endpoint: str, ca: bytes) -> bool:
    """False too while the member restarts (onto a new leaf)."""
    try:
        return tls.signed_by(served_certificate(endpoint), ca)
    except OSError:
        return False


async def refused(endpoint: str, client: EtcdTLS) -> bool:
    async with EtcdClient(endpoint, client, timeout=5.0) as etcd:
        try:
            await etcd.status()
        except (EtcdTLSError, ssl.SSLError):
            return True
    return False


def events(kubectl: Kubectl, name: str) -> str:
    return kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")


async def test_the_ca_rotates_under_a_tls_writer_keeping_every_write(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    name = "rot"
    operator = ExitStack()
    operator.enter_context(running_operator(kubectl, tmp_path / "operator"))
    kubectl.apply(etcd_cluster(name, 3, tls={}, storage={"type": "pvc", "size": "64Mi"},
                               memberFailureTimeout="15s"))  # fmt: skip
    status = await wait_healthy(kubectl, name, 3, timeout=180)
    old_ca = secret_data(kubectl, f"{name}-ca")
    # A user's own certificate from the old CA: it works now, and must not once the old CA is gone.
    users = tmp_path / "user"
    users.mkdir()
    mine = tls.issue(tls.KeyPair(old_ca["ca.crt"], old_ca["ca.key"]), "user", datetime.now(UTC),
                     tls.CA_LIFETIME, server=False)  # fmt: skip
    (users / "ca.crt").write_bytes(old_ca["ca.crt"])
    (users / "user.crt").write_bytes(mine.cert)
    (users / "user.key").write_bytes(mine.key)
    old_user = EtcdTLS(users / "ca.crt", users / "user.crt", users / "user.key")
    assert not await refused(status["members"][0]["clientUrl"], old_user)

    following = FollowingClient(kubectl, f"{name}-client-tls", tmp_path / "client")
    first = following.refresh()
    assert first is not None
    writer = Writer([m["clientUrl"] for m in status["members"]], tls=first)
    running = WriterThread(writer)
    running.start()
    phases: set[str] = set()
    seen_phases: list[str] = []
    try:
        await asyncio.sleep(2)
        begun = time.monotonic()
        rotate = subprocess.run(
            [str(Path(sys.executable).parent / "kustos"), "etcd", "rotate-ca", name, "-n", kubectl.namespace,
             "--kubeconfig", str(kubectl.cluster.kubeconfig)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert "asked the operator to rotate the CA" in rotate.stdout

        async def follow(current: dict[str, Any]) -> dict[str, Any]:
            writer.update(current)
            renewed = following.refresh()
            if renewed is not None:
                writer.tls = renewed
            phases.add(str(current.get("phase")))
            phase = ((current.get("tls") or {}).get("caRotation") or {}).get("phase")
            if phase and (not seen_phases or seen_phases[-1] != phase):
                seen_phases.append(phase)
            return current

        async def reissuing() -> bool:
            await follow(status_of(kubectl, name))
            return "Reissue" in seen_phases

        await wait_until(reissuing, "the rotation to reach Reissue", timeout=300,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        # The operator goes away after the bundle phase, before every leaf is re-issued (off the
        # event loop: the writer keeps writing). The next one finds the rotation in the CA
        # Secret and finishes it.
        await asyncio.to_thread(operator.close)
        old_leaves = [
            m["name"] for m in status["members"] if serves_a_leaf_of(m["clientUrl"], old_ca["ca.crt"])
        ]
        assert old_leaves, "every leaf was re-issued before the operator stopped"
        operator = ExitStack()
        second = await asyncio.to_thread(start_operator_again, kubectl, tmp_path / "operator-2")
        operator.callback(second.stop)
        with operator:

            async def completed() -> dict[str, Any] | None:
                current = await follow(status_of(kubectl, name))
                rotation = (current.get("tls") or {}).get("caRotation") or {}
                done = rotation.get("completed") and not rotation.get("phase")
                done = done and current.get("ready") == "3/3"
                return current if done else None

            status = await wait_until(completed, "the CA rotation to complete", timeout=600,
                                      cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            took = time.monotonic() - begun
            status = await wait_healthy(kubectl, name, 3)
            await follow(status)
            await asyncio.sleep(2)
    finally:
        running.stop()
        operator.close()

    # Every acknowledged write is there; nobody lost quorum.
    assert len(writer.acknowledged) > 100
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
    assert "QuorumLost" not in phases
    assert seen_phases == ["Trust", "Reissue", "Drop"], seen_phases
    rotation = status["tls"]["caRotation"]
    recorded = parse_rfc3339(rotation["completed"]) - parse_rfc3339(rotation["started"])  # type: ignore[operator]
    assert rotation["oldCaDropped"] and "rotate-ca" in rotation["reason"]

    # A new CA signs; the old one is gone from the CA Secret and from every bundle.
    new_ca = secret_data(kubectl, f"{name}-ca")
    assert new_ca["ca.crt"] != old_ca["ca.crt"]
    assert set(new_ca) == {"ca.crt", "ca.key"}
    client = secret_data(kubectl, f"{name}-client-tls")
    assert client["ca.crt"] == new_ca["ca.crt"] and tls.signed_by(client["tls.crt"], new_ca["ca.crt"])
    for member in status["members"]:
        data = secret_data(kubectl, f"{member['name']}-tls")
        assert data["ca.crt"] == new_ca["ca.crt"]
        served = served_certificate(member["clientUrl"])
        assert tls.signed_by(served, new_ca["ca.crt"]) and not tls.signed_by(served, old_ca["ca.crt"])
        serial = x509.load_pem_x509_certificate(served).serial_number
        assert format(serial, "x") == tls.info(data["tls.crt"]).serial
        # The members refuse a certificate of the old CA (client trust dropped it).
        assert await refused(member["clientUrl"], old_user)
    # Members trust each other on the new CA only: they are healthy peers.
    async with EtcdClient(status["members"][-1]["clientUrl"], writer.tls) as etcd:
        assert len((await etcd.member_list()).members) == 3
    happened = events(kubectl, name)
    assert "CARotationStarted" in happened and "CARotationCompleted" in happened

    print(
        f"\nCA rotation of 3 members (pvc), operator restarted in Reissue with {len(old_leaves)} "
        f"member(s) on the old CA's leaf: {took:.0f} s "
        f"(status: {recorded.total_seconds():.0f} s); {len(writer.acknowledged)} writes acknowledged, "
        f"0 lost, {writer.failures} failed attempts, longest write outage {writer.longest_outage():.2f} s"
    )
