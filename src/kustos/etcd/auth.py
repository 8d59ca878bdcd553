"""etcd users and roles: what spec.auth asks for against what etcd has, and the next step.

Pure: the controller (``authsync.py``) reads etcd and the Secrets, and acts on the one step
chosen here. The order is the one etcd needs: the ``root`` role and user first, then
authentication on (etcd refuses it without them), then a root password rotation under way,
then roles before the users granted them, and last what the spec no longer declares.

Passwords live in steps only as long as a pass; their reprs never show them. Whether a
user's password is the one its Secret holds is not something etcd can be asked (it keeps a
bcrypt hash), so the operator records, per user, which version of the Secret it applied
(``marker``: Secret name, key and resourceVersion) and sets the password again when that
version moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from kustos.etcd.client import RolePermission, prefix_end

ROOT = "root"
PERMISSION_TYPES = {"read": "READ", "write": "WRITE", "readwrite": "READWRITE"}


@dataclass(frozen=True)
class DesiredUser:
    name: str
    roles: frozenset[str]
    password: str | None = field(default=None, repr=False)
    """None: no password (client certificate login), or its Secret could not be read."""
    marker: str = ""
    """Which version of its Secret the password came from ("" for a certificate user)."""


@dataclass(frozen=True)
class Desired:
    enabled: bool
    root_password: str = field(repr=False)
    users: Mapping[str, DesiredUser] = field(default_factory=dict)
    roles: Mapping[str, frozenset[RolePermission]] = field(default_factory=dict)
    unreadable: frozenset[str] = frozenset()
    """Users whose password Secret is missing: left as they are in etcd until it exists."""
    pending_root: str | None = field(default=None, repr=False)
    """A new root password written to the root Secret and not yet made the current one."""
    rotation_due: bool = False


@dataclass(frozen=True)
class ObservedAuth:
    enabled: bool
    users: Mapping[str, frozenset[str]]
    """Each user with its roles."""
    roles: Mapping[str, frozenset[RolePermission]]
    applied: Mapping[str, str] = field(default_factory=dict)
    """Per user, the marker of the password the operator last set."""
    root_current: bool = True
    """The operator logged in with root's current (or pending) password, not an older one."""


# ---- steps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class InSync:
    """Nothing to do."""


@dataclass(frozen=True)
class EnableAuth:
    """Turn authentication on (root exists with the root role)."""


@dataclass(frozen=True)
class DisableAuth:
    """spec.auth is off (or gone) and etcd still checks users."""


@dataclass(frozen=True)
class StartRootRotation:
    """Write a new root password beside the current one in the root Secret (nothing in etcd yet)."""


@dataclass(frozen=True)
class FinishRootRotation:
    """Make etcd's root password the pending one, then make it the Secret's current one."""

    password: str = field(repr=False)


@dataclass(frozen=True)
class AddRole:
    role: str


@dataclass(frozen=True)
class GrantPermission:
    role: str
    permission: RolePermission


@dataclass(frozen=True)
class RevokePermission:
    role: str
    permission: RolePermission


@dataclass(frozen=True)
class AddUser:
    user: str
    password: str | None = field(repr=False)
    marker: str = ""


@dataclass(frozen=True)
class ChangePassword:
    user: str
    password: str = field(repr=False)
    marker: str = ""


@dataclass(frozen=True)
class GrantRole:
    user: str
    role: str


@dataclass(frozen=True)
class RevokeRole:
    user: str
    role: str


@dataclass(frozen=True)
class DeleteUser:
    user: str


@dataclass(frozen=True)
class DeleteRole:
    role: str


AuthStep = (
    InSync | EnableAuth | DisableAuth | StartRootRotation | FinishRootRotation | AddRole | GrantPermission
    | RevokePermission | AddUser | ChangePassword | GrantRole | RevokeRole | DeleteUser | DeleteRole
)  # fmt: skip


# ---- the plan ------------------------------------------------------------------------------


def plan(desired: Desired, observed: ObservedAuth) -> AuthStep:
    """The one next step towards ``desired``."""
    if not desired.enabled:
        return DisableAuth() if observed.enabled else InSync()
    if ROOT not in observed.roles:
        return AddRole(ROOT)
    if ROOT not in observed.users:
        return AddUser(ROOT, desired.root_password)
    if ROOT not in observed.users[ROOT]:
        return GrantRole(ROOT, ROOT)
    if not observed.enabled:
        return EnableAuth()
    if desired.pending_root is not None:
        return FinishRootRotation(desired.pending_root)
    if not observed.root_current:  # restored from a snapshot older than root's last rotation
        return ChangePassword(ROOT, desired.root_password)
    if desired.rotation_due:
        return StartRootRotation()
    return _roles(desired, observed) or _users(desired, observed) or _leftovers(desired, observed) or InSync()


def _ranges(permissions: frozenset[RolePermission]) -> dict[tuple[bytes, bytes], str]:
    return {(p.key, p.range_end): p.type for p in permissions}


def _roles(desired: Desired, observed: ObservedAuth) -> AuthStep | None:
    for role in sorted(desired.roles):
        if role not in observed.roles:
            return AddRole(role)
        want, have = _ranges(desired.roles[role]), _ranges(observed.roles[role])
        for (key, end), kind in sorted(want.items()):
            if have.get((key, end)) != kind:
                return GrantPermission(role, RolePermission(kind, key, end))
        for (key, end), kind in sorted(have.items()):
            if (key, end) not in want:
                return RevokePermission(role, RolePermission(kind, key, end))
    return None


def _users(desired: Desired, observed: ObservedAuth) -> AuthStep | None:
    for name in sorted(desired.users):
        user = desired.users[name]
        if name not in observed.users:
            return AddUser(name, user.password, user.marker)
        if user.password is not None and observed.applied.get(name) != user.marker:
            return ChangePassword(name, user.password, user.marker)
        have = observed.users[name]
        for role in sorted(user.roles - have):
            if role == ROOT or role in observed.roles:
                return GrantRole(name, role)
        for role in sorted(have - user.roles):
            return RevokeRole(name, role)
    return None


def _leftovers(desired: Desired, observed: ObservedAuth) -> AuthStep | None:
    kept = {ROOT, *desired.users, *desired.unreadable}
    for user in sorted(set(observed.users) - kept):
        return DeleteUser(user)
    for role in sorted(set(observed.roles) - {ROOT, *desired.roles}):
        return DeleteRole(role)
    return None


# ---- from the spec ---------------------------------------------------------------------------


def permission(kind: str, key: str, prefix: bool = False, range_end: str | None = None) -> RolePermission:
    """etcd's form of a declared permission (``prefix`` as ``etcdctl --prefix`` computes it)."""
    raw = key.encode()
    if prefix:
        end = prefix_end(raw)
    elif range_end is not None:
        end = b"\x00" if range_end == "\\0" else range_end.encode()
    else:
        end = b""
    return RolePermission(PERMISSION_TYPES[kind], raw, end)


def rotation_due(
    rotated_at: datetime | None, now: datetime, every: timedelta, requested: str, done_for: str
) -> bool:
    """A new root password is due: the interval has passed, or the annotation asks anew."""
    if requested and requested != done_for:
        return True
    return rotated_at is None or now - rotated_at >= every
