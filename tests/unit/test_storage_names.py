"""StorageCluster defaults (seed 001's table) and the names other controllers rely on."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kustos.api.storage import StorageCluster
from kustos.storage import names


def cluster(**spec: object) -> StorageCluster:
    return StorageCluster.model_validate(
        {"metadata": {"name": "stor", "namespace": "default", "uid": "u1"}, "spec": spec}
    )


def test_defaults_follow_the_reference_table() -> None:
    spec = cluster().spec
    assert spec.namespace == "storageos"
    assert spec.images.node_container == "storageos/node:v2.1.0"
    assert spec.images.init_container == "storageos/init:1.0.0"
    assert spec.images.csi_external_resizer_container == ""  # filled per Kubernetes version
    assert not spec.csi.enable and spec.csi.deployment_strategy == "statefulset"
    assert not any(
        [
            spec.csi.enable_provision_creds,
            spec.csi.enable_controller_publish_creds,
            spec.csi.enable_node_publish_creds,
            spec.csi.enable_controller_expand_creds,
        ]
    )
    assert (spec.service.name, spec.service.type) == ("storageos", "ClusterIP")
    assert (spec.service.external_port, spec.service.internal_port) == (5705, 5705)
    assert (spec.ingress.enable, spec.ingress.hostname, spec.ingress.tls) == (False, "storageos.local", False)
    assert spec.shared_dir == "/var/lib/kubelet/plugins/kubernetes.io~storageos"
    assert spec.kv_backend.backend == "embedded" and spec.kv_backend.address == ""
    assert not any(
        [
            spec.pause,
            spec.debug,
            spec.disable_fencing,
            spec.disable_telemetry,
            spec.disable_tcmu,
            spec.force_tcmu,
            spec.disable_scheduler,
        ]
    )
    assert spec.storage_class_name == "fast"
    assert spec.node_selector_terms == [] and spec.tolerations == [] and spec.resources is None


def test_camel_case_wire_names() -> None:
    c = cluster(kvBackend={"backend": "etcd", "etcdClusterRef": {"name": "kv"}}, k8sDistro="rancher")
    assert c.spec.kv_backend.etcd_cluster_ref is not None and c.spec.kv_backend.etcd_cluster_ref.name == "kv"
    assert c.spec.k8s_distro == "rancher"
    dumped = c.model_dump(exclude_unset=True)["spec"]
    assert dumped == {
        "kvBackend": {"backend": "etcd", "etcdClusterRef": {"name": "kv"}},
        "k8sDistro": "rancher",
    }


def test_unknown_deployment_strategy_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="deploymentStrategy"):
        cluster(csi={"deploymentStrategy": "daemonset"})


def test_names_are_deterministic() -> None:
    c = cluster(namespace="stor-system", storageClassName="gold")
    assert names.node_daemonset(c) == ("stor-system", "stor-node")
    assert names.storage_class(c) == "gold"
    assert names.provisioner(c) == names.CSI_DRIVER
    assert names.node_container_name == "node"
    assert names.MAINTENANCE_ANNOTATION == "kustos.dev/maintenance"


def test_tcmu_switches_use_the_reference_spelling() -> None:
    c = cluster(disableTCMU=True, forceTCMU=True)
    assert c.spec.disable_tcmu and c.spec.force_tcmu
    assert {"disableTCMU", "forceTCMU"} <= set(c.model_dump()["spec"])
