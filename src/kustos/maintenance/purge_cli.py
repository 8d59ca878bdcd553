"""``kustos purge-node NAME`` (and ``kubectl kustos purge-node``): the controller's purge, by hand.

The same guards and steps as the MaintenancePolicy controller (``purge.Purger``), with
EKCO's flags (``--certificates_dir``, ``--min_ready_master_nodes``,
``--min_ready_worker_nodes``, ``--maintain_rook_storage_nodes``, ``--config FILE`` holding a
MaintenancePolicy spec as YAML). It shows what it will do and asks first (``--yes`` skips
the question), and refuses a Ready node unless ``--force``.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from kustos.api.maintenance import MaintenancePolicySpec

EXIT_REFUSED = 2


def load_spec(config: Path | None) -> MaintenancePolicySpec:
    """The spec from a YAML file: a whole MaintenancePolicy or just its spec (defaults if None)."""
    if config is None:
        return MaintenancePolicySpec()
    document = yaml.safe_load(config.read_text()) or {}
    if not isinstance(document, dict):
        raise typer.BadParameter(f"{config}: not a YAML mapping", param_hint="--config")
    if document.get("kind") == "MaintenancePolicy" or "spec" in document:
        document = document.get("spec") or {}
    try:
        return MaintenancePolicySpec.model_validate(document)
    except ValueError as err:
        raise typer.BadParameter(f"{config}: {err}", param_hint="--config") from err


def with_flags(
    spec: MaintenancePolicySpec, certificates_dir: Path | None, min_masters: int | None,
    min_workers: int | None, maintain_rook: bool | None,
) -> MaintenancePolicySpec:  # fmt: skip
    changes: dict[str, Any] = {}
    if certificates_dir is not None:
        changes["certificates_dir"] = str(certificates_dir)
    if min_masters is not None:
        changes["min_ready_master_node_count"] = min_masters
    if min_workers is not None:
        changes["min_ready_worker_node_count"] = min_workers
    if maintain_rook is not None:
        changes["rook_should_use_all_nodes"] = not maintain_rook
    return spec.model_copy(update=changes)


def _text(path: Path | None) -> str | None:
    return str(path) if path is not None else None


async def _purge(
    name: str,
    spec: MaintenancePolicySpec,
    kubeconfig: Path | None,
    context: str | None,
    yes: bool,
    force: bool,
    kubectl: str | None = None,
) -> int:
    from kustos.maintenance.nodes import node_view
    from kustos.maintenance.planner import purge_refusal
    from kustos.maintenance.purge import Outcome, PurgeOptions, Purger
    from kustos.maintenance.rook import KubectlToolbox
    from kustos.runtime.api import Api
    from kustos.runtime.errors import ReconcileError
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics
    from kustos.runtime.resources import NODES

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        api = Api(clients.raw)
        nodes = await api.list_objects(NODES)
        node = next((n for n in nodes if n["metadata"]["name"] == name), None)
        if node is None:
            typer.echo(f"node {name} does not exist", err=True)
            return 1
        views = [node_view(n) for n in nodes]
        view = next(v for v in views if v.name == name)
        if view.ready and not force:
            typer.echo(f"refused: node {name} is Ready; purge a node that is gone for good, or pass --force",
                       err=True)  # fmt: skip
            return EXIT_REFUSED
        refusal = purge_refusal(spec, views, view)
        if refusal is not None:
            typer.echo(f"refused: {refusal}", err=True)
            return EXIT_REFUSED
        options = PurgeOptions.from_spec(spec)
        toolbox = None
        if options.maintain_rook and kubectl:
            toolbox = KubectlToolbox(api, options.rook_namespace, kubectl, _text(kubeconfig), context)
        purger = Purger(api, options, toolbox=toolbox)
        role = "control-plane" if view.control_plane else "worker"
        typer.echo(f"Purging {role} node {name} will, in order:")
        for line in await purger.remaining(name):
            typer.echo(f"  - {line}")
        typer.echo("This cannot be undone: the node must never join again with its old identity.")
        if not yes and not typer.confirm("Purge it?", default=False):
            typer.echo("not purged")
            return 1

        def progress(outcome: Outcome) -> None:
            mark = "refused" if outcome.refused else "done"
            typer.echo(f"{outcome.step}: {mark}: {outcome.message}")

        outcome = await purger.run(name, progress)
        return EXIT_REFUSED if outcome.refused else 0
    except ReconcileError as err:
        typer.echo(f"failed: {err.message}", err=True)
        return 1
    finally:
        await clients.close()


def purge_node(
    name: Annotated[str, typer.Argument(help="The Node to purge.")],
    config: Annotated[
        Path | None, typer.Option("--config", help="A MaintenancePolicy (or its spec) as YAML.")
    ] = None,
    certificates_dir: Annotated[
        Path | None,
        typer.Option("--certificates_dir", "--certificates-dir", help="kubeadm's certificates directory."),
    ] = None,
    min_ready_master_nodes: Annotated[
        int | None,
        typer.Option(
            "--min_ready_master_nodes",
            "--min-ready-master-nodes",
            min=0,
            help="Refuse if fewer ready control-plane nodes would remain (default 2).",
        ),
    ] = None,
    min_ready_worker_nodes: Annotated[
        int | None,
        typer.Option(
            "--min_ready_worker_nodes",
            "--min-ready-worker-nodes",
            min=0,
            help="Refuse if fewer ready worker nodes would remain (default 0).",
        ),
    ] = None,
    maintain_rook_storage_nodes: Annotated[
        bool | None,
        typer.Option(
            "--maintain_rook_storage_nodes/--no-maintain_rook_storage_nodes",
            help="Remove the node from the CephCluster's storage.nodes (Rook without useAllNodes).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Purge even a node that is Ready.")] = False,
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: in-cluster, else $KUBECONFIG.")] = None,
    context: Annotated[str | None, typer.Option(help="Kubeconfig context.")] = None,
    kubectl: Annotated[
        str | None,
        typer.Option(help="kubectl to exec the ceph commands in Rook's toolbox with (default: from PATH)."),
    ] = None,
) -> None:
    """Remove a dead node: its kubeadm endpoint, its etcd member (keeping quorum), the Node."""
    spec = with_flags(load_spec(config), certificates_dir, min_ready_master_nodes, min_ready_worker_nodes,
                      maintain_rook_storage_nodes)  # fmt: skip
    code = asyncio.run(
        _purge(name, spec, kubeconfig, context, yes, force, kubectl or shutil.which("kubectl"))
    )
    if code:
        raise typer.Exit(code)


__all__ = ["EXIT_REFUSED", "load_spec", "purge_node", "with_flags"]
