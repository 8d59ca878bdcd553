"""The kwokctl configuration: stages with the runner exclusion, binaries, timings and nodes."""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kustos.devcluster.binaries import KUBERNETES_VERSION, bin_dir, binary_path
from kustos.devcluster.kwokconfig import (
    AUDIT_POLICY,
    MANAGED_LABEL,
    RUNNER_POD,
    Timings,
    kwok_source_dir,
    kwokctl_config,
    node_manifest,
    stages,
)
from kustos.devcluster.podspec import RUNNER_IMAGE_PREFIXES, pod_is_runner_owned

NOT_RUNNER = {"key": RUNNER_POD, "operator": "NotIn", "values": ["true"]}
RUNNER = {"key": RUNNER_POD, "operator": "In", "values": ["true"]}

# Minimal copies of kwok's own stage files (v0.8.0), enough to check what we add to them.
FAKE_UPSTREAM = {
    "kustomize/stage/node/fast/node-initialize.yaml": """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      phase: Running
""",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml": """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      phase: Running
  immediateNextStage: true
""",
    "kustomize/stage/pod/fast/pod-ready.yaml": """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
  next:
    statusTemplate: |
      phase: Running
""",
    "kustomize/stage/pod/fast/pod-complete.yaml": """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      phase: Succeeded
""",
    "kustomize/stage/pod/fast/pod-delete.yaml": """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
""",
}
UPSTREAM_NAMES = ["node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete"]


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.lstrip())
    return root


@pytest.fixture
def fake_source(tmp_path: Path) -> Path:
    return _write_tree(tmp_path / "kwok", FAKE_UPSTREAM)


@pytest.fixture(params=["fake", "kwok-module"])
def source(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake kwok source tree, and kwok's real one when Go has it in its module cache."""
    if request.param == "fake":
        return _write_tree(tmp_path / "kwok", FAKE_UPSTREAM)
    if shutil.which("go") is None:
        _skip_outside_ci("the Go toolchain is not on PATH")
    # Only what the module cache already holds: never download in a unit test.
    monkeypatch.setenv("GOPROXY", "off")
    monkeypatch.setenv("GOFLAGS", "-mod=mod")
    try:
        return kwok_source_dir()
    except (subprocess.CalledProcessError, OSError, KeyError, ValueError):
        _skip_outside_ci("kwok's module source is not in the Go module cache")


def _skip_outside_ci(reason: str) -> NoReturn:
    """In CI (CI=true) a missing tool is a failure, never a skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _upstream(source: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load((source / rel).read_text()) for rel in FAKE_UPSTREAM]


def _expressions(stage: dict[str, Any]) -> list[dict[str, Any]]:
    return list((stage["spec"].get("selector") or {}).get("matchExpressions") or [])


# ---- stages -------------------------------------------------------------------------------


def test_stages_are_kwoks_defaults_followed_by_the_runner_stages(source: Path) -> None:
    names = [stage["metadata"]["name"] for stage in stages(source)]

    assert names == [
        *UPSTREAM_NAMES,
        "kustos-runner-pod-network",
        "kustos-runner-pod-delete",
        "kustos-node-boot",
    ]
    assert all(stage["kind"] == "Stage" for stage in stages(source))


def test_every_upstream_pod_stage_excludes_runner_pods(source: Path) -> None:
    upstream = {s["metadata"]["name"]: s for s in _upstream(source)}

    pod_stages = [s for s in stages(source)[:5] if s["spec"]["resourceRef"]["kind"] == "Pod"]

    assert [s["metadata"]["name"] for s in pod_stages] == ["pod-ready", "pod-complete", "pod-delete"]
    for stage in pod_stages:
        original = _expressions(upstream[stage["metadata"]["name"]])
        assert _expressions(stage) == [*original, NOT_RUNNER]


def test_upstream_node_stages_are_untouched(source: Path) -> None:
    upstream = {s["metadata"]["name"]: s for s in _upstream(source)}

    node_stages = [s for s in stages(source) if s["spec"]["resourceRef"]["kind"] == "Node"]

    assert [s["metadata"]["name"] for s in node_stages][:2] == [
        "node-initialize",
        "node-heartbeat-with-lease",
    ]
    assert node_stages[1] == upstream["node-heartbeat-with-lease"]
    # node-initialize leaves the kwok cloud provider's nodes to kustos-node-boot.
    init = node_stages[0]
    extra = _expressions(init)[len(_expressions(upstream["node-initialize"])) :]
    assert [e["operator"] for e in extra] == ["DoesNotExist", "DoesNotExist"]
    assert init["spec"]["next"] == upstream["node-initialize"]["spec"]["next"]
    for stage in node_stages:
        assert RUNNER_POD not in json.dumps(stage)


def test_kwok_provider_nodes_boot_at_their_ready_at_annotation(source: Path) -> None:
    boot = stages(source)[-1]

    assert boot["metadata"]["name"] == "kustos-node-boot"
    assert "kustos.dev/kwok-ready-at" in boot["spec"]["delay"]["durationFrom"]["jq"]["expression"]
    assert {"key": '.metadata.annotations["kustos.dev/kwok-never-ready"]', "operator": "DoesNotExist"} in (
        boot["spec"]["selector"]["matchExpressions"]
    )


def test_runner_stages_select_only_runner_pods(source: Path) -> None:
    network, delete = stages(source)[5:7]

    assert network["spec"]["resourceRef"]["kind"] == "Pod"
    assert _expressions(network) == [
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
        {"key": ".status.podIP", "operator": "DoesNotExist"},
        RUNNER,
    ]
    assert "podIP" in network["spec"]["next"]["statusTemplate"]
    assert "phase" not in network["spec"]["next"]["statusTemplate"]

    assert delete["spec"]["resourceRef"]["kind"] == "Pod"
    assert _expressions(delete) == [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}, RUNNER]
    assert delete["spec"]["next"] == {"delete": True}
    assert delete["spec"]["delay"]["durationFrom"] == {"jq": {"expression": ".metadata.deletionTimestamp"}}


def test_each_pod_stage_names_the_runner_rule_exactly_once(source: Path) -> None:
    for stage in stages(source):
        if stage["spec"]["resourceRef"]["kind"] == "Pod":
            runner_rules = [e for e in _expressions(stage) if e["key"] == RUNNER_POD]
            assert len(runner_rules) == 1, stage["metadata"]["name"]


def test_a_pod_stage_without_a_selector_still_gets_the_runner_exclusion(tmp_path: Path) -> None:
    files = dict(FAKE_UPSTREAM)
    stage = yaml.safe_load(files["kustomize/stage/pod/fast/pod-delete.yaml"])
    del stage["spec"]["selector"]
    files["kustomize/stage/pod/fast/pod-delete.yaml"] = yaml.safe_dump(stage)

    delete = stages(_write_tree(tmp_path, files))[4]

    assert _expressions(delete) == [NOT_RUNNER]


def test_stages_leave_the_source_files_as_they_were(fake_source: Path) -> None:
    before = {rel: (fake_source / rel).read_text() for rel in FAKE_UPSTREAM}

    stages(fake_source)
    stages(fake_source)

    assert {rel: (fake_source / rel).read_text() for rel in FAKE_UPSTREAM} == before


def test_stages_need_kwoks_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        stages(tmp_path)


def test_runner_rule_names_every_allow_listed_repository() -> None:
    for prefix in RUNNER_IMAGE_PREFIXES:
        assert f'startswith("{prefix}")' in RUNNER_POD


_RULE_PODS = [
    {"spec": {"containers": [{"name": "e", "image": "registry.k8s.io/etcd:3.6.16-0"}]}},
    {"spec": {"containers": [{"name": "e", "image": "quay.io/coreos/etcd:v3.4.0"}]}},
    {"spec": {"containers": [{"name": "n", "image": "nginx:1.27"}]}},
    {"spec": {"containers": [{"name": "b", "image": "docker.io/bitnami/etcd:3.5.35"}]}},
    {
        "spec": {
            "initContainers": [{"name": "i", "image": "gcr.io/etcd-development/etcd:v3.5.35"}],
            "containers": [{"name": "n", "image": "nginx:1.27"}],
        }
    },
    {
        "spec": {
            "initContainers": [{"name": "i", "image": "busybox:1.36"}],
            "containers": [
                {"name": "n", "image": "nginx:1.27"},
                {"name": "e", "image": "k8s.gcr.io/etcd:3.5.35"},
            ],
        }
    },
    {"spec": {"initContainers": None, "containers": [{"name": "n", "image": "registry.k8s.io/pause:3.10"}]}},
    # The operator's own image (agent pods), alone or beside etcd, is the runner's too.
    {"spec": {"containers": [{"name": "a", "image": "ghcr.io/kustos/kustos:0.1.0"}]}},
    {
        "spec": {
            "initContainers": [{"name": "a", "image": "ghcr.io/kustos/kustos:dev"}],
            "containers": [{"name": "e", "image": "registry.k8s.io/etcd:3.6.16-0"}],
        }
    },
    {"spec": {"containers": [{"name": "a", "image": "ghcr.io/kustos/kustos-extra:0.1.0"}]}},
    {"spec": {"containers": [{"name": "a", "image": "ghcr.io/kustos/kustos"}]}},
]


def test_runner_rule_agrees_with_pod_is_runner_owned_when_evaluated_by_jq() -> None:
    if shutil.which("jq") is None:
        _skip_outside_ci("needs the jq command")
    # kwok evaluates selector keys as jq expressions; jq is the reference implementation.
    out = subprocess.run(
        ["jq", "-c", f".[] | {RUNNER_POD}"],
        input=json.dumps(_RULE_PODS),
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout.split()

    assert out == [json.dumps(pod_is_runner_owned(pod)) for pod in _RULE_PODS]
    assert out.count("true") == 6


# ---- kwokctl config -----------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KUSTOS_CACHE", str(root))
    return root


def _options(config: list[dict[str, Any]]) -> dict[str, Any]:
    return config[0]["options"]


def _patch_args(config: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    (patch,) = [p for p in config[0]["componentsPatches"] if p["name"] == component]
    return list(patch["extraArgs"])


TIMING_OPTIONS = (
    "nodeLeaseDurationSeconds",
    "kubeControllerManagerNodeMonitorPeriodMilliseconds",
    "kubeControllerManagerNodeMonitorGracePeriodMilliseconds",
)


def test_config_documents_are_the_kwokctl_and_kwok_configurations_then_the_stages(
    cache: Path, fake_source: Path
) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=7)

    assert [(d["apiVersion"], d["kind"]) for d in config[:2]] == [
        ("config.kwok.x-k8s.io/v1alpha1", "KwokctlConfiguration"),
        ("config.kwok.x-k8s.io/v1alpha1", "KwokConfiguration"),
    ]
    assert config[2:] == stages(fake_source)


def test_config_runs_the_cached_binaries(cache: Path, fake_source: Path) -> None:
    options = _options(kwokctl_config(Timings(), fake_source, slot=1))

    expected = {
        "etcdBinary": binary_path("etcd"),
        "etcdctlBinary": binary_path("etcdctl"),
        "etcdutlBinary": binary_path("etcdutl"),
        "kubeApiserverBinary": binary_path("kube-apiserver"),
        "kubeControllerManagerBinary": binary_path("kube-controller-manager"),
        "kubeSchedulerBinary": binary_path("kube-scheduler"),
        "kwokControllerBinary": binary_path("kwok"),
        "kubectlBinary": binary_path("kubectl"),
    }
    assert {key: options[key] for key in expected} == {key: str(path) for key, path in expected.items()}
    assert all(Path(options[key]).parent == bin_dir() == cache / "bin" for key in expected)
    assert options["runtime"] == "binary"
    assert options["kubeVersion"] == KUBERNETES_VERSION


def test_config_binds_the_control_plane_to_loopback(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=1)

    assert _options(config)["bindAddress"] == "127.0.0.1"
    assert {"key": "node-ip", "value": "127.0.0.1", "override": True} in _patch_args(
        config, "kwok-controller"
    )


def test_default_timings_keep_the_kubernetes_defaults(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=1)

    assert not set(TIMING_OPTIONS) & set(_options(config))
    apiserver = {arg["key"] for arg in _patch_args(config, "kube-apiserver")}
    assert apiserver == {"service-cluster-ip-range"}


def test_fast_timings_are_set_in_the_units_kwokctl_expects(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings.fast(), fake_source, slot=1)

    options = _options(config)
    assert options["nodeLeaseDurationSeconds"] == 4
    assert options["kubeControllerManagerNodeMonitorPeriodMilliseconds"] == 1000
    assert options["kubeControllerManagerNodeMonitorGracePeriodMilliseconds"] == 8000
    apiserver = _patch_args(config, "kube-apiserver")
    assert {"key": "default-not-ready-toleration-seconds", "value": "10"} in apiserver
    assert {"key": "default-unreachable-toleration-seconds", "value": "10"} in apiserver


def test_toleration_args_only_when_tolerations_are_set(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(toleration_seconds=42), fake_source, slot=1)

    tolerations = [a for a in _patch_args(config, "kube-apiserver") if "toleration" in a["key"]]
    assert tolerations == [
        {"key": "default-not-ready-toleration-seconds", "value": "42"},
        {"key": "default-unreachable-toleration-seconds", "value": "42"},
    ]
    assert not set(TIMING_OPTIONS) & set(_options(config))


def test_each_timing_is_independent(cache: Path, fake_source: Path) -> None:
    options = _options(kwokctl_config(Timings(node_monitor_grace_seconds=20), fake_source, slot=1))

    assert options["kubeControllerManagerNodeMonitorGracePeriodMilliseconds"] == 20000
    assert "kubeControllerManagerNodeMonitorPeriodMilliseconds" not in options
    assert "nodeLeaseDurationSeconds" not in options


def test_kwok_controller_manages_only_labelled_nodes(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=1)

    args = _patch_args(config, "kwok-controller")
    assert {"key": "manage-all-nodes", "value": "false", "override": True} in args
    assert {"key": "manage-nodes-with-label-selector", "value": f"{MANAGED_LABEL}=true"} in args
    assert config[1]["options"]["manageAllNodes"] is False
    assert config[1]["options"]["manageNodesWithLabelSelector"] == f"{MANAGED_LABEL}=true"


def test_controllers_run_without_leader_election(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=1)

    for component in ("kube-controller-manager", "kube-scheduler"):
        assert {"key": "leader-elect", "value": "false"} in _patch_args(config, component)


def test_an_audit_policy_turns_on_the_api_servers_audit_log(cache: Path, fake_source: Path) -> None:
    policy = cache / "audit-policy.yaml"

    assert "kubeAuditPolicy" not in _options(kwokctl_config(Timings(), fake_source, slot=1))
    assert _options(kwokctl_config(Timings(), fake_source, slot=1, audit_policy=policy))[
        "kubeAuditPolicy"
    ] == str(policy)


def test_the_audit_policy_records_service_accounts_only_without_bodies() -> None:
    rules = AUDIT_POLICY["rules"]

    assert rules[0] == {"level": "Metadata", "userGroups": ["system:serviceaccounts"]}
    assert rules[-1] == {"level": "None"}
    assert "ResponseStarted" not in AUDIT_POLICY["omitStages"]  # open watches are recorded


def test_kwok_own_cidr_is_in_the_clusters_slot(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings(), fake_source, slot=9)

    assert config[1]["options"]["cidr"] == "127.9.255.0/24"


def test_config_survives_a_yaml_round_trip(cache: Path, fake_source: Path) -> None:
    config = kwokctl_config(Timings.fast(), fake_source, slot=3)

    assert list(yaml.safe_load_all(yaml.safe_dump_all(config))) == config


def test_config_does_not_share_state_between_calls(cache: Path, fake_source: Path) -> None:
    first = kwokctl_config(Timings(), fake_source, slot=1)
    snapshot = copy.deepcopy(first)

    kwokctl_config(Timings.fast(), fake_source, slot=2)

    assert first == snapshot


# ---- nodes --------------------------------------------------------------------------------


def test_worker_node_has_its_own_pod_range_address_and_zone() -> None:
    node = node_manifest("worker-3", slot=5, index=3, control_plane=False)
    assert node["spec"]["providerID"] == "kwok://worker-3"  # the kwok cloud provider answers for it

    assert node["kind"] == "Node"
    assert node["metadata"]["name"] == "worker-3"
    assert node["spec"]["podCIDR"] == "127.5.3.0/24"
    assert node["spec"]["podCIDRs"] == ["127.5.3.0/24"]
    assert node["spec"]["taints"] == []
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.5.0.3"}]
    labels = node["metadata"]["labels"]
    assert labels[MANAGED_LABEL] == "true"
    assert labels["kubernetes.io/hostname"] == "worker-3"
    assert labels["topology.kubernetes.io/zone"] == "worker-3"
    assert "node-role.kubernetes.io/worker" in labels
    assert "node-role.kubernetes.io/control-plane" not in labels


def test_control_plane_node_is_tainted_and_labelled() -> None:
    node = node_manifest("control-plane", slot=1, index=1, control_plane=True)

    assert node["spec"]["taints"] == [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == ""
    assert "node-role.kubernetes.io/worker" not in node["metadata"]["labels"]


def test_node_capacity_and_allocatable_agree() -> None:
    status = node_manifest("n", slot=1, index=1, control_plane=False)["status"]

    assert status["capacity"] == status["allocatable"]
    assert int(status["capacity"]["pods"]) > 0


@pytest.mark.parametrize(("slot", "index"), [(0, 1), (255, 1), (1, 0), (1, 255), (-1, 1), (300, 300)])
def test_node_manifest_rejects_slots_and_indexes_out_of_range(slot: int, index: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        node_manifest("n", slot=slot, index=index, control_plane=False)


_pairs = st.tuples(st.integers(1, 254), st.integers(1, 254))


@given(st.lists(_pairs, min_size=2, max_size=20, unique=True))
def test_distinct_nodes_never_share_addresses(pairs: list[tuple[int, int]]) -> None:
    nodes = [
        node_manifest(f"n{i}", slot, index, control_plane=False) for i, (slot, index) in enumerate(pairs)
    ]
    ranges = [ipaddress.ip_network(n["spec"]["podCIDR"]) for n in nodes]
    node_ips = [ipaddress.ip_address(n["status"]["addresses"][0]["address"]) for n in nodes]
    kwok_ranges = {ipaddress.ip_network(f"127.{slot}.255.0/24") for slot, _ in pairs}
    loopback = ipaddress.ip_network("127.0.0.0/8")

    assert len(set(node_ips)) == len(node_ips)
    for i, first in enumerate(ranges):
        assert first.subnet_of(loopback)
        assert not any(first.overlaps(other) for other in ranges[i + 1 :])
        assert not any(first.overlaps(kwok) for kwok in kwok_ranges)
        assert not any(ip in first for ip in node_ips)
    assert ipaddress.ip_address("127.0.0.1") not in {*node_ips}
    assert not any(ipaddress.ip_address("127.0.0.1") in r for r in ranges)
