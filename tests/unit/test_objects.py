"""Object facts the runtime decides on."""

from __future__ import annotations

from typing import Any

from kustos.runtime import objects


def test_a_heartbeat_alone_is_no_change_but_a_condition_or_label_is() -> None:
    def node(rv: str, beat: str, ready: str = "True", labels: dict[str, str] | None = None) -> dict[str, Any]:
        return {
            "metadata": {"name": "n", "resourceVersion": rv, "labels": labels or {}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": beat}]},
        }

    assert not objects.changed_beyond_heartbeat(node("1", "t1"), node("2", "t2"))
    assert objects.changed_beyond_heartbeat(node("1", "t1"), node("2", "t2", ready="False"))
    assert objects.changed_beyond_heartbeat(node("1", "t1"), node("2", "t1", labels={"a": "b"}))
    bumped = ({"metadata": {"resourceVersion": "1"}}, {"metadata": {"resourceVersion": "2"}})
    assert not objects.changed_beyond_heartbeat(*bumped)


def test_a_status_write_alone_is_no_change_beyond_status_but_spec_and_metadata_are() -> None:
    def cluster(rv: str, phase: str, size: int = 3, **meta: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": "c", "resourceVersion": rv, "generation": size, **meta},
            "spec": {"size": size},
            "status": {"phase": phase, "nextMemberIndex": int(rv)},
        }

    assert not objects.changed_beyond_status(cluster("1", "Creating"), cluster("2", "Failed"))
    assert objects.changed_beyond_status(cluster("1", "Creating"), cluster("2", "Creating", size=5))
    assert objects.changed_beyond_status(cluster("1", "x"), cluster("2", "x", annotations={"a": "b"}))
    assert objects.changed_beyond_status(cluster("1", "x"), cluster("2", "x", deletionTimestamp="t"))
