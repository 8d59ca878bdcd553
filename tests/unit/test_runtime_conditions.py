"""Conditions: set one without churning lastTransitionTime, and read them back."""

from __future__ import annotations

import copy
import re

from hypothesis import given
from hypothesis import strategies as st

from kustos.runtime.conditions import get_condition, is_true, now_rfc3339, set_condition

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"


def test_a_new_condition_is_appended_with_every_field() -> None:
    result = set_condition(None, "Ready", True, "AllMembersUp", "3/3", observed_generation=4, now=T0)
    assert result == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "AllMembersUp",
            "message": "3/3",
            "lastTransitionTime": T0,
            "observedGeneration": 4,
        }
    ]


def test_status_values() -> None:
    assert set_condition([], "A", False, "R", now=T0)[0]["status"] == "False"
    assert set_condition([], "A", "Unknown", "R", now=T0)[0]["status"] == "Unknown"
    assert set_condition([], "A", "True", "R", now=T0)[0]["status"] == "True"


def test_same_status_keeps_the_transition_time_but_updates_the_rest() -> None:
    first = set_condition([], "Ready", True, "Up", "1/3", observed_generation=1, now=T0)
    second = set_condition(first, "Ready", True, "StillUp", "3/3", observed_generation=2, now=T1)
    assert second == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "StillUp",
            "message": "3/3",
            "lastTransitionTime": T0,
            "observedGeneration": 2,
        }
    ]


def test_a_status_change_moves_the_transition_time() -> None:
    first = set_condition([], "Ready", True, "Up", now=T0)
    second = set_condition(first, "Ready", False, "Down", "member lost", now=T1)
    assert second[0]["lastTransitionTime"] == T1
    assert second[0]["reason"] == "Down"
    assert second[0]["message"] == "member lost"
    third = set_condition(second, "Ready", "False", "Down", now=T2)
    assert third[0]["lastTransitionTime"] == T1
    assert third[0]["message"] == ""  # the message says why, now: an empty one clears it


def test_observed_generation_is_kept_when_not_given() -> None:
    first = set_condition([], "Ready", True, "Up", observed_generation=3, now=T0)
    assert set_condition(first, "Ready", True, "Up", now=T1)[0]["observedGeneration"] == 3


def test_other_conditions_and_their_order_are_kept() -> None:
    conditions = [
        {"type": "Available", "status": "True", "reason": "A", "message": "", "lastTransitionTime": T0},
        {"type": "Ready", "status": "False", "reason": "B", "message": "", "lastTransitionTime": T0},
        {"type": "Degraded", "status": "False", "reason": "C", "message": "", "lastTransitionTime": T0},
    ]
    result = set_condition(conditions, "Ready", True, "Up", now=T1)
    assert [c["type"] for c in result] == ["Available", "Ready", "Degraded"]
    assert result[0] == conditions[0]
    assert result[2] == conditions[2]
    assert result[1]["lastTransitionTime"] == T1


def test_the_input_is_not_mutated() -> None:
    conditions = [
        {"type": "Ready", "status": "False", "reason": "B", "message": "m", "lastTransitionTime": T0}
    ]
    before = copy.deepcopy(conditions)
    result = set_condition(conditions, "Ready", True, "Up", "now up", observed_generation=9, now=T1)
    set_condition(conditions, "Other", True, "X", now=T1)
    assert conditions == before
    assert result is not conditions
    assert result[0] is not conditions[0]


def test_the_default_time_is_now_in_rfc3339() -> None:
    stamp = set_condition([], "Ready", True, "Up")[0]["lastTransitionTime"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now_rfc3339())


def test_get_condition_and_is_true() -> None:
    conditions = set_condition([], "Ready", True, "Up", now=T0)
    conditions = set_condition(conditions, "Degraded", False, "Fine", now=T0)
    conditions = set_condition(conditions, "Progressing", "Unknown", "Waiting", now=T0)
    ready = get_condition(conditions, "Ready")
    assert ready is not None and ready["reason"] == "Up"
    assert get_condition(conditions, "Missing") is None
    assert get_condition(None, "Ready") is None
    assert is_true(conditions, "Ready")
    assert not is_true(conditions, "Degraded")
    assert not is_true(conditions, "Progressing")
    assert not is_true(conditions, "Missing")
    assert not is_true(None, "Ready")


STATUSES = st.sampled_from([True, False, "True", "False", "Unknown"])


def _text(status: bool | str) -> str:
    return status if isinstance(status, str) else ("True" if status else "False")


@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["Ready", "Degraded"]), STATUSES, st.sampled_from(["A", "B"])),
        min_size=1,
        max_size=25,
    )
)
def test_transition_time_is_the_time_of_the_last_status_change(
    steps: list[tuple[str, bool | str, str]],
) -> None:
    conditions: list[dict[str, object]] = []
    expected: dict[str, tuple[str, str]] = {}  # type -> (status, time it took that status)
    for i, (type_, status, reason) in enumerate(steps):
        stamp = f"2026-01-01T00:00:{i:02d}Z"
        conditions = set_condition(conditions, type_, status, reason, now=stamp)
        previous = expected.get(type_)
        if previous is None or previous[0] != _text(status):
            expected[type_] = (_text(status), stamp)
        current = get_condition(conditions, type_)
        assert current is not None
        assert current["reason"] == reason
    assert len(conditions) == len(expected)
    for type_, (status, stamp) in expected.items():
        condition = get_condition(conditions, type_)
        assert condition is not None
        assert condition["status"] == status
        assert condition["lastTransitionTime"] == stamp
        assert is_true(conditions, type_) == (status == "True")


def test_set_model_condition_keeps_models_and_transition_times() -> None:
    from datetime import UTC, datetime

    from kustos.api.common import Condition
    from kustos.runtime.conditions import set_model_condition

    first = set_model_condition(
        Condition, [], "Ready", True, "AllReady", "", 1, datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert isinstance(first[0], Condition) and first[0].last_transition_time == "2026-01-01T00:00:00Z"
    again = set_model_condition(
        Condition, first, "Ready", True, "AllReady", "still", 2, "2026-02-01T00:00:00Z"
    )
    assert again[0].last_transition_time == "2026-01-01T00:00:00Z" and again[0].message == "still"
