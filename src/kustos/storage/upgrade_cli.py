"""``kustos storage restore-workloads``: give workloads back the replicas a StorageUpgrade took."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

storage = typer.Typer(help="Storage cluster helpers.")


async def restore(
    kubeconfig: Path | None, context: str | None, upgrade: str | None, dry_run: bool
) -> list[tuple[str, str, str, int]]:
    """Scale every workload scaled down by ``upgrade`` (namespace/name; any when None) back up."""
    from kustos.runtime.api import Api
    from kustos.runtime.kube import api_path, connect, load_config
    from kustos.runtime.metrics import Metrics
    from kustos.storage import upgrade_planner as up
    from kustos.storage.upgrade_controller import WORKLOAD_KINDS

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        api = Api(clients.raw)
        found = []
        for kind, ref in WORKLOAD_KINDS.items():
            response = await clients.raw.get(api_path(ref.group, ref.version, ref.plural))
            response.raise_for_status()
            items = response.json().get("items") or []
            for item in items:
                item["kind"] = kind
            found.extend(up.scaled_down(items, upgrade))
        if not dry_run:
            for kind, namespace, name, replicas in found:
                patch = {
                    "metadata": {"annotations": {up.REPLICAS_ANNOTATION: None, up.OWNER_ANNOTATION: None}},
                    "spec": {"replicas": replicas},
                }
                await api.patch(WORKLOAD_KINDS[kind], namespace, name, patch)
        return found
    finally:
        await clients.close()


@storage.command("restore-workloads")
def restore_workloads(
    name: Annotated[
        str | None, typer.Argument(help="The StorageUpgrade; every upgrade's when omitted.")
    ] = None,
    namespace: Annotated[str, typer.Option("-n", "--namespace", help="The upgrade's namespace.")] = "default",
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: in-cluster, else $KUBECONFIG.")] = None,
    context: Annotated[str | None, typer.Option()] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be scaled.")] = False,
) -> None:
    """Scale the Deployments and StatefulSets a StorageUpgrade scaled down back to their replicas.

    The counts come from each workload's kustos.dev/upgrade-replicas annotation, which is
    removed in the same patch.
    """
    upgrade = f"{namespace}/{name}" if name else None
    found = asyncio.run(restore(kubeconfig, context, upgrade, dry_run))
    if not found:
        whose = f" of {upgrade}" if upgrade else ""
        typer.echo(f"no workload carries a kustos.dev/upgrade-replicas annotation{whose}")
        return
    verb = "would scale" if dry_run else "scaled"
    for kind, ns, workload, replicas in found:
        typer.echo(f"{verb} {kind.lower()}/{workload} -n {ns} to {replicas}")
