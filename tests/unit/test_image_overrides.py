"""Pod image overrides: entry parsing, image references, the patch, the webhooks' answers."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, cast

import pytest

from kustos.maintenance import image_overrides
from kustos.maintenance.image_overrides import mutation, parse, reference_problem
from kustos.maintenance.image_overrides_webhook import (
    APPLIED_ANNOTATION,
    MUTATE_NAME,
    VALIDATE_NAME,
    configuration_name,
    policy_denials,
    webhooks,
)
from kustos.runtime.webhook import handle_review, webhook_configurations


@pytest.mark.parametrize(
    "image",
    [
        "nginx",
        "nginx:1.25",
        "library/nginx:latest",
        "docker.io/library/nginx:1.25-alpine",
        "projectcontour/contour:v1.18.0",
        "myregistry.io/contour:v1.18.0-fips",
        "localhost:5000/a/b/c:tag",
        "registry.k8s.io/etcd:3.5.16-0",
        "quay.io/x/y@sha256:" + "a" * 64,
        "quay.io/x/y:v1@sha256:" + "0" * 64,
        "[::1]:5000/img:1",
        "my_repo/some__name/a-b--c:1",
    ],
)
def test_valid_references(image: str) -> None:
    assert reference_problem(image) is None


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("Nginx:1", "lowercase"),
        ("nginx:", "not a valid"),
        ("nginx:-bad", "not a valid"),
        ("-nginx", "not a valid"),
        ("nginx@sha256:abc", "not a valid"),
        ("a//b", "not a valid"),
        ("a/b:" + "t" * 129, "not a valid"),
        ("x/" + "a" * 260, "longer than 255"),
    ],
)
def test_invalid_references(image: str, why: str) -> None:
    problem = reference_problem(image)
    assert problem is not None and why in problem


def test_parse_keeps_good_entries_and_names_bad_ones() -> None:
    result = parse(
        [
            "projectcontour/contour:v1.18.0=myregistry.io/contour:v1.18.0-fips",
            "Bad:1=good:1",
            "nginx:1=nginx:2",
            "nginx:1=nginx:3",
        ]
    )
    assert result.images == {
        "projectcontour/contour:v1.18.0": "myregistry.io/contour:v1.18.0-fips",
        "nginx:1": "nginx:2",
    }
    assert len(result.problems) == 2
    assert result.problems[0].startswith("spec.podImageOverrides[1]: 'Bad:1'")
    assert result.problems[1].startswith("spec.podImageOverrides[3]: 'nginx:1' is already overridden by")
    assert "spec.podImageOverrides[2]" in result.problems[1]


@pytest.mark.parametrize("entry", ["noequals", "=b", "a=", "a=b=c"])
def test_malformed_entries(entry: str) -> None:
    result = parse([entry])
    assert not result.images
    assert result.problems[0].startswith("spec.podImageOverrides[0]:")


def test_chains_are_refused() -> None:
    result = parse(["a:1=b:1", "b:1=c:1"])
    assert result.images == {"a:1": "b:1"}
    assert "spec.podImageOverrides[1]" in result.problems[0] and "chains" in result.problems[0]


def test_a_rewrite_to_itself_is_harmless() -> None:
    assert parse(["a:1=a:1"]) == image_overrides.Overrides({}, ())


def pod(
    *images: str, init: tuple[str, ...] = (), annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "metadata": meta,
        "spec": {
            "initContainers": [{"name": f"init{i}", "image": im} for i, im in enumerate(init)],
            "containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)],
        },
    }


def test_mutation_rewrites_exact_matches_only() -> None:
    images = {"nginx:1": "mirror/nginx:1", "busybox": "mirror/busybox:1.36"}
    patch = mutation(pod("nginx:1", "docker.io/library/nginx:1", "busybox", init=("busybox",)), images)
    assert patch == [
        {"op": "replace", "path": "/spec/initContainers/0/image", "value": "mirror/busybox:1.36"},
        {"op": "replace", "path": "/spec/containers/0/image", "value": "mirror/nginx:1"},
        {"op": "replace", "path": "/spec/containers/2/image", "value": "mirror/busybox:1.36"},
    ]


def test_mutation_on_update_leaves_images_the_pod_already_had() -> None:
    images = {"nginx:1": "mirror/nginx:1"}
    old = pod("nginx:1", "other:1")
    assert mutation(pod("nginx:1", "other:1"), images, old) == []
    changed = pod("nginx:1", "nginx:1")
    assert mutation(changed, images, old) == [
        {"op": "replace", "path": "/spec/containers/1/image", "value": "mirror/nginx:1"}
    ]


def test_rewritten_lines() -> None:
    p = pod("nginx:1")
    assert image_overrides.rewritten(mutation(p, {"nginx:1": "m/nginx:1"}), p) == ["c0: nginx:1 -> m/nginx:1"]


# ---- the webhooks -----------------------------------------------------------------------------


class FakePolicies:
    """The one informer method the webhooks read."""

    def __init__(self, entries: list[str] | None) -> None:
        self.policy = (
            None
            if entries is None
            else {"metadata": {"name": "default"}, "spec": {"podImageOverrides": entries}}
        )

    def get(self, key: str) -> dict[str, Any] | None:
        return self.policy if key == "default" else None


def review(webhook_name: str, entries: list[str] | None, request: dict[str, Any]) -> dict[str, Any]:
    hooks = {w.name: w for w in webhooks(cast(Any, FakePolicies(entries)))}
    body = {"request": {"uid": "u1", **request}}
    return cast(dict[str, Any], asyncio.run(handle_review(hooks[webhook_name], body))["response"])


def decode(response: dict[str, Any]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], json.loads(base64.b64decode(response["patch"])))


def test_pod_webhook_rewrites_and_annotates() -> None:
    response = review(
        MUTATE_NAME, ["nginx:1=mirror/nginx:1"], {"operation": "CREATE", "object": pod("nginx:1")}
    )
    assert response["allowed"] and response["patchType"] == "JSONPatch"
    patch = decode(response)
    assert patch[0] == {"op": "replace", "path": "/spec/containers/0/image", "value": "mirror/nginx:1"}
    assert patch[1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {APPLIED_ANNOTATION: "c0: nginx:1 -> mirror/nginx:1"},
    }


def test_pod_webhook_adds_to_existing_annotations() -> None:
    response = review(
        MUTATE_NAME,
        ["nginx:1=mirror/nginx:1"],
        {"operation": "CREATE", "object": pod("nginx:1", annotations={"a": "b"})},
    )
    assert decode(response)[1]["path"] == "/metadata/annotations/kustos.dev~1image-overrides"


@pytest.mark.parametrize("entries", [None, [], ["other:1=x:1"]])
def test_pod_webhook_allows_untouched(entries: list[str] | None) -> None:
    response = review(MUTATE_NAME, entries, {"operation": "CREATE", "object": pod("nginx:1")})
    assert response["allowed"] and "patch" not in response


def test_policy_webhook_refuses_bad_entries_naming_them() -> None:
    policy = {"spec": {"podImageOverrides": ["ok:1=ok:2", "UPPER:1=x:1"], "envoyPodSelector": "app"}}
    response = review(VALIDATE_NAME, None, {"operation": "CREATE", "object": policy})
    assert not response["allowed"] and response["status"]["code"] == 422
    message = response["status"]["message"]
    assert "spec.podImageOverrides[1]: 'UPPER:1'" in message and "spec.envoyPodSelector" in message


def test_policy_webhook_ratchets_unchanged_fields() -> None:
    old = {"spec": {"podImageOverrides": ["UPPER:1=x:1"], "envoyPodSelector": "app"}}
    new = {
        "spec": {"podImageOverrides": ["UPPER:1=x:1"], "envoyPodSelector": "app"},
        "metadata": {"labels": {"a": "b"}},
    }
    assert policy_denials(new, old) == []
    assert policy_denials({"spec": {}}, None) == []


def test_the_pod_webhook_has_a_configuration_of_its_own() -> None:
    hooks = webhooks(cast(Any, FakePolicies(None)), "kustos")
    shared = webhook_configurations(
        "kustos", [w for w in hooks if w.configuration is None], "Q0E=", "https://x"
    )
    assert [obj["kind"] for _, obj in shared] == ["ValidatingWebhookConfiguration"]
    mutating = next(w for w in hooks if w.name == MUTATE_NAME)
    assert mutating.configuration == configuration_name("kustos") == "kustos-image-overrides"
    assert mutating.failure_policy == "Ignore"
    entry = mutating.configuration_entry({"url": "https://x"})
    assert entry["rules"][0]["resources"] == ["pods"] and entry["rules"][0]["operations"] == [
        "CREATE",
        "UPDATE",
    ]


# ---- the manager keeps the pod webhook out of its shared configuration ------------------------


async def test_manager_applies_shared_configurations_without_the_own_one() -> None:
    import httpx2

    from kustos.runtime.kube import KubeClients
    from kustos.runtime.kubeconfig import KubeAccess
    from kustos.runtime.manager import Manager, ManagerOptions

    applied: list[dict[str, Any]] = []

    async def server(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        applied.append(body)
        return httpx2.Response(200, json=body)

    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    clients = KubeClients(config=KubeAccess(server="https://k8s"), raw=raw)
    options = ManagerOptions(
        leader_election=False, webhook_url="https://10.0.0.1:9443", namespaces=("team-a",)
    )
    manager = Manager(clients, options)
    for webhook in webhooks(cast(Any, FakePolicies(None)), "kustos"):
        manager.add_webhook(webhook)
    assert manager.own_webhook_configurations("kustos-image-overrides") == [], "no server yet"

    class Server:
        certificate = type("C", (), {"ca_bundle": "Q0E="})()

    manager.webhook_server = cast(Any, Server())
    await manager._apply_webhook_configurations()
    assert [a["kind"] for a in applied] == ["ValidatingWebhookConfiguration"]
    assert [w["name"] for w in applied[0]["webhooks"]] == [VALIDATE_NAME]

    [(ref, own)] = manager.own_webhook_configurations("kustos-image-overrides")
    assert ref.kind == "MutatingWebhookConfiguration" and own["metadata"]["name"] == "kustos-image-overrides"
    [entry] = own["webhooks"]
    assert entry["name"] == MUTATE_NAME and entry["clientConfig"]["caBundle"] == "Q0E="
    assert entry["clientConfig"]["url"] == "https://10.0.0.1:9443/mutate-v1-pod-image-overrides"
    assert entry["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]
    }
    await raw.aclose()


def test_the_configuration_exists_exactly_while_there_is_a_usable_override() -> None:
    from kustos.maintenance.image_overrides import (
        ApplyConfiguration,
        ConfigurationView,
        RemoveConfiguration,
        Unavailable,
        configuration_notes,
        configuration_requeue,
        plan_configuration,
    )
    from kustos.runtime.steps import Done, Wait

    usable = parse(["nginx=mirror/nginx"])
    applied = plan_configuration(ConfigurationView(usable, serving=True, server_ready=True))
    assert applied == ApplyConfiguration(1)
    assert configuration_requeue(applied) == 300.0  # applied again: a renewed CA, a hand deletion
    starting = plan_configuration(ConfigurationView(usable, serving=True, server_ready=False))
    assert isinstance(starting, Wait) and configuration_requeue(starting) == 1.0
    for empty in (parse([]), parse(["bad image=x"])):
        assert (
            plan_configuration(ConfigurationView(empty, serving=True, server_ready=True))
            == RemoveConfiguration()
        )
    # No webhook the API server can reach: none made, none to remove, and the user is told.
    off = ConfigurationView(usable, serving=False, server_ready=False)
    assert plan_configuration(off) == Unavailable()
    assert [n.reason for n in configuration_notes(off, Unavailable())] == ["ImageOverridesUnavailable"]
    assert plan_configuration(ConfigurationView(parse([]), serving=False, server_ready=False)) == Done()
    # A skipped entry is said, naming it, whatever else the pass does.
    mixed = ConfigurationView(parse(["nginx=mirror/nginx", "a=b=c"]), serving=True, server_ready=True)
    notes = configuration_notes(mixed, plan_configuration(mixed))
    assert [(n.reason, n.type) for n in notes] == [("InvalidImageOverrides", "Warning")]
    assert "spec.podImageOverrides[1]" in notes[0].message
