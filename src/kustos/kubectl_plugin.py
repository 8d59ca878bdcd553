"""``kubectl kustos ...``: the kubectl plugin (kubectl runs ``kubectl-kustos`` from PATH).

``status`` shows every EtcdCluster, StorageCluster and NodeJob in one view; ``recover``
is ``kustos etcd recover`` and ``purge-node`` is ``kustos purge-node`` (the same commands, so
the two never disagree). The cluster is the
one kubectl would use: $KUBECONFIG or ~/.kube/config, or --kubeconfig/--context.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kustos.api.etcd import EtcdCluster
from kustos.api.nodejob import NodeJob
from kustos.api.storage import StorageCluster
from kustos.etcd import cli as etcd_cli
from kustos.maintenance import purge_cli
from kustos.runtime import objects

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


async def _list_all(kubeconfig: Path | None, context: str | None, namespace: str | None) -> list[list[Obj]]:
    from kustos.runtime.kube import api_path, connect, load_config
    from kustos.runtime.metrics import Metrics

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        found = []
        for model, *_ in TABLES:
            crd = model.crd
            path = api_path(crd.group, crd.version, crd.plural, namespace)
            response = await clients.raw.get(path)
            for _ in range(10):  # 429 while the API server's cache of a new CRD initializes
                if response.status_code != 429:
                    break
                await asyncio.sleep(float(response.headers.get("Retry-After") or 1))
                response = await clients.raw.get(path)
            if response.status_code == 404:
                items: list[Obj] = []  # a CRD that is not installed is an empty table, not an error
            else:
                response.raise_for_status()
                items = response.json().get("items") or []
            found.append(sorted(items, key=lambda o: (objects.namespace(o) or "", objects.name(o))))
        return found
    finally:
        await clients.close()


@app.command("status")
def status(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="Default: every namespace.")
    ] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: $KUBECONFIG or ~/.kube/config.")] = None,
    context: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Every EtcdCluster, StorageCluster and NodeJob: how ready, which phase, what is wrong."""
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
