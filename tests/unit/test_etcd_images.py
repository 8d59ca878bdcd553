"""Which etcd image kustos pulls for a repository and a version, and what it says when it cannot."""

from __future__ import annotations

from kustos.api.etcd import EtcdClusterSpec
from kustos.devcluster.nodeimages import etcd_image as preloaded_image
from kustos.etcd.stuck import classify
from kustos.images import DEFAULT_ETCD_REPOSITORY, PROVEN_ETCD_VERSIONS, etcd_image, pull_advice
from tests.unit.test_etcd_stuck import NOW, pod, waiting


def test_the_default_is_the_etcd_projects_registry_at_the_newest_proven_version() -> None:
    spec = EtcdClusterSpec()
    assert spec.repository == "gcr.io/etcd-development/etcd" == DEFAULT_ETCD_REPOSITORY
    assert spec.version == PROVEN_ETCD_VERSIONS[-1] == "3.7.3"
    assert etcd_image(spec.repository, spec.version) == "gcr.io/etcd-development/etcd:v3.7.3"


def test_each_known_repository_is_tagged_its_own_way() -> None:
    assert etcd_image("quay.io/coreos/etcd", "3.7.3") == "quay.io/coreos/etcd:v3.7.3"
    assert etcd_image("registry.k8s.io/etcd", "3.6.8") == "registry.k8s.io/etcd:3.6.8-0"
    assert etcd_image("k8s.gcr.io/etcd", "3.5.9") == "k8s.gcr.io/etcd:3.5.9-0"
    # A mirror kustos does not know: the etcd project's own scheme.
    assert etcd_image("mirror.example:5000/etcd", "3.7.3") == "mirror.example:5000/etcd:v3.7.3"


def test_real_nodes_preload_the_default_names() -> None:
    assert preloaded_image("v3.7.3") == "gcr.io/etcd-development/etcd:v3.7.3"


def test_a_member_whose_image_is_missing_points_at_the_repository_with_every_release() -> None:
    status = waiting("ImagePullBackOff", "manifest unknown")
    status["containerStatuses"][0]["image"] = "registry.k8s.io/etcd:3.7.3-0"
    found = classify(pod(status, node="w-1"), None, NOW)
    assert found is not None and found.reason == "ImagePullFailed"
    assert "registry.k8s.io/etcd carries the versions Kubernetes ships" in found.message
    assert f"set spec.repository to {DEFAULT_ETCD_REPOSITORY}" in found.message
    assert "spec.version" in pull_advice(DEFAULT_ETCD_REPOSITORY)
