"""Which etcd version changes a cluster may make (pure).

etcd supports rolling a cluster one minor version up at a time (3.5 -> 3.6) and any
patch change within a minor. Going down one minor is possible only where etcd has a
downgrade protocol (``etcdctl downgrade enable``, from v3.6): kustos drives it for those
minors and refuses every other downgrade, skipped minors and major changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kustos.api.etcd import EtcdCluster

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-\d+)?$")


def parse(version: str) -> tuple[int, int, int] | None:
    found = _VERSION.match(version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def image_version(image: str) -> str | None:
    """The etcd version an image's tag names (``...:v3.6.16`` or ``...:3.6.16-0``)."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    parsed = parse(tag)
    return ".".join(map(str, parsed)) if parsed else None


def upgrade_refusal(current: str | None, wanted: str) -> str | None:
    """Why going from ``current`` to ``wanted`` is refused, or None when it is allowed."""
    if current is None or current == wanted:
        return None
    have, want = parse(current), parse(wanted)
    if have is None or want is None:
        return f"cannot compare etcd versions {current!r} and {wanted!r}"
    if have[0] != want[0]:
        return f"changing the major version ({current} to {wanted}) is not supported"
    if want[1] > have[1] + 1:
        return (
            f"upgrading from {current} to {wanted} skips a minor version: "
            f"upgrade to {have[0]}.{have[1] + 1}.x first"
        )
    before = _OLDEST_PATCH_BEFORE.get((want[0], want[1]))
    if want[1] == have[1] + 1 and before is not None and have < before:
        oldest = ".".join(map(str, before))
        return (
            f"upgrading from {current} to {wanted} needs every member on {oldest} or later first "
            f"(etcd's upgrade guide): set spec.version to the newest {have[0]}.{have[1]}.x, then {wanted}"
        )
    if want[1] < have[1] and rollback_target(current, wanted) is None:
        if want[1] < have[1] - 1:
            return (
                f"downgrading from {current} to {wanted} skips a minor version: etcd rolls back "
                f"one minor at a time; set spec.version to {have[0]}.{have[1] - 1}.x first"
            )
        return (
            f"etcd {have[0]}.{have[1]} has no downgrade protocol: it cannot roll back to "
            f"{wanted}; set spec.version back to {current}"
        )
    return None


# The minors whose etcd can downgrade its cluster to the previous minor through the
# downgrade API (Maintenance.Downgrade, added in v3.6; checked on v3.6.16 -> "3.5" and
# v3.7.3 -> "3.6", tests/integration/test_etcd_upgrade.py).
_DOWNGRADE_CAPABLE_MINORS = frozenset({(3, 6), (3, 7)})

# minor -> the oldest patch of the previous minor that may roll to it: "Before upgrading to
# 3.7, make sure that all of your 3.6 members are updated to 3.6.11 or later" (etcd's
# upgrade_3_7 guide; earlier 3.6 patches may not be compatible with a rolling upgrade).
_OLDEST_PATCH_BEFORE: dict[tuple[int, int], tuple[int, int, int]] = {(3, 7): (3, 6, 11)}


def rollback_target(current: str, wanted: str) -> str | None:
    """The ``major.minor`` to pass to etcd's downgrade API when going from ``current`` to
    ``wanted`` is a one-minor rollback etcd supports (3.6.x -> 3.5.y gives "3.5"), else None.
    """
    have, want = parse(current), parse(wanted)
    if have is None or want is None or have[0] != want[0] or want[1] != have[1] - 1:
        return None
    if (have[0], have[1]) not in _DOWNGRADE_CAPABLE_MINORS:
        return None
    return f"{want[0]}.{want[1]}"


def agreed_version(reported: Iterable[str]) -> str | None:
    """The version every member reports ("" for one that did not answer), if they agree: one
    silent member must not make a half-done rollback look finished, or an upgrade look done."""
    versions = set(reported)
    return versions.pop() if len(versions) == 1 and "" not in versions else None


# ---- what a cluster's spec and status ask for ----------------------------------------------


def _current(cluster: EtcdCluster) -> str | None:
    """The version every member last reported running (None before they all answered once)."""
    return cluster.status.current_version if cluster.status else None


def version_refusal(cluster: EtcdCluster) -> str | None:
    """Why spec.version cannot be rolled out from the version the members run, if it cannot."""
    return upgrade_refusal(_current(cluster), cluster.spec.version)


def rollback(cluster: EtcdCluster) -> str | None:
    """The minor ("3.5") etcd's downgrade protocol takes the cluster to, if spec.version asks for it."""
    current = _current(cluster)
    return rollback_target(current, cluster.spec.version) if current else None


def target_version(cluster: EtcdCluster) -> str:
    """The version members should run: the spec's, unless that change is refused."""
    current = _current(cluster)
    if current and version_refusal(cluster) is not None:
        return current
    return cluster.spec.version


def creation_version(cluster: EtcdCluster, rolling_back: bool) -> str:
    """The version a (re)created member pod starts on. While a rollback is under way (a member
    still runs the newer minor) the version the cluster ran: a PVC member's data may not be
    downgraded yet, and the rollback then restarts it in place. Once every member runs the
    older minor, that one: etcd lets only such a member join."""
    current = _current(cluster)
    return current if current and rolling_back else target_version(cluster)
