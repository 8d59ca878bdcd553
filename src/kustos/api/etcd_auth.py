"""etcd authentication of an EtcdCluster: its users and roles, as etcd itself has them
(``etcdctl user``/``role``/``auth``), declared in the spec and kept in sync (issue 27)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kustos.api.common import Duration
from kustos.runtime.crd import KubeModel, Rule, kube_schema, list_map

ROTATE_ROOT_ANNOTATION = "kustos.dev/rotate-root-password"
"""Set (or change) this annotation on an EtcdCluster to rotate the operator's root password now."""

NAME_PATTERN = r"^[^\s]+$"


class SecretKeyRef(KubeModel):
    """A key of a Secret in the cluster's namespace."""

    name: str = Field(min_length=1)
    key: str = Field(default="password", min_length=1)


class EtcdUser(KubeModel):
    """One etcd user (``etcdctl user add``)."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    """The user name; with client certificates, the certificate's Common Name."""
    password_secret: SecretKeyRef | None = None
    """Where its password is (a changed value is applied within a resync). Without it the user
    has no password and logs in only by a client certificate whose CN is its name (spec.tls)."""
    roles: list[str] = Field(
        default_factory=list, max_length=32, json_schema_extra={"items": {"type": "string", "maxLength": 128}}
    )
    """Roles granted to it (declared in roles, or root)."""


class Permission(KubeModel):
    """A key range a role may read, write or both (``etcdctl role grant-permission``)."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[Rule("!(has(self.rangeEnd) && self.prefix)", "set at most one of rangeEnd and prefix")]
        )
    )

    type: Literal["read", "write", "readwrite"]
    key: str = Field(min_length=1, max_length=1024)
    """The key, or the start of the range."""
    prefix: bool = False
    """Every key starting with ``key``."""
    range_end: str | None = Field(default=None, min_length=1, max_length=1024)
    """The end of the range, exclusive (``\\0``: every key from ``key`` on)."""


class EtcdRole(KubeModel):
    """One etcd role (``etcdctl role add``) and its permissions."""

    name: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    permissions: list[Permission] = Field(default_factory=list, max_length=64)


class AuthSpec(KubeModel):
    """etcd users and roles. The operator logs in as ``root`` with a password it keeps in the
    Secret ``<cluster>-etcd-root`` (never shown elsewhere) and rotates it."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    "!has(self.users) || self.users.all(u, u.name != 'root')",
                    "root is the operator's own user: declare another",
                    field_path=".users",
                ),
                Rule(
                    "!has(self.users) || self.users.all(u, !has(u.roles) || u.roles.all(r, r == 'root' || "
                    "(has(self.roles) && self.roles.exists(d, d.name == r))))",
                    "every role granted in users must be declared in roles (or be root)",
                    field_path=".users",
                ),
                Rule(
                    "!has(self.roles) || self.roles.all(r, r.name != 'root')",
                    "the root role is etcd's own: grant it, do not declare it",
                    field_path=".roles",
                ),
            ]
        )
    )

    enabled: bool = True
    """etcd authentication on: every client logs in (a password, or a client certificate)."""
    users: list[EtcdUser] = Field(default_factory=list, max_length=64, json_schema_extra=list_map("name"))
    """The users etcd has besides root; others are deleted."""
    roles: list[EtcdRole] = Field(default_factory=list, max_length=64, json_schema_extra=list_map("name"))
    """The roles etcd has besides root; others are deleted."""
    root_rotation: Duration = "720h"
    """How often the operator changes its root password (default 30 days); the annotation
    kustos.dev/rotate-root-password asks for it now."""
