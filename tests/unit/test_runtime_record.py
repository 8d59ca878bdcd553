"""replace_status and record: one write per pass when something changed, Events on transitions."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest

from kustos.api.common import Condition
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import EventRecorder
from kustos.runtime.informer import ResourceRef
from kustos.runtime.record import Note, note_failure, record, status_changed, transitions

THINGS = ResourceRef("kustos.dev", "v1alpha1", "things", "Thing")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeServer:
    """Answers the requests an Api makes; remembers them."""

    def __init__(self, answer: Callable[[httpx2.Request], httpx2.Response] | None = None) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self._answer = answer

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        if self._answer is not None:
            return self._answer(request)
        if request.method == "PUT":
            return httpx2.Response(
                200, json={**body, "metadata": {**body["metadata"], "resourceVersion": "8"}}
            )
        return httpx2.Response(201, json=body)

    def api(self) -> Api:
        return Api(httpx2.AsyncClient(transport=httpx2.MockTransport(self), base_url="https://k8s"))

    def writes(self) -> list[Any]:
        return [b for m, p, b in self.requests if m == "PUT"]

    def events(self) -> list[Any]:
        return [b for m, p, b in self.requests if p.endswith("/events")]


def _thing(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1", "kind": "Thing",
        "metadata": {"name": "t", "namespace": "ns", "generation": 2, "resourceVersion": "7", "uid": "u",
                     "managedFields": [{"manager": "x"}]},
        "spec": {"size": 3},
        "status": status if status is not None else {},
    }  # fmt: skip


def _cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


async def test_replace_status_puts_the_whole_status_with_the_resource_version() -> None:
    server = FakeServer()
    updated = await server.api().replace_status(
        THINGS, _thing({"phase": "Old", "gone": 1}), {"phase": "New", "x": None}
    )
    ((method, path, body),) = server.requests
    assert (method, path) == ("PUT", "/apis/kustos.dev/v1alpha1/namespaces/ns/things/t/status")
    assert body["status"] == {"phase": "New", "observedGeneration": 2}  # "gone" and the null are cleared
    assert body["metadata"]["resourceVersion"] == "7" and "managedFields" not in body["metadata"]
    assert updated["metadata"]["resourceVersion"] == "8"


async def test_replace_status_conflict_is_a_reconcile_error() -> None:
    server = FakeServer(lambda _r: httpx2.Response(409, json={"reason": "Conflict", "message": "modified"}))
    with pytest.raises(ReconcileError) as caught:
        await server.api().replace_status(THINGS, _thing(), {"phase": "New"})
    assert isinstance(caught.value, ApiStatusError) and caught.value.conflict


def test_status_changed_ignores_nulls_and_stamps_the_generation() -> None:
    obj = _thing({"phase": "Running", "observedGeneration": 2})
    assert not status_changed(obj, {"phase": "Running", "message": None})
    assert status_changed(obj, {"phase": "Running", "message": "hi"})
    assert status_changed(_thing({"phase": "Running", "observedGeneration": 1}), {"phase": "Running"})


def test_transitions_are_status_or_reason_changes() -> None:
    old = [_cond("Ready", "True", "AllReady"), _cond("Degraded", "False", "AsExpected")]
    assert transitions(old, [_cond("Ready", "True", "AllReady", "new words")]) == []
    changed = [_cond("Ready", "False", "PodsNotReady"), _cond("Degraded", "False", "AsExpected")]
    assert [c["type"] for c in transitions(old, changed)] == ["Ready"]
    # New to the status: only a warning is news.
    fresh = [_cond("Ready", "True", "AllReady"), _cond("Degraded", "True", "MemberDown")]
    assert [c["type"] for c in transitions([], fresh)] == ["Degraded"]


def test_note_failure_puts_the_message_on_progressing() -> None:
    conditions = note_failure([], ReconcileError("etcd unreachable", "EtcdUnavailable"), NOW, 2)
    assert conditions == [{
        "type": "Progressing", "status": "True", "reason": "EtcdUnavailable", "message": "etcd unreachable",
        "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]  # fmt: skip
    assert note_failure(conditions, None) == conditions


def test_a_refusal_without_a_reason_is_still_a_condition_the_api_server_takes() -> None:
    """A 500 from server-side apply carries no reason; fuzzing found the failure condition then
    refused by the API server (an empty reason), so nothing at all was recorded."""
    refusal = ApiStatusError(500, "", "failed to create typed patch object: .spec.ingress[1].from[2].key")
    (condition,) = note_failure([], refusal, NOW, 1)
    assert condition["reason"] == "Http500" and "typed patch object" in condition["message"]
    assert Condition.model_validate(condition).reason == "Http500"


async def test_record_writes_once_when_changed_and_announces_transitions() -> None:
    server = FakeServer()
    api = server.api()
    events = EventRecorder(api)
    old = {
        "phase": "Running",
        "observedGeneration": 2,
        "conditions": [_cond("Degraded", "False", "AsExpected")],
    }
    same = await record(api, THINGS, _thing(old), dict(old), events)
    assert server.requests == [] and same["metadata"]["resourceVersion"] == "7"

    new = {"phase": "Degraded", "conditions": [_cond("Degraded", "True", "MemberDown", "m-1 down")]}
    updated = await record(api, THINGS, _thing(old), new, events, notes=[Note("Checked", "all looked at")])
    assert updated["metadata"]["resourceVersion"] == "8"
    assert len(server.writes()) == 1
    assert [(e["type"], e["reason"], e["message"]) for e in server.events()] == [
        ("Warning", "MemberDown", "m-1 down"),
        ("Normal", "Checked", "all looked at"),
    ]


async def test_record_announce_limits_events_and_without_recorder_none() -> None:
    server = FakeServer()
    api = server.api()
    new = {"conditions": [_cond("Degraded", "True", "MemberDown"), _cond("Ready", "False", "NotReady")]}
    await record(api, THINGS, _thing(), new, EventRecorder(api), announce={"Ready"})
    assert [e["reason"] for e in server.events()] == ["NotReady"]
    await record(api, THINGS, _thing(), {"phase": "X"}, None)
    assert len(server.writes()) == 2


async def test_record_of_a_vanished_object_is_quiet_and_a_conflict_raises() -> None:
    gone = FakeServer(lambda _r: httpx2.Response(404, json={"reason": "NotFound", "message": "gone"}))
    obj = _thing()
    assert await record(gone.api(), THINGS, obj, {"phase": "X"}, None) is obj
    conflict = FakeServer(lambda _r: httpx2.Response(409, json={"reason": "Conflict", "message": "modified"}))
    with pytest.raises(ApiStatusError):
        await record(conflict.api(), THINGS, obj, {"phase": "X"}, EventRecorder(conflict.api()))
    assert conflict.events() == []
