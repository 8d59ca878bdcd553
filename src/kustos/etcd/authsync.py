"""The EtcdCluster controller's side of etcd authentication: the operator's root Secret, what
etcd has, and carrying out the step ``auth.plan`` chooses.

The root Secret ``<cluster>-etcd-root`` is the operator's: ``password`` is root's current
password, ``pending`` a new one while a rotation is under way. A rotation writes ``pending``
first, then changes etcd, then makes ``pending`` current; the operator logs in with
``password`` and, failing that, ``pending`` (``CredentialBook``), so a crash between any two
of those writes never locks it out. The Secret's annotations are the operator's ledger: when
root's password last changed, which rotation request it answered, and which version of each
user's password Secret it applied.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets as random
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.api.etcd_auth import ROTATE_ROOT_ANNOTATION
from kustos.etcd import auth
from kustos.etcd.client import CREDENTIALS, EtcdClient, EtcdCredentials, EtcdTLS, RolePermission
from kustos.etcd.pods import owned_metadata
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.informer import Informer
from kustos.runtime.resources import SECRETS
from kustos.runtime.times import parse_duration, parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Event = Callable[[EtcdCluster, str, str, bool], Awaitable[None]]

PASSWORD_KEY = "password"
PENDING_KEY = "pending"
PREVIOUS_KEY = "previous"
KEPT_PASSWORDS = 4
ROTATED_AT_ANNOTATION = "kustos.dev/root-rotated-at"
ROTATED_FOR_ANNOTATION = "kustos.dev/root-rotated-for"
APPLIED_ANNOTATION = "kustos.dev/applied-passwords"
AUTH_TIMEOUT = 5.0


def root_secret_name(cluster: EtcdCluster) -> str:
    return f"{cluster.metadata['name']}-etcd-root"


def new_password() -> str:
    return random.token_urlsafe(24)


def _value(secret: Obj, key: str) -> str | None:
    raw = (secret.get("data") or {}).get(key)
    return base64.b64decode(raw).decode() if raw else None


def _previous(secret: Obj) -> list[str]:
    return [p for p in (_value(secret, PREVIOUS_KEY) or "").splitlines() if p]


def root_credentials(secret: Obj | None) -> tuple[EtcdCredentials, ...]:
    """Root's current password, the one a rotation is moving to, then the last few it had: a
    member restored from an older snapshot has root's password of that time."""
    if secret is None:
        return ()
    found = (_value(secret, PASSWORD_KEY), _value(secret, PENDING_KEY), *_previous(secret))
    return tuple(EtcdCredentials(auth.ROOT, p) for p in dict.fromkeys(found) if p)


def _encoded(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def _annotations(secret: Obj) -> dict[str, str]:
    return dict(secret["metadata"].get("annotations") or {})


def applied_markers(secret: Obj) -> dict[str, str]:
    try:
        value = json.loads(_annotations(secret).get(APPLIED_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


class AuthSync:
    """The root Secret, the credential book, and one auth step per pass."""

    def __init__(self, api: Api, secrets: Informer, backups: Informer, event: Event) -> None:
        self.api = api
        self.secrets = secrets  # kustos's own Secrets (by the cluster label): the root Secret is one
        self.backups = backups
        self.event = event

    def _cached(self, cluster: EtcdCluster) -> Obj | None:
        return self.secrets.get(f"{cluster.metadata['namespace']}/{root_secret_name(cluster)}")

    async def identity(self, cluster: EtcdCluster, now: datetime) -> Obj | None:
        """The root Secret; None: no authentication. It is created when spec.auth is on, or when
        the cluster is restored from a backup of a cluster that had one: the restored members
        have that cluster's users, so its root passwords come along (as ``previous``)."""
        namespace = cluster.metadata["namespace"]
        cached = self._cached(cluster)
        wanted = cluster.spec.auth is not None and cluster.spec.auth.enabled
        unformed = cluster.spec.restore is not None and not (cluster.status and cluster.status.cluster_id)
        if cached is not None or not (wanted or unformed):
            return cached  # most passes of most clusters: no API call
        secret = await self.api.get(SECRETS, namespace, root_secret_name(cluster))
        if secret is not None:
            return secret
        inherited = await self._restored_from(cluster)
        if not inherited and not wanted:
            return None
        metadata = owned_metadata(cluster, root_secret_name(cluster))
        metadata["annotations"] = {ROTATED_AT_ANNOTATION: rfc3339(now)}
        data = {PASSWORD_KEY: _encoded(new_password())}
        if inherited:
            data[PREVIOUS_KEY] = _encoded("\n".join(c.password for c in inherited))
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "Opaque",
            "data": data,
        }
        try:
            return await self.api.create(SECRETS, manifest)
        except ApiStatusError as err:
            if not err.conflict:
                raise
            return await self.api.get(SECRETS, namespace, root_secret_name(cluster))

    async def _restored_from(self, cluster: EtcdCluster) -> tuple[EtcdCredentials, ...]:
        if cluster.spec.restore is None:
            return ()
        namespace = cluster.metadata["namespace"]
        backup = self.backups.get(f"{namespace}/{cluster.spec.restore.backup}")
        source = ((backup or {}).get("spec") or {}).get("clusterName")
        if not source or source == cluster.metadata["name"]:
            return ()
        return root_credentials(await self.api.get(SECRETS, namespace, f"{source}-etcd-root"))

    @staticmethod
    def remember(cluster: EtcdCluster, secret: Obj | None, endpoints: list[str]) -> None:
        """Every kustos client of these members logs in as root from now on."""
        if secret is not None:
            CREDENTIALS.remember(objects.key(cluster), endpoints, root_credentials(secret))

    async def desired(self, cluster: EtcdCluster, secret: Obj, now: datetime) -> auth.Desired:
        spec = cluster.spec.auth
        password = _value(secret, PASSWORD_KEY) or ""
        if spec is None or not spec.enabled:
            return auth.Desired(enabled=False, root_password=password)
        users: dict[str, auth.DesiredUser] = {}
        unreadable: set[str] = set()
        for user in spec.users:
            if user.password_secret is None:
                users[user.name] = auth.DesiredUser(user.name, frozenset(user.roles))
                continue
            ref = user.password_secret
            source = await self.api.get(SECRETS, cluster.metadata["namespace"], ref.name)
            value = _value(source, ref.key) if source is not None else None
            if source is None or not value:
                unreadable.add(user.name)
                continue
            marker = f"{ref.name}/{ref.key}/{source['metadata'].get('resourceVersion', '')}"
            users[user.name] = auth.DesiredUser(user.name, frozenset(user.roles), value, marker)
        roles = {
            role.name: frozenset(
                auth.permission(p.type, p.key, p.prefix, p.range_end) for p in role.permissions
            )
            for role in spec.roles
        }
        notes = _annotations(secret)
        requested = (cluster.metadata.get("annotations") or {}).get(ROTATE_ROOT_ANNOTATION, "")
        due = auth.rotation_due(
            parse_rfc3339(notes.get(ROTATED_AT_ANNOTATION)), now, parse_duration(spec.root_rotation),
            requested, notes.get(ROTATED_FOR_ANNOTATION, ""),
        )  # fmt: skip
        return auth.Desired(
            enabled=True, root_password=password, users=users, roles=roles, unreadable=frozenset(unreadable),
            pending_root=_value(secret, PENDING_KEY), rotation_due=due,
        )  # fmt: skip

    @staticmethod
    async def observe(client: EtcdClient, secret: Obj, wanted: bool) -> auth.ObservedAuth:
        """What etcd has (only whether auth is on, when the spec no longer asks for it)."""
        status = await client.auth_status()
        if not wanted:
            return auth.ObservedAuth(status.enabled, {}, {})
        users = {u: frozenset(await client.user_roles(u)) for u in await client.user_list()}
        roles = {r: frozenset(await client.role_permissions(r)) for r in await client.role_list()}
        # Logged in with an older root password (a member restored from an older snapshot)?
        used = client.logged_in_as
        current = used is None or used.password in (_value(secret, PASSWORD_KEY), _value(secret, PENDING_KEY))
        return auth.ObservedAuth(status.enabled, users, roles, applied_markers(secret), root_current=current)

    async def sync(self, cluster: EtcdCluster, endpoint: str, tls: EtcdTLS | None, now: datetime) -> bool:
        """One step towards spec.auth through one healthy member; True when it did something."""
        if self._cached(cluster) is None:
            return False  # no root Secret: authentication was never asked for
        # Afresh: the ledger in its annotations must include this operator's last writes.
        secret = await self.api.get(SECRETS, cluster.metadata["namespace"], root_secret_name(cluster))
        if secret is None:
            return False
        desired = await self.desired(cluster, secret, now)
        if desired.unreadable:  # left as they are in etcd meanwhile (an Event aggregates repeats)
            missing = ", ".join(sorted(desired.unreadable))
            message = f"spec.auth.users: no password in the passwordSecret of {missing}; waiting for it"
            await self.event(cluster, "EtcdUserWaiting", message, True)
        async with EtcdClient(endpoint, tls, AUTH_TIMEOUT, root_credentials(secret)) as client:
            observed = await self.observe(client, secret, desired.enabled)
            step = auth.plan(desired, observed)
            if isinstance(step, auth.InSync):
                return False
            log.info("auth step: %s", step)
            await self._act(cluster, client, secret, step, now)
        return True

    async def _act(
        self, cluster: EtcdCluster, client: EtcdClient, secret: Obj, step: auth.AuthStep, now: datetime
    ) -> None:
        say = self.event
        match step:
            case auth.EnableAuth():
                await client.auth_enable()
                await say(cluster, "EtcdAuthEnabled", "etcd authentication is on: clients log in", False)
            case auth.DisableAuth():
                await client.auth_disable()
                await say(
                    cluster,
                    "EtcdAuthDisabled",
                    "etcd authentication is off: spec.auth does not ask for it",
                    True,
                )
            case auth.StartRootRotation():
                await self._patch(secret, {"data": {PENDING_KEY: _encoded(new_password())}})
            case auth.FinishRootRotation(password=password):
                await client.user_change_password(auth.ROOT, password)
                requested = (cluster.metadata.get("annotations") or {}).get(ROTATE_ROOT_ANNOTATION, "")
                notes = {ROTATED_AT_ANNOTATION: rfc3339(now), ROTATED_FOR_ANNOTATION: requested}
                kept = list(
                    dict.fromkeys(p for p in [_value(secret, PASSWORD_KEY) or "", *_previous(secret)] if p)
                )
                await self._patch(secret, {
                    "metadata": {"annotations": notes},
                    "data": {PASSWORD_KEY: _encoded(password), PENDING_KEY: None,
                             PREVIOUS_KEY: _encoded("\n".join(kept[:KEPT_PASSWORDS]))},
                })  # fmt: skip
                await say(
                    cluster,
                    "EtcdRootRotated",
                    f"the operator's root password changed ({root_secret_name(cluster)})",
                    False,
                )
            case auth.AddRole(role=role):
                await client.role_add(role)
                await say(cluster, "EtcdRoleAdded", f"added etcd role {role}", False)
            case auth.GrantPermission(role=role, permission=permission):
                await client.role_grant_permission(role, permission)
                await say(cluster, "EtcdPermissionGranted", f"role {role}: {describe(permission)}", False)
            case auth.RevokePermission(role=role, permission=permission):
                await client.role_revoke_permission(role, permission.key, permission.range_end)
                await say(
                    cluster, "EtcdPermissionRevoked", f"role {role}: no longer {describe(permission)}", False
                )
            case auth.AddUser(user=user, password=password, marker=marker):
                await client.user_add(user, password)
                await self._applied(secret, user, marker)
                await say(cluster, "EtcdUserAdded", f"added etcd user {user}", False)
            case auth.ChangePassword(user=user, password=password, marker=marker):
                await client.user_change_password(user, password)
                await self._applied(secret, user, marker)
                await say(
                    cluster,
                    "EtcdPasswordChanged",
                    f"set the password of etcd user {user} from its Secret",
                    False,
                )
            case auth.GrantRole(user=user, role=role):
                await client.user_grant_role(user, role)
                await say(cluster, "EtcdRoleGranted", f"granted role {role} to etcd user {user}", False)
            case auth.RevokeRole(user=user, role=role):
                await client.user_revoke_role(user, role)
                await say(cluster, "EtcdRoleRevoked", f"revoked role {role} from etcd user {user}", False)
            case auth.DeleteUser(user=user):
                await client.user_delete(user)
                await say(
                    cluster,
                    "EtcdUserDeleted",
                    f"deleted etcd user {user}: spec.auth.users does not declare it",
                    False,
                )
            case auth.DeleteRole(role=role):
                await client.role_delete(role)
                await say(
                    cluster,
                    "EtcdRoleDeleted",
                    f"deleted etcd role {role}: spec.auth.roles does not declare it",
                    False,
                )

    async def _applied(self, secret: Obj, user: str, marker: str) -> None:
        if marker:
            markers = {**applied_markers(secret), user: marker}
            await self._patch(
                secret,
                {"metadata": {"annotations": {APPLIED_ANNOTATION: json.dumps(markers, sort_keys=True)}}},
            )

    async def _patch(self, secret: Obj, patch: Obj) -> None:
        await self.api.patch(SECRETS, objects.namespace(secret), objects.name(secret), patch)


def describe(permission: RolePermission) -> str:
    """A permission as etcdctl shows it (keys are the user's, never secret)."""
    key = permission.key.decode(errors="replace")
    if not permission.range_end:
        return f"{permission.type} {key}"
    end = permission.range_end.decode(errors="replace")
    return f"{permission.type} [{key}, {end})"
