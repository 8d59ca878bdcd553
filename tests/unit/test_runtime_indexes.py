"""Informer indexes stay true through lists, watch events and deletions."""

from __future__ import annotations

import json
from typing import Any

from kustos.runtime.informer import Informer, ResourceRef

PODS = ResourceRef("", "v1", "pods", "Pod")


def _pod(name: str, node: str | None, cluster: str | None = None, version: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": version}
    if cluster:
        meta["labels"] = {"kustos.dev/cluster": cluster}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


async def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    await informer._handle_line(json.dumps({"type": kind, "object": obj}))


def _names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


async def test_index_follows_watch_events() -> None:
    informer = Informer(None, PODS)  # type: ignore[arg-type]
    by_node = informer.index_by_node_name()
    by_cluster = informer.index_by_label("kustos.dev/cluster")
    await _event(informer, "ADDED", _pod("a", "n1", "c1"))
    await _event(informer, "ADDED", _pod("b", "n1", "c2"))
    await _event(informer, "ADDED", _pod("c", None, "c1"))
    assert _names(informer.by_index(by_node, "n1")) == ["a", "b"]
    assert _names(informer.by_index(by_cluster, "c1")) == ["a", "c"]
    await _event(informer, "MODIFIED", _pod("c", "n2", "c1", "2"))  # scheduled
    await _event(informer, "MODIFIED", _pod("a", "n1", "c2", "2"))  # relabelled
    assert _names(informer.by_index(by_node, "n2")) == ["c"]
    assert _names(informer.by_index(by_cluster, "c1")) == ["c"]
    assert _names(informer.by_index(by_cluster, "c2")) == ["a", "b"]
    await _event(informer, "DELETED", _pod("b", "n1", "c2", "3"))
    assert _names(informer.by_index(by_node, "n1")) == ["a"]
    assert informer.by_index(by_node, "nowhere") == []
    assert sorted(informer.index_values(by_node)) == ["n1", "n2"]


async def test_index_added_late_covers_what_is_cached_and_twice_is_once() -> None:
    informer = Informer(None, PODS)  # type: ignore[arg-type]
    await _event(informer, "ADDED", _pod("a", "n1"))
    name = informer.index_by_node_name()
    assert informer.index_by_node_name() == name
    assert _names(informer.by_index(name, "n1")) == ["a"]
