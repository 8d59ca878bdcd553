"""Creations the informer has not delivered yet hold the owner's planning back, until seen or expired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kustos.runtime.clock import FixedClock
from kustos.runtime.expectations import Expectations

MOMENT = datetime(2026, 11, 24, 8, 0, tzinfo=UTC)


def test_a_created_pod_is_awaited_until_the_informer_delivers_it() -> None:
    expected = Expectations(FixedClock(MOMENT))
    expected.expect("ns/c", "c-3")
    expected.expect("ns/c", "c-4")
    assert expected.unseen("ns/c") == ["c-3", "c-4"]
    expected.seen("ns/c", "c-3")
    assert expected.unseen("ns/c") == ["c-4"]
    expected.seen("ns/c", "c-4")  # e.g. its DELETED event: created and gone at once still counts
    assert expected.unseen("ns/c") == []
    expected.seen("ns/c", "c-5")  # an event nobody waited for changes nothing
    assert expected.unseen("ns/c") == []


def test_owners_are_apart_and_a_lost_event_expires() -> None:
    clock = FixedClock(MOMENT)
    expected = Expectations(clock, ttl=timedelta(seconds=30))
    expected.expect("ns/a", "a-1")
    assert expected.unseen("ns/b") == []
    clock.advance(29)
    assert expected.unseen("ns/a") == ["a-1"]
    clock.advance(1)
    assert expected.unseen("ns/a") == []


def test_a_deleted_owner_waits_for_nothing() -> None:
    expected = Expectations(FixedClock(MOMENT))
    expected.expect("ns/c", "c-0")
    expected.forget("ns/c")
    assert expected.unseen("ns/c") == []
