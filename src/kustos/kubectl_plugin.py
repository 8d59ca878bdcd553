"""``kubectl kustos ...``: the kubectl plugin (kubectl runs ``kubectl-kustos`` from PATH).

``status`` shows every EtcdCluster, StorageCluster and NodeJob in one view, and ``status NAME``
one EtcdCluster's facts (the figures the domain metrics export, docs/metrics.md, read from its
status without Prometheus, and the figures only the operator observed, from the leading
operator pod's /metrics through the API server's pod proxy); ``recover``
is ``kustos etcd recover`` and ``purge-node`` is ``kustos purge-node`` (the same commands, so
the two never disagree). The cluster is the
one kubectl would use: $KUBECONFIG or ~/.kube/config, or --kubeconfig/--context.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx2
import typer
from rich.console import Console
from rich.table import Table

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.api.nodejob import NodeJob
from kustos.api.storage import StorageCluster
from kustos.etcd import cli as etcd_cli
from kustos.maintenance import purge_cli
from kustos.metrics import scraped
from kustos.metrics.facts import EtcdClusterFacts, MemberFacts, etcd_cluster_facts, last_backups
from kustos.runtime import objects
from kustos.runtime.leader import holder_host
from kustos.runtime.observations import EtcdObservation

app = typer.Typer(
    help="kustos from kubectl: `kubectl kustos status`, `recover NAME`, `purge-node NAME`.",
    no_args_is_help=True,
)
app.command("recover")(etcd_cli.recover)
app.command("purge-node")(purge_cli.purge_node)

console = Console(soft_wrap=True)
Obj = dict[str, Any]


def _condition(obj: Obj, kind: str) -> Obj:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def _message(obj: Obj, *kinds: str) -> str:
    """The first condition among ``kinds`` that is not fine, else the first's message."""
    for kind in kinds:
        condition = _condition(obj, kind)
        bad = condition.get("status") == ("False" if kind in ("Available", "Active") else "True")
        if bad and condition.get("message"):
            return str(condition["message"])
    return str(_condition(obj, kinds[0]).get("message") or "")


def etcd_rows(items: list[Obj]) -> list[list[str]]:
    return [
        [
            objects.namespace(o) or "", objects.name(o),
            _said(o, "ready"),
            str((o.get("status") or {}).get("currentVersion") or (o.get("spec") or {}).get("version") or "-"),
            _said(o, "phase"),
            _message(o, "Degraded", "Progressing"),
        ]
        for o in items
    ]  # fmt: skip


def _said(obj: Obj, field: str) -> str:
    """One status field for a table cell; "-" until the operator has recorded it."""
    return str((obj.get("status") or {}).get(field) or "-")


def storage_rows(items: list[Obj]) -> list[list[str]]:
    return [
        [
            objects.namespace(o) or "", objects.name(o),
            _said(o, "ready"),
            _said(o, "phase"),
            _message(o, "Active", "Ready"),
        ]
        for o in items
    ]  # fmt: skip


def nodejob_rows(items: list[Obj]) -> list[list[str]]:
    return [
        [
            objects.namespace(o) or "", objects.name(o),
            _said(o, "progress"),
            _said(o, "phase"),
            str((o.get("status") or {}).get("message") or ""),
        ]
        for o in items
    ]  # fmt: skip


TABLES = (
    (EtcdCluster, "EtcdClusters", ("namespace", "name", "ready", "version", "phase", "message"), etcd_rows),
    (StorageCluster, "StorageClusters", ("namespace", "name", "ready", "phase", "message"), storage_rows),
    (NodeJob, "NodeJobs", ("namespace", "name", "progress", "phase", "message"), nodejob_rows),
)


def _age(seconds: float) -> str:
    """Like kubectl's AGE column: 45s, 12m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def cluster_rows(f: EtcdClusterFacts, now: datetime) -> list[tuple[str, str]]:
    """One EtcdCluster's facts, a line each, worded for a person on call."""
    margin = f.quorum_margin
    if f.voters == 0:
        quorum = "- (no member recorded yet)"
    elif margin < 0:
        quorum = f"{margin}: QUORUM LOST (needs {f.quorum} healthy voters)"
    elif margin == 0 and f.voters > 1:
        quorum = f"0: AT RISK, one more failure loses quorum (needs {f.quorum})"
    else:
        quorum = f"{margin} (needs {f.quorum} healthy voters)"
    leader = f.leader
    due_since = f.backup_overdue_since
    overdue = (
        f.backup_interval_seconds is not None
        and due_since is not None
        and (now - due_since).total_seconds() > 2 * f.backup_interval_seconds
    )
    backup = "none"
    if f.last_backup_time is not None:
        age = (now - f.last_backup_time).total_seconds()
        backup = f"{_age(age)} ago, {_size(f.last_backup_size)}"
    backup += " (OVERDUE)" if overdue else ""
    every = f.backup_interval_seconds
    return [
        ("phase", f.phase or "-"),
        ("version", f"{f.version or '-'} (desired {f.desired_version})"),
        (
            "members",
            f"{len(f.members)} of {f.desired_size} desired: {f.voters} voters, {f.learners} learners",
        ),
        ("healthy voters", f"{f.healthy_voters}/{f.voters}"),
        ("quorum margin", quorum),
        ("leader", f"{leader.name} (index {leader.index})" if leader else "none"),
        (
            "leader changes",
            "-" if f.leader_changes is None else str(f.leader_changes),
        ),
        ("alarms", ", ".join(f"{alarm} on {member}" for member, alarm in f.alarms) or "none"),
        ("last backup", backup),
        ("backup schedule", f"every {_age(every)}" if every else "none"),
        (
            "rebuilds",
            str(f.rebuilds)
            + (" (one running)" if f.recovering else "")
            + ("; restored from a backup" if f.restored else ""),
        ),
        ("degraded", f.degraded or "no"),
    ]


def member_rows(f: EtcdClusterFacts) -> list[list[str]]:
    def health(m: MemberFacts) -> str:
        if m.healthy:
            return "yes"
        late = m.unhealthy_seconds > f.member_failure_timeout_seconds
        return f"NO, for {_age(m.unhealthy_seconds)}" + (" (past its failure timeout)" if late else "")

    return [
        [
            m.name, "-" if m.index is None else str(m.index), health(m),
            "learner" if m.learner else ("leader" if m.leader else "voter"),
            _size(m.backend_bytes), _size(m.backend_in_use_bytes), _size(m.backend_quota_bytes),
        ]
        for m in f.members
    ]  # fmt: skip


async def _get(clients: Any, model: Any, namespace: str | None) -> list[Obj]:
    from kustos.runtime.kube import api_path

    crd = model.crd
    path = api_path(crd.group, crd.version, crd.plural, namespace)
    response = await clients.raw.get(path)
    for _ in range(10):  # 429 while the API server's cache of a new CRD initializes
        if response.status_code != 429:
            break
        await asyncio.sleep(float(response.headers.get("Retry-After") or 1))
        response = await clients.raw.get(path)
    if response.status_code == 404:
        return []  # a CRD that is not installed is an empty table, not an error
    response.raise_for_status()
    items: list[Obj] = response.json().get("items") or []
    return sorted(items, key=lambda o: (objects.namespace(o) or "", objects.name(o)))


@dataclass(frozen=True)
class Operator:
    """Where the operator's leader election Lease is (the chart's: the release's namespace and
    full name), and the port of its /metrics (None: the pod's first port, the chart's metrics)."""

    namespace: str
    lease: str
    metrics_port: int | None = None


@dataclass(frozen=True)
class Scrape:
    """The leading operator's /metrics, or why it could not be read."""

    exposition: str | None
    why: str = ""


async def _scrape_leader(clients: Any, operator: Operator) -> Scrape:
    """The leading operator pod's /metrics through the API server's pod proxy (the user needs
    get on the Lease and on pods/proxy, no route to the pod); the reason in words otherwise."""
    ns = operator.namespace
    try:
        lease = await clients.raw.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{operator.lease}")
        if lease.status_code != 200:
            why = {404: "no such Lease", 403: "forbidden to read it"}.get(lease.status_code)
            return Scrape(None, f"Lease {ns}/{operator.lease}: {why or f'HTTP {lease.status_code}'}")
        holder = str((lease.json().get("spec") or {}).get("holderIdentity") or "")
        if not holder:
            return Scrape(None, f"no operator holds the Lease {ns}/{operator.lease}")
        pod = holder_host(holder)
        port = "" if operator.metrics_port is None else f":{operator.metrics_port}"
        answer = await clients.raw.get(f"/api/v1/namespaces/{ns}/pods/{pod}{port}/proxy/metrics")
    except httpx2.HTTPError as err:
        return Scrape(None, f"the API server did not answer: {err}")
    if answer.status_code == 200:
        return Scrape(answer.text)
    why = {
        404: f"the leader {holder} is not a pod in {ns}: an operator outside the cluster?",
        403: f"forbidden: it takes get on pods/proxy in {ns}",
    }.get(answer.status_code)
    return Scrape(None, why or f"the proxy to pod {ns}/{pod} answered HTTP {answer.status_code}")


async def _one_cluster(
    kubeconfig: Path | None, context: str | None, namespace: str | None, name: str, operator: Operator
) -> tuple[Obj, list[Obj], Scrape]:
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        found = [c for c in await _get(clients, EtcdCluster, namespace) if objects.name(c) == name]
        if len(found) != 1:
            where = f"namespace {namespace}" if namespace else "any namespace"
            why = "not found" if not found else "in several namespaces: say which with -n"
            raise typer.BadParameter(f"EtcdCluster {name} {why} ({where})", param_hint="NAME")
        backups = await _get(clients, EtcdBackup, objects.namespace(found[0]))
        return found[0], backups, await _scrape_leader(clients, operator)
    finally:
        await clients.close()


def observed(cluster: Obj, scrape: Scrape) -> tuple[EtcdObservation | None, str]:
    """What the leading operator observed of ``cluster``; else a footnote that says why not."""
    if scrape.exposition is None:
        return None, f"the operator's /metrics is not reachable ({scrape.why})"
    namespace, name = objects.namespace(cluster) or "", objects.name(cluster)
    try:
        seen = scraped.observation(scrape.exposition, namespace, name)
    except ValueError as err:  # not a Prometheus exposition: some other server on that port
        return None, f"the operator's /metrics did not parse ({err})"
    if seen is None:
        return None, "the leading operator has not observed this cluster yet"
    return seen, ""


def show_cluster(cluster: Obj, backups: list[Obj], now: datetime, scrape: Scrape) -> None:
    seen, footnote = observed(cluster, scrape)
    facts = etcd_cluster_facts(cluster, last_backups(backups), now, seen)
    table = Table(
        title=f"EtcdCluster {facts.namespace}/{facts.name}", title_justify="left", show_header=False
    )
    table.add_column("fact", style="bold")
    table.add_column("value")
    for row in cluster_rows(facts, now):
        table.add_row(*row)
    console.print(table)
    members = Table(title="Members", title_justify="left")
    for column in ("member", "index", "healthy", "role", "backend", "in use", "quota"):
        members.add_column(column.upper())
    for member in member_rows(facts):
        members.add_row(*member)
    console.print(members)
    if footnote:
        console.print(f"backend sizes, leader changes and alarms by member show as -: {footnote}")


async def _list_all(kubeconfig: Path | None, context: str | None, namespace: str | None) -> list[list[Obj]]:
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        return [await _get(clients, model, namespace) for model, *_ in TABLES]
    finally:
        await clients.close()


@app.command("status")
def status(
    name: Annotated[
        str | None, typer.Argument(help="One EtcdCluster: its quorum, leader, backups and members.")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Default: every namespace.")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: $KUBECONFIG or ~/.kube/config.")] = None,
    context: Annotated[str | None, typer.Option()] = None,
    operator_namespace: Annotated[
        str, typer.Option(help="Where the operator's leader election Lease is (the chart's namespace).")
    ] = "kustos-system",
    lease: Annotated[str, typer.Option(help="The Lease's name (the chart release's full name).")] = "kustos",
    metrics_port: Annotated[
        int | None, typer.Option(help="The operator pod's metrics port. Default: its first port.")
    ] = None,
) -> None:
    """Every EtcdCluster, StorageCluster and NodeJob: how ready, which phase, what is wrong; or,
    given NAME, one EtcdCluster's facts (what the metrics and alerts say, without Prometheus)."""
    if name is not None:
        operator = Operator(operator_namespace, lease, metrics_port)
        cluster, backups, scrape = asyncio.run(_one_cluster(kubeconfig, context, namespace, name, operator))
        show_cluster(cluster, backups, datetime.now(UTC), scrape)
        return
    listed = asyncio.run(_list_all(kubeconfig, context, namespace))
    for (_, title, columns, rows), items in zip(TABLES, listed, strict=True):
        table = Table(title=f"{title} ({len(items)})", title_justify="left")
        for column in columns:
            table.add_column(column.upper())
        for row in rows(items):
            table.add_row(*row)
        console.print(table)


def main() -> None:
    app(prog_name="kubectl kustos")


if __name__ == "__main__":
    main()
