"""Helpers for EtcdCluster tests: create, wait, ask the real members, write and check keys."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kustos.api.resources import RESOURCES
from kustos.devcluster import binaries
from kustos.devcluster.binaries import binary_path
from kustos.devcluster.cluster import DevCluster
from kustos.etcd.client import EtcdClient, EtcdCredentials, EtcdError, EtcdTLS, EtcdUnavailable
from kustos.runtime.crd import render_crds
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, start_chart_operator


def build_missing_etcd_binaries() -> None:
    """For tests that run etcd processes themselves: build what is missing (never skip)."""
    missing = [b for b in binaries.missing_binaries() if b.name.startswith("etcd")]
    if missing:
        binaries.build(missing)


def install_crds(cluster: DevCluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=render_crds(RESOURCES))
    for resource in RESOURCES:
        cluster.wait_established(resource.crd.name)


@contextmanager
def running_operator(
    kubectl: Kubectl,
    log_dir: Path,
    env: dict[str, str] | None = None,
    resolv_conf: Path | None = None,
    extra: Sequence[str] = (),
) -> Iterator[OperatorProcess]:
    """``kustos run`` with every kustos controller, scoped to the test's namespace (resolving
    through the cluster DNS unless ``resolv_conf`` names another resolver).

    It is the chart's ServiceAccount and nothing more (``chart_identity``): its leader election
    Lease and webhook configurations are the chart's, in kustos-system. The API server's audit
    log is checked at the end of the session: nothing it asked was refused. ``extra``: more
    ``kustos run`` options (a later one overrides the chart's).
    """
    process = start_chart_operator(
        kubectl.cluster, log_dir, "--namespace", kubectl.namespace, *extra, env=env, resolv_conf=resolv_conf
    )
    try:
        yield process
    finally:
        if process.alive():
            process.stop()


@contextmanager
def watched_statuses(kubectl: Kubectl, kind: str, name: str) -> Iterator[list[dict[str, Any]]]:
    """Every status the API server stored for one object while the block ran, in order, from a
    watch: a poll can miss a state that lasted less than its interval (a fast rolling step)."""
    seen: list[dict[str, Any]] = []
    watch = subprocess.Popen(
        [str(kubectl.cluster.kubectl_path), "--kubeconfig", str(kubectl.cluster.kubeconfig),
         "-n", kubectl.namespace, "get", kind, name, "-o", "json", "--watch"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip

    def read() -> None:
        assert watch.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in watch.stdout:
            buffer += line
            with contextlib.suppress(json.JSONDecodeError):
                obj, end = decoder.raw_decode(buffer.lstrip())
                seen.append(dict(obj.get("status") or {}))
                buffer = buffer.lstrip()[end:]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        watch.terminate()
        watch.wait(timeout=10)
        reader.join(timeout=10)


def etcd_cluster(name: str, size: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "EtcdCluster",
        "metadata": {"name": name},
        "spec": {"size": size, "memberFailureTimeout": "5s", **spec},
    }


def status_of(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict(kubectl.get("etcdcluster", name).get("status") or {})


async def wait_healthy(kubectl: Kubectl, name: str, size: int, timeout: float = 120) -> dict[str, Any]:
    """Until the cluster reports ``size`` healthy voting members and each one agrees."""

    async def healthy() -> dict[str, Any] | None:
        status = status_of(kubectl, name)
        members = status.get("members") or []
        ok = (
            status.get("ready") == f"{size}/{size}"
            and status.get("phase") == "Running"
            and len(members) == size
            and all(m.get("healthy") and not m.get("learner") for m in members)
        )
        return status if ok else None

    return await wait_until(healthy, f"{name} with {size} healthy members", timeout=timeout,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


def endpoint_status(status: dict[str, Any]) -> list[dict[str, Any]]:
    """``etcdctl endpoint status`` from every member the status lists: the real etcd view."""
    endpoints = ",".join(m["clientUrl"] for m in status["members"])
    result = subprocess.run(
        [str(binary_path("etcdctl")), f"--endpoints={endpoints}", "endpoint", "status", "-w", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return list(json.loads(result.stdout))


def member_list(endpoint: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(binary_path("etcdctl")), f"--endpoints={endpoint}", "member", "list", "-w", "json"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return list(json.loads(result.stdout)["members"])


# The etcd client keeps 8 connections per member alive: more writes in flight would each open
# (and, through the cluster DNS, look up) a connection of their own and close it after.
PUTS_IN_FLIGHT = 8


async def put_all(client: EtcdClient, items: Iterable[tuple[str, str | bytes]]) -> None:
    """Every (key, value) written, PUTS_IN_FLIGHT at a time over the client's kept connections;
    returns once etcd has acknowledged each."""
    pending = iter(items)

    async def writer() -> None:
        for key, value in pending:
            await client.put(key, value)

    await asyncio.gather(*(writer() for _ in range(PUTS_IN_FLIGHT)))


def assert_consistent(kubectl: Kubectl, name: str, size: int, status: dict[str, Any]) -> None:
    """One cluster ID, one leader, members == pods, no orphan or duplicate member."""
    statuses = endpoint_status(status)
    assert len({s["Status"]["header"]["cluster_id"] for s in statuses}) == 1
    assert len({s["Status"]["leader"] for s in statuses}) == 1
    members = member_list(status["members"][0]["clientUrl"])
    pods = kubectl.get("pods", None, "-l", f"kustos.dev/cluster={name}")["items"]
    pod_names = sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))
    member_names = sorted(m.get("name", "") for m in members)
    assert member_names == pod_names, f"members {member_names} != pods {pod_names}"
    assert len(members) == size and not any(m.get("isLearner") for m in members)


@dataclass
class Writer:
    """Puts sequential keys through any member that answers; remembers what was acknowledged.

    ``tls``: the CA (and a client certificate) for a TLS cluster's https endpoints;
    ``credentials``: whom it logs in as where etcd authentication is on.
    """

    endpoints: list[str]
    tls: EtcdTLS | None = None
    credentials: tuple[EtcdCredentials, ...] = ()
    acknowledged: list[str] = field(default_factory=list)
    acknowledged_at: list[float] = field(default_factory=list)  # monotonic time of each ack
    failures: int = 0
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def update(self, status: dict[str, Any]) -> None:
        self.endpoints = [m["clientUrl"] for m in status.get("members") or [] if m.get("clientUrl")]

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"/writer/{i:06d}"
            for endpoint in list(self.endpoints):
                try:
                    async with EtcdClient(endpoint, self.tls, 2.0, self.credentials) as client:
                        await client.put(key, str(i))
                    self.acknowledged.append(key)
                    self.acknowledged_at.append(time.monotonic())
                    i += 1
                    break
                except (EtcdError, OSError):
                    self.failures += 1
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def ask_to_stop(self) -> None:
        """From another thread: the writer ends after its current put."""
        self._stop.set()

    async def stop_when_asked(self) -> None:
        """On the writer's own loop (another thread's): return once ``ask_to_stop`` was called
        (the writer checks that flag between puts)."""
        if self._task is not None:
            await self._task

    def longest_outage(self) -> float:
        """The longest time between two acknowledged writes, in seconds: the outage a client saw."""
        times = self.acknowledged_at
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    async def missing(self, endpoint: str) -> list[str]:
        """The acknowledged keys ``endpoint`` does not have. A member that has just rejoined may
        answer "leader changed" or "no leader" for a moment (etcd's own client retries those):
        asked again, up to 30 s, before the test fails on it."""
        deadline = time.monotonic() + 30
        while True:
            try:
                async with EtcdClient(endpoint, self.tls, 10.0, self.credentials) as client:
                    found = await client.range("/writer/", prefix=True, keys_only=True)
                break
            except EtcdUnavailable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        present = {kv.key.decode() for kv in found.kvs}
        return [k for k in self.acknowledged if k not in present]


def assert_rejected(kubectl: Kubectl, obj: dict[str, Any], *fragments: str) -> None:
    result = subprocess.run(
        [str(kubectl.cluster.kubectl_path), "--kubeconfig", str(kubectl.cluster.kubeconfig),
         "-n", kubectl.namespace, "apply", "--validate=strict", "-f", "-"],
        input=yaml.safe_dump(obj), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode != 0, f"accepted: {obj}"
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
