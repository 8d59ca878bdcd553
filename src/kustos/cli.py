"""The ``kustos`` command.

``kustos run``, the operator, is not built here: ``kustos.entry`` hands it to ``kustos.run``
before this application is imported (its ``run`` command below forwards to the same parser).
rich and the dev cluster's code are imported inside the commands that use them (a unit test
holds the line; benchmarks/idle_rss.py measures what each import costs).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from kustos.etcd import cli as etcd_cli
from kustos.maintenance import certs_cli, internallb_node, purge_cli
from kustos.storage import upgrade_cli

if TYPE_CHECKING:
    from rich.console import Console

    from kustos.devcluster.cluster import DevCluster

app = typer.Typer(
    help="kustos: operators for clustered data stores and the nodes beneath them.",
    no_args_is_help=True,
)
dev = typer.Typer(help="The local control plane (etcd, kube-apiserver, kwok) to develop and demo on.")
app.add_typer(dev, name="dev")
app.add_typer(etcd_cli.etcd, name="etcd")
app.add_typer(upgrade_cli.storage, name="storage")
app.command("purge-node")(purge_cli.purge_node)
app.add_typer(internallb_node.internal_lb, name="internal-lb")
app.add_typer(certs_cli.maintenance, name="maintenance")
proof = typer.Typer(help="Record histories of clients on a test etcd cluster and check them (docs/proof.md).")
app.add_typer(proof, name="proof")

# kustos.devcluster.cluster.DEFAULT_NAME (a unit test holds them equal), not imported from there.
DEFAULT_NAME = "kustos"


@functools.cache
def _rich_console() -> Console:
    from rich.console import Console

    # soft_wrap: paths and export lines must stay copy-pasteable on narrow terminals.
    return Console(soft_wrap=True)


class _LazyConsole:
    """The rich Console, made on first use: ``kustos run`` prints one line at most, and would
    otherwise carry rich (~2 MiB resident) for its whole life."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_rich_console(), name)


console = cast("Console", _LazyConsole())

NameOption = Annotated[str, typer.Option("--name", help="Name of the dev cluster.")]


# Real nodes `kustos dev up` starts: one per member of the sample (its members spread one a
# node, as the default anti-affinity prefers), the operator's two pods on two of them.
DEFAULT_REAL_NODES = 3


def _cluster(name: str, workers: int = 3, fast: bool = False, real_nodes: int = 0) -> DevCluster:
    from kustos.devcluster.cluster import DevCluster, DevClusterConfig
    from kustos.devcluster.kwokconfig import Timings

    timings = Timings.fast() if fast else Timings()
    config = DevClusterConfig(name=name, worker_nodes=workers, timings=timings, real_nodes=real_nodes)
    return DevCluster(config)


@dev.command("build")
def dev_build(
    image: Annotated[
        bool, typer.Option("--image/--no-image", help="Also kustos's image, if this tree's is not built.")
    ] = True,
    test_servers: Annotated[
        bool,
        typer.Option(
            "--test-servers/--no-test-servers",
            help="Also the servers only the test suite runs (MinIO): a long build `dev up` never needs.",
        ),
    ] = False,
) -> None:
    """Build the missing control-plane, node, etcd and kwok binaries (runc and haproxy from
    Debian), and kustos's image from deploy/Dockerfile, which `kustos dev up` runs on its real nodes."""
    from kustos.devcluster import binaries, kustosimage

    missing = binaries.missing_binaries(with_test_servers=test_servers)
    debian = binaries.missing_debian_packages()
    started = time.monotonic()
    try:
        if not missing and not debian:
            total = len(binaries.all_binaries(with_test_servers=test_servers)) + len(binaries.DEBIAN_PACKAGES)
            console.print(f"all {total} binaries are cached in {binaries.bin_dir()}")
        else:
            binaries.install_debian_packages(debian, log=console.print)
            binaries.build(missing, log=console.print)
            console.print(
                f"built {len(missing) + len(debian)} binaries in {time.monotonic() - started:.0f}s"
                f" into {binaries.bin_dir()}"
            )
        if image:
            archive = kustosimage.current_archive(log=console.print)
            console.print(f"kustos's image of this tree: {archive}")
    except binaries.BuildError as err:
        console.print(f"[red]{err}")
        raise typer.Exit(1) from err


@dev.command("image")
def dev_image() -> None:
    """Build kustos's image from deploy/Dockerfile with buildah (bases made with mmdebstrap);
    real nodes started afterwards have it."""
    from kustos.devcluster import binaries, kustosimage

    try:
        kustosimage.build(log=console.print)
    except binaries.BuildError as err:
        console.print(f"[red]{err}")
        raise typer.Exit(1) from err


@dev.command("up")
def dev_up(
    name: NameOption = DEFAULT_NAME,
    workers: Annotated[int, typer.Option(help="Worker nodes to create.")] = 3,
    real_nodes: Annotated[
        int,
        typer.Option(
            help="Real worker nodes (kubelet, containerd, runc) beside the kwok ones; the operator and "
            "the sample run there, from kustos's image (built if missing). 0: everything on kwok nodes, "
            "pods run by the process runner."
        ),
    ] = DEFAULT_REAL_NODES,
    fast: Annotated[bool, typer.Option(help="Test timings: dead nodes are noticed in seconds.")] = False,
    sample: Annotated[
        bool, typer.Option("--sample/--no-sample", help="Run the operator and a sample EtcdCluster.")
    ] = True,
) -> None:
    """Start the local control plane in the background, the operator, and a sample EtcdCluster."""
    from kustos.devcluster import binaries, kustosimage
    from kustos.devcluster.cluster import DevClusterError, require_privileges

    cluster = _cluster(name, workers, fast, real_nodes)
    try:
        image = None
        if real_nodes and not cluster.is_running():
            require_privileges()  # before a build of minutes that could not be used
            # Before the nodes start: each imports it while its kubelet is not yet up.
            image = kustosimage.current_archive(log=console.print)
        cluster.start(log=console.print, kustos_image=image)
        if sample:
            _run_sample(cluster)
    except (DevClusterError, binaries.BuildError) as err:
        console.print(f"[red]{err}")
        raise typer.Exit(1) from err
    console.print()
    console.print("The dev cluster runs in the background. Use it with:")
    console.print(f"  export KUBECONFIG={cluster.kubeconfig}")
    console.print(f"  {cluster.kubectl_path} get etcdclusters     (or: kustos dev kubectl get etcdclusters)")
    console.print(
        f"The operator runs in {OPERATOR_NAMESPACE}; its pods' logs: kustos dev logs{_name_flag(name)}"
    )
    console.print(f"Stop it all and remove its state with: kustos dev down{_name_flag(name)}")


SAMPLE = "example"
# kustos.devcluster.operator.NAMESPACE (a unit test holds them equal), not imported from there.
OPERATOR_NAMESPACE = "kustos-system"


def _run_sample(cluster: DevCluster) -> None:
    """The operator installed by its chart, and a three-member EtcdCluster shown converging
    until it is Ready."""
    from rich.live import Live
    from rich.table import Table

    from kustos.devcluster import binaries
    from kustos.devcluster import operator as dev_operator
    from kustos.devcluster.cluster import DevClusterError

    # As users install it: the chart (CRDs, RBAC, webhooks, the Deployment) into
    # kustos-system; its two pods run kustos's image (on real nodes) as the chart's
    # ServiceAccount, with the kwok cloud provider for the node families.
    real = bool(cluster.real_nodes())
    values = dev_operator.write_dev_values(cluster, real_nodes=real)
    console.print(f"installing the operator: helm upgrade --install kustos {dev_operator.chart_dir()} "
                  f"--namespace {dev_operator.NAMESPACE} --values {values} ...")  # fmt: skip
    try:
        dev_operator.install(cluster, values_file=values)
        dev_operator.wait_ready(cluster, 2, timeout=180, log=console.print)
    except dev_operator.InstallError as err:
        raise DevClusterError(str(err)) from err
    group = dev_operator.start_kwok_group(cluster)
    console.print(f"kwok node group {dev_operator.KWOK_GROUP} ({dev_operator.KWOK_IMAGE}): {' '.join(group)}")
    if not cluster.kubectl("get", "etcdcluster", SAMPLE, "--ignore-not-found", "-o", "name"):
        where = "the etcd image on real nodes" if real else "real etcd processes"
        console.print(f"creating EtcdCluster {SAMPLE} (3 members, {where}) ...")
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(sample_manifest(real)))
    started = time.monotonic()
    deadline = started + 180
    status: dict[str, object] = {}
    with Live(console=_rich_console(), refresh_per_second=4) as live:
        while True:
            found = cluster.kubectl("get", "etcdcluster", SAMPLE, "-o", "json", check=False)
            status = json.loads(found).get("status", {}) if found else {}
            table = Table(title=f"EtcdCluster {SAMPLE}  {time.monotonic() - started:.0f}s")
            for column in ("member", "id", "client URL", "healthy", "leader", "learner"):
                table.add_column(column)
            for m in status.get("members", []) or []:  # type: ignore[union-attr]
                table.add_row(m.get("name", ""), m.get("id", ""), m.get("clientUrl", ""),
                              "yes" if m.get("healthy") else "no", "*" if m.get("leader") else "",
                              "yes" if m.get("learner") else "")  # fmt: skip
            table.caption = f"READY {status.get('ready', '0/3')}  PHASE {status.get('phase', '-')}"
            live.update(table)
            if status.get("ready") == "3/3" and status.get("phase") == "Running":
                break
            if time.monotonic() > deadline:
                logs = f"kustos dev logs{_name_flag(cluster.config.name)}"
                raise DevClusterError(f"EtcdCluster {SAMPLE} was not ready within 180s; see {logs}")
            time.sleep(0.5)
    console.print()
    console.out(cluster.kubectl("get", "etcdclusters"))
    # The members' client URLs are cluster DNS names; from the host, their pod IPs reach them.
    ips = cluster.kubectl("get", "pods", "-l", f"kustos.dev/cluster={SAMPLE}", "-o",
                          "jsonpath={.items[*].status.podIP}").split()  # fmt: skip
    urls = ",".join(f"http://{ip}:2379" for ip in ips)
    console.print(f"Reach it with: {binaries.binary_path('etcdctl')} --endpoints={urls} member list -w table")
    console.print(f"(its members' DNS names resolve through the cluster DNS at {cluster.dns_server})")


def sample_manifest(real_nodes: bool) -> dict[str, Any]:
    """The sample: three members by their DNS names (the default addressing); with real
    nodes, held to them by a nodeSelector, as a user pins a workload to a node pool."""
    spec: dict[str, Any] = {"size": 3}
    if real_nodes:
        from kustos.devcluster.realnode import REAL_NODE_LABEL

        spec["pod"] = {"nodeSelector": {REAL_NODE_LABEL: "true"}}
    return {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
            "metadata": {"name": SAMPLE, "namespace": "default"}, "spec": spec}  # fmt: skip


def _name_flag(name: str) -> str:
    return "" if name == DEFAULT_NAME else f" --name {name}"


@dev.command("down")
def dev_down(name: NameOption = DEFAULT_NAME) -> None:
    """Stop the control plane, the agent and every pod process; remove the cluster's state."""
    cluster = _cluster(name)
    cluster.stop()
    console.print(f"dev cluster {name} is stopped and its state removed")


@dev.command("status")
def dev_status(name: NameOption = DEFAULT_NAME) -> None:
    """Show the components and nodes of the dev cluster."""
    from rich.table import Table

    cluster = _cluster(name)
    state = cluster.status()
    components = Table(title=f"dev cluster {name}")
    for column in ("component", "pid", "running"):
        components.add_column(column)
    for c in state["components"]:
        components.add_row(c["name"], str(c["pid"] or "-"), "yes" if c["running"] else "no")
    console.print(components)
    if state["nodes"]:
        nodes = Table(title="nodes")
        for column in ("node", "roles", "ready"):
            nodes.add_column(column)
        for n in state["nodes"]:
            nodes.add_row(n["name"], ",".join(n["roles"]), n["ready"])
        console.print(nodes)
        if state.get("network"):
            net = state["network"]
            console.print(
                f"pod network {net['cidr']} on bridge {net['bridge']}; API server and cluster DNS "
                f"at {net['gateway']}"
            )
        _print_operator_pods(cluster)
        console.print(f"export KUBECONFIG={state['kubeconfig']}")
    else:
        console.print("not running")
        raise typer.Exit(1)


def _print_operator_pods(cluster: DevCluster) -> None:
    """The chart's operator pods: phase, node, and which one holds the Lease."""
    from kustos.devcluster import operator as dev_operator

    pods = dev_operator.operator_pods(cluster)
    if not pods:
        console.print(f"no operator pods in {OPERATOR_NAMESPACE}")
        return
    leader = dev_operator.leader_pod(cluster)
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        phase = (pod.get("status") or {}).get("phase", "-")
        role = "leader" if pod_name == leader else "standby"
        console.print(f"operator pod {pod_name}  {phase}  {role}  node {pod['spec'].get('nodeName', '-')}")


@dev.command("logs")
def dev_logs(
    name: NameOption = DEFAULT_NAME,
    tail: Annotated[int, typer.Option(help="Lines per pod.")] = 200,
) -> None:
    """The operator's logs: every pod of the chart's Deployment, each line prefixed with its pod."""
    from kustos.devcluster import operator as dev_operator

    cluster = _cluster(name)
    if not cluster.is_running():
        console.print(f"dev cluster {name} is not running")
        raise typer.Exit(1)
    _print_operator_pods(cluster)
    if not dev_operator.operator_pods(cluster):
        raise typer.Exit(1)
    console.out(dev_operator.logs(cluster, tail=tail), end="")


NodeArgument = Annotated[str, typer.Argument(help="Node name, e.g. kustos-worker-1.")]


@dev.command("partition")
def dev_partition(node: NodeArgument, name: NameOption = DEFAULT_NAME) -> None:
    """Cut a node off the network: its pods are unreachable, their processes keep running."""
    _cluster(name).partition_node(node)
    console.print(f"node {node} is partitioned (heal it with: kustos dev heal {node}{_name_flag(name)})")


@dev.command("heal")
def dev_heal(node: NodeArgument, name: NameOption = DEFAULT_NAME) -> None:
    """End a node's partition: its pods are reachable again and its heartbeat resumes."""
    _cluster(name).heal_node(node)
    console.print(f"node {node} is healed")


@dev.command("stop-node")
def dev_stop_node(node: NodeArgument, name: NameOption = DEFAULT_NAME) -> None:
    """Stop a node: its heartbeat stops and its pods' processes are killed."""
    _cluster(name).take_node_down(node)
    console.print(f"node {node} is stopped (start it with: kustos dev start-node {node}{_name_flag(name)})")


@dev.command("start-node")
def dev_start_node(node: NodeArgument, name: NameOption = DEFAULT_NAME) -> None:
    """Start a stopped node again: its heartbeat resumes and its pods' containers restart."""
    _cluster(name).bring_node_up(node)
    console.print(f"node {node} is started")


@dev.command(
    "kubectl",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def dev_kubectl(ctx: typer.Context, name: NameOption = DEFAULT_NAME) -> None:
    """Run the dev cluster's kubectl against it: ``kustos dev kubectl get pods -A``."""
    cluster = _cluster(name)
    command = [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), *ctx.args]
    raise typer.Exit(subprocess.call(command, env=os.environ.copy()))


@app.command("crds")
def crds(
    write: Annotated[
        Path | None, typer.Option(help="Write one file per CRD into this directory (e.g. deploy/crds).")
    ] = None,
) -> None:
    """Print the CustomResourceDefinitions generated from the models in kustos.api."""
    from kustos.api.resources import RESOURCES
    from kustos.runtime.crd import render_crds, write_crds

    if write is None:
        console.out(render_crds(RESOURCES), end="")
        return
    for path in write_crds(RESOURCES, write):
        console.print(f"wrote {path}")


@app.command(
    "run",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def run(ctx: typer.Context) -> None:
    """Run the operator: every kustos controller, against the current cluster (options: kustos run --help)."""
    from kustos.run import main as run_operator

    raise typer.Exit(run_operator(ctx.args))


@app.command("chart")
def chart(
    write: Annotated[
        Path | None, typer.Option(help="Regenerate the chart's generated files (e.g. deploy/helm/kustos).")
    ] = None,
) -> None:
    """Print (or write) values.schema.json of the Helm chart, generated from its values model."""
    from kustos.install import chart as chart_files

    if write is None:
        console.out(chart_files.generated()[chart_files.SCHEMA], end="")
        return
    for path in chart_files.write(write):
        console.print(f"wrote {path}")


@proof.command("record")
def proof_record(
    endpoint: Annotated[list[str], typer.Option(help="An etcd client URL (repeatable): test clusters only.")],
    out: Annotated[Path, typer.Option(help="The history file to write (JSON lines).")],
    scenario: Annotated[str, typer.Option(help="The report's name for this run.")] = "",
    clients: Annotated[int, typer.Option(help="Concurrent clients.")] = 4,
    watchers: Annotated[int, typer.Option(help="Concurrent watches of the whole prefix.")] = 2,
    rate: Annotated[float, typer.Option(help="Calls a second, all clients together.")] = 200.0,
    duration: Annotated[float, typer.Option(help="Seconds of load at most.")] = 10.0,
    max_operations: Annotated[int, typer.Option(help="Calls at most.")] = 20_000,
    prefix: Annotated[str, typer.Option(help="The keys' prefix; nothing else may write the cluster.")] = (
        "/kustos-proof/"
    ),
    follow_members: Annotated[
        bool, typer.Option(help="Refresh the endpoints from etcd's member list every second.")
    ] = False,
    cacert: Annotated[
        Path | None, typer.Option(help="The CA bundle members' certificates are checked against (https).")
    ] = None,
    cert: Annotated[
        Path | None, typer.Option(help="The client certificate (members with client-cert-auth).")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="The client certificate's key.")] = None,
) -> None:
    """Load an etcd cluster with gets, puts, deletes, transactions and watches; record every call.

    The TLS files are read again every second: a renewed client certificate or a rotated CA
    (a mounted <name>-client-tls Secret changing in place) is used from the next call on."""
    from kustos.etcd.client import EtcdTLS
    from kustos.proof.recorder import Workload, WorkloadError, record

    if key is not None and cert is None:
        raise typer.BadParameter("--key needs --cert")
    if cert is not None and key is None:
        raise typer.BadParameter("--cert needs --key")
    client_tls = EtcdTLS(cacert, cert, key) if cacert or cert else None
    if client_tls is not None:
        try:
            client_tls.ssl_context()
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
            raise typer.BadParameter(f"--cacert/--cert/--key: {err}") from err
    try:
        workload = Workload(
            tuple(endpoint), clients=clients, watchers=watchers, rate=rate, duration=duration,
            max_operations=max_operations, prefix=prefix, scenario=scenario, follow_members=follow_members,
            tls=client_tls,
        )  # fmt: skip
    except WorkloadError as err:
        raise typer.BadParameter(str(err)) from err
    recording = asyncio.run(record(workload, out))
    reloads = (
        f"; the TLS files changed and were taken {recording.tls_reloads} time(s)"
        if recording.tls_reloads
        else ""
    )
    console.print(
        f"recorded {recording.operations} calls ({recording.indeterminate} indeterminate) and "
        f"{recording.watch_events} watch events in {recording.seconds:.1f}s into {recording.path}{reloads}"
    )


@proof.command("check")
def proof_check(
    histories: Annotated[list[Path], typer.Argument(help="History files written by `kustos proof record`.")],
    failures: Annotated[str, typer.Option(help="What was injected, for the report.")] = "none",
    timeout: Annotated[float, typer.Option(help="Seconds porcupine may take per history.")] = 120.0,
) -> None:
    """Check histories (linearizability, watch guarantees, lost writes) and print the report table.

    Exits 1 when a history fails, 2 when one cannot be read."""
    from kustos.devcluster import binaries
    from kustos.proof.check import CheckerError, check_history, report_table
    from kustos.proof.history import HistoryError

    checker = binaries.ensure_built(binaries.linearizability_checker(), log=console.print)
    try:
        verdicts = [
            check_history(path, checker, failures, timeout, visualization=path.with_suffix(".html"))
            for path in histories
        ]
    except (HistoryError, CheckerError, OSError) as err:
        console.print(str(err), style="red", markup=False)
        raise typer.Exit(2) from err
    console.out(report_table(verdicts))
    for verdict in verdicts:
        for problem in verdict.watch_problems[:20]:
            console.print(f"{verdict.scenario}: {problem}", markup=False)
        if verdict.linearizability.visualization:
            console.print(f"{verdict.scenario}: porcupine's picture: {verdict.linearizability.visualization}")
    if not all(v.passed for v in verdicts):
        raise typer.Exit(1)


def main() -> None:
    app(prog_name="kustos")


if __name__ == "__main__":
    main()
