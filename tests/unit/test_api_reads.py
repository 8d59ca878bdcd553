"""Which ``kubectl get`` calls the tests' in-process reads serve, and that they print what
kubectl would (tests/integration/api_reads.py; compared with kubectl itself on the real API
server in tests/integration/test_control_plane.py)."""

from __future__ import annotations

from tests.integration.api_reads import Read, Resource, as_kubectl_list, parse, resource_names


def test_a_namespaced_json_get_with_its_selectors_is_a_read() -> None:
    args = ["-n", "ns1", "get", "pods", "-l", "app=x", "--field-selector=status.phase=Running", "-o", "json"]
    assert parse(args) == Read(
        "pods", namespace="ns1", label_selector="app=x", field_selector="status.phase=Running"
    )
    assert parse(["get", "Node", "n1", "-ojson"]) == Read("node", name="n1")
    assert parse(["get", "nodes", "-A", "--output=json"]) == Read("nodes", all_namespaces=True)
    assert parse(["get", "pod", "p", "--ignore-not-found", "-o", "json"]) == Read(
        "pod", name="p", ignore_not_found=True
    )


def test_anything_but_a_plain_json_get_goes_to_kubectl() -> None:
    for args in (
        ["get", "node", "n1", "-o", "jsonpath={.spec}"],  # another output
        ["get", "pods"],  # a table
        ["get", "pods,pvc", "-o", "json"],  # two resources
        ["get", "pod/p", "-o", "json"],  # kind/name
        ["get", "events", "--sort-by=.lastTimestamp", "-o", "json"],  # a flag it does not know
        ["get", "--raw", "/api/v1/namespaces"],
        ["apply", "-f", "-", "-o", "json"],
        ["get", "pods", "-o"],  # a flag without its value
        ["get", "events", "--field-selector", "reason=X", "-o", "json"],  # kubectl's timing kept
    ):
        assert parse(args) is None, args


def test_every_name_kubectl_accepts_resolves_with_and_without_its_group() -> None:
    entry = {"name": "etcdclusters", "singularName": "etcdcluster", "kind": "EtcdCluster",
             "shortNames": ["ec"], "namespaced": True}  # fmt: skip
    names = resource_names(entry, "kustos.dev")
    assert {"etcdclusters", "etcdcluster", "ec", "etcdclusters.kustos.dev", "ec.kustos.dev"} <= set(names)
    core = {"name": "persistentvolumeclaims", "singularName": "", "kind": "PersistentVolumeClaim",
            "shortNames": ["pvc"], "namespaced": True}  # fmt: skip
    assert set(resource_names(core, "")) == {"persistentvolumeclaims", "persistentvolumeclaim", "pvc"}


def test_a_list_reads_as_kubectl_prints_it_each_item_typed_without_managed_fields() -> None:
    pods = Resource("/api/v1", "pods", True, "Pod")
    listing = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
               "items": [{"metadata": {"name": "a", "managedFields": [{"manager": "kubectl"}]}}]}  # fmt: skip
    assert as_kubectl_list(listing, pods) == {
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}],
    }  # fmt: skip
    assert Resource("/apis/kustos.dev/v1alpha1", "etcdclusters", True, "EtcdCluster").api_version == (
        "kustos.dev/v1alpha1"
    )
