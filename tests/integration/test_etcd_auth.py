"""etcd authentication (issue 27 item 4) against real members and a real operator.

A 3-member cluster with spec.auth: a user whose role allows one prefix writes it and is refused
elsewhere; a changed password Secret takes effect; a user the spec drops is gone; the
operator's root password is rotated on request and the operator keeps working (its status,
a backup through an agent pod); a writer logged in as that user loses no acknowledged write;
and no password shows in the operator's log, the Events or the cluster's status.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kustos.etcd.authsync import PENDING_KEY, root_credentials
from kustos.etcd.client import (
    AuthFailed,
    AuthRequired,
    EtcdClient,
    EtcdCredentials,
    EtcdError,
    PermissionDenied,
)
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, assert_rejected, etcd_cluster, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_recovery import take_backup
from tests.integration.test_security import secret_values

pytestmark = pytest.mark.process_runner(
    "etcd users and roles are etcd's and kustos's; restricted pods on runc: test_real_nodes_lifecycle"
)

FIRST = "first-password-of-app"
SECOND = "second-password-of-app"


def password_secret(kubectl: Kubectl, value: str) -> None:
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-pw"},
                   "stringData": {"password": value}})  # fmt: skip


def auth_spec(*users: dict[str, Any]) -> dict[str, Any]:
    return {
        "users": list(users),
        "roles": [{"name": "app", "permissions": [{"type": "readwrite", "key": "/writer/", "prefix": True}]}],
    }


APP_USER = {"name": "app", "passwordSecret": {"name": "app-pw"}, "roles": ["app"]}


def app(password: str) -> tuple[EtcdCredentials, ...]:
    return (EtcdCredentials("app", password),)


async def can_write(
    endpoint: str, credentials: tuple[EtcdCredentials, ...], key: str = "/writer/probe"
) -> bool:
    try:
        async with EtcdClient(endpoint, timeout=3.0, credentials=credentials) as client:
            await client.put(key, "x")
    except (AuthFailed, AuthRequired, PermissionDenied):
        return False
    return True


def root_secret_name_of(cluster: str) -> str:
    return f"{cluster}-etcd-root"


def patch(kubectl: Kubectl, spec: dict[str, Any]) -> None:
    kubectl("patch", "etcdcluster", "auth", "--type=merge", "-p", json.dumps({"spec": spec}))


def root_secret(kubectl: Kubectl) -> dict[str, Any]:
    return dict(kubectl.get("secret", root_secret_name_of("auth")))


def test_a_role_nobody_declared_is_refused_naming_the_field(crds: None, kubectl: Kubectl) -> None:
    spec = auth_spec({"name": "app", "passwordSecret": {"name": "app-pw"}, "roles": ["nope"]})
    assert_rejected(kubectl, etcd_cluster("bad", 1, auth=spec), "spec.auth.users", "declared in roles")
    assert_rejected(kubectl, etcd_cluster("bad", 1, auth={"users": [{"name": "root"}]}), "root")


async def test_users_and_roles_are_kept_in_sync_and_root_rotation_keeps_the_operator_working(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    password_secret(kubectl, FIRST)
    kubectl.apply(etcd_cluster("auth", 3, auth=auth_spec(APP_USER)))
    status = await wait_healthy(kubectl, "auth", 3, timeout=180)
    url = status["members"][0]["clientUrl"]

    async def app_writes() -> bool:
        """Authentication on (a login gives a token), and app may write its prefix."""
        try:
            async with EtcdClient(url, timeout=3.0, credentials=app(FIRST)) as client:
                token = await client.login()
                await client.put("/writer/probe", "x")
        except (AuthFailed, AuthRequired, PermissionDenied):
            return False
        return token is not None

    await wait_until(app_writes, "user app to write its prefix", timeout=60)
    # Authentication is on: no token, no request; the role's prefix only.
    async with EtcdClient(url, timeout=3.0) as anonymous:
        with pytest.raises(AuthRequired):
            await anonymous.put("/writer/x", "x")
    async with EtcdClient(url, timeout=3.0, credentials=app(FIRST)) as client:
        with pytest.raises(PermissionDenied):
            await client.put("/elsewhere", "x")
        with pytest.raises(PermissionDenied):
            await client.range("/elsewhere")

    writer = Writer([m["clientUrl"] for m in status["members"]], credentials=(*app(FIRST), *app(SECOND)))
    writer.start()
    try:
        # A new password in the Secret: the new one logs in, the old one no longer.
        password_secret(kubectl, SECOND)

        async def password_moved() -> bool:
            return await can_write(url, app(SECOND)) and not await can_write(url, app(FIRST))

        await wait_until(password_moved, "the new password of app to take effect", timeout=60)

        # Root rotation on request: the Secret's password changes, and the operator keeps going.
        before = root_credentials(root_secret(kubectl))[0].password
        kubectl("annotate", "etcdcluster", "auth", "kustos.dev/rotate-root-password=now")

        async def rotated() -> bool:
            secret = root_secret(kubectl)
            return root_credentials(secret)[0].password != before and PENDING_KEY not in secret["data"]

        await wait_until(rotated, "root's password to rotate", timeout=60)
        after = root_credentials(root_secret(kubectl))[0].password
        async with EtcdClient(url, timeout=3.0, credentials=(EtcdCredentials("root", before),)) as old:
            with pytest.raises(AuthFailed):
                await old.status()
        # The operator's own paths log in with the new password: an agent pod's snapshot, a resize.
        backup = await take_backup(kubectl, "after-rotation", "auth")
        assert backup["location"]
        patch(kubectl, {"size": 1})
        status = await wait_healthy(kubectl, "auth", 1, timeout=120)
        writer.update(status)
        acknowledged = len(writer.acknowledged)

        async def writing() -> bool:
            return len(writer.acknowledged) > acknowledged + 20

        await wait_until(writing, "writes after the resize", timeout=30)
    finally:
        await writer.stop()
    assert await writer.missing(status["members"][0]["clientUrl"]) == []

    # A user the spec no longer declares is gone.
    patch(kubectl, {"auth": auth_spec()})

    async def app_gone() -> bool:
        try:
            async with EtcdClient(
                status["members"][0]["clientUrl"], timeout=3.0, credentials=app(SECOND)
            ) as c:
                await c.status()
        except AuthFailed:
            return True
        except EtcdError:
            return False
        return False

    await wait_until(app_gone, "user app to be deleted", timeout=60)

    # No password anywhere a user reads: the operator's log, Events, the cluster's status.
    values = dict(secret_values(kubectl, operator))
    for where, value in {
        "app's first password": FIRST,
        "root's first password": before,
        "root's password": after,
    }.items():
        values[where] = value
        values[f"{where} (base64)"] = base64.b64encode(value.encode()).decode()
    assert any(where.startswith(f"{root_secret_name_of('auth')}/") for where in values)
    texts = {
        "operator log": operator.log(),
        "events": kubectl("get", "events", "-o", "json"),
        "etcdclusters": kubectl("get", "etcdclusters", "-o", "json"),
        "etcdbackups": kubectl("get", "etcdbackups", "-o", "json"),
        "pods": kubectl("get", "pods", "-o", "json"),
    }
    leaks = [f"{where} in the {text}" for where, value in values.items() for text, content in texts.items()
             if value in content]  # fmt: skip
    assert leaks == []
    assert status_of(kubectl, "auth")["phase"] == "Running"
