"""Maintenance of TLS clusters, the local part: which client certificate the operator reads,
what it says when it cannot, and where its files live (and that they go away)."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.api.etcd import EtcdCluster
from kustos.etcd import tls
from kustos.etcd.certs import CertificateManager, operator_certificates, secret_problem
from kustos.runtime.api import Api
from kustos.runtime.informer import Informer
from kustos.runtime.manager import Manager

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
KEYS = ("tls.crt", "tls.key", "ca.crt")


def cluster(tls_spec: dict[str, Any] | None) -> EtcdCluster:
    spec: dict[str, Any] = {"size": 3}
    if tls_spec is not None:
        spec["tls"] = tls_spec
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "main", "namespace": "prod", "uid": "c1"}, "spec": spec,
    })  # fmt: skip


def secret(name: str, data: dict[str, bytes]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "prod"},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


@pytest.fixture(scope="module")
def client_data() -> dict[str, bytes]:
    ca = tls.new_ca("test CA", NOW)
    pair = tls.issue(ca, "kustos-operator", NOW, timedelta(days=1), server=False)
    return {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert}


class Secrets:
    """The Secret cache as the certificate code reads it (``get("namespace/name")``)."""

    def __init__(self, *secrets: dict[str, Any]) -> None:
        self.items = {f"{s['metadata']['namespace']}/{s['metadata']['name']}": s for s in secrets}
        self.asked: list[str] = []

    def get(self, key: str) -> dict[str, Any] | None:
        self.asked.append(key)
        return self.items.get(key)


class Absent:
    """An API that has no such Secret either."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def get(self, _ref: Any, namespace: str, name: str) -> None:
        self.asked.append(f"{namespace}/{name}")


def certificates(tmp_path: Path, *secrets: dict[str, Any]) -> tuple[CertificateManager, Secrets, Absent]:
    cache, api = Secrets(*secrets), Absent()
    return CertificateManager(cast(Api, api), cast(Informer, cache), tmp_path), cache, api


# ---- secret_problem ---------------------------------------------------------------------


def test_a_missing_secret_is_named() -> None:
    assert secret_problem("my-client", None) == "TLS Secret my-client does not exist"


@given(st.sets(st.sampled_from(KEYS)))
def test_a_secret_is_usable_exactly_when_it_has_all_three_keys(present: set[str]) -> None:
    problem = secret_problem("s", secret("s", dict.fromkeys(present, b"pem")))
    missing = [k for k in KEYS if k not in present]
    if not missing:
        assert problem is None
    else:
        assert problem == f"TLS Secret s lacks {', '.join(missing)}"


# ---- client_tls: read-only, from the Secret the EtcdCluster controller keeps -----------------


async def test_a_plain_cluster_needs_no_certificate_and_reads_nothing(tmp_path: Path) -> None:
    manager, cache, api = certificates(tmp_path)
    assert await manager.client_tls(cluster(None)) == (None, None)
    assert cache.asked == [] and api.asked == [] and list(tmp_path.iterdir()) == []


async def test_the_generated_client_certificate_is_used_as_files_only_the_operator_reads(
    tmp_path: Path, client_data: dict[str, bytes]
) -> None:
    manager, _, api = certificates(tmp_path, secret("main-client-tls", client_data))
    client, problem = await manager.client_tls(cluster({}))
    assert problem is None and client is not None
    assert client.ca_file and client.cert_file and client.key_file
    assert client.ca_file.read_bytes() == client_data["ca.crt"]
    assert client.cert_file.read_bytes() == client_data["tls.crt"]
    assert client.key_file.read_bytes() == client_data["tls.key"]
    assert stat.S_IMODE(client.key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(client.key_file.parent.stat().st_mode) == 0o700
    client.ssl_context()  # a usable certificate chain: the key belongs to the certificate
    assert api.asked == []  # found in the cache


async def test_a_users_operator_client_secret_is_used(tmp_path: Path, client_data: dict[str, bytes]) -> None:
    secrets = {"peer": "my-peer", "server": "my-server", "operatorClient": "my-client"}
    manager, _, _ = certificates(tmp_path, secret("my-client", client_data))
    client, problem = await manager.client_tls(cluster({"secrets": secrets}))
    assert problem is None and client is not None and client.cert_file is not None
    assert client.cert_file.read_bytes() == client_data["tls.crt"]


async def test_no_client_certificate_yet_is_a_reason_not_an_error(tmp_path: Path) -> None:
    manager, _, api = certificates(tmp_path)
    assert await manager.client_tls(cluster({})) == (None, "TLS Secret main-client-tls does not exist")
    assert api.asked == ["prod/main-client-tls"]  # not in the cache: asked the API
    incomplete = secret("main-client-tls", {"ca.crt": b"pem"})
    manager, _, _ = certificates(tmp_path, incomplete)
    lacking = "TLS Secret main-client-tls lacks tls.crt, tls.key"
    assert await manager.client_tls(cluster({})) == (None, lacking)


async def test_a_renewed_secret_replaces_the_files(tmp_path: Path, client_data: dict[str, bytes]) -> None:
    first, _, _ = certificates(tmp_path, secret("main-client-tls", client_data))
    old, _ = await first.client_tls(cluster({}))
    renewed = {**client_data, "tls.crt": b"renewed"}
    second, _, _ = certificates(tmp_path, secret("main-client-tls", renewed))
    new, _ = await second.client_tls(cluster({}))
    assert old is not None and new is not None and old.cert_file == new.cert_file
    assert new.cert_file is not None and new.cert_file.read_bytes() == b"renewed"


# ---- where the files live ---------------------------------------------------------------------


def test_without_a_workdir_the_files_go_to_a_private_temporary_directory() -> None:
    manager = CertificateManager(cast(Api, Absent()), cast(Informer, Secrets()))
    workdir = manager.workdir
    assert workdir.is_dir() and workdir.name.startswith("kustos-etcd-tls-")
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
    manager.cleanup()
    assert not workdir.exists()


def test_a_given_workdir_is_left_alone(tmp_path: Path) -> None:
    manager = CertificateManager(cast(Api, Absent()), cast(Informer, Secrets()), tmp_path)
    manager.cleanup()
    assert tmp_path.is_dir()


def test_the_temporary_directory_is_removed_when_the_process_exits(tmp_path: Path) -> None:
    script = (
        "from kustos.etcd.certs import CertificateManager\n"
        "m = CertificateManager(None, None)\n"
        "(m.workdir / 'x' / 'y').mkdir(parents=True)\n"
        "(m.workdir / 'x' / 'y' / 'tls.key').write_text('k')\n"
        "print(m.workdir)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    workdir = Path(result.stdout.strip())
    assert workdir.parent == tmp_path and workdir.name.startswith("kustos-etcd-tls-")
    assert not workdir.exists() and list(tmp_path.iterdir()) == []


def test_no_directory_is_made_before_the_first_client_files(tmp_path: Path) -> None:
    script = "from kustos.etcd.certs import CertificateManager\nm = CertificateManager(None, None)\n"
    script += "import os\nos._exit(0)\n"  # as a SIGKILL would: no cleanup
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert list(tmp_path.iterdir()) == []


class FakeManager:
    """What ``operator_certificates`` uses of a manager: its API and its shared informers."""

    def __init__(self) -> None:
        self.api = Absent()
        self.informers: list[Any] = []

    def informer(self, resource: Any, options: Any) -> Secrets:
        self.informers.append((resource.plural, options.label_selector))
        return Secrets()


def test_every_controller_of_a_manager_shares_one_certificate_manager() -> None:
    one, other = FakeManager(), FakeManager()
    first = operator_certificates(cast(Manager, one))
    assert operator_certificates(cast(Manager, one)) is first
    assert operator_certificates(cast(Manager, other)) is not first
    assert one.informers == [("secrets", "kustos.dev/cluster")]  # the EtcdCluster controller's cache
    workdir = first.workdir
    del first
    del one  # the manager is gone: so is its directory
    assert not workdir.exists()
