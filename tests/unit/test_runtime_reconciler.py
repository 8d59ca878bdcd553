"""The reconciler base's pure parts, and the API client's network failures as ReconcileErrors."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

import httpx2
import pytest
from pydantic import BaseModel, Field, ValidationError

from kustos.runtime.api import Api, ApiStatusError, ApiUnreachable
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError, TerminalError
from kustos.runtime.informer import Informer
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import invalid_spec, previous_with_failure
from kustos.runtime.resources import CONFIGMAPS
from tests.example.controller import FAIL_ANNOTATION, BaseExampleReconciler


class Spec(BaseModel):
    size: int = Field(ge=1)
    name: str


class Obj(BaseModel):
    spec: Spec


def test_an_invalid_spec_is_terminal_and_names_each_field() -> None:
    with pytest.raises(ValidationError) as caught:
        Obj.model_validate({"spec": {"size": 0}})
    failure = invalid_spec(caught.value)
    assert isinstance(failure, TerminalError)
    assert failure.reason == "InvalidSpec"
    assert "spec.size: " in failure.message and "spec.name: " in failure.message


async def test_an_unreachable_api_server_is_a_reconcile_error_naming_the_request() -> None:
    """No server listens on this port: the connection is refused for real."""
    async with httpx2.AsyncClient(base_url="http://127.0.0.1:9", timeout=2) as raw:
        api = Api(raw)
        with pytest.raises(ApiUnreachable) as caught:
            await api.get(CONFIGMAPS, "default", "x")
    assert isinstance(caught.value, ReconcileError)
    assert caught.value.reason == "ApiUnreachable"
    assert "GET /api/v1/namespaces/default/configmaps/x" in caught.value.message


def _status(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"phase": "Rolling", "heirs": ["a"], "conditions": conditions, "observedGeneration": 1}


def test_a_pass_that_saw_nothing_keeps_what_the_status_remembers() -> None:
    raw = {"metadata": {"name": "x", "generation": 2}, "status": _status([])}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    kept = previous_with_failure(
        raw, TerminalError("invalid spec: spec.x: bad", "InvalidSpec"), now, "Degraded"
    )
    assert kept["heirs"] == ["a"] and kept["phase"] == "Rolling"
    (condition,) = kept["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Degraded",
        "True",
        "InvalidSpec",
    )
    assert condition["message"] == "invalid spec: spec.x: bad"


class StatusServer:
    """The API server's answer to a status write: the object under a new resourceVersion, or
    409 when the write carries another than the stored one."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.stored = obj

    async def replace_status(
        self, ref: object, obj: dict[str, Any], status: dict[str, Any]
    ) -> dict[str, Any]:
        if obj["metadata"]["resourceVersion"] != self.stored["metadata"]["resourceVersion"]:
            raise ApiStatusError(409, "Conflict", "the object has been modified")
        version = str(int(self.stored["metadata"]["resourceVersion"]) + 1)
        self.stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}, "status": status}
        return self.stored


class NoEvents:
    async def record(self, *_: object) -> None:
        return None


async def test_a_pass_starts_from_its_own_status_write_while_the_cache_still_shows_the_one_before() -> None:
    """A failing step records a new attempt number each pass (as an EtcdCluster records a
    member index). The watch has not brought the first write back when the second pass starts:
    it counts on from the write, not from the cache's older copy (onto which its write would be
    refused, 409). Once another copy is cached (a write of someone else's), that one counts."""
    example = {
        "apiVersion": "example.kustos.dev/v1alpha1", "kind": "Example",
        "metadata": {"name": "x", "namespace": "default", "uid": "u", "generation": 1, "resourceVersion": "5",
                     "annotations": {FAIL_ANNOTATION: "true"}},
        "spec": {"message": "hi"},
    }  # fmt: skip
    server, cached = StatusServer(example), {"default/x": example}
    manager = SimpleNamespace(api=server, events=NoEvents())
    cache = SimpleNamespace(get=cached.get)
    reconciler = BaseExampleReconciler(cast(Manager, manager), Deps(), cache=cast(Informer, cache))
    for attempt in (1, 2, 3):
        with pytest.raises(ReconcileError, match="refused"):
            await reconciler.reconcile("default/x")
        assert server.stored["status"]["phase"] == f"Attempt {attempt}"
    someone = {**server.stored, "metadata": {**server.stored["metadata"], "resourceVersion": "40"},
               "status": {"phase": "Attempt 7"}}  # fmt: skip
    server.stored = cached["default/x"] = someone
    with pytest.raises(ReconcileError, match="refused"):
        await reconciler.reconcile("default/x")
    assert server.stored["status"]["phase"] == "Attempt 8"
