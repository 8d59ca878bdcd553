"""NodeImage against the real control plane, with the kwok cloud provider (issue 15).

The proof: 10 kwok nodes of the provider (3 control plane, 7 workers) carry Deployments
with PodDisruptionBudgets and a 3-member EtcdCluster (real etcd processes) spread over the
workers, with a writer checking every acknowledged write. The NodeImage changes; every
node is replaced, and a watcher sampling the cluster all along records that no budget was
broken: no PDB below its desired healthy pods, never more than maxSurge extra nor
maxUnavailable unavailable nodes per role, etcd never below quorum, no write lost.
Then the faults: a heir that never becomes Ready, a drain a PDB blocks, provider
refusals, the operator killed after each step, pause and resume, the autoscaler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.api.etcd import EtcdCluster
from kustos.api.nodeimage import NodeImage
from kustos.devcluster.cluster import DevCluster
from kustos.nodes.cloud.kwok import GROUP_LABEL, IMAGE_ANNOTATION, PROVIDER_PREFIX, KwokProvider, label_value
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from kustos.runtime.resources import CONFIGMAPS, NODES, PODS
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, etcd_cluster, wait_healthy
from tests.integration.kube import budget_breach, wait_until
from tests.integration.operator import OperatorProcess, start_chart_operator

pytestmark = pytest.mark.process_runner(
    "rollouts over 10 provider nodes, more real nodes than 2 cores can run"
)

OLD, NEW = "kwok-os:v1", "kwok-os:v2"
ETCDCLUSTERS = EtcdCluster.crd.ref
NODEIMAGES = NodeImage.crd.ref
KWOK_NAMESPACE = "kube-system"
FIRST_INDEX = 100  # provider nodes' addresses and pod ranges, above the dev cluster's own nodes


@pytest.fixture
async def api(dev_cluster: DevCluster) -> AsyncIterator[Api]:
    clients = connect(load_config(dev_cluster.kubeconfig), Metrics())
    yield Api(clients.raw)
    await clients.close()


@dataclass
class Fleet:
    """The test's provider groups (a ConfigMap of its own) and the kwok nodes in them."""

    api: Api
    cluster: DevCluster
    name: str
    provider: KwokProvider
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cp(self) -> str:
        return f"{self.name}-cp"

    @property
    def workers(self) -> str:
        return f"{self.name}-w"

    @property
    def configmap(self) -> str:
        return f"kwok-groups-{self.name}"

    def options(self) -> list[str]:
        octets = str(self.cluster.network.cidr.network_address).split(".")
        pairs = {
            "namespace": KWOK_NAMESPACE, "configmap": self.configmap, "ip-prefix": "127.77",
            "pod-cidr-prefix": f"{octets[0]}.{octets[1]}", "first-index": str(FIRST_INDEX),
        }  # fmt: skip
        return [arg for k, v in pairs.items() for arg in ("--cloud-option", f"{k}={v}")]

    async def write_groups(self) -> None:
        data = {"groups.yaml": yaml.safe_dump(list(self.groups.values()), sort_keys=False)}
        existing = await self.api.get(CONFIGMAPS, KWOK_NAMESPACE, self.configmap)
        if existing is None:
            meta = {"name": self.configmap, "namespace": KWOK_NAMESPACE}
            manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
            await self.api.create(CONFIGMAPS, manifest)
        else:
            await self.api.patch(CONFIGMAPS, KWOK_NAMESPACE, self.configmap, {"data": data})

    async def set_group(self, group: str, **changes: Any) -> None:
        """Change a group's settings (failCreate, neverReady, ...), keeping the image the
        operator set: read back first."""
        cm = await self.api.get(CONFIGMAPS, KWOK_NAMESPACE, self.configmap)
        assert cm is not None
        current = {g["id"]: g for g in yaml.safe_load(cm["data"]["groups.yaml"])}
        current[group].update(changes)
        for key, value in list(current[group].items()):
            if value is None:
                del current[group][key]
        self.groups = current
        await self.write_groups()

    async def nodes(self, group: str | None = None) -> list[dict[str, Any]]:
        selector = f"{GROUP_LABEL}={group}" if group else f"{GROUP_LABEL} in ({self.cp},{self.workers})"
        return await self.api.list_objects(NODES, None, selector)


@pytest.fixture
async def fleet(api: Api, dev_cluster: DevCluster, namespace: str) -> AsyncIterator[Fleet]:
    octets = str(dev_cluster.network.cidr.network_address).split(".")
    provider = KwokProvider(api, namespace=KWOK_NAMESPACE, configmap=f"kwok-groups-{namespace}",
                            pod_cidr_prefix=f"{octets[0]}.{octets[1]}", first_index=FIRST_INDEX)  # fmt: skip
    fleet = Fleet(api, dev_cluster, namespace, provider)
    yield fleet
    # Cluster-scoped leftovers of the test: its NodeImage, groups, pending nodes and nodes.
    for kind in ("nodeimage", "scalinggroups", "pendingnodes"):
        dev_cluster.kubectl("delete", kind, "-l", f"kustos.dev/test={namespace}", "--wait=false", check=False)
    dev_cluster.kubectl("delete", "nodeimage", namespace, "--wait=false", check=False)
    for sg in json.loads(dev_cluster.kubectl("get", "scalinggroups", "-o", "json", check=False) or "{}").get(
        "items", []
    ):
        if sg["spec"]["groupId"] in (fleet.cp, fleet.workers):
            dev_cluster.kubectl("delete", "scalinggroup", sg["metadata"]["name"], "--wait=false", check=False)
    for pn in json.loads(dev_cluster.kubectl("get", "pendingnodes", "-o", "json", check=False) or "{}").get(
        "items", []
    ):
        if pn["spec"]["groupId"] in (fleet.cp, fleet.workers):
            dev_cluster.kubectl("delete", "pendingnode", pn["metadata"]["name"], "--wait=false", check=False)
    selector = f"{GROUP_LABEL} in ({fleet.cp},{fleet.workers})"
    dev_cluster.kubectl("delete", "nodes", "-l", selector, "--wait=false", check=False)
    dev_cluster.kubectl("delete", "configmap", "-n", KWOK_NAMESPACE, fleet.configmap, check=False)


async def start_fleet(fleet: Fleet, cp: int, workers: int, ready_after: float = 1.0) -> None:
    fleet.groups = {
        fleet.cp: {"id": fleet.cp, "role": "ControlPlane", "image": OLD, "max": 20,
                   "readyAfterSeconds": ready_after},
        fleet.workers: {"id": fleet.workers, "role": "Worker", "image": OLD, "max": 50,
                        "readyAfterSeconds": ready_after},
    }  # fmt: skip
    await fleet.write_groups()
    for group, count in ((fleet.cp, cp), (fleet.workers, workers)):
        for _ in range(count):
            await fleet.provider.create_instance(group)

    async def ready() -> bool:
        nodes = await fleet.nodes()
        return len(nodes) == cp + workers and all(objects.node_ready(n) for n in nodes)

    await wait_until(ready, f"{cp + workers} provider nodes Ready", timeout=60)


def run_operator(
    kubectl: Kubectl,
    fleet: Fleet,
    log_dir: Path,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
) -> OperatorProcess:
    """The chart's operator with ``fleet``'s kwok provider; ``extra``: more ``kustos run`` options."""
    return start_chart_operator(
        kubectl.cluster, log_dir, "--namespace", kubectl.namespace,
        "--cloud-provider", "kwok", *fleet.options(), *extra, env=env,
    )  # fmt: skip


@contextlib.contextmanager
def operator_running(
    kubectl: Kubectl, fleet: Fleet, log_dir: Path, extra: Sequence[str] = ()
) -> Iterator[OperatorProcess]:
    process = run_operator(kubectl, fleet, log_dir, extra=extra)
    try:
        yield process
    finally:
        if process.alive():
            process.stop()


def node_image(name: str, image: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
            "spec": {"image": image, "joinTimeout": "60s", "etcd": {"enabled": False}, **spec}}  # fmt: skip


def apply_cluster(cluster: DevCluster, *documents: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(documents))


def get_image(cluster: DevCluster, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", "nodeimage", name, "-o", "json")))


def workload(name: str, group: str, replicas: int, min_available: int) -> list[dict[str, Any]]:
    labels = {"app": name}
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": labels}}  # fmt: skip
    pod = {"containers": [{"name": "web", "image": "nginx:1.27"}], "nodeSelector": {GROUP_LABEL: group},
           "topologySpreadConstraints": [spread], "terminationGracePeriodSeconds": 0}  # fmt: skip
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
         "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}}},
    ]  # fmt: skip


async def all_replaced(fleet: Fleet, total: int, image: str = NEW) -> bool:
    nodes = await fleet.nodes()
    return (
        len(nodes) == total
        and all(objects.annotations(n).get(IMAGE_ANNOTATION) == image for n in nodes)
        and all(objects.node_ready(n) and not objects.node_unschedulable(n) for n in nodes)
    )


@dataclass
class Watcher:
    """Samples nodes, PDBs and the EtcdCluster every 0.3 s while the rollout runs."""

    api: Api
    fleet: Fleet
    namespace: str
    totals: dict[str, int]
    etcd: str | None = None
    max_extra: dict[str, int] = field(default_factory=dict)
    max_unavailable: dict[str, int] = field(default_factory=dict)
    pdb_breaches: list[str] = field(default_factory=list)
    etcd_min_healthy: int | None = None
    samples: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        from kustos.runtime.refs import ResourceRef

        pdbs = ResourceRef("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
        etcds = ResourceRef("kustos.dev", "v1alpha1", "etcdclusters", "EtcdCluster")
        while not self._stop.is_set():
            for group, total in self.totals.items():
                nodes = await self.fleet.nodes(group)
                extra = len(nodes) - total
                usable = sum(1 for n in nodes if objects.node_ready(n) and not objects.node_unschedulable(n))
                self.max_extra[group] = max(self.max_extra.get(group, 0), extra)
                self.max_unavailable[group] = max(self.max_unavailable.get(group, 0), total - usable)
            for pdb in await self.api.list_objects(pdbs, self.namespace):
                if (breach := budget_breach(pdb)) is not None:
                    self.pdb_breaches.append(breach)
            if self.etcd:
                cluster = await self.api.get(etcds, self.namespace, self.etcd)
                members = ((cluster or {}).get("status") or {}).get("members") or []
                healthy = sum(1 for m in members if m.get("healthy"))
                if members:
                    self.etcd_min_healthy = min(healthy, self.etcd_min_healthy or healthy)
            self.samples += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.3)


# ---- the proof ----------------------------------------------------------------------------


@pytest.mark.timeout(1200)
async def test_every_node_replaced_within_every_budget_and_no_write_lost(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=3, workers=7)
    kubectl.apply(*workload("web", fleet.workers, replicas=4, min_available=3))
    kubectl.apply(*workload("api", fleet.workers, replicas=3, min_available=2))
    placement = {"antiAffinity": "required", "nodeSelector": {GROUP_LABEL: fleet.workers}}
    members = etcd_cluster("e", 3, addressing="podIP", pod=placement)
    kubectl.apply(members)
    with operator_running(kubectl, fleet, tmp_path / "operator") as operator:
        status = await wait_healthy(kubectl, "e", 3, timeout=180)
        writer = Writer([m["clientUrl"] for m in status["members"]])
        writer.start()
        # The rollout starts at the image the nodes run: nothing to do.
        apply_cluster(
            kubectl.cluster, node_image(fleet.name, OLD, workers={"maxSurge": 2, "maxUnavailable": 0})
        )

        async def steady() -> bool:
            image = get_image(kubectl.cluster, fleet.name)
            return (image.get("status") or {}).get("progress") == "10/10"

        await wait_until(steady, "the NodeImage to see 10/10 up to date", timeout=60)
        watcher = Watcher(api, fleet, kubectl.namespace, {fleet.cp: 3, fleet.workers: 7}, etcd="e")
        watcher.start()
        apply_cluster(
            kubectl.cluster, node_image(fleet.name, NEW, workers={"maxSurge": 2, "maxUnavailable": 0})
        )

        async def done() -> bool:
            # The writer follows the members as they move to new nodes (no kubectl here: a
            # blocking call would stall the writer and the watcher).
            cluster = await api.get(ETCDCLUSTERS, kubectl.namespace, "e") or {}
            if (cluster.get("status") or {}).get("members"):
                writer.update(cluster["status"])
            image = await api.get(NODEIMAGES, None, fleet.name) or {}
            progress = (image.get("status") or {}).get("progress")
            return progress == "10/10" and await all_replaced(fleet, 10)

        try:
            await wait_until(done, "every node replaced", timeout=900)
        finally:
            await watcher.stop()
            await writer.stop()
        assert operator.alive(), operator.log()[-3000:]
        status = await wait_healthy(kubectl, "e", 3, timeout=120)
        lost = await writer.missing(status["members"][0]["clientUrl"])

    print(f"watcher: {watcher.samples} samples, extra {watcher.max_extra}, "
          f"unavailable {watcher.max_unavailable}, etcd min healthy {watcher.etcd_min_healthy}, "
          f"writes {len(writer.acknowledged)}")  # fmt: skip
    assert watcher.samples > 10
    assert watcher.max_extra[fleet.cp] <= 1 and watcher.max_extra[fleet.workers] <= 2, watcher.max_extra
    assert watcher.max_unavailable[fleet.cp] == 0 and watcher.max_unavailable[fleet.workers] == 0
    assert watcher.pdb_breaches == []
    assert watcher.etcd_min_healthy is not None and watcher.etcd_min_healthy >= 2  # quorum of 3 all along
    assert len(writer.acknowledged) > 0 and lost == []
    image = get_image(kubectl.cluster, fleet.name)
    assert next(c for c in image["status"]["conditions"] if c["type"] == "Available")["status"] == "True"
    # kubectl get shows the progress.
    table = kubectl.cluster.kubectl("get", "nodeimage", fleet.name)
    assert "10/10" in table and "PROGRESS" in table


# ---- faults ---------------------------------------------------------------------------------


@pytest.mark.timeout(600)
async def test_a_heir_that_never_becomes_ready_is_deleted_and_tried_again(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=1, workers=1)
    await fleet.set_group(fleet.workers, neverReady=True)
    await fleet.set_group(fleet.cp, neverReady=True)
    with operator_running(kubectl, fleet, tmp_path / "operator"):
        apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, joinTimeout="4s"))

        async def deadline_hit() -> bool:
            # A Join of this fleet's control-plane group (its nodes are named after the group),
            # said on a PendingNode: not any Event that mentions a kwok node.
            selector = "reason=DeadlineExceeded,involvedObject.kind=PendingNode"
            events = kubectl.cluster.kubectl(
                "get", "events", "-A", "--field-selector", selector, "-o", "json"
            )
            joins = f"Join {PROVIDER_PREFIX}{label_value(fleet.cp)[:40]}-"
            return any(e.get("message", "").startswith(joins) for e in json.loads(events)["items"])

        await wait_until(deadline_hit, "a Join past its deadline to be reported", timeout=90)
        # The never-ready instance was deleted at the provider: no node of it is left over.
        nodes = await fleet.nodes(fleet.cp)
        assert len(nodes) <= 2, [objects.name(n) for n in nodes]
        await fleet.set_group(fleet.cp, neverReady=None)
        await fleet.set_group(fleet.workers, neverReady=None)
        await wait_until(lambda: all_replaced(fleet, 2), "both nodes replaced after a new try", timeout=180)


@pytest.mark.timeout(600)
async def test_a_pdb_blocked_drain_names_the_pods_and_is_forced_only_by_policy(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=1, workers=1)
    kubectl.apply(*workload("stuck", fleet.workers, replicas=1, min_available=1))

    async def running() -> bool:
        pods = await api.list_objects(PODS, kubectl.namespace, "app=stuck")
        return len(pods) == 1 and objects.pod_ready(pods[0])

    await wait_until(running, "the blocked pod to run", timeout=60)
    spec = {"drainTimeout": "3s", "controlPlane": {"maxSurge": 1}, "workers": {"maxSurge": 1}}
    with operator_running(kubectl, fleet, tmp_path / "operator"):
        apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, **spec))

        async def blocked() -> str | None:
            status = get_image(kubectl.cluster, fleet.name).get("status") or {}
            degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), None)
            if degraded and degraded["status"] == "True" and degraded["reason"] == "DrainBlocked":
                return str(degraded["message"])
            return None

        message = await wait_until(blocked, "the drain to be reported blocked", timeout=180)
        assert f"{kubectl.namespace}/stuck-" in message and "onDrainTimeout: wait" in message, message
        # wait: nothing was forced.
        assert len(await api.list_objects(PODS, kubectl.namespace, "app=stuck")) == 1
        apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, onDrainTimeout="force", **spec))
        await wait_until(lambda: all_replaced(fleet, 2), "both nodes replaced once forced", timeout=180)
        listing = kubectl.cluster.kubectl(
            "get", "events", "-A", "--field-selector", "reason=DrainForced", "-o", "json"
        )
        events = json.loads(listing)["items"]
        assert any("stuck-" in e["message"] for e in events)


@pytest.mark.timeout(600)
async def test_provider_refusals_are_reported_and_retried(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=1, workers=1)
    await fleet.set_group(fleet.cp, failCreate="capacity")
    with operator_running(kubectl, fleet, tmp_path / "operator"):

        async def refused(reason: str) -> bool:
            status = get_image(kubectl.cluster, fleet.name).get("status") or {}
            return any(
                c["type"] == "Degraded" and c["reason"] == reason for c in status.get("conditions") or []
            )

        # Without spec.etcd no control-plane node is touched: its etcd member could stay behind.
        unset = node_image(fleet.name, NEW)
        del unset["spec"]["etcd"]
        apply_cluster(kubectl.cluster, unset)
        await wait_until(lambda: refused("EtcdUnset"), "the unset spec.etcd in status", timeout=60)
        conditions = get_image(kubectl.cluster, fleet.name)["status"]["conditions"]
        degraded = next(c for c in conditions if c["type"] == "Degraded")
        assert "set spec.etcd" in degraded["message"] and "enabled: false" in degraded["message"]
        assert len(await fleet.nodes()) == 2  # no heir asked for
        apply_cluster(kubectl.cluster, node_image(fleet.name, NEW))
        await wait_until(lambda: refused("ProviderCapacity"), "the capacity refusal in status", timeout=60)
        await fleet.set_group(fleet.cp, failCreate="throttled")
        await wait_until(lambda: refused("ProviderThrottled"), "the throttling in status", timeout=60)
        assert len(await fleet.nodes()) == 2  # no instance, no stray PendingNode from refusals
        await fleet.set_group(fleet.cp, failCreate=None)
        await wait_until(
            lambda: all_replaced(fleet, 2), "both nodes replaced after the refusals", timeout=180
        )


STEPS = ("CreateHeir", "ClaimInstance", "Pair", "Drain", "DeleteDonor")


@pytest.mark.timeout(600)
async def test_operator_killed_after_each_step_leaves_no_duplicate_and_no_orphan(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=1, workers=len(STEPS))
    apply_cluster(kubectl.cluster, node_image(fleet.name, NEW))
    total = 1 + len(STEPS)
    for step in STEPS:
        marker = tmp_path / f"fault-{step}"
        env = {"KUSTOS_FAULT_EXIT_AFTER": step, "KUSTOS_FAULT_MARKER": str(marker)}
        process = run_operator(kubectl, fleet, tmp_path / f"operator-{step}", env=env)
        try:

            async def exited(p: OperatorProcess = process) -> bool:
                return not p.alive()

            await wait_until(exited, f"the operator to exit after {step}", timeout=120)
            assert process.wait(5) == 137, process.log()[-3000:]
        finally:
            if process.alive():
                process.kill(signal.SIGKILL)
        nodes = await fleet.nodes()
        assert len(nodes) <= total + 1, f"after {step}: {[objects.name(n) for n in nodes]}"
    with operator_running(kubectl, fleet, tmp_path / "operator"):
        await wait_until(
            lambda: all_replaced(fleet, total), "every node replaced after the crashes", timeout=300
        )
    pending = json.loads(kubectl.cluster.kubectl("get", "pendingnodes", "-o", "json"))["items"]
    assert not [p for p in pending if p["spec"]["groupId"] in (fleet.cp, fleet.workers)
                and p["spec"]["goal"] == "Join"]  # fmt: skip


@pytest.mark.timeout(600)
async def test_pause_holds_and_resume_finishes_and_the_autoscaler_gets_its_own_setting_back(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None
) -> None:
    await start_fleet(fleet, cp=1, workers=2)
    autoscaler = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cluster-autoscaler"},
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "ca"}},
                           "template": {"metadata": {"labels": {"app": "ca"}},
                                        "spec": {"containers": [{"name": "ca", "image": "autoscaler:1"}],
                                                 "nodeSelector": {GROUP_LABEL: fleet.workers}}}}}  # fmt: skip
    kubectl.apply(autoscaler)
    strategy = {
        "apiVersion": "kustos.dev/v1alpha1", "kind": "AutoscalingStrategy", "metadata": {"name": fleet.name},
        "spec": {"deploymentName": "cluster-autoscaler", "deploymentNamespace": kubectl.namespace},
    }  # fmt: skip
    apply_cluster(kubectl.cluster, strategy)
    try:
        with operator_running(kubectl, fleet, tmp_path / "operator"):
            apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, paused=True))

            async def paused_status() -> bool:
                status = get_image(kubectl.cluster, fleet.name).get("status") or {}
                return status.get("waitingFor") == "paused"

            await wait_until(paused_status, "the paused rollout in status", timeout=60)
            await asyncio.sleep(3)
            assert len(await fleet.nodes()) == 3  # paused: no heir asked for

            def replicas() -> int:
                return int(kubectl.get("deployment", "cluster-autoscaler")["spec"]["replicas"])

            apply_cluster(kubectl.cluster, node_image(fleet.name, NEW, paused=False))

            async def held() -> bool:
                return replicas() == 0

            await wait_until(held, "the autoscaler held at 0 during the rollout", timeout=60)
            await wait_until(lambda: all_replaced(fleet, 3), "every node replaced after resume", timeout=240)

            async def restored() -> bool:
                return replicas() == 3

            await wait_until(restored, "the autoscaler's own 3 replicas back", timeout=60)
    finally:
        kubectl.cluster.kubectl("delete", "autoscalingstrategy", fleet.name, check=False)


def test_bad_specs_are_refused_naming_the_field(kubectl: Kubectl, crds: None) -> None:
    cluster = kubectl.cluster
    for spec, fragment in (
        ({"workers": {"maxSurge": 0}}, "maxSurge must be a whole number of nodes >= 1"),
        ({"workers": {"maxSurge": "0%"}}, "maxSurge"),
        ({"controlPlane": {"maxUnavailable": "150%"}}, "maxUnavailable"),
        ({"onDrainTimeout": "explode"}, "onDrainTimeout"),
    ):
        result = subprocess.run(
            [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "apply",
             "--dry-run=server", "-f", "-"],
            input=yaml.safe_dump(node_image("bad", NEW, **spec)), capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode != 0 and fragment in result.stderr, (spec, result.stderr)
