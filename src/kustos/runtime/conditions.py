"""Standard Conditions (metav1.Condition): set one without churning lastTransitionTime."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import BaseModel

from kustos.runtime.errors import ReconcileError
from kustos.runtime.times import rfc3339

M = TypeVar("M", bound=BaseModel)

Condition = dict[str, Any]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Condition] | None,
    type_: str,
    status: bool | str,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: str | datetime | None = None,
) -> list[Condition]:
    """Return the list with ``type_`` set; lastTransitionTime moves only when status changes.

    Reason, message and observedGeneration are always updated: they say why, now.
    """
    value = status if isinstance(status, str) else ("True" if status else "False")
    result = [dict(c) for c in conditions or []]
    existing = next((c for c in result if c.get("type") == type_), None)
    stamp = rfc3339(now) if isinstance(now, datetime) else (now or now_rfc3339())
    if existing is None:
        existing = {"type": type_}
        result.append(existing)
        existing["lastTransitionTime"] = stamp
    elif existing.get("status") != value:
        existing["lastTransitionTime"] = stamp
    existing.update(status=value, reason=reason, message=message)
    if observed_generation is not None:
        existing["observedGeneration"] = observed_generation
    return result


def get_condition(conditions: list[Condition] | None, type_: str) -> Condition | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def is_true(conditions: list[Condition] | None, type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.get("status") == "True"


def set_model_condition(
    model: type[M], conditions: Sequence[M], type_: str, status: bool | str, reason: str,
    message: str = "", observed_generation: int | None = None, now: str | datetime | None = None,
) -> list[M]:  # fmt: skip
    """``set_condition`` for a status that holds its conditions as models (``kustos.api``'s)."""
    plain = [c.model_dump(by_alias=True, exclude_none=True) for c in conditions]
    updated = set_condition(plain, type_, status, reason, message, observed_generation, now)
    return [model.model_validate(c) for c in updated]


def note_failure(
    conditions: list[Condition] | None, failure: ReconcileError | None, now: datetime | str | None = None,
    generation: int | None = None, type_: str = "Progressing", status: bool | str = True,
) -> list[Condition]:  # fmt: skip
    """Put the last failure's reason and message on ``type_`` (unchanged when there is none)."""
    if failure is None:
        return [dict(c) for c in conditions or []]
    return set_condition(conditions, type_, status, failure.reason, failure.message[:1000], generation, now)
