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
from pathlib import Path

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster
from tests.integration.conftest import Kubectl

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kustos"
MANIFEST = REPO / "deploy" / "manifests" / "kustos.yaml"


def helm(cluster: DevCluster, *args: str) -> str:
    binaries.build([b for b in binaries.missing_binaries() if b.name == "helm"])
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


def test_the_plain_manifest_is_accepted_by_the_api_server(dev_cluster: DevCluster) -> None:
    dev_cluster.kubectl("create", "namespace", "kustos-system", check=False)
    out = dev_cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", str(MANIFEST))
    for kind in ("customresourcedefinition", "clusterrole", "deployment", "validatingwebhookconfiguration",
                 "mutatingwebhookconfiguration", "poddisruptionbudget", "service"):  # fmt: skip
        assert kind in out, out


def test_helm_installs_in_namespaced_mode_and_uninstall_keeps_the_crds(
    dev_cluster: DevCluster, kubectl: Kubectl
) -> None:
    release = f"kustos-{kubectl.namespace}"
    helm(
        dev_cluster, "install", release, str(CHART), "--namespace", kubectl.namespace,
        "--set", f"namespaces={{{kubectl.namespace}}}", "--set", "replicas=0",
    )  # fmt: skip
    try:
        role = kubectl.get("role", release)
        assert {"etcdclusters"} <= {r for rule in role["rules"] for r in rule["resources"]}
        config = json.loads(
            dev_cluster.kubectl("get", "validatingwebhookconfiguration", release, "-o", "json")
        )
        selectors = {json.dumps(w["namespaceSelector"]) for w in config["webhooks"]}
        assert selectors == {json.dumps({"matchLabels": {"kubernetes.io/metadata.name": kubectl.namespace}})}
        assert kubectl.get("deployment", release)["spec"]["replicas"] == 0
        assert "kustos" in helm(dev_cluster, "list", "--namespace", kubectl.namespace)
    finally:
        helm(dev_cluster, "uninstall", release, "--namespace", kubectl.namespace)
    assert not dev_cluster.kubectl("get", "validatingwebhookconfiguration", release, "--ignore-not-found")
    assert not kubectl("get", "role", release, "--ignore-not-found")
    # The CRDs stay (helm.sh/resource-policy: keep): deleting them would delete every cluster.
    assert dev_cluster.kubectl("get", "crd", "etcdclusters.kustos.dev", "-o", "name").strip()
