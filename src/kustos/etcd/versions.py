"""Which etcd version changes a cluster may make, and through which versions (pure).

etcd supports rolling a cluster one minor version up at a time (3.5 -> 3.6) and any
patch change within a minor. Going down one minor is possible only where etcd has a
downgrade protocol (``etcdctl downgrade enable``, from v3.6). A change of several minors
is a path of such steps (``version_path``): up through the newest patch the suite proves
of each minor between (``kustos.images.PROVEN_ETCD_VERSIONS``), down one minor at a time
through etcd's downgrade of each. ``kustos.etcd.chain`` walks it. Major changes, and paths
through a minor kustos proves no patch of, are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kustos.api.etcd import DOWNGRADE_CAPABLE_MINORS, EtcdCluster
from kustos.images import PROVEN_ETCD_VERSIONS

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-\d+)?$")


def parse(version: str) -> tuple[int, int, int] | None:
    found = _VERSION.match(version)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def image_version(image: str) -> str | None:
    """The etcd version an image's tag names (``...:v3.6.16`` or ``...:3.6.16-0``)."""
    tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
    parsed = parse(tag)
    return ".".join(map(str, parsed)) if parsed else None


def _parsed(version: str) -> tuple[int, int, int]:
    found = parse(version)
    assert found is not None, version
    return found


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def newest_proven(major: int, minor: int, proven: Sequence[str] = PROVEN_ETCD_VERSIONS) -> str | None:
    """The newest patch of ``major.minor`` the suite proves (a step of a longer path), if any."""
    found = [v for v in map(parse, proven) if v is not None and v[:2] == (major, minor)]
    return _dotted(max(found)) if found else None


def version_path(
    current: str, wanted: str, proven: Sequence[str] = PROVEN_ETCD_VERSIONS
) -> tuple[str, ...] | str:
    """The versions the members run in turn to go from ``current`` to ``wanted`` (``wanted``
    last; empty when they are equal), or why there is no such path.

    Up: through the newest proven patch of each minor between, after the newest proven patch
    of ``current``'s minor when the next minor needs a later patch first (3.6.5 -> 3.7.3 goes
    through 3.6.16). Down: one minor at a time through etcd's downgrade protocol, each minor
    between on its newest proven patch (3.7.3 -> 3.5.35 goes through 3.6.16).
    """
    if current == wanted:
        return ()
    have, want = parse(current), parse(wanted)
    if have is None or want is None:
        return f"cannot compare etcd versions {current!r} and {wanted!r}"
    if have[0] != want[0]:
        return f"changing the major version ({current} to {wanted}) is not supported"
    path: list[str] = []
    at = have
    while at[1] != want[1]:
        up = want[1] > at[1]
        minor = at[1] + (1 if up else -1)
        before = _OLDEST_PATCH_BEFORE.get((at[0], minor)) if up else None
        if before is not None and at < before:
            patch = newest_proven(at[0], at[1], proven)
            if patch is None or _parsed(patch) < before:
                return (
                    f"upgrading from {_dotted(at)} to {at[0]}.{minor} needs every member on "
                    f"{_dotted(before)} or later first (etcd's upgrade guide), and kustos proves no such "
                    f"{at[0]}.{at[1]} patch: set spec.version to a {at[0]}.{at[1]}.x of at least "
                    f"{_dotted(before)} first"
                )
            path.append(patch)
            at = _parsed(patch)
        if not up and (at[0], at[1]) not in DOWNGRADE_CAPABLE_MINORS:
            return (
                f"etcd {at[0]}.{at[1]} has no downgrade protocol: it cannot roll back to {at[0]}.{minor}"
                f"{f' on the way to {wanted}' if minor != want[1] else f' ({wanted})'}; "
                f"set spec.version back to {current}"
            )
        if minor == want[1]:
            break
        between = newest_proven(at[0], minor, proven)
        if between is None:
            direction = "upgrading" if up else "downgrading"
            return (
                f"{direction} from {current} to {wanted} goes through etcd {at[0]}.{minor}, and kustos "
                f"proves no {at[0]}.{minor} patch to pass through (it proves {', '.join(proven)}): "
                f"set spec.version to a {at[0]}.{minor}.x first"
            )
        path.append(between)
        at = _parsed(between)
    path.append(wanted)
    return tuple(path)


def upgrade_refusal(current: str | None, wanted: str) -> str | None:
    """Why going from ``current`` to ``wanted`` is refused, or None when it is allowed."""
    if current is None:
        return None
    path = version_path(current, wanted)
    return path if isinstance(path, str) else None


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
    if (have[0], have[1]) not in DOWNGRADE_CAPABLE_MINORS:
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
    return rollback_target(current, target_version(cluster)) if current else None


def recorded_step(cluster: EtcdCluster) -> str | None:
    """The step of a path across minors that status.versionPath records for spec.version."""
    path = cluster.status.version_path if cluster.status else None
    if path is None or path.target != cluster.spec.version or path.step not in path.steps:
        return None
    return path.step


def target_version(cluster: EtcdCluster) -> str:
    """The version members should run now: the spec's, or the step of a path across minors
    under way (``kustos.etcd.chain`` moves it on); the current one if the change is refused."""
    current = _current(cluster)
    if not current:
        return cluster.spec.version
    path = version_path(current, cluster.spec.version)
    if isinstance(path, str):
        return current
    return recorded_step(cluster) or (path[0] if path else cluster.spec.version)


def creation_version(cluster: EtcdCluster, rolling_back: bool, target: str | None = None) -> str:
    """The version a (re)created member pod starts on. While a rollback is under way (a member
    still runs the newer minor) the version the cluster ran: a PVC member's data may not be
    downgraded yet, and the rollback then restarts it in place. Once every member runs the
    older minor, that one: etcd lets only such a member join. ``target``: the version this
    pass rolls to (``Observed.version``; a path's next step may start before it is recorded)."""
    current = _current(cluster)
    return current if current and rolling_back else target or target_version(cluster)
