"""Reading a kubeconfig or a pod's service account as client-go does: the server, how it is
verified, and the credentials each request carries, against a real TLS server."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from kustos.etcd import tls
from kustos.runtime.kube import connect
from kustos.runtime.kubeconfig import KubeAccess, KubeConfigError, TokenFileAuth, from_kubeconfig, in_cluster
from kustos.runtime.metrics import Metrics

EXEC = "client.authentication.k8s.io"
V1 = f"{EXEC}/v1"


def write_kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any], **extra: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "k", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "dev", "context": {"cluster": "k", "user": "u", **extra}}],
    }))  # fmt: skip
    return path


class ApiServer:
    """An HTTPS server that requires a client certificate or a token, and answers who it saw."""

    def __init__(self, tmp: Path) -> None:
        now = datetime.now(UTC)
        self.ca = tls.new_ca("kube-ca", now)
        serving = tls.issue(self.ca, "apiserver", now, timedelta(days=1), ips=("127.0.0.1",))
        (tmp / "serving.pem").write_bytes(serving.cert + serving.key)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca.cert.decode())
        self.context.verify_mode = ssl.CERT_OPTIONAL
        self.context.load_cert_chain(tmp / "serving.pem")
        self.tokens = {"good"}
        self.seen: list[str] = []
        self.port = 0

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        cert = writer.get_extra_info("peercert")
        subject = dict(pair[0] for pair in cert["subject"]) if cert else {}
        who = f"cert:{subject['commonName']}" if subject else headers.get("Authorization", "anonymous")
        self.seen.append(who)
        allowed = subject or headers.get("Authorization", "").removeprefix("Bearer ") in self.tokens
        body = json.dumps({"who": who}).encode()
        status = "200 OK" if allowed else "401 Unauthorized"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> ApiServer:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0, ssl=self.context)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    def leaf(self, name: str) -> tls.KeyPair:
        return tls.issue(self.ca, name, datetime.now(UTC), timedelta(days=1), server=False)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pems() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("kustos-client-*.pem"))


@pytest.fixture
async def api_server(tmp_path: Path) -> AsyncIterator[ApiServer]:
    async with ApiServer(tmp_path) as server:
        yield server


async def ask(access: KubeAccess) -> tuple[int, str]:
    """One request through the client the operator builds from ``access``."""
    clients = connect(access, Metrics())
    try:
        response = await clients.raw.get("/version")
        return response.status_code, response.json()["who"]
    finally:
        await clients.close()


async def test_client_certificate_and_ca_as_data(tmp_path: Path, api_server: ApiServer) -> None:
    leaf = api_server.leaf("kustos-operator")
    config = write_kubeconfig(
        tmp_path / "config",
        {"client-certificate-data": _b64(leaf.cert), "client-key-data": _b64(leaf.key)},
        {
            "server": f"https://127.0.0.1:{api_server.port}",
            "certificate-authority-data": _b64(api_server.ca.cert),
        },
    )
    before = pems()
    assert await ask(from_kubeconfig([config])) == (200, "cert:kustos-operator")
    assert pems() == before  # the key went through a private file, gone once loaded


async def test_files_are_read_relative_to_the_kubeconfig(tmp_path: Path, api_server: ApiServer) -> None:
    leaf = api_server.leaf("admin")
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(api_server.ca.cert)
    (tmp_path / "pki" / "admin.crt").write_bytes(leaf.cert)
    (tmp_path / "pki" / "admin.key").write_bytes(leaf.key)
    config = write_kubeconfig(
        tmp_path / "config",
        {"client-certificate": "pki/admin.crt", "client-key": "pki/admin.key"},
        {"server": f"https://127.0.0.1:{api_server.port}/", "certificate-authority": "pki/ca.crt"},
        namespace="team-a",
    )
    access = from_kubeconfig([config])
    assert (access.server, access.namespace) == (f"https://127.0.0.1:{api_server.port}", "team-a")
    assert await ask(access) == (200, "cert:admin")


async def test_a_server_the_ca_did_not_sign_is_refused(tmp_path: Path, api_server: ApiServer) -> None:
    other = tls.new_ca("someone-else", datetime.now(UTC))
    config = write_kubeconfig(
        tmp_path / "config", {"token": "good"},
        {"server": f"https://127.0.0.1:{api_server.port}",
         "certificate-authority-data": base64.b64encode(other.cert).decode()},
    )  # fmt: skip
    with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await ask(from_kubeconfig([config]))
    insecure = write_kubeconfig(
        tmp_path / "insecure", {"token": "good"},
        {"server": f"https://127.0.0.1:{api_server.port}", "insecure-skip-tls-verify": True},
    )  # fmt: skip
    assert await ask(from_kubeconfig([insecure])) == (200, "Bearer good")


async def test_in_cluster_the_rotated_token_is_read_again_after_a_401(
    tmp_path: Path, api_server: ApiServer
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(api_server.ca.cert)
    (account / "namespace").write_text("kustos-system")
    (account / "token").write_text("good\n")
    access = in_cluster(
        account, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api_server.port)}
    )
    assert (access.server, access.namespace) == (f"https://127.0.0.1:{api_server.port}", "kustos-system")
    assert await ask(access) == (200, "Bearer good")
    # The kubelet rotated the token and the old one expired: the next request still gets through.
    api_server.tokens = {"rotated"}
    (account / "token").write_text("rotated\n")
    assert await ask(access) == (200, "Bearer rotated")
    assert api_server.seen[-2:] == ["Bearer good", "Bearer rotated"]
    assert in_cluster(account, {"KUBERNETES_SERVICE_HOST": "fd00::1"}).server == "https://[fd00::1]:443"


def test_a_token_file_is_read_again_each_minute(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one")
    now = [0.0]
    auth = TokenFileAuth(token, clock=lambda: now[0])
    request = httpx2.Request("GET", "https://k8s/api")
    assert next(auth.auth_flow(request)).headers["Authorization"] == "Bearer one"
    token.write_text("two")
    now[0] = 59.0
    assert next(auth.auth_flow(request)).headers["Authorization"] == "Bearer one"
    now[0] = 60.0
    assert next(auth.auth_flow(request)).headers["Authorization"] == "Bearer two"
    token.unlink()  # a failed read keeps the token it has
    now[0] = 130.0
    assert next(auth.auth_flow(request)).headers["Authorization"] == "Bearer two"


async def test_an_exec_plugin_token_is_asked_for_again_when_it_expires(
    tmp_path: Path, api_server: ApiServer
) -> None:
    calls = tmp_path / "calls"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os, sys\n"
        f"n = len(open({str(calls)!r}).read()) if os.path.exists({str(calls)!r}) else 0\n"
        f"open({str(calls)!r}, 'a').write('x')\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "expired = '2000-01-01T00:00:00Z' if n == 0 else '2999-01-01T00:00:00Z'\n"
        "status = {'token': os.environ['TOKEN'] + str(n), 'expirationTimestamp': expired}\n"
        "print(json.dumps({'apiVersion': sys.argv[1], 'kind': 'ExecCredential', 'status': status}))\n"
    )
    api_server.tokens = {"good0", "good1"}
    config = write_kubeconfig(
        tmp_path / "config",
        {"exec": {"apiVersion": V1, "command": sys.executable, "args": [str(plugin), V1],
                  "env": [{"name": "TOKEN", "value": "good"}]}},
        {"server": f"https://127.0.0.1:{api_server.port}",
         "certificate-authority-data": base64.b64encode(api_server.ca.cert).decode()},
    )  # fmt: skip
    access = from_kubeconfig([config])
    clients = connect(access, Metrics())
    try:
        for _ in range(3):
            assert (await clients.raw.get("/version")).status_code == 200
    finally:
        await clients.close()
    # The first token came back already expired: asked again once, then kept.
    assert api_server.seen == ["Bearer good0", "Bearer good1", "Bearer good1"]
    assert calls.read_text() == "xx"


def test_kubeconfig_files_merge_and_the_first_to_name_an_entry_wins(tmp_path: Path) -> None:
    first = write_kubeconfig(tmp_path / "a", {"token": "a"}, {"server": "https://a:6443"})
    second = tmp_path / "b"
    second.write_text(yaml.safe_dump({
        "current-context": "other",
        "clusters": [{"name": "k", "cluster": {"server": "https://b:6443"}},
                     {"name": "kb", "cluster": {"server": "https://kb:6443"}}],
        "users": [{"name": "ub", "user": {"token": "b"}}],
        "contexts": [{"name": "other", "context": {"cluster": "kb", "user": "ub"}}],
    }))  # fmt: skip
    assert (from_kubeconfig([tmp_path / "missing", first, second]).server) == "https://a:6443"
    chosen = from_kubeconfig([second, first])
    assert (chosen.server, chosen.token) == ("https://kb:6443", "b")
    assert from_kubeconfig([first, second], context="other").server == "https://kb:6443"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"current-context": "dev", "contexts": []}, "no context 'dev' in the kubeconfig"),
        ({"contexts": [{"name": "dev", "context": {"cluster": "k"}}]}, "has no current-context"),
        ({"current-context": "dev", "contexts": [{"name": "dev", "context": {"cluster": "gone"}}]},
         r"contexts\[dev\].cluster: no cluster named 'gone'"),
        ({"current-context": "dev", "contexts": [{"name": "dev", "context": {"cluster": "k", "user": "x"}}],
          "clusters": [{"name": "k", "cluster": {"server": "https://k"}}]},
         r"contexts\[dev\].user: no user named 'x'"),
        ({"current-context": "dev", "contexts": [{"name": "dev", "context": {"cluster": "k"}}],
          "clusters": [{"name": "k", "cluster": {}}]}, r"clusters\[k\].cluster.server is empty"),
        ({"current-context": "dev", "contexts": [{"name": "dev", "context": {"cluster": "k", "user": "u"}}],
          "clusters": [{"name": "k", "cluster": {"server": "https://k"}}],
          "users": [{"name": "u", "user": {"exec": {"command": "x", "apiVersion": f"{EXEC}/v1alpha1"}}}]},
         r"exec.apiVersion 'client.authentication.k8s.io/v1alpha1' is not one of"),
    ],
)  # fmt: skip
def test_a_kubeconfig_that_cannot_be_used_says_what_is_wrong(
    tmp_path: Path, doc: dict[str, Any], message: str
) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=message):
        from_kubeconfig([path])


def test_no_kubeconfig_at_all_names_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=f"no kubeconfig found at {tmp_path}/none and not in a pod"):
        from_kubeconfig([tmp_path / "none"])
