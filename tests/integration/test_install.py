"""The chart and the plain manifest against the real API server: every object they hold is
accepted (schemas, RBAC escalation checks, webhook configurations), `helm install` and
`helm uninstall` work, and uninstalling keeps the CRDs.

The operator's pods are not started here (replicas=0): running them in the cluster needs the
dev cluster's in-cluster networking and ServiceAccount tokens (issue 14 items 4-6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.api.resources import RESOURCES
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.ports import free_port
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import (
    CHART_NAMESPACE,
    CHART_RELEASE,
    REFUSED,
    chart_identity,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.process_runner(
    "the chart's objects against the API server; its pods on runc: test_dev_up, test_real_nodes_lifecycle"
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kustos"
MANIFEST = REPO / "deploy" / "manifests" / "kustos.yaml"


def helm(cluster: DevCluster, *args: str) -> str:
    binaries.build_missing("helm")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(cluster.state_dir / "helm-home"),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    result = subprocess.run(
        [str(binaries.binary_path("helm")), *args], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


WEBHOOK_CONFIGURATION_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}


def test_the_plain_manifest_is_accepted_by_the_api_server(dev_cluster: DevCluster, tmp_path: Path) -> None:
    dev_cluster.kubectl("create", "namespace", "kustos-system", check=False)
    # The suite's operators register webhook configurations of the same names with a `url`; an
    # apply would merge the manifest's `service` into them (both set: invalid). Checked under
    # another name, each configuration is validated exactly as written.
    documents = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    for document in documents:
        if document["kind"] in WEBHOOK_CONFIGURATION_KINDS:
            document["metadata"]["name"] += "-manifest-check"
    checked = tmp_path / "kustos.yaml"
    checked.write_text(yaml.safe_dump_all(documents))
    # --force-conflicts: the session's chart release may own these objects already (helm's field
    # manager); what is checked is that the API server accepts every object as written.
    out = dev_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", str(checked)
    )
    for kind in ("customresourcedefinition", "clusterrole", "deployment", "validatingwebhookconfiguration",
                 "mutatingwebhookconfiguration", "poddisruptionbudget", "service"):  # fmt: skip
        assert kind in out, out


async def test_helm_installs_in_namespaced_mode_and_uninstall_keeps_the_crds(
    dev_cluster: DevCluster, kubectl: Kubectl
) -> None:
    release = f"kustos-{kubectl.namespace}"
    adopt_crds(dev_cluster, release, kubectl.namespace)
    second = await extra_namespace(dev_cluster, f"{kubectl.namespace}-b")
    try:
        helm(
            dev_cluster, "install", release, str(CHART), "--namespace", kubectl.namespace,
            "--set", f"namespaces={{{kubectl.namespace},{second.namespace}}}", "--set", "replicas=0",
        )  # fmt: skip
        try:
            for each in (kubectl, second):
                role = each.get("role", release)
                assert {"etcdclusters"} <= {r for rule in role["rules"] for r in rule["resources"]}
                assert each.get("rolebinding", release)["roleRef"]["name"] == release
            config = json.loads(
                dev_cluster.kubectl("get", "validatingwebhookconfiguration", release, "-o", "json")
            )
            selectors = {json.dumps(w["namespaceSelector"]) for w in config["webhooks"]}
            expected = {"key": "kubernetes.io/metadata.name", "operator": "In",
                        "values": [kubectl.namespace, second.namespace]}  # fmt: skip
            assert selectors == {json.dumps({"matchExpressions": [expected]})}
            deployment = kubectl.get("deployment", release)
            assert deployment["spec"]["replicas"] == 0
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            assert [a for a in args if a.startswith("--namespace=")] == [
                f"--namespace={kubectl.namespace}",
                f"--namespace={second.namespace}",
            ]
            assert "kustos" in helm(dev_cluster, "list", "--namespace", kubectl.namespace)
        finally:
            helm(dev_cluster, "uninstall", release, "--namespace", kubectl.namespace)
        assert not dev_cluster.kubectl("get", "validatingwebhookconfiguration", release, "--ignore-not-found")
        assert not kubectl("get", "role", release, "--ignore-not-found")
        assert not second("get", "role", release, "--ignore-not-found")
    finally:
        dev_cluster.kubectl("delete", "namespace", second.namespace, "--wait=false", check=False)
    # The CRDs stay (helm.sh/resource-policy: keep): deleting them would delete every cluster.
    assert dev_cluster.kubectl("get", "crd", "etcdclusters.kustos.dev", "-o", "name").strip()


def adopt_crds(cluster: DevCluster, release: str, namespace: str) -> None:
    """CRDs another test applied with kubectl become this release's, as helm requires."""
    for crd in (r.crd.name for r in RESOURCES):
        if cluster.kubectl("get", "crd", crd, "--ignore-not-found", "-o", "name").strip():
            cluster.kubectl("annotate", "--overwrite", "crd", crd, f"meta.helm.sh/release-name={release}",
                            f"meta.helm.sh/release-namespace={namespace}")  # fmt: skip
            cluster.kubectl("label", "--overwrite", "crd", crd, "app.kubernetes.io/managed-by=Helm")


def start_operator_as(kubeconfig: Path, log: Path, *args: str, release: str = "") -> subprocess.Popen[bytes]:
    """``kustos run`` with only ``kubeconfig``'s identity; with a cluster-mode ``release``, told
    its chart's storage roles as the chart's Deployment does."""
    env = {**os.environ}
    if release:
        env |= {"KUSTOS_STORAGE_NODE_ROLE": f"{release}-storage-node",
                "KUSTOS_STORAGE_CSI_HELPER_ROLE": f"{release}-storage-csi-helper"}  # fmt: skip
    with log.open("wb") as sink:
        command = [sys.executable, "-m", "kustos", "run", "--kubeconfig", str(kubeconfig), *args]
        return subprocess.Popen(command, stdout=sink, stderr=sink, cwd=REPO, env=env)


async def extra_namespace(dev_cluster: DevCluster, name: str) -> Kubectl:
    """Another namespace for this test (the ``namespace`` fixture gives one), with the default
    ServiceAccount pods need; removed by the caller."""
    dev_cluster.kubectl("create", "namespace", name)

    async def default_service_account() -> bool:
        found = dev_cluster.kubectl("-n", name, "get", "serviceaccount", "default", "--ignore-not-found")
        return bool(found.strip())

    await wait_until(default_service_account, f"the default service account of {name}", timeout=60)
    return Kubectl(dev_cluster, name)


@pytest.mark.parametrize("mode", ["cluster", "namespaced"])
async def test_the_operator_runs_an_etcd_cluster_with_only_the_charts_permissions(
    mode: str, dev_cluster: DevCluster, kubectl: Kubectl, tmp_path: Path
) -> None:
    """Not an administrator: the chart's ServiceAccount, with the roles the chart ships,
    creates an EtcdCluster until it is healthy, and the API server refuses it nothing. In
    namespaced mode the chart is given TWO namespaces: a cluster in each becomes healthy (one
    list/watch per namespace, the same name in both), and a third namespace stays unread."""
    release, namespace = f"kustos-{kubectl.namespace}", kubectl.namespace
    adopt_crds(dev_cluster, release, namespace)
    # No webhooks: their Service has no endpoint in the dev cluster yet (the operator runs
    # beside the cluster, not in it), so the API server could not call them.
    values = ["--set", "replicas=0", "--set", "webhook.enabled=false"]
    operator_args = ["--namespace", namespace, "--lease-name", release, "--lease-namespace", namespace,
                     "--metrics-address", f"127.0.0.1:{free_port()}"]  # fmt: skip
    watched, unwatched = [kubectl], None
    if mode == "namespaced":
        second = await extra_namespace(dev_cluster, f"{namespace}-b")
        unwatched = await extra_namespace(dev_cluster, f"{namespace}-c")
        watched.append(second)
        values += ["--set", f"namespaces={{{namespace},{second.namespace}}}"]
        operator_args += ["--namespace", second.namespace,
                          "--controllers", "etcdcluster,etcdbackup,etcdmaintenance,nodejob"]  # fmt: skip
    helm(dev_cluster, "install", release, str(CHART), "--namespace", namespace, *values)
    identity = f"system:serviceaccount:{namespace}:{release}"
    # Deleting Nodes: node image rollouts (a donor replaced by its heir) and node maintenance's
    # purge need it, and only a cluster-wide install runs them; a namespaced install can never
    # delete a Node. Node status is the kubelet's: no install writes it.
    can_delete_nodes = "no" if mode == "namespaced" else "yes"
    assert (
        dev_cluster.kubectl("auth", "can-i", "delete", "nodes", "--as", identity, check=False).strip()
        == can_delete_nodes
    )
    assert (
        dev_cluster.kubectl("auth", "can-i", "update", "nodes/status", "--as", identity, check=False).strip()
        == "no"
    )
    assert dev_cluster.kubectl("auth", "can-i", "escalate", "clusterroles", "--as", identity,
                               check=False).strip() == "no"  # fmt: skip
    process = None
    log = tmp_path / "operator.log"
    try:
        kubeconfig = service_account_kubeconfig(dev_cluster, namespace, release, tmp_path / "sa.json")
        process = start_operator_as(kubeconfig, log, *operator_args)
        if unwatched is not None:
            for resource in ("etcdclusters.kustos.dev", "pods", "secrets"):
                answer = dev_cluster.kubectl("auth", "can-i", "list", resource, "-n", unwatched.namespace,
                                             "--as", identity, check=False)  # fmt: skip
                assert answer.strip() == "no", resource
            unwatched.apply(etcd_cluster("least", 1))
        for each in watched:
            each.apply(etcd_cluster("least", 1))
        for each in watched:
            await wait_healthy(each, "least", 1, timeout=120)
        if unwatched is not None:
            # Out of the operator's reach: never reconciled, no pod made for it.
            assert not unwatched.get("etcdcluster", "least").get("status")
            assert not unwatched.get("pods")["items"]
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        helm(dev_cluster, "uninstall", release, "--namespace", namespace)
        for each in [*watched[1:], *([unwatched] if unwatched else [])]:
            dev_cluster.kubectl("delete", "namespace", each.namespace, "--wait=false", check=False)
    text = log.read_text(errors="replace")
    assert "controller etcdcluster started" in text, text[-3000:]
    assert not REFUSED.search(text), text[-3000:]


async def test_the_operator_runs_a_storage_cluster_with_only_the_charts_permissions(
    dev_cluster: DevCluster, kubectl: Kubectl, tmp_path: Path
) -> None:
    """The StorageCluster path: it generates ClusterRoles (which the operator may create only
    holding their permissions) and binds the built-in scheduler roles (allowed by `bind` on
    those two names), then removes everything when the StorageCluster is deleted."""
    from tests.integration.test_storagecluster import storage_cluster, workers

    release, namespace = f"kustos-{kubectl.namespace}", kubectl.namespace
    adopt_crds(dev_cluster, release, namespace)
    helm(dev_cluster, "install", release, str(CHART), "--namespace", namespace,
         "--set", "replicas=0", "--set", "webhook.enabled=false")  # fmt: skip
    process = None
    log = tmp_path / "operator.log"
    manifest = storage_cluster(kubectl, "stor", workers(dev_cluster), csi={"enable": True})
    try:
        kubeconfig = service_account_kubeconfig(dev_cluster, namespace, release, tmp_path / "sa.json")
        process = start_operator_as(
            kubeconfig, log, "--namespace", namespace, "--lease-name", release,
            "--lease-namespace", namespace, "--metrics-address", f"127.0.0.1:{free_port()}",
            "--controllers", "storagecluster", release=release,
        )  # fmt: skip

        async def running() -> bool:
            status = kubectl.get("storagecluster", "stor").get("status") or {}
            return status.get("ready") == "3/3" and status.get("phase") == "Running"

        kubectl.apply(manifest)
        await wait_until(running, "StorageCluster 3/3 Running as the chart's identity", timeout=120,
                         cluster=dev_cluster, namespace=manifest["spec"]["namespace"])  # fmt: skip
        bindings = dev_cluster.kubectl("get", "clusterrolebindings", "-o", "name")
        assert "kube-scheduler" in bindings and "volume-scheduler" in bindings
        # The node and CSI helper pods are bound to the chart's roles; none is generated.
        roles = {
            b["roleRef"]["name"]
            for b in json.loads(
                dev_cluster.kubectl(
                    "get", "clusterrolebindings", "-l", "app.kubernetes.io/managed-by=kustos", "-o", "json"
                )
            )["items"]
        }
        assert {f"{release}-storage-node", f"{release}-storage-csi-helper"} <= roles, roles
        generated = dev_cluster.kubectl(
            "get", "clusterroles", "-l", "app.kubernetes.io/managed-by=kustos", "-o", "name"
        )
        assert not generated.strip(), generated
        kubectl("delete", "storagecluster", "stor", "--wait=true", "--timeout=90s")
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        kubectl("patch", "storagecluster", "stor", "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                check=False)  # fmt: skip
        helm(dev_cluster, "uninstall", release, "--namespace", namespace)
    text = log.read_text(errors="replace")
    assert not REFUSED.search(text), text[-3000:]


CAN_I_GOLDEN = REPO / "tests" / "unit" / "golden" / "chart" / "can-i-list.txt"


def test_what_the_charts_service_account_may_do_is_the_golden(dev_cluster: DevCluster) -> None:
    """``kubectl auth can-i --list`` as the chart's ServiceAccount (the session's release in
    kustos-system), cluster-wide rules and its own namespace's. A change in the chart's RBAC
    shows here as a diff to review; KUSTOS_UPDATE_GOLDEN=1 rewrites it."""
    chart_identity(dev_cluster)
    identity = f"system:serviceaccount:{CHART_NAMESPACE}:{CHART_RELEASE}"
    listing = dev_cluster.kubectl("auth", "can-i", "--list", "--as", identity, "-n", CHART_NAMESPACE)
    # Columns are padded to the widest entry: compare the rows, not the padding.
    rows = "\n".join(" ".join(line.split()) for line in listing.splitlines()) + "\n"
    if os.environ.get("KUSTOS_UPDATE_GOLDEN") == "1":
        CAN_I_GOLDEN.write_text(rows)
    assert CAN_I_GOLDEN.read_text() == rows, (
        f"{CAN_I_GOLDEN} is stale; regenerate with KUSTOS_UPDATE_GOLDEN=1"
    )


def as_operator(
    cluster: DevCluster, *args: str, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl as the session release's ServiceAccount (its token, not impersonation)."""
    command = [str(cluster.kubectl_path), "--kubeconfig", str(chart_identity(cluster)), *args]
    return subprocess.run(command, input=input_text, capture_output=True, text=True, check=False)


def test_the_operators_identity_may_not_write_what_kustos_does_not_own(
    dev_cluster: DevCluster, kubectl: Kubectl
) -> None:
    """RBAC lets the chart's ServiceAccount create pods and Secrets anywhere; the chart's
    ValidatingAdmissionPolicy refuses those that are not kustos's: a pod in kube-system with
    its default ServiceAccount, an unlabelled Secret. What kustos itself writes passes (every
    test that runs operators as the chart's ServiceAccount runs under this policy)."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-kustos", "namespace": "kube-system"},
        "spec": {"serviceAccountName": "default", "containers": [{"name": "c", "image": "busybox"}]},
    }
    # A policy applies once the API server has loaded it and its binding, a moment after the
    # chart's install (this module may be the session's first to install it).
    deadline = time.monotonic() + 30
    while True:
        refused = as_operator(dev_cluster, "create", "-f", "-", input_text=json.dumps(pod))
        if refused.returncode != 0 or time.monotonic() > deadline:
            break
        dev_cluster.kubectl("delete", "pod", "not-kustos", "-n", "kube-system", "--wait=false", check=False)
        time.sleep(1)
    assert refused.returncode != 0 and "ValidatingAdmissionPolicy" in refused.stderr, refused.stderr
    assert "kustos labels and an owner reference" in refused.stderr, refused.stderr
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "loose", "namespace": kubectl.namespace},
        "stringData": {"k": "v"},
    }
    refused = as_operator(dev_cluster, "create", "-f", "-", input_text=json.dumps(secret))
    assert refused.returncode != 0 and "ValidatingAdmissionPolicy" in refused.stderr, refused.stderr
    # A kustos-labelled pod owned by a kustos object still may not take host access: that is a
    # StorageCluster's or a NodeJob's only.
    owner = {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "EtcdCluster",
        "name": "x",
        "uid": "00000000-0000-0000-0000-000000000000",
    }
    pod["metadata"] = {
        "name": "host",
        "namespace": kubectl.namespace,
        "ownerReferences": [owner],
        "labels": {"app.kubernetes.io/managed-by": "kustos"},
    }
    pod["spec"] = {"hostNetwork": True, "containers": [{"name": "c", "image": "busybox"}]}
    refused = as_operator(dev_cluster, "create", "--dry-run=server", "-f", "-", input_text=json.dumps(pod))
    assert refused.returncode != 0 and "host namespaces" in refused.stderr, refused.stderr
    del pod["spec"]["hostNetwork"]
    accepted = as_operator(dev_cluster, "create", "--dry-run=server", "-f", "-", input_text=json.dumps(pod))
    assert accepted.returncode == 0, accepted.stderr


async def test_who_may_edit_a_namespace_runs_etcd_there_but_no_node_job(
    dev_cluster: DevCluster, kubectl: Kubectl, crds: None
) -> None:
    """The chart's roles for people: `edit` in a namespace brings EtcdCluster (aggregated by
    kube-controller-manager), never NodeJob, which is root on its nodes (docs/security.md)."""
    chart_identity(dev_cluster)
    user = f"alice-{kubectl.namespace}"
    kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", f"--user={user}")

    def can(verb: str, resource: str) -> bool:
        answer = kubectl("auth", "can-i", verb, resource, "--as", user, check=False).strip()
        return answer == "yes"

    async def aggregated() -> bool:
        return can("create", "etcdclusters.kustos.dev")

    await wait_until(aggregated, "EtcdCluster in the edit role", timeout=60)
    assert can("create", "etcdbackups.kustos.dev") and can("delete", "etcdclusters.kustos.dev")
    for resource in ("nodejobs", "storageclusters", "storageupgrades", "maintenancepolicies", "nodeimages"):
        assert not can("create", f"{resource}.kustos.dev"), resource
    # The real request, not only the authorizer's answer: refused for the user.
    job = {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "NodeJob",
        "metadata": {"name": "root", "namespace": kubectl.namespace},
        "spec": {"image": "busybox"},
    }
    refused = subprocess.run(
        [str(dev_cluster.kubectl_path), "--kubeconfig", str(dev_cluster.kubeconfig), "--as", user,
         "create", "--dry-run=server", "-f", "-"],
        input=json.dumps(job), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode != 0 and REFUSED.search(refused.stderr), refused.stderr
