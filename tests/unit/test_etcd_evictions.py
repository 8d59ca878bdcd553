"""Which eviction requests the eviction webhook records on a member pod (kustos.etcd.evictions)."""

from __future__ import annotations

from typing import Any, cast

from kustos.etcd.evictions import EVICTION_NAME, eviction_webhook, to_record

MEMBER = {"metadata": {"name": "e-0", "namespace": "ns", "labels": {"kustos.dev/cluster": "e"}}}


def test_an_eviction_of_a_live_member_is_recorded_once() -> None:
    assert to_record({"name": "e-0", "namespace": "ns"}, MEMBER)
    marked = {"metadata": {**MEMBER["metadata"], "annotations": {"kustos.dev/eviction-requested": "t"}}}
    assert not to_record({"name": "e-0", "namespace": "ns"}, marked)


def test_a_dry_run_or_a_pod_that_is_no_member_or_is_going_records_nothing() -> None:
    assert not to_record({"name": "e-0", "namespace": "ns", "dryRun": True}, MEMBER)
    assert not to_record({"name": "web-0", "namespace": "ns"}, None)
    going = {"metadata": {**MEMBER["metadata"], "deletionTimestamp": "2026-11-26T00:00:00Z"}}
    assert not to_record({"name": "e-0", "namespace": "ns"}, going)


def test_the_webhook_fails_open_and_declares_its_dry_run_behaviour() -> None:
    """An operator that is down never blocks an eviction; a dry run is sent to it (and records nothing)."""
    webhook = eviction_webhook(cast(Any, None), cast(Any, None), cast(Any, None))
    entry = webhook.configuration_entry({"url": "https://example"})
    assert entry["name"] == EVICTION_NAME
    assert (entry["failurePolicy"], entry["sideEffects"]) == ("Ignore", "NoneOnDryRun")
    assert entry["rules"][0]["resources"] == ["pods/eviction"]
