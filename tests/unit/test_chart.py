"""The Helm chart (deploy/helm/kustos): generated files current, `helm lint` clean, golden
`helm template` outputs for the three modes, the plain manifest current, and the chart's
webhook configurations equal to what the operator serves.

helm is built from its pinned Go module when missing (as the integration tests build the
control plane): nothing here skips. Regenerate goldens and deploy/manifests/kustos.yaml with
KUSTOS_UPDATE_GOLDEN=1 (`make chart`) and review the diff.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from kustos.api.resources import RESOURCES
from kustos.devcluster import binaries
from kustos.etcd.evictions import eviction_webhook
from kustos.etcd.webhook import webhooks as etcd_webhooks
from kustos.install import chart as chart_files
from kustos.install.values import ChartValues, defaults
from kustos.maintenance.image_overrides_webhook import webhooks as image_override_webhooks
from kustos.runtime.manager import namespace_selector
from kustos.storage.manifests import CSI_HELPER_RULES, NODE_RULES
from kustos.storage.webhook import scheduler_webhook

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "kustos"
MANIFEST = REPO / "deploy" / "manifests" / "kustos.yaml"
GOLDEN = Path(__file__).parent / "golden" / "chart"
RELEASE, NAMESPACE = "kustos", "kustos-system"
UPDATE = os.environ.get("KUSTOS_UPDATE_GOLDEN") == "1"

MODES: dict[str, list[str]] = {
    "default": [],
    "namespaced": ["--set", "namespaces={team-a,team-b}"],
    "cert-manager": ["--set", "webhook.certManager.enabled=true",
                     "--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                     "--set", "metrics.prometheusRule.enabled=true"],
}  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    binaries.build_missing("helm")
    return binaries.binary_path("helm")


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # A private HOME: helm reads and writes its config and cache there, never the user's.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(REPO / ".pytest_cache" / "helm-home")}
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def template(helm: Path, *args: str) -> str:
    return run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def without_crds(text: str) -> str:
    """The rendered chart but its CRDs (which test_generated_files_are_current pins)."""
    kept = [d for d in documents(text) if d["kind"] != "CustomResourceDefinition"]
    return yaml.safe_dump_all(kept, sort_keys=True, width=1_000_000)


def test_generated_files_are_current() -> None:
    if UPDATE:
        chart_files.write(CHART)
    assert chart_files.stale(CHART) == [], "regenerate with `kustos chart --write deploy/helm/kustos`"


def test_values_yaml_states_the_models_defaults() -> None:
    stated = yaml.safe_load((CHART / "values.yaml").read_text())
    assert ChartValues.model_validate(stated) == ChartValues()
    assert stated == defaults()


@pytest.mark.parametrize("mode", MODES)
def test_helm_lint_is_clean(helm: Path, mode: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *MODES[mode])
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("mode", MODES)
def test_helm_template_matches_golden(helm: Path, mode: str) -> None:
    rendered = without_crds(template(helm, *MODES[mode]))
    golden = GOLDEN / f"{mode}.yaml"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(rendered)
    assert golden.read_text() == rendered, f"{golden} is stale; regenerate with KUSTOS_UPDATE_GOLDEN=1"


def plain_manifest(helm: Path) -> str:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    header = (
        "# kustos with the chart's default values: `helm template kustos deploy/helm/kustos "
        f"--namespace {NAMESPACE}`,\n# kept current by tests/unit/test_chart.py. Apply with "
        "`kubectl apply --server-side -f deploy/manifests/kustos.yaml`.\n"
    )
    return header + "---\n" + yaml.safe_dump(namespace, sort_keys=True) + template(helm)


def test_plain_manifest_is_the_chart_with_defaults(helm: Path) -> None:
    rendered = plain_manifest(helm)
    if UPDATE:
        MANIFEST.parent.mkdir(parents=True, exist_ok=True)
        MANIFEST.write_text(rendered)
    assert MANIFEST.read_text() == rendered, f"{MANIFEST} is stale; regenerate with KUSTOS_UPDATE_GOLDEN=1"


def test_default_install_holds_every_crd_kept_on_uninstall(helm: Path) -> None:
    crds = [d for d in documents(template(helm)) if d["kind"] == "CustomResourceDefinition"]
    assert {c["metadata"]["name"] for c in crds} == {kind.crd.name for kind in RESOURCES}
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in crds)
    off = documents(template(helm, "--set", "crds.install=false"))
    assert not [d for d in off if d["kind"] == "CustomResourceDefinition"]


def test_the_schema_refuses_typos_and_wrong_types(helm: Path) -> None:
    typo = run_helm(helm, "template", RELEASE, str(CHART), "--set", "replcas=3", check=False)
    assert typo.returncode != 0 and "replcas" in typo.stderr
    wrong = run_helm(helm, "template", RELEASE, str(CHART), "--set", "replicas=two", check=False)
    assert wrong.returncode != 0 and "replicas" in wrong.stderr
    for bad in ("namespaces={team-a,team-a}", "namespaces={Team_A}"):
        refused = run_helm(helm, "template", RELEASE, str(CHART), "--set", bad, check=False)
        assert refused.returncode != 0 and "namespaces" in refused.stderr, bad


def test_the_values_model_refuses_a_repeated_or_invalid_namespace() -> None:
    assert ChartValues.model_validate({"namespaces": ["a", "b"]}).namespaces == ["a", "b"]
    with pytest.raises(ValueError, match="namespaces listed twice: \\['a'\\]"):
        ChartValues.model_validate({"namespaces": ["a", "b", "a"]})
    with pytest.raises(ValueError, match="not namespace names"):
        ChartValues.model_validate({"namespaces": ["A_b"]})


def _operator_entries(namespaced: bool) -> dict[str, dict[str, Any]]:
    """What the operator's manager applies, for the chart's Service (runtime/webhook.py)."""
    served = [*etcd_webhooks(), eviction_webhook(cast(Any, None), cast(Any, None), cast(Any, None))]
    if not namespaced:
        served.append(scheduler_webhook(cast(Any, None), cast(Any, None)))
        # The pod image override webhook has its own configuration, made by the leader.
        served += [w for w in image_override_webhooks(cast(Any, None)) if w.configuration is None]
    entries = {}
    for webhook in served:
        if namespaced:
            webhook.namespace_selector = namespace_selector(("team-a", "team-b"))
        service = {"namespace": NAMESPACE, "name": f"{RELEASE}-webhook", "port": 443, "path": webhook.path}
        entries[webhook.name] = webhook.configuration_entry({"service": service})
    return entries


@pytest.mark.parametrize("mode", ["default", "namespaced"])
def test_chart_webhooks_are_what_the_operator_serves(helm: Path, mode: str) -> None:
    """The leader applies its own copy of these entries with the CA bundle: they must agree, or
    the leader and `helm upgrade` would fight over them."""
    configurations = [
        d for d in documents(template(helm, *MODES[mode]))
        if d["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
    ]  # fmt: skip
    charted = {w["name"]: w for c in configurations for w in c["webhooks"]}
    assert charted == _operator_entries(namespaced=mode == "namespaced")
    assert {c["metadata"]["name"] for c in configurations} == {RELEASE}


@pytest.mark.parametrize(
    "sets",
    [
        *MODES.values(),
        ["--set", "webhook.url=https://kustos.example:9443", "--set", "leaderElection.enabled=false",
         "--set", "jsonLogs=true", "--set", "cloudProvider.name=kwok"],
    ],
    ids=[*MODES, "webhook-url"],
)  # fmt: skip
def test_kustos_run_accepts_every_argument_the_chart_passes(helm: Path, sets: list[str]) -> None:
    """``kustos run`` parses its own options (kustos/run.py, not typer's CLI): a flag the chart
    renders and the parser lacks would stop every operator pod at start."""
    from kustos.run import parser

    deployment = next(d for d in documents(template(helm, *sets)) if d["kind"] == "Deployment")
    command, *args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert command == "run"
    parsed = parser().parse_args(args)  # argparse exits (status 2) on a flag it does not know
    assert parsed.leader_elect == ("--leader-elect" in args)  # --no-leader-elect turns it off
    assert parsed.namespace == [a.removeprefix("--namespace=") for a in args if a.startswith("--namespace=")]


def test_deployment_is_hardened_and_highly_available(helm: Path) -> None:
    rendered = documents(template(helm))
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 2
    assert "--leader-elect" in container["args"]
    assert pod["securityContext"]["runAsUser"] == 65532 and pod["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert container["resources"]["requests"]["memory"] == "96Mi"
    assert any(d["kind"] == "PodDisruptionBudget" for d in rendered)


def test_namespaced_mode_reads_nothing_cluster_wide_but_nodes(helm: Path) -> None:
    rendered = documents(template(helm, *MODES["namespaced"]))
    # The operator's ClusterRoles (those the chart binds); the roles for people are no grant.
    bound = {d["roleRef"]["name"] for d in rendered if d["kind"] == "ClusterRoleBinding"}
    cluster_roles = [d for d in rendered if d["kind"] == "ClusterRole" and d["metadata"]["name"] in bound]
    assert len(cluster_roles) == 1
    for rule in cluster_roles[0]["rules"]:
        reads = {"get", "list", "watch"} & set(rule["verbs"])
        assert not reads or rule["resources"] == ["nodes"], rule
        assert rule["resources"] == ["nodes"] or rule.get("resourceNames") == [RELEASE], rule
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendered if d["kind"] == "Role"}
    assert roles == {("team-a", RELEASE), ("team-b", RELEASE), (NAMESPACE, f"{RELEASE}-operator")}
    bindings = {
        (d["metadata"]["namespace"], d["roleRef"]["name"]) for d in rendered if d["kind"] == "RoleBinding"
    }
    assert {("team-a", RELEASE), ("team-b", RELEASE)} <= bindings
    args = next(d for d in rendered if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert [a for a in args["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert "--controllers=etcdcluster,etcdbackup,etcdmaintenance,nodejob" in args["args"]


def test_scheduler_and_storage_roles_are_bound_not_held(helm: Path) -> None:
    docs = documents(template(helm))
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "kustos")
    bind = [r for r in role["rules"] if "bind" in r["verbs"]]
    assert bind == [{
        "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
        "resourceNames": ["system:kube-scheduler", "system:volume-scheduler", "kustos-storage-node",
                          "kustos-storage-csi-helper"],
    }]  # fmt: skip
    assert not [
        r for r in role["rules"] if "*" in r["verbs"] or "*" in r["resources"] or "escalate" in r["verbs"]
    ]
    # The shipped roles hold what a StorageCluster's pods need; the operator holds none of it.
    shipped = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}
    assert shipped["kustos-storage-node"] == NODE_RULES
    assert shipped["kustos-storage-csi-helper"] == CSI_HELPER_RULES
    held = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert not held & {("storage.k8s.io", "volumeattachments"), ("storage.k8s.io", "csinodes"),
                       ("coordination.k8s.io", "leases")}  # fmt: skip
    # Volumes are only read (node maintenance: which node a claim is pinned to), never written.
    volumes = [r for r in role["rules"] if "persistentvolumes" in r["resources"]]
    assert [r["verbs"] for r in volumes] == [["list", "watch"]]
    env = {e["name"]: e.get("value") for d in docs if d["kind"] == "Deployment"
           for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert env["KUSTOS_STORAGE_NODE_ROLE"] == "kustos-storage-node"
    assert env["KUSTOS_STORAGE_CSI_HELPER_ROLE"] == "kustos-storage-csi-helper"


def test_the_cloud_provider_and_its_options_reach_the_operator(helm: Path) -> None:
    def args(*sets: str) -> list[str]:
        rendered = documents(template(helm, *sets))
        deployment = next(d for d in rendered if d["kind"] == "Deployment")
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert not [a for a in args() if a.startswith("--cloud")]
    aws = args(
        "--set", "cloudProvider.name=aws", "--set", "cloudProvider.options.region=eu-west-1",
        "--set", "cloudProvider.options.cluster=prod",
        "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/kustos",
    )  # fmt: skip
    assert aws[aws.index("--cloud-provider=aws") :][:3] == [
        "--cloud-provider=aws",
        "--cloud-option=cluster=prod",
        "--cloud-option=region=eu-west-1",
    ]
    gcp = args("--set", "cloudProvider.name=gcp", "--set", "cloudProvider.options.project=prod-1")
    assert gcp[gcp.index("--cloud-provider=gcp") :][:2] == [
        "--cloud-provider=gcp",
        "--cloud-option=project=prod-1",
    ]
    azure = args(
        "--set", "cloudProvider.name=azure", "--set", "cloudProvider.options.subscription=0000",
        "--set-string", "podLabels.azure\\.workload\\.identity/use=true",
    )  # fmt: skip
    assert azure[azure.index("--cloud-provider=azure") :][:2] == [
        "--cloud-provider=azure",
        "--cloud-option=subscription=0000",
    ]
    refused = run_helm(helm, "template", RELEASE, str(CHART), "--set", "cloudProvider.name=gce", check=False)
    assert refused.returncode != 0 and "cloudProvider" in refused.stderr


def test_rook_exec_is_a_role_in_rooks_namespace_only(helm: Path) -> None:
    """pods/exec is granted in Rook's namespace (rook.enabled), never cluster-wide."""
    assert not [d for d in documents(template(helm)) if d["metadata"]["name"].endswith("-rook")]
    rendered = documents(template(helm, "--set", "rook.enabled=true", "--set", "rook.namespace=storage"))
    role = next(d for d in rendered if d["kind"] == "Role" and d["metadata"]["name"].endswith("-rook"))
    assert role["metadata"]["namespace"] == "storage"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]}]
    binding = next(
        d for d in rendered if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-rook")
    )
    assert binding["metadata"]["namespace"] == "storage"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    for cluster_role in (d for d in rendered if d["kind"] == "ClusterRole"):
        assert not [r for r in cluster_role["rules"] if "pods/exec" in r.get("resources", [])]
    refused = run_helm(helm, "template", RELEASE, str(CHART), "--set", "rook.namespace=Bad_NS", check=False)
    assert refused.returncode != 0 and "rook" in refused.stderr


@pytest.mark.parametrize(
    ("args", "shipped"),
    [
        ([], False),  # no prometheus-operator: a PrometheusRule would fail the install
        (["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"], True),
        (["--api-versions", "monitoring.coreos.com/v1/PrometheusRule",
          "--set", "metrics.prometheusRule.enabled=false"], False),
        (["--set", "metrics.prometheusRule.enabled=true"], True),
    ],
)  # fmt: skip
def test_alert_rules_ship_when_prometheus_operator_is_there_or_asked(
    helm: Path, args: list[str], shipped: bool
) -> None:
    rules = [d for d in documents(template(helm, *args)) if d["kind"] == "PrometheusRule"]

    assert bool(rules) == shipped
    if rules:
        shipped_rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
        assert rules[0]["spec"] == shipped_rules  # the very rules promtool checks


def test_users_get_etcd_through_edit_and_every_other_kind_only_through_platform_admin(helm: Path) -> None:
    """EtcdCluster and EtcdBackup join view/edit/admin; every other kustos kind (NodeJob is root
    on its nodes) is reachable only through platform-admin, which covers every kind there is."""
    rendered = {d["metadata"]["name"]: d for d in documents(template(helm)) if d["kind"] == "ClusterRole"}
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    aggregated = [
        d for d in rendered.values() if any(k.startswith(aggregate) for k in d["metadata"]["labels"])
    ]
    kinds = {r.split("/")[0] for d in aggregated for rule in d["rules"] for r in rule["resources"]}
    assert kinds == {"etcdclusters", "etcdbackups"}
    platform = rendered[f"{RELEASE}-platform-admin"]
    assert {r for rule in platform["rules"] for r in rule["resources"]} >= {m.crd.plural for m in RESOURCES}
    assert not [d for d in documents(template(helm, "--set", "userRoles.enabled=false"))
                if d["metadata"]["name"].endswith(("-view", "-edit", "-platform-admin"))]  # fmt: skip
