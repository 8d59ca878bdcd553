"""The reconciler base's pure parts, and the API client's network failures as ReconcileErrors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel, Field, ValidationError

from kustos.runtime.api import Api, ApiUnreachable
from kustos.runtime.errors import ReconcileError, TerminalError
from kustos.runtime.reconciler import invalid_spec, previous_with_failure
from kustos.runtime.resources import CONFIGMAPS


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
