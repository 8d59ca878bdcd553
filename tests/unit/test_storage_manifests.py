"""What a StorageCluster generates (pure): golden files per combination, and each switch's effect.

The golden files under tests/unit/golden/storagecluster-*.yaml are the reviewed listing of
every object per parameter combination; regenerate with KUSTOS_UPDATE_GOLDEN=1 and review.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kustos.api.storage import StorageCluster
from kustos.storage import names
from kustos.storage.images import TABLE, csi_images, parse_kube_version
from kustos.storage.manifests import HASH_ANNOTATION, Inputs, desired, listing, refusals, shipped_roles

GOLDEN = Path(__file__).parent / "golden"
KUBE = (1, 36)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SECRET = {
    "username": b64("admin"),
    "password": b64("secret"),
    "tls.crt": b64("CERT"),
    "tls.key": b64("KEY"),
    **{
        f"csi{p}{k}": b64(f"{p}-{k}".lower())
        for p in ("Provision", "ControllerPublish", "NodePublish", "ControllerExpand")
        for k in ("Username", "Password")
    },
}


def cluster(**spec: Any) -> StorageCluster:
    return StorageCluster.model_validate(
        {"metadata": {"name": "stor", "namespace": "default", "uid": "u1"}, "spec": spec}
    )


def render(spec: dict[str, Any], secret: dict[str, str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return desired(Inputs(cluster(**spec), KUBE, secret_data=secret, **kw))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"{kind} {name}: {listing(objects)}"
    return matches[0]


def container(objects: list[dict[str, Any]], name: str = "node") -> dict[str, Any]:
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


COMBINATIONS: dict[str, tuple[dict[str, Any], dict[str, str] | None]] = {
    "defaults": ({}, None),
    "csi-statefulset": (
        {"secretRefName": "stor-api", "csi": {"enable": True, "enableProvisionCreds": True,
                                              "enableControllerPublishCreds": True,
                                              "enableNodePublishCreds": True,
                                              "enableControllerExpandCreds": True}},
        SECRET,
    ),
    "csi-deployment": ({"csi": {"enable": True, "deploymentStrategy": "deployment"}}, None),
    "ingress-tls": (
        {"secretRefName": "stor-api", "ingress": {"enable": True, "tls": True, "hostname": "stor.example",
                                                  "annotations": {"kubernetes.io/ingress.class": "nginx"}}},
        SECRET,
    ),
}  # fmt: skip


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_golden(combination: str) -> None:
    spec, secret = COMBINATIONS[combination]
    objects = render(spec, secret)
    text = "# " + "\n# ".join(listing(objects)) + "\n" + yaml.safe_dump_all(objects, sort_keys=True)
    path = GOLDEN / f"storagecluster-{combination}.yaml"
    if os.environ.get("KUSTOS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.is_file(), f"{path} is missing; run with KUSTOS_UPDATE_GOLDEN=1 and review it"
    assert path.read_text() == text, f"{path} differs; regenerate with KUSTOS_UPDATE_GOLDEN=1 and review"


def test_shipped_roles_are_bound_not_generated() -> None:
    roles = {"node": "kustos-storage-node", "csi-helper": "kustos-storage-csi-helper"}
    objects = render({"csi": {"enable": True}}, shipped_roles=roles)

    assert not [o for o in objects if o["kind"] == "ClusterRole"]
    for component, role in roles.items():
        binding = find(objects, "ClusterRoleBinding", f"kustos-storage-default.stor-{component}.shipped")
        assert binding["roleRef"]["name"] == role
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"stor-{component}", "namespace": "storageos"}
        ]


def test_shipped_roles_come_from_the_environment_the_chart_sets() -> None:
    environ = {"KUSTOS_STORAGE_NODE_ROLE": "r-node", "KUSTOS_STORAGE_CSI_HELPER_ROLE": "", "OTHER": "x"}

    assert shipped_roles(environ) == {"node": "r-node"}
    assert shipped_roles({}) == {}


def test_defaults_listing() -> None:
    assert listing(render({})) == [
        "Namespace storageos",
        "ServiceAccount storageos/stor-node",
        "ClusterRole kustos-storage-default.stor-node",
        "ClusterRoleBinding kustos-storage-default.stor-node",
        "ServiceAccount storageos/stor-scheduler",
        "ClusterRoleBinding kustos-storage-default.stor-scheduler-kube-scheduler",
        "ClusterRoleBinding kustos-storage-default.stor-scheduler-volume-scheduler",
        "StorageClass fast",
        "Service storageos/storageos",
        "DaemonSet storageos/stor-node",
        "ConfigMap storageos/stor-scheduler",
        "Deployment storageos/stor-scheduler",
    ]


def test_node_daemonset_is_privileged_with_bidirectional_mounts() -> None:
    objects = render({"sharedDir": "/var/lib/kubelet/plugins/x"})
    ds = find(objects, "DaemonSet")
    assert (ds["metadata"]["namespace"], ds["metadata"]["name"]) == names.node_daemonset(cluster())
    pod = ds["spec"]["template"]["spec"]
    node = container(objects)
    assert node["image"] == "storageos/node:v2.1.0"
    assert pod["initContainers"][0]["image"] == "storageos/init:1.0.0"
    assert node["securityContext"]["privileged"] and pod["initContainers"][0]["securityContext"]["privileged"]
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    assert mounts["/var/lib/kubelet/plugins/x"]["mountPropagation"] == "Bidirectional"
    assert mounts["/var/lib/storageos"]["mountPropagation"] == "Bidirectional"
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins/x", "/var/lib/storageos", "/sys", "/lib/modules"} <= host_paths
    assert "affinity" not in pod and "tolerations" not in pod and "resources" not in node


@pytest.mark.parametrize(
    ("spec", "variable", "value"),
    [
        ({}, "LOG_LEVEL", "info"),
        ({"debug": True}, "LOG_LEVEL", "debug"),
        ({"disableFencing": True}, "DISABLE_FENCING", "true"),
        ({"disableTelemetry": True}, "DISABLE_TELEMETRY", "true"),
        ({"disableTCMU": True}, "DISABLE_TCMU", "true"),
        ({"forceTCMU": True}, "FORCE_TCMU", "true"),
        ({"k8sDistro": "openshift"}, "K8S_DISTRO", "openshift"),
        ({"service": {"internalPort": 5800}}, "API_PORT", "5800"),
        ({"kvBackend": {"backend": "etcd", "address": "1.2.3.4:2379"}}, "KV_BACKEND", "etcd"),
    ],
)
def test_switches_reach_the_node_container(spec: dict[str, Any], variable: str, value: str) -> None:
    assert env(render(spec))[variable] == value


def test_placement_and_resources() -> None:
    terms = [{"matchExpressions": [{"key": "storage", "operator": "In", "values": ["yes"]}]}]
    tolerations = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    resources = {"requests": {"cpu": "100m", "memory": "512Mi"}}
    objects = render({"nodeSelectorTerms": terms, "tolerations": tolerations, "resources": resources})
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == terms
    assert pod["tolerations"] == tolerations
    assert container(objects)["resources"] == resources


def test_k8s_distro_annotates_the_node_pods() -> None:
    objects = render({"k8sDistro": "rancher"})
    template = find(objects, "DaemonSet")["spec"]["template"]
    assert template["metadata"]["annotations"]["kustos.dev/k8s-distro"] == "rancher"


def test_service_parameters() -> None:
    objects = render({"service": {"name": "api", "type": "NodePort", "externalPort": 80, "internalPort": 5705,
                                  "annotations": {"a": "b"}}})  # fmt: skip
    service = find(objects, "Service", "api")
    assert service["spec"]["type"] == "NodePort"
    assert service["spec"]["ports"] == [{"name": "api", "protocol": "TCP", "port": 80, "targetPort": 5705}]
    assert service["metadata"]["annotations"]["a"] == "b"
    pod_labels = find(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_ingress_with_tls_copies_the_certificate() -> None:
    objects = render(*COMBINATIONS["ingress-tls"])
    ingress = find(objects, "Ingress")
    assert ingress["spec"]["rules"][0]["host"] == "stor.example"
    assert ingress["metadata"]["annotations"]["kubernetes.io/ingress.class"] == "nginx"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "storageos", "port": {"number": 5705}}
    tls_secret = find(objects, "Secret", ingress["spec"]["tls"][0]["secretName"])
    assert tls_secret["type"] == "kubernetes.io/tls"
    assert tls_secret["data"] == {"tls.crt": b64("CERT"), "tls.key": b64("KEY")}


def test_no_ingress_unless_enabled() -> None:
    assert not [o for o in render({"ingress": {"tls": True}}) if o["kind"] == "Ingress"]


def test_csi_objects_and_credentials() -> None:
    objects = render(*COMBINATIONS["csi-statefulset"])
    driver = find(objects, "CSIDriver")
    assert driver["metadata"]["name"] == names.provisioner(cluster())
    helper = find(objects, "StatefulSet")
    helpers = {c["name"]: c["image"] for c in helper["spec"]["template"]["spec"]["containers"]}
    assert set(helpers) == {"csi-external-provisioner", "csi-external-attacher", "csi-external-resizer"}
    sidecars = {c["name"] for c in find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]}
    assert sidecars == {"node", "csi-driver-registrar", "csi-liveness-probe"}
    storage_class = find(objects, "StorageClass")
    params = storage_class["parameters"]
    for suffix, param in [
        ("csi-provision", "provisioner"),
        ("csi-controller-publish", "controller-publish"),
        ("csi-node-publish", "node-publish"),
        ("csi-controller-expand", "controller-expand"),
    ]:
        assert params[f"csi.storage.k8s.io/{param}-secret-name"] == f"stor-{suffix}"
        assert params[f"csi.storage.k8s.io/{param}-secret-namespace"] == "storageos"
        find(objects, "Secret", f"stor-{suffix}")
    provision = find(objects, "Secret", "stor-csi-provision")["data"]
    assert provision == {"username": b64("provision-username"), "password": b64("provision-password")}
    assert storage_class["allowVolumeExpansion"] is True
    assert env(objects)["CSI_ENDPOINT"].startswith("unix://")


def test_only_enabled_credentials_are_created() -> None:
    objects = render({"secretRefName": "s", "csi": {"enable": True, "enableNodePublishCreds": True}}, SECRET)
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    assert secrets == {"stor-credentials", "stor-csi-node-publish"}


def test_deployment_strategy() -> None:
    objects = render({"csi": {"enable": True, "deploymentStrategy": "deployment"}})
    helper = find(objects, "Deployment", "stor-csi-helper")
    assert helper["spec"]["replicas"] == 1
    assert not [o for o in objects if o["kind"] == "StatefulSet"]


def test_csi_off_creates_no_csi_objects() -> None:
    kinds = {o["kind"] for o in render({"csi": {"enableProvisionCreds": True}})}
    assert not kinds & {"CSIDriver", "StatefulSet"}


def test_scheduler_switch() -> None:
    on = listing(render({}))
    off = listing(render({"disableScheduler": True}))
    assert "Deployment storageos/stor-scheduler" in on
    assert not [line for line in off if "scheduler" in line]


def test_storage_class_name_and_namespace() -> None:
    objects = render({"storageClassName": "gold", "namespace": "default"})
    assert find(objects, "StorageClass")["metadata"]["name"] == "gold"
    assert not [o for o in objects if o["kind"] == "Namespace"]  # its own namespace is not created


def test_kv_backend_endpoints_and_tls() -> None:
    tls = {"ca.crt": b64("CA"), "tls.crt": b64("C"), "tls.key": b64("K"), "other": b64("x")}
    objects = desired(
        Inputs(
            cluster(
                kvBackend={"backend": "etcd", "etcdClusterRef": {"name": "kv"}}, tlsEtcdSecretRefName="t"
            ),
            KUBE,
            kv_endpoints=("http://127.0.0.5:2379", "http://127.0.0.6:2379"),
            etcd_tls_data=tls,
        )
    )
    variables = env(objects)
    assert variables["KV_ADDR"] == "http://127.0.0.5:2379,http://127.0.0.6:2379"
    assert variables["ETCD_TLS_CLIENT_CA"] == "/run/etcd-tls/ca.crt"
    assert set(find(objects, "Secret", "stor-etcd-tls")["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    assert "KV_ADDR" not in env(render({}))


def test_every_object_is_labelled_and_hashed() -> None:
    for combination, (spec, secret) in COMBINATIONS.items():
        for obj in render(spec, secret):
            meta = obj["metadata"]
            assert meta["labels"][names.CLUSTER_LABEL] == "default.stor", combination
            assert meta["annotations"][HASH_ANNOTATION]


def test_a_spec_change_changes_only_the_affected_hashes() -> None:
    before = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"][HASH_ANNOTATION] for o in render({})
    }
    after = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"][HASH_ANNOTATION]
        for o in render({"debug": True})
    }
    assert {k for k in before if before[k] != after[k]} == {("DaemonSet", "stor-node")}


# ---- refusals ------------------------------------------------------------------------


def test_tcmu_conflict_is_refused() -> None:
    reasons = refusals(Inputs(cluster(disableTCMU=True, forceTCMU=True), KUBE))
    assert reasons == ["disableTCMU and forceTCMU are both true: choose one"]


def test_missing_secret_is_refused() -> None:
    reasons = refusals(Inputs(cluster(secretRefName="nope"), KUBE, secret_data=None))
    assert reasons == ["secret default/nope (secretRefName) not found"]


def test_missing_secret_keys_are_named() -> None:
    spec = {"secretRefName": "s", "ingress": {"enable": True, "tls": True},
            "csi": {"enable": True, "enableProvisionCreds": True}}  # fmt: skip
    reasons = refusals(Inputs(cluster(**spec), KUBE, secret_data={"username": b64("u")}))
    assert len(reasons) == 1
    for key in ("tls.crt", "tls.key", "csiProvisionUsername", "csiProvisionPassword"):
        assert key in reasons[0]


def test_tls_needs_a_secret() -> None:
    assert refusals(Inputs(cluster(ingress={"enable": True, "tls": True}), KUBE))


def test_defaults_are_accepted() -> None:
    assert refusals(Inputs(cluster(), KUBE)) == []
    assert (
        refusals(Inputs(*(lambda s, d: (cluster(**s), KUBE, (), d))(*COMBINATIONS["csi-statefulset"]))) == []
    )


# ---- image table ---------------------------------------------------------------------


def test_image_defaults_follow_the_kubernetes_version() -> None:
    spec = {"csi": {"enable": True}}
    old = desired(Inputs(cluster(**spec), (1, 13)))
    helper = find(old, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert "csi-cluster-driver-registrar" in {c["name"] for c in helper}
    assert "csi-external-resizer" not in {c["name"] for c in helper}
    assert not [o for o in old if o["kind"] == "CSIDriver"]
    assert (
        find(desired(Inputs(cluster(**spec), (1, 15))), "CSIDriver")["apiVersion"] == "storage.k8s.io/v1beta1"
    )
    new = desired(Inputs(cluster(**spec), (1, 36)))
    assert container(new, "csi-driver-registrar")["image"] == csi_images((1, 36)).node_driver_registrar
    assert find(new, "CSIDriver")["apiVersion"] == "storage.k8s.io/v1"


def test_set_images_win_over_the_table() -> None:
    spec = {"csi": {"enable": True}, "images": {"csiNodeDriverRegistrarContainer": "mine:1"}}
    assert container(desired(Inputs(cluster(**spec), (1, 36))), "csi-driver-registrar")["image"] == "mine:1"


@given(st.integers(0, 60))
def test_every_minor_has_registrar_provisioner_and_attacher(minor: int) -> None:
    images = csi_images((1, minor))
    assert images.node_driver_registrar and images.external_provisioner and images.external_attacher
    assert bool(images.cluster_driver_registrar) == (minor < 14)
    assert bool(images.external_resizer) == (minor >= 16)


def test_table_is_ordered() -> None:
    assert [v for v, _ in TABLE] == sorted(v for v, _ in TABLE)


@pytest.mark.parametrize(
    ("info", "version"),
    [
        ({"major": "1", "minor": "36"}, (1, 36)),
        ({"major": "1", "minor": "29+"}, (1, 29)),
        ({"major": "", "minor": "", "gitVersion": "v1.31.2-eks-1"}, (1, 31)),
    ],
)
def test_parse_kube_version(info: dict[str, object], version: tuple[int, int]) -> None:
    assert parse_kube_version(info) == version


def test_an_existing_namespace_is_used_but_never_owned() -> None:
    objects = desired(Inputs(cluster(namespace="kube-system"), KUBE, foreign_namespace=True))
    assert not [o for o in objects if o["kind"] == "Namespace"]
    assert find(objects, "DaemonSet")["metadata"]["namespace"] == "kube-system"


def test_node_pod_labels_select_the_daemonset_pods() -> None:
    ds = find(render({}), "DaemonSet")
    assert ds["spec"]["selector"]["matchLabels"] == names.node_pod_labels(cluster())
    assert names.node_pod_labels(cluster()).items() <= ds["spec"]["template"]["metadata"]["labels"].items()
