"""The auth planner: spec.auth against what etcd has, one step at a time, until in sync."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from kustos.etcd import auth
from kustos.etcd.auth import (
    AddRole,
    AddUser,
    ChangePassword,
    DeleteRole,
    DeleteUser,
    Desired,
    DesiredUser,
    DisableAuth,
    EnableAuth,
    FinishRootRotation,
    GrantPermission,
    GrantRole,
    InSync,
    ObservedAuth,
    RevokePermission,
    RevokeRole,
    StartRootRotation,
)
from kustos.etcd.client import RolePermission

APP = auth.permission("readwrite", "/app/", prefix=True)
ROOT_READY = ObservedAuth(True, {"root": frozenset({"root"})}, {"root": frozenset()})


def desired(**kw: object) -> Desired:
    base = Desired(
        enabled=True,
        root_password="r00t",
        users={"app": DesiredUser("app", frozenset({"app"}), "s3cret", "app-pw/password/7")},
        roles={"app": frozenset({APP})},
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def apply(observed: ObservedAuth, step: auth.AuthStep) -> ObservedAuth:
    """What etcd would have after the step (a model of etcd's auth store for the walk below)."""
    users = {u: set(r) for u, r in observed.users.items()}
    roles = {r: set(p) for r, p in observed.roles.items()}
    applied = dict(observed.applied)
    enabled = observed.enabled
    match step:
        case AddRole(role=role):
            roles[role] = set()
        case AddUser(user=user, marker=marker):
            users[user] = set()
            applied[user] = marker
        case ChangePassword(user=user, marker=marker):
            applied[user] = marker
        case GrantRole(user=user, role=role):
            users[user].add(role)
        case RevokeRole(user=user, role=role):
            users[user].discard(role)
        case GrantPermission(role=role, permission=p):
            roles[role] = {q for q in roles[role] if (q.key, q.range_end) != (p.key, p.range_end)} | {p}
        case RevokePermission(role=role, permission=p):
            roles[role].discard(p)
        case DeleteUser(user=user):
            del users[user]
        case DeleteRole(role=role):
            del roles[role]
            for granted in users.values():
                granted.discard(role)
        case EnableAuth():
            enabled = True
        case DisableAuth():
            enabled = False
    return ObservedAuth(
        enabled,
        {u: frozenset(r) for u, r in users.items()},
        {r: frozenset(p) for r, p in roles.items()},
        applied,
    )


def walk(want: Desired, observed: ObservedAuth, limit: int = 30) -> tuple[list[auth.AuthStep], ObservedAuth]:
    steps: list[auth.AuthStep] = []
    for _ in range(limit):
        step = auth.plan(want, observed)
        if isinstance(step, InSync):
            return steps, observed
        steps.append(step)
        observed = apply(observed, step)
    raise AssertionError(f"no convergence: {steps}")


def test_a_fresh_cluster_gets_root_then_auth_on_then_its_roles_and_users() -> None:
    steps, end = walk(desired(), ObservedAuth(False, {}, {}))
    assert steps[:4] == [AddRole("root"), AddUser("root", "r00t"), GrantRole("root", "root"), EnableAuth()]
    assert steps.index(AddRole("app")) < steps.index(
        GrantRole("app", "app")
    )  # a role exists before its grant
    assert end.enabled
    assert end.users == {"root": {"root"}, "app": {"app"}}
    assert end.roles["app"] == {RolePermission("READWRITE", b"/app/", b"/app0")}


def test_what_the_spec_no_longer_declares_is_removed_but_root_stays() -> None:
    observed = ObservedAuth(
        True,
        {"root": frozenset({"root"}), "app": frozenset({"app", "old"}), "gone": frozenset()},
        {"root": frozenset(), "app": frozenset({APP, auth.permission("read", "/x")}), "old": frozenset()},
        {"app": "app-pw/password/7"},
    )
    steps, end = walk(desired(), observed)
    assert RevokeRole("app", "old") in steps and DeleteUser("gone") in steps and DeleteRole("old") in steps
    assert end.users == {"root": {"root"}, "app": {"app"}}
    assert end.roles == {"root": set(), "app": {APP}}


def test_a_changed_password_secret_sets_the_password_again_once() -> None:
    _, synced = walk(desired(), ObservedAuth(False, {}, {}))
    moved = desired(users={"app": DesiredUser("app", frozenset({"app"}), "n3w", "app-pw/password/8")})
    steps, _ = walk(moved, synced)
    assert steps == [ChangePassword("app", "n3w", "app-pw/password/8")]


def test_a_certificate_user_has_no_password_and_never_gets_one() -> None:
    cert = desired(users={"reader": DesiredUser("reader", frozenset())}, roles={})
    steps, _ = walk(cert, ROOT_READY)
    assert steps == [AddUser("reader", None, "")]


def test_a_user_whose_secret_is_missing_is_neither_added_nor_deleted() -> None:
    observed = replace(ROOT_READY, users={**ROOT_READY.users, "app": frozenset()})
    waiting = desired(users={}, roles={}, unreadable=frozenset({"app", "new"}))
    assert auth.plan(waiting, observed) == InSync()


def test_a_changed_permission_type_is_granted_over_the_old_one() -> None:
    observed = replace(ROOT_READY, roles={**ROOT_READY.roles, "app": frozenset({replace(APP, type="READ")})})
    assert auth.plan(desired(users={}), observed) == GrantPermission("app", APP)


def test_rotation_writes_the_new_password_first_then_changes_etcd() -> None:
    assert auth.plan(desired(rotation_due=True), ROOT_READY) == StartRootRotation()
    # A pending password finishes first, whatever else is due: it is the one the operator may hold.
    assert auth.plan(desired(pending_root="n3w", rotation_due=True), ROOT_READY) == FinishRootRotation("n3w")


def test_auth_turned_off_disables_it_and_nothing_else() -> None:
    assert auth.plan(desired(enabled=False), ROOT_READY) == DisableAuth()
    assert auth.plan(desired(enabled=False), replace(ROOT_READY, enabled=False)) == InSync()


def test_passwords_never_show_in_a_step_or_desired_repr() -> None:
    shown = " ".join(
        repr(s)
        for s in (
            AddUser("app", "s3cret"), ChangePassword("app", "s3cret"), FinishRootRotation("s3cret"),
            desired(pending_root="s3cret", root_password="s3cret"),
        )
    )  # fmt: skip
    assert "s3cret" not in shown and "r00t" not in shown


def test_permissions_as_etcdctl_makes_them() -> None:
    assert auth.permission("read", "/a", prefix=True) == RolePermission("READ", b"/a", b"/b")
    assert auth.permission("write", "k") == RolePermission("WRITE", b"k", b"")
    assert auth.permission("read", "a", range_end="c") == RolePermission("READ", b"a", b"c")
    assert auth.permission("read", "a", range_end="\\0") == RolePermission("READ", b"a", b"\x00")


def test_rotation_is_due_after_its_interval_or_when_the_annotation_asks_anew() -> None:
    now = datetime(2026, 11, 26, tzinfo=UTC)
    day = timedelta(days=1)
    assert not auth.rotation_due(now - day, now, 30 * day, "", "")
    assert auth.rotation_due(now - 31 * day, now, 30 * day, "", "")
    assert auth.rotation_due(now - day, now, 30 * day, "please", "")
    assert not auth.rotation_due(now - day, now, 30 * day, "please", "please")
