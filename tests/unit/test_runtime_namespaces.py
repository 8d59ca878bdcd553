"""Namespaced mode with a list of namespaces: one list/watch per namespace read as one cache,
and webhooks that admit only those namespaces."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from kustos.runtime.informer import Informer, InformerOptions, NamespacesInformer, ResourceRef
from kustos.runtime.kube import KubeClients
from kustos.runtime.kubeconfig import KubeAccess
from kustos.runtime.manager import Manager, ManagerOptions, namespace_selector
from kustos.runtime.metrics import Metrics

THINGS = ResourceRef("kustos.dev", "v1alpha1", "things", "Thing")
NODES = ResourceRef("", "v1", "nodes", "Node", namespaced=False)


def thing(namespace: str, name: str, node: str = "", version: str = "1") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "resourceVersion": version, "labels": {"app": name}}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


class FakeApiServer:
    """Lists per namespace (a list across namespaces is refused, as a Role-only operator's is);
    each namespace's watch sends what its queue holds."""

    def __init__(self, items: dict[str, list[dict[str, Any]]]) -> None:
        self.items = items
        self.paths: list[str] = []
        self.watches: dict[str, asyncio.Queue[dict[str, Any]]] = {ns: asyncio.Queue() for ns in items}
        self.failing: set[str] = set()

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        self.paths.append(path)
        parts = path.split("/")
        if "namespaces" not in parts:
            return httpx2.Response(403, json={"reason": "Forbidden", "message": "cluster-wide list"})
        namespace = parts[parts.index("namespaces") + 1]
        if namespace in self.failing:
            return httpx2.Response(500, json={"message": "boom"})
        if request.url.params.get("watch"):
            return httpx2.Response(200, content=self._events(namespace))
        return httpx2.Response(
            200, json={"items": self.items[namespace], "metadata": {"resourceVersion": "1"}}
        )

    async def _events(self, namespace: str) -> AsyncIterator[bytes]:
        while True:
            event = await self.watches[namespace].get()
            yield (json.dumps(event) + "\n").encode()


def manager_for(server: FakeApiServer, namespaces: tuple[str, ...]) -> Manager:
    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    clients = KubeClients(config=KubeAccess(server="https://k8s"), raw=raw)
    options = ManagerOptions(leader_election=False, metrics_address="127.0.0.1:0", namespaces=namespaces)
    return Manager(clients, options, Metrics())


async def eventually(check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached")


def test_one_namespace_keeps_the_single_informer() -> None:
    manager = manager_for(FakeApiServer({"a": []}), ("a",))
    informer = manager.informer(THINGS)
    assert type(informer) is Informer and informer.options.namespace == "a"


def test_no_namespace_watches_every_namespace_and_cluster_scoped_stays_single() -> None:
    manager = manager_for(FakeApiServer({}), ())
    assert type(manager.informer(THINGS)) is Informer and manager.informer(THINGS).options.namespace is None
    several = manager_for(FakeApiServer({"a": [], "b": []}), ("a", "b"))
    assert type(several.informer(NODES)) is Informer
    # An explicit namespace (e.g. "" for every namespace) is the caller's choice, kept as is.
    assert type(several.informer(THINGS, InformerOptions(namespace=""))) is Informer


def test_several_namespaces_share_one_facade_per_resource_and_selector() -> None:
    manager = manager_for(FakeApiServer({"a": [], "b": []}), ("a", "b"))
    informer = manager.informer(THINGS)
    assert isinstance(informer, NamespacesInformer)
    assert informer.namespaces == ("a", "b")
    assert [p.options.namespace for p in informer.parts.values()] == ["a", "b"]
    assert manager.informer(THINGS) is informer
    labelled = manager.informer(THINGS, InformerOptions(label_selector="app=x"))
    assert labelled is not informer and isinstance(labelled, NamespacesInformer)
    assert all(p.options.label_selector == "app=x" for p in labelled.parts.values())


def test_a_facade_needs_two_distinct_namespaces() -> None:
    raw = httpx2.AsyncClient(base_url="https://k8s")
    with pytest.raises(ValueError, match="two or more"):
        NamespacesInformer(raw, THINGS, ["a", "a"])
    with pytest.raises(ValueError, match="two or more"):
        NamespacesInformer(raw, THINGS, ["a", ""])


async def test_the_facade_lists_each_namespace_and_reads_as_one_cache() -> None:
    server = FakeApiServer({
        "a": [thing("a", "x", node="n1"), thing("a", "y")],
        "b": [thing("b", "x", node="n1")],
    })  # fmt: skip
    manager = manager_for(server, ("a", "b"))
    informer = manager.informer(THINGS)
    by_node = informer.index_by_node_name()
    by_app = informer.index_by_label("app")
    seen: list[tuple[str, str]] = []

    def record(kind: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        seen.append((kind, f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"))

    informer.add_handler(record)
    assert not informer.has_synced
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.wait_synced(), 5)
        assert informer.has_synced
        assert sorted(informer.keys()) == ["a/x", "a/y", "b/x"]  # the same name in two namespaces
        assert len(informer) == 3 and len(list(informer.list())) == 3
        found = informer.get("b/x")
        assert found is not None and found["metadata"]["namespace"] == "b" and found["kind"] == "Thing"
        assert informer.get("c/x") is None and informer.get("x") is None
        assert sorted(o["metadata"]["namespace"] for o in informer.by_index(by_node, "n1")) == ["a", "b"]
        assert informer.index_values(by_node) == ["n1"]
        assert sorted(informer.index_values(by_app)) == ["x", "y"]
        assert sorted(seen) == [("ADDED", "a/x"), ("ADDED", "a/y"), ("ADDED", "b/x")]
        assert not any(p.endswith("/things") and "/namespaces/" not in p for p in server.paths)
        # A watch event in one namespace reaches the shared handlers and indexes.
        server.watches["b"].put_nowait({"type": "ADDED", "object": thing("b", "z", node="n2", version="2")})
        await eventually(lambda: informer.get("b/z") is not None)
        assert ("ADDED", "b/z") in seen and informer.index_values(by_node) == ["n1", "n2"]
        # The gauge counts the whole cache, not the namespace that changed last.
        gauge = {"resource": str(THINGS)}
        assert manager.metrics.registry.get_sample_value("kustos_informer_cached_objects", gauge) == 4.0
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # Every namespace's list/watch ended with the facade: none runs on behind it.
    assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


async def test_one_failing_namespace_is_reported_and_keeps_the_facade_unsynced() -> None:
    server = FakeApiServer({"a": [thing("a", "x")], "b": []})
    server.failing.add("b")
    informer = manager_for(server, ("a", "b")).informer(THINGS)
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: informer.last_error is not None)
        assert not informer.has_synced and not informer.absent
        assert informer.last_error is not None and informer.last_error.startswith("b: ")
        server.failing.clear()
        await asyncio.wait_for(informer.wait_synced(), 10)
        assert informer.last_error is None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_webhook_selector_names_every_watched_namespace() -> None:
    assert namespace_selector(()) is None
    assert namespace_selector(("a", "b", "a")) == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]
    }


def test_kustos_run_namespace_is_repeatable_and_one_stays_one() -> None:
    from unittest import mock

    from typer.testing import CliRunner

    from kustos import cli
    from kustos.runtime import manager as manager_module

    seen: list[tuple[str, ...]] = []

    def captured(**options: Any) -> None:
        seen.append(options["namespaces"])
        raise SystemExit(0)  # stop before connecting to anything

    for args in (["--namespace", "a", "--namespace", "b", "--namespace", "a"], ["--namespace", "a"], []):
        with mock.patch.object(manager_module, "ManagerOptions", captured):
            result = CliRunner().invoke(cli.app, ["run", *args])
        assert result.exit_code == 0, result.output
    assert seen == [("a", "b"), ("a",), ()]
