"""``kustos run`` loads what the operator runs and nothing more.

Every module imported stays resident for the operator's life (benchmarks/idle_rss.py
measures each one: rich ~2 MiB, cryptography ~8 MiB, a second HTTP stack ~1 MiB), so the
heavy ones are imported where they are used. These tests assert the imports themselves,
in a fresh interpreter, not memory figures, which vary by machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Top-level packages the operator must not load just by starting.
NOT_ON_THE_OPERATOR_PATH = {
    "rich": "CLI output only: the dev cluster commands",
    "typer": "the other commands' framework: kustos run parses its options with argparse (kustos/run.py)",
    "click": "typer's base, as typer",
    "cryptography": "only when an EtcdCluster uses TLS (webhook certificates: a child process)",
    "httpx": "the API client's httpx2 serves the etcd client too",
    "obstore": "backup agent pods only",
    "websockets": "the first exec in a pod (Rook's StorageCluster only): ~1 MiB",
    "cronsim": "the first cron schedule evaluated (backups, defragmentation): ~0.9 MiB",
    "boto3": "only with --cloud-provider aws (botocore alone is ~20 MiB)",
    "botocore": "only with --cloud-provider aws",
    "google": "only with --cloud-provider gcp (google-cloud-compute: ~160 MiB, 5 s to import)",
    "grpc": "only with --cloud-provider gcp",
    "azure": "only with --cloud-provider azure (azure-mgmt-compute: ~140 MiB)",
    "lightkube": "the dev cluster's node agent only; kustos.runtime.kubeconfig reads kubeconfigs (~4 MiB)",
    "msgspec": "lightkube's models",
}


def printed_by(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def loaded_after(statement: str) -> set[str]:
    """The modules in sys.modules after ``statement`` runs in a fresh interpreter."""
    return set(
        json.loads(printed_by(f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"))
    )


AT_START = "import kustos.entry, kustos.run, kustos.controllers, kustos.runtime.manager"
"""What `kustos run` imports before it connects: its entry, the runtime, the family table."""

# The models of the kinds no family loaded at start uses (MaintenancePolicy's are: Envoy restarts
# and image overrides read the policy, and load with the etcd families).
LATE_MODELS = {
    "kustos.api.storage", "kustos.api.storageupgrade", "kustos.api.nodejob", "kustos.api.nodeimage",
    "kustos.api.scalinggroup", "kustos.api.pendingnode", "kustos.api.autoscaling",
}  # fmt: skip


def with_families(only_at_start: bool) -> set[str]:
    """The modules after AT_START and the families' own imports: those registered at start, or
    every one (each loaded on its first object, as in an operator with one object of each)."""
    chosen = "family.loads_on is None" if only_at_start else "True"
    return loaded_after(
        f"{AT_START}\nimport importlib\n"
        "for family in kustos.controllers.CONTROLLERS.values():\n"
        f"    if {chosen}:\n"
        "        importlib.import_module(family.module)"
    )


@pytest.fixture(scope="module")
def start_modules() -> set[str]:
    """What an operator with no object of the late families holds."""
    return with_families(only_at_start=True)


@pytest.fixture(scope="module")
def operator_modules() -> set[str]:
    return with_families(only_at_start=False)


def test_a_family_whose_kind_has_no_object_is_not_imported_at_start(start_modules: set[str]) -> None:
    """Each costs the idle operator its modules (issue 28: 3 MiB for the node, storage and
    maintenance families); the first object of its kind loads it."""
    from kustos.controllers import CONTROLLERS

    lazy = {name: family.module for name, family in CONTROLLERS.items() if family.loads_on}
    assert {"maintenance", "storagecluster", "nodeimage"} <= set(lazy)
    assert {name: module for name, module in lazy.items() if module in start_modules} == {}


def test_a_kind_whose_family_has_not_loaded_has_no_models_built_at_start(
    start_modules: set[str], operator_modules: set[str]
) -> None:
    """The operator watches such a kind by its coordinates alone (kustos.api.refs): its models
    cost an operator running etcd alone 0.6 MiB (issue 28), and load with its family."""
    assert LATE_MODELS & start_modules == set()
    assert operator_modules >= LATE_MODELS


@pytest.mark.parametrize("package", sorted(NOT_ON_THE_OPERATOR_PATH))
def test_the_operator_does_not_load(operator_modules: set[str], package: str) -> None:
    found = sorted(m for m in operator_modules if m == package or m.startswith(f"{package}."))
    assert not found, f"{package} ({NOT_ON_THE_OPERATOR_PATH[package]}) is imported by: {found[:5]}"


def test_the_operator_does_not_load_the_dev_cluster(operator_modules: set[str]) -> None:
    assert not sorted(m for m in operator_modules if m.startswith("kustos.devcluster"))


def test_webhook_certificates_are_made_and_read_without_loading_cryptography(tmp_path: Path) -> None:
    """The in-cluster default makes or reads its webhook certificate at every start."""
    cert = tmp_path / "tls.crt"
    modules = loaded_after(
        "from pathlib import Path\n"
        "from kustos.runtime.webhook import ServingCertificate\n"
        "made = ServingCertificate.self_signed(['kustos-webhook.kustos-system.svc'], ['127.0.0.1'], days=2)\n"
        f"Path({str(cert)!r}).write_bytes(made.cert_pem)\n"
        f"read = ServingCertificate.from_files(Path({str(cert)!r}), Path({str(cert)!r}))\n"
        "assert read.not_after == made.not_after.replace(microsecond=0), (read.not_after, made.not_after)\n"
    )
    assert b"BEGIN CERTIFICATE" in cert.read_bytes()
    assert "cryptography" not in modules


def test_the_clients_of_the_api_server_and_of_etcd_load_no_second_http_stack() -> None:
    """httpx2's own transport would load httpcore2, anyio and an HTTP/2 stack (~3 MiB) with
    the first client: every client of the operator uses ``runtime.transport`` instead."""
    modules = loaded_after(
        "from kustos.runtime.kube import connect\n"
        "from kustos.runtime.kubeconfig import KubeAccess\n"
        "from kustos.runtime.metrics import Metrics\n"
        "from kustos.etcd.client import _new_http\n"
        "connect(KubeAccess(server='https://127.0.0.1:6443'), Metrics())\n"
        "_new_http('http://127.0.0.1:2379', None)\n"
    )
    assert not {m.split(".")[0] for m in modules} & {"httpcore2", "anyio", "h2"}


def test_no_api_model_is_built_before_an_object_of_its_kind_is_read() -> None:
    """A built model holds its validator and serializer: a kind the cluster has no object of
    should cost the operator nothing but its classes."""
    code = (
        "import kustos.run, kustos.controllers, kustos.runtime.manager\n"
        "from kustos.runtime.crd import KubeModel\n"
        "def every(cls):\n"
        "    for sub in cls.__subclasses__():\n"
        "        yield sub\n"
        "        yield from every(sub)\n"
        "built = {m.__qualname__ for m in every(KubeModel) if m.__pydantic_complete__}\n"
        "print(sorted(built - {'CustomResource'}))"
    )
    built = printed_by(code).strip()
    assert built == "[]", f"built at import: {built}"


def test_controllers_load_no_cli() -> None:
    """Controllers are a library: typer belongs to the command line."""
    modules = loaded_after("import kustos.controllers")
    assert not {m.split(".")[0] for m in modules} & {"typer", "rich"}


def test_cli_default_cluster_name_is_the_dev_clusters() -> None:
    from kustos import cli
    from kustos.devcluster.cluster import DEFAULT_NAME

    assert cli.DEFAULT_NAME == DEFAULT_NAME


def test_cli_operator_namespace_is_the_dev_installs() -> None:
    from kustos import cli
    from kustos.devcluster.operator import NAMESPACE

    assert cli.OPERATOR_NAMESPACE == NAMESPACE
