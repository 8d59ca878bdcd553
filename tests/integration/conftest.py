"""Fixtures for integration tests: one real local control plane per test session.

Nothing here skips: a missing binary is built, and a build or start failure
fails the session, in CI and on a laptop alike (SPEC F-DEV).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from httpx2 import Timeout
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig, running_clusters
from kustos.devcluster.kwokconfig import Timings
from kustos.devcluster.paths import cache_root
from kustos.devcluster.pids import alive
from tests.integration.api_reads import ReadingCluster
from tests.integration.operator import OperatorProcess
from tests.integration.runner_use import MARKER as RUNNER_MARKER
from tests.integration.runner_use import RunnerUse

WORKERS = 4
# The session's control plane (``dev_cluster``), named for this process.
SESSION_CLUSTER = f"pytest-{os.getpid()}"
REPO = Path(__file__).resolve().parents[2]
CLONE_NEWNS = 0x00020000


def _private_resolv_conf() -> Path:
    """Give this test session its own mount namespace whose /etc/resolv.conf is a file we
    write: the host's until the cluster runs (builds may fetch Go modules), then the
    cluster DNS.

    Tests (httpx, etcdctl) reach members by the DNS names the operator gives them, as
    anything in the cluster would. It happens at import, before pytest starts a thread:
    a process with threads cannot leave its mount namespace. Everything the session starts
    (control plane, agent, pods) shares the namespace, so it goes away with them.
    """
    path = Path(f"/tmp/kustos-resolv-{os.getpid()}.conf")
    path.write_text(Path("/etc/resolv.conf").read_text())
    atexit.register(path.unlink, missing_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if threading.active_count() > 1 or libc.unshare(CLONE_NEWNS) != 0:
        raise RuntimeError(
            f"cannot enter a private mount namespace (errno {ctypes.get_errno()}, "
            f"{threading.active_count()} threads): the integration tests need root"
        )
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "--bind", str(path), "/etc/resolv.conf"], check=True)
    return path


SESSION_RESOLV_CONF = _private_resolv_conf()


def _cache_bytecode() -> None:
    """Let the Python processes the session starts (about 115 operators a run, the agent,
    CLIs) reuse compiled bytecode instead of compiling kustos and its dependencies at every
    start: this machine sets ``PYTHONDONTWRITEBYTECODE`` and the venv holds no bytecode, which
    cost an operator about 0.9 s of CPU per start, seconds under load (docs/benchmarks.md).
    The cache lives outside the checkout (keyed by each source's path and mtime, written
    atomically, so sessions side by side share it), as an image built with compiled bytecode
    would ship it."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", str(cache_root() / "pycache"))


_cache_bytecode()


def remove_abandoned_clusters(prefix: str) -> None:
    """Clusters named ``<prefix><pid>`` whose test process died before its teardown."""
    for name in running_clusters():
        owner = name.removeprefix(prefix)
        if name.startswith(prefix) and owner.isdigit() and not alive(int(owner)):
            DevCluster(DevClusterConfig(name=name)).stop()


RUNNER_USE = RunnerUse(DevCluster(DevClusterConfig(name=SESSION_CLUSTER)).agent_log)
# Each collected module's reason for the process runner (runner_use), None when it gives none.
RUNNER_REASONS: dict[str, str | None] = {}


def module_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker(RUNNER_MARKER)
        RUNNER_REASONS[module_of(item.nodeid)] = str(marker.args[0]) if marker else None
    full_profile = [item for item in items if item.get_closest_marker("proof_full")]
    if full_profile:
        from tests.integration.test_proof import profile_name  # collected, so imported already

        if profile_name() == "short":
            config.hook.pytest_deselected(items=full_profile)
            items[:] = [item for item in items if item not in full_profile]


def pytest_runtest_logfinish(nodeid: str) -> None:
    RUNNER_USE.count(module_of(nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = RUNNER_USE.report(RUNNER_REASONS)
    if lines:
        terminalreporter.section("process runner (tests/integration/runner_use.py)")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def dev_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    """The session's control plane: four workers, fast node-failure timings. At its end the
    API server's audit log is read (``check_least_privilege``)."""
    binaries.build()
    remove_abandoned_clusters("pytest-")
    cluster = ReadingCluster(
        DevClusterConfig(
            name=SESSION_CLUSTER,
            worker_nodes=WORKERS,
            timings=Timings.fast(),
            restart_backoff=(0.5, 4.0),
        )
    )
    try:
        cluster.start(timeout=180)
        # Only the cluster DNS (NXDOMAIN for every other name: nothing leaves the machine);
        # the cluster.local search domain completes the short names the operator reports
        # (``<pod>.<service>.<ns>.svc``), as in a pod.
        SESSION_RESOLV_CONF.write_text(f"search cluster.local\nnameserver {cluster.dns_server}\n")
        yield cluster
        print(f"\nkubectl calls: {cluster.served} served in-process, {cluster.forwarded} by kubectl")
        check_least_privilege(cluster, request.session, tmp_path_factory.getbasetemp())
    finally:
        if request.session.testsfailed:
            keep_control_plane_logs(cluster, tmp_path_factory.getbasetemp())
        # KUSTOS_KEEP_CLUSTER=1 leaves it running to look at after a failure; the next
        # session removes it.
        if os.environ.get("KUSTOS_KEEP_CLUSTER") != "1":
            cluster.stop()


def keep_control_plane_logs(cluster: DevCluster, out: Path) -> None:
    """A failed session keeps its control plane's and node agent's logs (the cluster's state
    goes with it): a failure that depends on the cluster's moment (a node missing heartbeats)
    can only be explained from them."""
    kept = out / "control-plane-logs"
    try:
        shutil.copytree(cluster.cluster_dir / "logs", kept, ignore=shutil.ignore_patterns("audit.log"),
                        dirs_exist_ok=True)  # fmt: skip
        for log in cluster.state_dir.glob("*.log"):
            shutil.copyfile(log, kept / log.name)
    except OSError as err:
        print(f"\ncould not keep the control plane's logs: {err}")
        return
    print(f"\ncontrol plane logs of the failed session: {kept}")


def check_least_privilege(cluster: DevCluster, session: pytest.Session, out: Path) -> None:
    """No request by the operator's identity (the chart's ServiceAccount) was refused, and, after
    the whole suite, every permission the chart grants was used or has its reason in
    docs/install.md. The report goes to ``<pytest tmp>/least-privilege.txt``."""
    from kustos.devcluster import operator as dev_operator
    from tests.integration import audit

    chart = str(dev_operator.chart_dir())
    # As the session's release (operator.SESSION_VALUES): with exec in Rook's namespace.
    grants = audit.chart_grants(audit.rendered(dev_operator.helm(cluster, "template", "kustos", chart,
                                "--namespace", "kustos-system", "--set", "rook.enabled=true",
                                "--set", "rook.namespace=kustos-rook")), "cluster mode")  # fmt: skip
    grants += audit.chart_grants(audit.rendered(dev_operator.helm(cluster, "template", "kustos", chart,
                                 "--namespace", "kustos-system", "--set", "namespaces={team-a,team-b}")),
                                 "namespaced mode")  # fmt: skip
    reasons = audit.justified((REPO / "docs" / "install.md").read_text())
    # Kept beside the report: the cluster's state goes with the session.
    kept = out / "audit.log"
    shutil.copyfile(cluster.audit_log, kept)
    result = audit.coverage(audit.read_requests(kept), grants, reasons)
    report = out / "least-privilege.txt"
    report.write_text(result.report())
    print(f"\nleast-privilege report: {report}")
    if result.denied:
        denied = "\n".join(f"  {r.user} {r.verb} {r.resource} {r.namespace}/{r.name}" for r in result.denied)
        pytest.fail(f"the API server refused the operator's identity (report: {report}):\n{denied}")
    modules = {Path(str(item.path)).name for item in session.items}
    shard_report = os.environ.get("KUSTOS_SHARD_REPORT")
    if shard_report:
        # One of parallel sessions (tests/shards.py): the runner decides on their union.
        unjustified = [str(g) for g in result.unjustified]
        Path(shard_report).write_text(json.dumps({"modules": sorted(modules), "unjustified": unjustified}))
    whole_suite = {p.name for p in Path(__file__).parent.glob("test_*.py")} <= modules
    enforce = (whole_suite and not session.testsfailed) or os.environ.get("KUSTOS_AUDIT_COVERAGE") == "1"
    if enforce and result.unjustified:
        unused = "\n".join(f"  {g}" for g in result.unjustified)
        pytest.fail(
            f"the chart grants permissions no request used and docs/install.md does not justify "
            f"(under '{audit.JUSTIFIED_HEADING}'; report: {report}):\n{unused}"
        )


@pytest.fixture(scope="session")
async def kube(dev_cluster: DevCluster) -> AsyncIterator[AsyncClient]:
    # lightkube's 10 s default is shorter than the API server can take under three sessions'
    # load (a burst of patches to one object once took longer); client-go waits without limit.
    config = KubeConfig.from_file(dev_cluster.kubeconfig)
    client = AsyncClient(config=config, field_manager="kustos-test", timeout=Timeout(60.0))
    yield client
    await client.close()


@pytest.fixture
async def namespace(kube: AsyncClient, dev_cluster: DevCluster) -> AsyncIterator[str]:
    """A fresh namespace per test, removed (with all it holds) afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    await kube.create(Namespace.from_dict({"metadata": {"name": name}}))  # type: ignore[attr-defined]
    # Pods are refused until the namespace's default ServiceAccount exists. kube-controller-manager
    # creates it, seconds (once 57 s) later when it is busy emptying the namespaces of earlier
    # tests; made here it is there at once, and the controller leaves it as it is.
    try:
        await kube.create(ServiceAccount.from_dict({"metadata": {"name": "default"}}), namespace=name)  # type: ignore[attr-defined]
    except ApiError as err:
        if err.status.code != 409:  # the controller was first
            raise
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class Kubectl:
    """kubectl bound to the session cluster and one namespace, speaking dicts."""

    def __init__(self, cluster: DevCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    def __call__(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        return self.cluster.kubectl("-n", self.namespace, *args, check=check, input_text=input_text)

    def apply(self, *documents: dict[str, Any]) -> None:
        self("apply", "-f", "-", input_text=yaml.safe_dump_all(documents))

    def get(self, kind: str, name: str | None = None, *selector: str) -> Any:
        args = ["get", kind] + ([name] if name else []) + list(selector)
        return json.loads(self(*args, "-o", "json"))


@pytest.fixture
def kubectl(dev_cluster: DevCluster, namespace: str) -> Kubectl:
    return Kubectl(dev_cluster, namespace)


@pytest.fixture(scope="module")
def crds(dev_cluster: DevCluster) -> None:
    """kustos's CRDs, installed (and established) once per module that asks."""
    from tests.integration.etcd_support import install_crds  # it imports this module

    install_crds(dev_cluster)


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    """``kustos run`` with every kustos controller, scoped to the test's namespace."""
    from tests.integration.etcd_support import running_operator

    with running_operator(kubectl, tmp_path / "operator") as process:
        yield process
