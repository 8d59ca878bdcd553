"""Where the API server is and who the operator is to it: the pod's service account, or one
context of a kubeconfig, read as client-go reads them.

kustos reads this itself rather than through lightkube: importing any part of lightkube
loads its whole package (its models among it), 4 to 6 MiB of the idle operator's memory
for a few dozen lines of YAML lookups (issue 28).

- In a pod: the service account's token, CA and namespace, and ``KUBERNETES_SERVICE_HOST``.
  The token file is read again every minute and after a 401, as client-go does, since the
  kubelet replaces the projected token before it expires.
- Else ``$KUBECONFIG`` (a ``:``-separated list, the first file naming an entry wins) or
  ``~/.kube/config``: the server, its CA (file or data) or ``insecure-skip-tls-verify``, and
  the user's client certificate (file or data), token, ``tokenFile``, exec plugin or basic
  credentials. Relative paths are relative to the file that names them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx2
import yaml

from kustos.runtime.times import parse_rfc3339

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
TOKEN_FILE_REREAD_SECONDS = 60.0  # client-go's cachingTokenSource for token files
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class KubeConfigError(ValueError):
    """A kubeconfig or service account that cannot be used, with what is wrong in it."""


@dataclass(frozen=True)
class ExecPlugin:
    """A ``users[].user.exec`` entry: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]


@dataclass(frozen=True)
class KubeAccess:
    """One API server and the credentials for it; ``*_data`` fields hold PEM bytes. The secrets
    stay out of its repr, so a log line or a traceback that shows it does not show them."""

    server: str
    namespace: str = "default"
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    client_cert_file: Path | None = None
    client_key_file: Path | None = None
    client_cert_data: bytes | None = None
    client_key_data: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    exec_plugin: ExecPlugin | None = None
    basic: tuple[str, str] | None = field(default=None, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """Verifies the server as the config says, and presents the client certificate if any."""
        if self.ca_file is not None or self.ca_data is not None:
            ctx = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file else None,
                cadata=self.ca_data.decode() if self.ca_data else None,
            )
        else:
            ctx = ssl.create_default_context()
            if self.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_file is not None or self.client_cert_data is not None:
            _load_client_certificate(ctx, self)
        return ctx

    def auth(self) -> httpx2.Auth | None:
        """The Authorization each request carries; None when the client certificate is the proof."""
        if self.token_file is not None:
            return TokenFileAuth(self.token_file, self.token)
        if self.token is not None:
            return StaticTokenAuth(self.token)
        if self.exec_plugin is not None:
            return ExecAuth(self.exec_plugin)
        if self.basic is not None:
            return httpx2.BasicAuth(*self.basic)
        return None


def _load_client_certificate(ctx: ssl.SSLContext, access: KubeAccess) -> None:
    """OpenSSL loads a certificate chain from files only: PEM data goes through a private
    temporary file that is gone once loaded."""
    if access.client_cert_data is None and access.client_key_data is None:
        ctx.load_cert_chain(str(access.client_cert_file), str(access.client_key_file))
        return
    cert = access.client_cert_data or Path(str(access.client_cert_file)).read_bytes()
    key = access.client_key_data or Path(str(access.client_key_file)).read_bytes()
    with tempfile.NamedTemporaryFile(prefix="kustos-client-", suffix=".pem") as pem:
        pem.write(cert.rstrip(b"\n") + b"\n" + key)
        pem.flush()
        ctx.load_cert_chain(pem.name)


class StaticTokenAuth(httpx2.Auth):
    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = self._header
        yield request


class TokenFileAuth(httpx2.Auth):
    """A token file read again once a minute and after a 401: the kubelet rotates projected
    service account tokens, and a token read once would expire under a long-running operator."""

    def __init__(
        self, path: Path, token: str | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._path = path
        self._clock = clock
        self._header = f"Bearer {token.strip()}" if token else None
        self._read_at = clock() if token else float("-inf")

    def _current(self, force: bool = False) -> str:
        if force or self._header is None or self._clock() - self._read_at >= TOKEN_FILE_REREAD_SECONDS:
            try:
                self._header = f"Bearer {self._path.read_text().strip()}"
            except OSError as err:
                if self._header is None:
                    raise KubeConfigError(f"token file {self._path}: {err.strerror or err}") from err
            self._read_at = self._clock()  # a failed read keeps the old token a minute more
        return self._header

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        request.headers["Authorization"] = self._current()
        response = yield request
        if response.status_code == 401:
            request.headers["Authorization"] = self._current(force=True)
            yield request


class ExecAuth(httpx2.Auth):
    """A credential plugin's token, asked for again when it expires or the server says 401."""

    def __init__(self, plugin: ExecPlugin) -> None:
        self._plugin = plugin
        self._header: str | None = None
        self._expires: datetime | None = None

    async def _ask(self) -> str:
        env = {**os.environ, **dict(self._plugin.env)}
        env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": self._plugin.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        )
        proc = await asyncio.create_subprocess_exec(
            self._plugin.command, *self._plugin.args, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        if proc.returncode != 0:
            said = err.decode(errors="replace").strip()[:500]
            command = self._plugin.command
            raise KubeConfigError(f"users[].user.exec: {command} exited {proc.returncode}: {said}")
        try:
            status = json.loads(out)["status"]
            token = status["token"]
        except (ValueError, KeyError, TypeError) as parse_err:
            raise KubeConfigError(
                f"users[].user.exec: {self._plugin.command} printed no ExecCredential with status.token"
            ) from parse_err
        self._expires = parse_rfc3339(status.get("expirationTimestamp"))
        return f"Bearer {token}"

    def _fresh(self) -> bool:
        return self._header is not None and (
            self._expires is None or self._expires > datetime.now(self._expires.tzinfo)
        )

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if not self._fresh():
            self._header = await self._ask()
        request.headers["Authorization"] = self._header or ""
        response = yield request
        if response.status_code == 401:
            self._header = await self._ask()
            request.headers["Authorization"] = self._header
            yield request


def load(kubeconfig: Path | None = None, context: str | None = None) -> KubeAccess:
    """An explicit kubeconfig, else in-cluster, else ``$KUBECONFIG`` or ~/.kube/config."""
    if kubeconfig is not None:
        return from_kubeconfig([kubeconfig], context)
    if (SERVICE_ACCOUNT / "token").exists() and "KUBERNETES_SERVICE_HOST" in os.environ:
        return in_cluster(SERVICE_ACCOUNT, os.environ)
    paths = os.environ.get("KUBECONFIG", "")
    files = [Path(p) for p in paths.split(os.pathsep) if p] or [DEFAULT_KUBECONFIG]
    return from_kubeconfig(files, context)


def in_cluster(account: Path, env: Mapping[str, str]) -> KubeAccess:
    host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    namespace_file = account / "namespace"
    return KubeAccess(
        server=f"https://{host}:{port}",
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else "default",
        ca_file=account / "ca.crt",
        token=(account / "token").read_text().strip(),
        token_file=account / "token",
    )


def from_kubeconfig(files: list[Path], context: str | None = None) -> KubeAccess:
    """The context named (else ``current-context``) of the kubeconfig these files make together."""
    merged: dict[str, dict[str, tuple[Path, dict[str, Any]]]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    read = 0
    for path in (f.expanduser() for f in files):
        if not path.is_file():
            continue
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise KubeConfigError(f"kubeconfig {path}: not YAML: {err}") from err
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path}: not a mapping")
        read += 1
        current = current or doc.get("current-context") or None
        for kind, merged_kind in merged.items():
            for entry in doc.get(kind) or []:
                name = entry.get("name") if isinstance(entry, dict) else None
                if name and name not in merged_kind:  # client-go: the first file to name it wins
                    merged_kind[name] = (path, entry.get(kind[:-1]) or {})
    if not read:
        raise KubeConfigError(f"no kubeconfig found at {', '.join(str(f) for f in files)} and not in a pod")
    name = context or current
    if not name or name not in merged["contexts"]:
        why = f"no context {name!r} in the kubeconfig" if name else "the kubeconfig has no current-context"
        raise KubeConfigError(why)
    _, ctx = merged["contexts"][name]
    cluster_path, cluster = _entry(merged, "cluster", ctx.get("cluster"), f"contexts[{name}].cluster")
    # A context without a user is anonymous (client-go's too); one naming a missing user is a mistake.
    user_path, user = (
        _entry(merged, "user", ctx["user"], f"contexts[{name}].user")
        if ctx.get("user")
        else (cluster_path, {})
    )
    if not cluster.get("server"):
        raise KubeConfigError(f"clusters[{ctx.get('cluster')}].cluster.server is empty")
    exec_entry = user.get("exec")
    return KubeAccess(
        server=str(cluster["server"]).rstrip("/"),
        namespace=str(ctx.get("namespace") or "default"),
        ca_file=_file(cluster_path, cluster.get("certificate-authority")),
        ca_data=_data(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert_file=_file(user_path, user.get("client-certificate")),
        client_key_file=_file(user_path, user.get("client-key")),
        client_cert_data=_data(user.get("client-certificate-data"), "client-certificate-data"),
        client_key_data=_data(user.get("client-key-data"), "client-key-data"),
        token=user.get("token"),
        token_file=_file(user_path, user.get("tokenFile")),
        exec_plugin=_exec(exec_entry) if exec_entry else None,
        basic=(user["username"], user["password"]) if user.get("username") and user.get("password") else None,
    )


def _entry(
    merged: dict[str, dict[str, tuple[Path, dict[str, Any]]]], kind: str, name: str | None, where: str
) -> tuple[Path, dict[str, Any]]:
    entries = merged[f"{kind}s"]
    if not name or name not in entries:
        raise KubeConfigError(f"{where}: no {kind} named {name!r} in the kubeconfig")
    return entries[name]


def _file(base: Path, value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else base.parent / path


def _data(value: str | None, key: str) -> bytes | None:
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as err:
        raise KubeConfigError(f"kubeconfig {key}: not base64") from err


def _exec(entry: dict[str, Any]) -> ExecPlugin:
    api_version = entry.get("apiVersion") or EXEC_API_VERSIONS[0]
    if api_version not in EXEC_API_VERSIONS:
        known = ", ".join(EXEC_API_VERSIONS)
        raise KubeConfigError(f"users[].user.exec.apiVersion {api_version!r} is not one of {known}")
    if not entry.get("command"):
        raise KubeConfigError("users[].user.exec.command is empty")
    return ExecPlugin(
        command=str(entry["command"]),
        args=tuple(str(a) for a in entry.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in entry.get("env") or ()),
        api_version=api_version,
    )
