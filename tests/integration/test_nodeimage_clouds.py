"""A full rollout on GCP and on Azure, end to end (issue 24): the operator with
``--cloud-provider gcp|azure`` against the local fakes of their APIs (through the official
SDKs), the bridge that makes the fakes' instances kwok Nodes, 10 nodes (3 control plane),
workloads with PodDisruptionBudgets and a kustos EtcdCluster (real etcd) with a writer.

0 PDB violations, etcd never below quorum, no acknowledged write lost, no node unavailable
beyond maxUnavailable, no more instances than maxSurge allows: as test_nodeimage.py proves on
kwok and test_nodeimage_aws.py on AWS.

The operator authenticates as it would on GKE or AKS with workload identity: its
ServiceAccount's projected token (from the dev cluster, the OIDC issuer) exchanged through
the SDKs' own credential chains (google-auth's Application Default Credentials with a
workload identity federation file; azure-identity's DefaultAzureCredential with
AZURE_FEDERATED_TOKEN_FILE) at the fakes' token endpoints. A credential the cloud refuses
shows on the NodeImage, and the rollout goes on once the identity is set up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.api.etcd import EtcdCluster
from kustos.api.nodeimage import NodeImage
from kustos.devcluster.azurefake import AzureFake
from kustos.devcluster.cloudbridge import BRIDGE_LABEL
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.gcpfake import GcpFake
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.cloud import Role
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from kustos.runtime.refs import ResourceRef
from kustos.runtime.resources import NODES
from tests.cloud_support import (
    AZURE_CLIENT,
    OPERATOR_ACCOUNT,
    AzureCloud,
    Cloud,
    GcpCloud,
    ServiceAccount,
    azure_workload_identity,
    cluster_issuer,
    gcp_service_account_key,
    gcp_workload_identity,
)
from tests.integration import test_nodeimage_aws as aws_e2e
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, etcd_cluster, wait_healthy
from tests.integration.kube import budget_breach, wait_until
from tests.integration.operator import chart_identity, start_chart_operator

pytestmark = [
    pytest.mark.integration,
    pytest.mark.process_runner("the cloud fakes' instances are kwok nodes; no real machine backs them"),
]

ETCDCLUSTERS = EtcdCluster.crd.ref
NODEIMAGES = NodeImage.crd.ref
PDBS = ResourceRef("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
CP, WORKERS = 3, 7
ROLES = {"cp": "node-role.kubernetes.io/control-plane", "w": "node-role.kubernetes.io/worker"}
WORKER_NODES = {BRIDGE_LABEL: "true", ROLES["w"]: ""}


@pytest.fixture
async def api(dev_cluster: DevCluster) -> AsyncIterator[Api]:
    clients = connect(load_config(dev_cluster.kubeconfig), Metrics())
    yield Api(clients.raw)
    await clients.close()


@pytest.fixture(params=["gcp", "azure"])
async def cloud(
    request: pytest.FixtureRequest, api: Api, dev_cluster: DevCluster, namespace: str, tmp_path: Path
) -> AsyncIterator[Cloud]:
    octets = str(dev_cluster.network.cidr.network_address).split(".")
    pods = f"{octets[0]}.{octets[1]}"
    made: Cloud
    chart_identity(dev_cluster)  # the chart's ServiceAccount, whose tokens the operator presents
    if request.param == "gcp":
        gcp = GcpFake(boot_seconds=1.0, delete_seconds=1.0)
        gcp.api.start()
        identity, _ = gcp_workload_identity(gcp, dev_cluster, OPERATOR_ACCOUNT, tmp_path / "identity")
        made = GcpCloud("gcp", api, "e2e", fake=gcp, pod_cidr_prefix=pods, environment=identity)
    else:
        azure = AzureFake(boot_seconds=1.0, delete_seconds=1.0)
        azure.start(tmp_path / "azure")
        identity = azure_workload_identity(azure, dev_cluster, OPERATOR_ACCOUNT, tmp_path / "identity")
        made = AzureCloud("azure", api, "e2e", fake=azure, pod_cidr_prefix=pods, environment=identity)
    try:
        async with made.bridged():
            yield made
    finally:
        made.fake.api.stop()  # type: ignore[attr-defined]


def operator_options(cloud: Cloud) -> list[str]:
    return [arg for key, value in cloud.options().items() for arg in ("--cloud-option", f"{key}={value}")]


def workload(name: str, replicas: int, min_available: int) -> list[dict[str, Any]]:
    labels = {"app": name}
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": labels}}  # fmt: skip
    pod = {"containers": [{"name": "web", "image": "nginx:1.27"}], "nodeSelector": WORKER_NODES,
           "topologySpreadConstraints": [spread], "terminationGracePeriodSeconds": 0}  # fmt: skip
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
         "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}}},
    ]  # fmt: skip


@dataclass
class Watcher:
    """Samples the cloud's groups, the bridge's Nodes, PDBs and the EtcdCluster every 0.3 s."""

    cloud: Cloud
    namespace: str
    groups: dict[str, str]  # role key -> group id
    max_instances: dict[str, int] = field(default_factory=dict)
    max_unavailable: dict[str, int] = field(default_factory=dict)
    pdb_breaches: list[str] = field(default_factory=list)
    etcd_min_healthy: int | None = None
    etcd_at_minimum: list[dict[str, Any]] = field(default_factory=list)  # what status said then
    samples: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        totals = {"cp": CP, "w": WORKERS}
        provider = self.cloud.provider()
        while not stop.is_set():
            nodes = await self.cloud.api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
            for key, group_id in self.groups.items():
                live = [
                    i for i in await provider.instances(group_id) if i.state.value in ("Pending", "Running")
                ]
                self.max_instances[key] = max(self.max_instances.get(key, 0), len(live))
                usable = sum(1 for n in nodes if ROLES[key] in objects.labels(n) and objects.node_ready(n)
                             and not objects.node_unschedulable(n))  # fmt: skip
                self.max_unavailable[key] = max(self.max_unavailable.get(key, 0), totals[key] - usable)
            for pdb in await self.cloud.api.list_objects(PDBS, self.namespace):
                if (breach := budget_breach(pdb)) is not None:
                    self.pdb_breaches.append(breach)
            cluster = await self.cloud.api.get(ETCDCLUSTERS, self.namespace, "e")
            members = ((cluster or {}).get("status") or {}).get("members") or []
            if members:
                healthy = sum(1 for m in members if m.get("healthy"))
                if self.etcd_min_healthy is None or healthy < self.etcd_min_healthy:
                    self.etcd_min_healthy, self.etcd_at_minimum = healthy, members
            self.samples += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)


async def nodes_of(cloud: Cloud, count: int) -> bool:
    nodes = await cloud.api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
    return len(nodes) == count and all(objects.node_ready(n) for n in nodes)


async def rolled_out(cloud: Cloud, groups: dict[str, str], old: set[str]) -> bool:
    provider = cloud.provider()
    instances = [i for g in groups.values() for i in await provider.instances(g)]
    nodes = await cloud.api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
    return (
        len(instances) == len(nodes) == CP + WORKERS
        and all(i.image == cloud.new for i in instances)
        and not {n["spec"]["providerID"] for n in nodes} & old
        and all(objects.node_ready(n) and not objects.node_unschedulable(n) for n in nodes)
    )


@pytest.mark.timeout(1200)
async def test_every_node_replaced_within_every_budget_and_no_write_lost(
    cloud: Cloud, api: Api, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    groups = {"cp": await cloud.make_group("cp", Role.CONTROL_PLANE, CP),
              "w": await cloud.make_group("w", Role.WORKER, WORKERS)}  # fmt: skip
    provider = cloud.provider()
    old = {i.provider_id for g in groups.values() for i in await provider.instances(g)}

    async def nodes_up() -> bool:
        nodes = await api.list_objects(NODES, None, f"{BRIDGE_LABEL}=true")
        return {n["spec"]["providerID"] for n in nodes} == old and all(objects.node_ready(n) for n in nodes)

    await wait_until(nodes_up, "a Ready node per instance", timeout=90, cluster=dev_cluster)
    kubectl.apply(
        *workload("web", replicas=4, min_available=3), *workload("api", replicas=3, min_available=2)
    )
    kubectl.apply(etcd_cluster("e", 3, addressing="podIP", pod={"antiAffinity": "required",
                                                                "nodeSelector": WORKER_NODES}))  # fmt: skip
    name = kubectl.namespace
    watcher, stop = Watcher(cloud, kubectl.namespace, groups), asyncio.Event()
    process = start_chart_operator(
        dev_cluster, tmp_path / "operator", "--namespace", kubectl.namespace,
        "--cloud-provider", cloud.name, *operator_options(cloud), env=cloud.environment,
    )  # fmt: skip
    try:
        status = await wait_healthy(kubectl, "e", 3, timeout=180)
        writer = Writer([m["clientUrl"] for m in status["members"]])
        writer.start()
        task = asyncio.create_task(watcher.run(stop))
        dev_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({
            "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
            "spec": {"image": cloud.new, "imageVersion": "2026.11", "joinTimeout": "120s",
                     "drainTimeout": "2m", "etcd": {"enabled": False},
                     "workers": {"maxSurge": 2, "maxUnavailable": 0}},
        }))  # fmt: skip

        async def done() -> bool:
            if not process.alive():
                return True  # fails just below, now rather than at the timeout
            cluster = await api.get(ETCDCLUSTERS, kubectl.namespace, "e") or {}
            if (cluster.get("status") or {}).get("members"):
                writer.update(cluster["status"])  # the writer follows the members to new nodes
            image = await api.get(NODEIMAGES, None, name) or {}
            progress = (image.get("status") or {}).get("progress")
            return progress == f"{CP + WORKERS}/{CP + WORKERS}" and await rolled_out(cloud, groups, old)

        try:
            await wait_until(done, "every node replaced", timeout=900, interval=1)
            assert process.alive(), f"the operator exited:\n{process.log()[-3000:]}"
        except AssertionError as err:
            raise AssertionError(f"{err}\noperator log (tail):\n{process.log()[-6000:]}") from None
        finally:
            stop.set()
            await task
            await writer.stop()
        status = await wait_healthy(kubectl, "e", 3, timeout=120)
        lost = await writer.missing(status["members"][0]["clientUrl"])
        image = json.loads(dev_cluster.kubectl("get", "nodeimage", name, "-o", "json"))
    finally:
        if process.alive():
            process.stop()
        aws_e2e.remove_rollout_objects(dev_cluster, name, tuple(groups.values()))

    print(f"{cloud.name}: {watcher.samples} samples, instances {watcher.max_instances}, unavailable "
          f"{watcher.max_unavailable}, etcd min healthy {watcher.etcd_min_healthy}, "
          f"writes {len(writer.acknowledged)}")  # fmt: skip
    assert watcher.samples > 10
    assert watcher.max_instances["cp"] <= CP + 1 and watcher.max_instances["w"] <= WORKERS + 2, watcher
    assert watcher.max_unavailable == {"cp": 0, "w": 0}, watcher
    assert watcher.pdb_breaches == []
    # Quorum of 3 all along.
    assert watcher.etcd_min_healthy is not None and watcher.etcd_min_healthy >= 2, watcher.etcd_at_minimum
    assert len(writer.acknowledged) > 0 and lost == []
    assert next(c for c in image["status"]["conditions"] if c["type"] == "Available")["status"] == "True"
    # The groups are back to their size, launching the new image.
    for key, group_id in groups.items():
        [group] = [g for g in await provider.groups() if g.group_id == group_id]
        assert (group.desired, group.image) == ({"cp": CP, "w": WORKERS}[key], cloud.new)


@pytest.mark.timeout(600)
async def test_a_creation_that_never_shows_up_is_taken_back_at_its_join_deadline(
    api: Api, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """The group's size is not left raised: the Join deadline passes with no instance listed,
    the PendingNode controller takes the creation back, and the next heir is asked afresh."""
    fake = GcpFake(boot_seconds=0.5, delete_seconds=0.5)
    fake.api.start()
    cloud = GcpCloud("gcp", api, "held", fake=fake, environment=gcp_service_account_key(fake, tmp_path))
    name = kubectl.namespace
    workers = await cloud.make_group("w", Role.WORKER, 1)
    async with cloud.bridged():
        try:
            await wait_until(lambda: nodes_of(cloud, 1), "the group's node", timeout=60)
            fake.hold_creations = True
            process = start_chart_operator(
                dev_cluster, tmp_path / "operator", "--namespace", kubectl.namespace,
                "--cloud-provider", "gcp", *operator_options(cloud), env=cloud.environment,
            )  # fmt: skip
            try:
                dev_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({
                    "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
                    "spec": {"image": cloud.new, "joinTimeout": "10s", "etcd": {"enabled": False}},
                }))  # fmt: skip

                async def taken_back() -> bool:
                    sizes = [size for group, size in fake.resizes if group == workers]
                    return 2 in sizes and 1 in sizes[sizes.index(2) :]

                try:
                    await wait_until(taken_back, "the held creation taken back", timeout=120, interval=1)
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{fake.resizes}\n{process.log()[-4000:]}") from None
            finally:
                process.stop()
            # Never more than the one creation outstanding at a time.
            assert max(size for group, size in fake.resizes if group == workers) == 2
        finally:
            fake.api.stop()
            aws_e2e.remove_rollout_objects(dev_cluster, name, (workers,))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("provider", ["gcp", "azure"])
async def test_a_refused_credential_is_named_on_the_node_image_and_the_rollout_goes_on_once_it_is_set_up(
    provider: str, api: Api, dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """The operator's identity is not trusted yet (GCP: its principal has no role on the
    project; Azure: the app has no federated credential for its ServiceAccount): the
    NodeImage says so (Degraded, ProviderCredentials, the cloud's own words, and a Warning
    Event), the operator keeps running and backs off; once the user sets the identity up,
    the rollout goes on with nothing restarted. The bridge meanwhile uses an identity of its own."""
    chart_identity(dev_cluster)
    cloud: Cloud
    if provider == "gcp":
        gcp = GcpFake(boot_seconds=0.5, delete_seconds=0.5)
        gcp.api.start()
        operator_env, pool = gcp_workload_identity(
            gcp, dev_cluster, OPERATOR_ACCOUNT, tmp_path / "op", bind=False
        )
        cloud = GcpCloud("gcp", api, "creds", fake=gcp, environment=gcp_service_account_key(gcp, tmp_path))
        refusal = f"subject/{OPERATOR_ACCOUNT.subject} has no role"
        calls = "oauth.token"

        def set_up() -> None:
            with gcp.api.lock:
                pool.subjects.add(OPERATOR_ACCOUNT.subject)  # gcloud projects add-iam-policy-binding
    else:
        azure = AzureFake(boot_seconds=0.5, delete_seconds=0.5)
        azure.start(tmp_path / "azure")
        bridge_env = azure_workload_identity(
            azure, dev_cluster, ServiceAccount("default", "default"), tmp_path
        )
        operator_env = azure_workload_identity(
            azure, dev_cluster, OPERATOR_ACCOUNT, tmp_path / "op", federate=False
        )
        cloud = AzureCloud("azure", api, "creds", fake=azure, environment=bridge_env)
        refusal = "AADSTS70021: No matching federated identity record found"
        calls = "entra.token"

        def set_up() -> None:  # az identity federated-credential create --issuer ... --subject ...
            issuer, keys = cluster_issuer(dev_cluster)
            azure.federate(AZURE_CLIENT, issuer, OPERATOR_ACCOUNT.subject, keys)

    fake: GcpFake | AzureFake = cloud.fake  # type: ignore[attr-defined]
    name = kubectl.namespace
    workers = await cloud.make_group("w", Role.WORKER, 1)
    async with cloud.bridged():
        [old] = [i.provider_id for i in await cloud.provider().instances(workers)]
        try:
            await wait_until(lambda: nodes_of(cloud, 1), "the group's node", timeout=60)
            process = start_chart_operator(
                dev_cluster, tmp_path / "operator", "--namespace", kubectl.namespace,
                "--cloud-provider", provider, *operator_options(cloud), env=operator_env,
            )  # fmt: skip
            try:
                dev_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({
                    "apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": name},
                    "spec": {"image": cloud.new, "joinTimeout": "60s", "etcd": {"enabled": False}},
                }))  # fmt: skip

                async def refused() -> dict[str, Any] | None:
                    image = await api.get(NODEIMAGES, None, name) or {}
                    for c in (image.get("status") or {}).get("conditions") or []:
                        if c["type"] == "Degraded" and c.get("reason") == "ProviderCredentials":
                            return dict(c)
                    return None

                try:
                    condition = await wait_until(refused, "the refused credential in status", timeout=90)
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{process.log()[-4000:]}") from None
                assert refusal in condition["message"], condition
                selector = f"involvedObject.name={name},reason=ProviderCredentials"
                events = json.loads(
                    dev_cluster.kubectl("get", "events", "-A", "--field-selector", selector, "-o", "json")
                )["items"]
                assert events and events[0]["type"] == "Warning", events
                # Backed off, not spinning: few token requests while it stays refused.
                before = fake.api.calls.count(calls)
                await asyncio.sleep(15)
                attempts = fake.api.calls.count(calls) - before
                print(f"{provider}: {attempts} token requests in 15 s while refused")
                assert attempts < 30
                assert process.alive(), process.log()[-3000:]
                assert [i.provider_id for i in await cloud.provider().instances(workers)] == [old]

                set_up()

                async def replaced() -> bool:
                    image = await api.get(NODEIMAGES, None, name) or {}
                    instances = await cloud.provider().instances(workers)
                    return (image.get("status") or {}).get("progress") == "1/1" and [
                        i.image for i in instances] == [cloud.new] and await nodes_of(cloud, 1)  # fmt: skip

                try:
                    await wait_until(replaced, "the node replaced once the identity was set up", timeout=240)
                except AssertionError as err:
                    raise AssertionError(f"{err}\n{process.log()[-4000:]}") from None
                conditions = {
                    c["type"]: c for c in (await api.get(NODEIMAGES, None, name))["status"]["conditions"]
                }
                assert conditions["Degraded"]["status"] == "False", conditions["Degraded"]
                assert process.alive()
            finally:
                process.stop()
        finally:
            fake.api.stop()
            aws_e2e.remove_rollout_objects(dev_cluster, name, (workers,))
