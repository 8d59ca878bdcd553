"""The pure parts of the API plumbing: REST paths, object keys, resource references, transforms."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.runtime.informer import ResourceRef, drop_managed_fields
from kustos.runtime.kube import api_path, object_key

NAME = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@pytest.mark.parametrize(
    ("args", "path"),
    [
        (("", "v1", "pods"), "/api/v1/pods"),
        (("", "v1", "pods", "team-a"), "/api/v1/namespaces/team-a/pods"),
        (("", "v1", "pods", "team-a", "web-0"), "/api/v1/namespaces/team-a/pods/web-0"),
        (("", "v1", "nodes", None, "worker-1"), "/api/v1/nodes/worker-1"),
        (("apps", "v1", "statefulsets"), "/apis/apps/v1/statefulsets"),
        (("kustos.dev", "v1alpha1", "etcdclusters", "team-a", "main"),
         "/apis/kustos.dev/v1alpha1/namespaces/team-a/etcdclusters/main"),
        (("coordination.k8s.io", "v1", "leases", "kube-system"),
         "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"),
        (("", "v1", "namespaces", None, "team-a"), "/api/v1/namespaces/team-a"),
    ],
)  # fmt: skip
def test_api_path(args: tuple[Any, ...], path: str) -> None:
    assert api_path(*args) == path


@given(
    group=st.one_of(st.just(""), st.from_regex(r"[a-z]+(\.[a-z]+){0,2}", fullmatch=True)),
    namespace=st.one_of(st.none(), NAME),
    name=st.one_of(st.just(""), NAME),
)
def test_api_path_segments(group: str, namespace: str | None, name: str) -> None:
    path = api_path(group, "v1", "things", namespace, name)
    expected = ["api", "v1"] if not group else ["apis", group, "v1"]
    if namespace:
        expected += ["namespaces", namespace]
    expected.append("things")
    if name:
        expected.append(name)
    assert path == "/" + "/".join(expected)


def test_object_key() -> None:
    assert object_key({"metadata": {"namespace": "team-a", "name": "main"}}) == "team-a/main"
    assert object_key({"metadata": {"name": "worker-1"}}) == "worker-1"
    assert object_key({"metadata": {"namespace": None, "name": "worker-1"}}) == "worker-1"
    assert object_key({"metadata": {"namespace": "", "name": "worker-1"}}) == "worker-1"
    with pytest.raises(KeyError):
        object_key({"metadata": {"namespace": "team-a"}})


@given(namespace=st.one_of(st.none(), NAME), name=NAME)
def test_object_key_splits_back(namespace: str | None, name: str) -> None:
    meta = {"name": name} if namespace is None else {"namespace": namespace, "name": name}
    key = object_key({"metadata": meta})
    assert key.rpartition("/")[2] == name
    assert (key.partition("/")[0] if "/" in key else None) == namespace


def test_resource_ref_api_version_and_str() -> None:
    pods = ResourceRef("", "v1", "pods", "Pod")
    clusters = ResourceRef("kustos.dev", "v1alpha1", "etcdclusters", "EtcdCluster")
    nodes = ResourceRef("", "v1", "nodes", "Node", namespaced=False)
    assert (pods.api_version, str(pods)) == ("v1", "pods")
    assert (clusters.api_version, str(clusters)) == ("kustos.dev/v1alpha1", "etcdclusters.kustos.dev")
    assert pods.namespaced and not nodes.namespaced
    # Frozen and hashable: usable as a dict key for informers.
    assert {pods: 1}[ResourceRef("", "v1", "pods", "Pod")] == 1
    with pytest.raises(AttributeError):
        pods.plural = "other"  # type: ignore[misc]


def test_drop_managed_fields_removes_only_managed_fields() -> None:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "team-a",
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"containers": []},
    }
    expected = copy.deepcopy(obj)
    del expected["metadata"]["managedFields"]
    assert drop_managed_fields(obj) == expected


def test_drop_managed_fields_tolerates_objects_without_them() -> None:
    assert drop_managed_fields({}) == {}
    assert drop_managed_fields({"metadata": {"name": "x"}}) == {"metadata": {"name": "x"}}
