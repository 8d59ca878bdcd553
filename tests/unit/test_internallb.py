"""The internal load balancer's pure parts, and its node writer against a real HAProxy.

Every configuration the renderer can produce is checked by HAProxy itself (``haproxy -c``,
Debian's package, which ``kustos dev build`` caches).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kustos.api.maintenance import MaintenancePolicySpec
from kustos.cli import app
from kustos.devcluster.binaries import binary_path
from kustos.devcluster.ports import free_port
from kustos.maintenance import internallb, planner
from kustos.maintenance.internallb import (
    ApiServer,
    ApplyLoadBalancer,
    LoadBalancerView,
    RemoveLoadBalancer,
    Settings,
    WriterView,
    api_servers,
    render_config,
    writer_daemonset,
)
from kustos.maintenance.internallb_node import ReloadFailed, master_command, write
from kustos.maintenance.planner import NodeView, Observed, PodView, TaintOutOfService

NOW = datetime(2026, 11, 26, tzinfo=UTC)
OWNER = {"apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy",
         "metadata": {"name": "default", "uid": "u-1"}}  # fmt: skip
IMAGE = "ghcr.io/kustos/kustos:1.0"


def haproxy() -> str:
    cached = binary_path("haproxy")
    found = str(cached) if cached.is_file() else shutil.which("haproxy")
    if found is None:
        pytest.skip("HAProxy is not installed: run `kustos dev build`")
    return found


def check(config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    return subprocess.run([haproxy(), "-c", "-f", str(path)], capture_output=True, text=True, check=False)


def spec(**changes: object) -> MaintenancePolicySpec:
    return MaintenancePolicySpec.model_validate({"enableInternalLoadBalancer": True, **changes})


SERVERS = (ApiServer("cp-1", "10.0.0.1"), ApiServer("cp-2", "10.0.0.2", 8443))


# ---- the configuration ------------------------------------------------------------------


node_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
hosts = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
servers = st.lists(
    st.builds(ApiServer, node_names, hosts, st.integers(1, 65535)), max_size=5, unique_by=lambda s: s.node
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(found=servers, bind=st.sampled_from(["127.0.0.1", "::1", "10.64.0.1"]), port=st.integers(1024, 65535))
def test_every_generated_configuration_passes_haproxy_check(
    found: list[ApiServer], bind: str, port: int, tmp_path: Path
) -> None:
    result = check(render_config(found, bind, port), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_configuration_listens_on_localhost_6444_and_names_every_server(tmp_path: Path) -> None:
    config = render_config(SERVERS)

    assert "bind 127.0.0.1:6444" in config
    assert "server cp-1 10.0.0.1:6443" in config
    assert "server cp-2 10.0.0.2:8443" in config
    assert check(config, tmp_path).returncode == 0


def test_the_default_spec_is_ekcos() -> None:
    default = MaintenancePolicySpec()

    assert default.enable_internal_load_balancer is False
    assert default.internal_load_balancer_port == 6444
    assert default.internal_load_balancer_haproxy_image == "haproxy:lts-alpine"


def test_a_bind_address_that_is_not_an_ip_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="internalLoadBalancerBindAddress"):
        MaintenancePolicySpec.model_validate({"internalLoadBalancerBindAddress": "1.2.3"})


# ---- the servers ------------------------------------------------------------------------


def test_kubeadms_annotation_wins_over_the_internal_ip_and_a_node_without_address_is_left_out() -> None:
    found = api_servers(
        {"cp-1": "10.0.0.1", "cp-2": "10.0.0.2", "cp-3": ""},
        {"cp-2": "192.168.0.2:7443", "cp-4-not-control-plane": "1.1.1.1:1"},
    )

    assert found == (ApiServer("cp-1", "10.0.0.1", 6443), ApiServer("cp-2", "192.168.0.2", 7443))


@given(servers)
def test_a_server_survives_the_writers_arguments(found: list[ApiServer]) -> None:
    assert [ApiServer.parse(str(s)) for s in found] == found


# ---- the plan ----------------------------------------------------------------------------


def writer(digest: str, namespace: str = "kube-system", **counts: int) -> WriterView:
    return WriterView(namespace, digest, **counts)


def test_the_writer_is_applied_when_on_and_kept_while_the_servers_stay() -> None:
    view = LoadBalancerView(SERVERS, None, IMAGE)

    step = internallb.plan(spec(), view)

    assert isinstance(step, ApplyLoadBalancer) and step.settings.servers == SERVERS
    applied = LoadBalancerView(SERVERS, writer(step.settings.digest()), IMAGE)
    assert internallb.plan(spec(), applied) is None


def test_a_control_plane_node_leaving_rewrites_every_node() -> None:
    before = Settings.of(spec(), SERVERS, IMAGE)
    view = LoadBalancerView(SERVERS[:1], writer(before.digest()), IMAGE)

    step = internallb.plan(spec(), view)

    assert isinstance(step, ApplyLoadBalancer) and step.settings.servers == SERVERS[:1]


def test_without_a_control_plane_address_nothing_is_written_and_the_status_says_why() -> None:
    view = LoadBalancerView((), None, IMAGE)

    assert internallb.plan(spec(), view) is None
    status = internallb.status(spec(), view)
    assert status is not None and "waiting for a control-plane node" in status.message


def test_switched_off_the_writer_goes_and_a_moved_namespace_starts_over() -> None:
    view = LoadBalancerView(SERVERS, writer("x", "kurl"), IMAGE)

    assert internallb.plan(spec(enableInternalLoadBalancer=False), view) == RemoveLoadBalancer(
        "kurl", "enableInternalLoadBalancer is off"
    )
    assert isinstance(internallb.plan(spec(), view), RemoveLoadBalancer)
    assert internallb.plan(spec(enableInternalLoadBalancer=False), LoadBalancerView(SERVERS)) is None


def test_the_status_counts_nodes_rolled_out() -> None:
    digest = Settings.of(spec(), SERVERS, IMAGE).digest()
    rolling = internallb.status(
        spec(), LoadBalancerView(SERVERS, writer(digest, desired=5, updated=3, ready=4), IMAGE)
    )
    done = internallb.status(
        spec(), LoadBalancerView(SERVERS, writer(digest, desired=5, updated=5, ready=5), IMAGE)
    )

    assert rolling is not None and rolling.nodes_updated == "3/5" and "one node at a time" in rolling.message
    assert done is not None and done.nodes_updated == "5/5" and done.servers == [str(s) for s in SERVERS]
    assert internallb.status(spec(enableInternalLoadBalancer=False), LoadBalancerView(SERVERS)) is None


def test_clearing_a_fenced_node_comes_before_the_load_balancer() -> None:
    down = NodeView("w-1", ready=False, unreachable_since=NOW, fenced_at=NOW)
    o = Observed(spec(), (NodeView("cp-1", True, True), down), now=NOW,
                 load_balancer=LoadBalancerView(SERVERS, None, IMAGE))  # fmt: skip

    assert isinstance(planner.plan(o), TaintOutOfService)
    calm = Observed(spec(), (NodeView("cp-1", True, True),), pods=(PodView("a", "b", "u", None),), now=NOW,
                    load_balancer=LoadBalancerView(SERVERS, None, IMAGE))  # fmt: skip
    step = planner.plan(calm)
    assert isinstance(step, ApplyLoadBalancer)
    status = planner.status(calm, step, NOW)
    assert status.last_action is not None and status.last_action.action == "InternalLoadBalancer"
    assert status.internal_load_balancer is not None
    assert status.internal_load_balancer.message == "writing the new configuration to the nodes"


# ---- the writer on a node -----------------------------------------------------------------


def test_the_daemonsets_arguments_write_what_the_renderer_renders(tmp_path: Path) -> None:
    settings_ = Settings.of(spec(internalLoadBalancerPort=7444), SERVERS, IMAGE)
    daemonset = writer_daemonset(settings_, OWNER)
    init = daemonset["spec"]["template"]["spec"]["initContainers"][0]
    argv = [a.replace("/host/", f"{tmp_path}/") for a in init["command"][1:]]

    result = CliRunner().invoke(app, argv)

    assert result.exit_code == 0, result.output
    assert (tmp_path / "etc/haproxy/haproxy.cfg").read_text() == render_config(SERVERS, "127.0.0.1", 7444)
    pod = yaml.safe_load((tmp_path / "etc/kubernetes/manifests/haproxy.yaml").read_text())
    assert pod["spec"]["containers"][0]["image"] == "haproxy:lts-alpine"
    assert pod["spec"]["containers"][0]["livenessProbe"]["tcpSocket"] == {"host": "127.0.0.1", "port": 7444}
    assert daemonset["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    again = CliRunner().invoke(app, argv)
    assert "the files were current" in again.output


@pytest.fixture
def running_haproxy(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A real HAProxy in master-worker mode on a loopback port, as the static pod runs it."""
    etc, run = tmp_path / "haproxy", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "haproxy.cfg").write_text(render_config(SERVERS, "127.0.0.1", free_port()))
    process = subprocess.Popen(
        [haproxy(), "-W", "-db", "-S", f"{run}/master.sock,mode,600", "-f", f"{etc}/haproxy.cfg"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not (run / "master.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield etc, run
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)


def test_a_running_haproxy_is_reloaded_and_a_refused_configuration_fails_the_writer(
    running_haproxy: tuple[Path, Path], tmp_path: Path
) -> None:
    etc, run = running_haproxy
    manifests = tmp_path / "manifests"

    port = free_port()
    done = write(list(SERVERS[:1]), port, "127.0.0.1", "haproxy:lts-alpine", etc, manifests, run)

    assert "reloaded" in done
    assert "server cp-2" not in (etc / "haproxy.cfg").read_text()
    assert "1 [failed: 0]" in master_command(run / "master.sock", "show proc")
    with pytest.raises(ReloadFailed, match="refused the new configuration"):
        write([ApiServer("cp-1", "10.0.0.1", 6443)], port, "not-an-address", "x", etc, manifests, run)
