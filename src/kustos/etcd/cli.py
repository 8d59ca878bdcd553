"""``kustos etcd ...``: commands the operator runs in its agent pods (and people may run by hand)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

etcd = typer.Typer(help="etcd helpers: the operator's snapshot agent, recovery, the images it pulls.")


@etcd.command("snapshot")
def snapshot(
    name: Annotated[str, typer.Option(help="Snapshot name; stored as <name>.db.")],
    cluster: Annotated[str, typer.Option(help="The EtcdCluster's name (for retention).")],
    file: Annotated[
        Path | None, typer.Option(help="A snapshot `etcdctl snapshot save` wrote: verify and store it.")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Without --file: client URL of the member to stream from.")
    ] = None,
    started: Annotated[
        str | None, typer.Option(help="When the backup began (ISO 8601); the duration counts from it.")
    ] = None,
    member: Annotated[str, typer.Option(help="The member's name, for the record.")] = "",
    directory: Annotated[Path | None, typer.Option("--dir", help="Store in this directory (a PVC).")] = None,
    location_prefix: Annotated[str, typer.Option(help="How the directory is named in results.")] = "",
    s3_endpoint: Annotated[str | None, typer.Option(help="Store in this S3-compatible endpoint.")] = None,
    s3_bucket: Annotated[str, typer.Option()] = "",
    s3_prefix: Annotated[str, typer.Option()] = "",
    s3_region: Annotated[str, typer.Option()] = "us-east-1",
    s3_path_style: Annotated[bool, typer.Option()] = True,
    scratch: Annotated[Path, typer.Option(help="Where to spool before verifying.")] = Path("/tmp/kustos"),
    keep: Annotated[int | None, typer.Option(help="Keep this many scheduled snapshots.")] = None,
    cacert: Annotated[Path | None, typer.Option(help="CA of a TLS cluster's members.")] = None,
    cert: Annotated[Path | None, typer.Option(help="Client certificate for a TLS cluster.")] = None,
    key: Annotated[Path | None, typer.Option(help="Key of the client certificate.")] = None,
) -> None:
    """Verify a snapshot's checksum (--file, or streamed from --endpoint), store it; print the
    result as the last line.

    S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    """
    from datetime import datetime

    from kustos.etcd.agent_report import ERROR_MARKER
    from kustos.etcd.client import EtcdTLS
    from kustos.etcd.snapshot import (
        Destination,
        DirectoryDestination,
        S3Destination,
        s3_store,
        store_snapshot,
        take_snapshot,
    )

    destination: Destination
    if directory is not None:
        destination = DirectoryDestination(directory, location_prefix)
        spool = directory
    elif s3_endpoint:
        store = s3_store(s3_endpoint, s3_bucket, s3_region, s3_path_style)
        destination = S3Destination(store, s3_bucket, s3_prefix.strip("/"))
        spool = scratch
    else:
        raise typer.BadParameter("give --dir or --s3-endpoint")
    if (file is None) == (endpoint is None):
        raise typer.BadParameter("give exactly one of --file and --endpoint")
    try:
        if file is not None:
            began = datetime.fromisoformat(started) if started else None
            result = asyncio.run(store_snapshot(file, member, name, destination, cluster, keep, began))
        else:
            assert endpoint is not None
            tls = EtcdTLS(cacert, cert, key) if endpoint.startswith("https://") else None
            result = asyncio.run(
                take_snapshot(endpoint, member, name, destination, spool, cluster, keep, tls)
            )
    except Exception as err:  # the operator reads this line from the pod's log
        first_line = (str(err).strip().splitlines() or [""])[0]
        print(f"{ERROR_MARKER}{type(err).__name__}: {first_line}", flush=True)
        sys.exit(1)
    print(result.line(), flush=True)


@etcd.command("fetch-snapshot")
def fetch_snapshot(
    out: Annotated[Path, typer.Option(help="Where to put the verified snapshot.")],
    endpoint: Annotated[str | None, typer.Option(help="Stream it from this member's client URL.")] = None,
    file: Annotated[Path | None, typer.Option(help="Read it from this file (a backup on a PVC).")] = None,
    s3_endpoint: Annotated[str | None, typer.Option(help="Read it from this S3-compatible endpoint.")] = None,
    s3_bucket: Annotated[str, typer.Option()] = "",
    s3_key: Annotated[str, typer.Option()] = "",
    s3_region: Annotated[str, typer.Option()] = "us-east-1",
    s3_path_style: Annotated[bool, typer.Option()] = True,
    sha256: Annotated[str | None, typer.Option(help="The checksum the backup recorded.")] = None,
    cacert: Annotated[Path | None, typer.Option(help="CA of a TLS cluster's members.")] = None,
    cert: Annotated[Path | None, typer.Option(help="Client certificate for a TLS cluster.")] = None,
    key: Annotated[Path | None, typer.Option(help="Its key.")] = None,
) -> None:
    """Fetch a snapshot for a restoring seed and verify it; print the result as the last line.

    S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    """
    from kustos.etcd.agent_report import ERROR_MARKER
    from kustos.etcd.client import EtcdTLS
    from kustos.etcd.snapshot import fetch_snapshot, s3_store

    s3 = (s3_store(s3_endpoint, s3_bucket, s3_region, s3_path_style), s3_key) if s3_endpoint else None
    tls = EtcdTLS(cacert, cert, key) if endpoint and endpoint.startswith("https://") else None
    try:
        result = asyncio.run(fetch_snapshot(out, endpoint=endpoint, file=file, s3=s3, sha256=sha256, tls=tls))
    except Exception as err:
        first_line = (str(err).strip().splitlines() or [""])[0]
        print(f"{ERROR_MARKER}{type(err).__name__}: {first_line}", flush=True)
        sys.exit(1)
    print(result.line(), flush=True)


@etcd.command("recover")
def recover(
    name: Annotated[str, typer.Argument(help="The EtcdCluster that lost quorum.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    from_backup: Annotated[str | None, typer.Option(help="Rebuild from this EtcdBackup.")] = None,
    from_member: Annotated[str | None, typer.Option(help="Rebuild from this surviving member's pod.")] = None,
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: $KUBECONFIG or ~/.kube/config.")] = None,
    context: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Approve rebuilding a cluster that lost quorum, in place, under the same name.

    Without options the operator picks the surviving member with the newest data, else the
    newest backup (the cluster's status says which). Writes the cluster acknowledged after
    the source's revision are lost: that is the price of getting it back.
    """
    from kustos.etcd.recovery import RECOVER_ANNOTATION

    if from_backup and from_member:
        raise typer.BadParameter("give at most one of --from-backup and --from-member")
    value = f"backup/{from_backup}" if from_backup else f"member/{from_member}" if from_member else "auto"
    cluster = asyncio.run(_annotate_cluster(kubeconfig, context, namespace, name, RECOVER_ANNOTATION, value))
    if cluster is None:
        print(f"EtcdCluster {namespace}/{name} not found", file=sys.stderr)
        sys.exit(1)
    status = cluster.get("status") or {}
    degraded: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Degraded"), {}
    )
    print(f"asked the operator to rebuild {namespace}/{name} from {value.replace('/', ' ')}")
    print(f"it was {status.get('phase', 'unknown')}: {degraded.get('message', '')}")
    print(f"follow it with: kubectl get etcdcluster {name} -n {namespace} -w")


@etcd.command("rotate-ca")
def rotate_ca(
    name: Annotated[str, typer.Argument(help="The EtcdCluster whose CA (operator-issued) rotates.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    kubeconfig: Annotated[Path | None, typer.Option(help="Default: $KUBECONFIG or ~/.kube/config.")] = None,
    context: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Rotate a cluster's CA now, without downtime: members restart one at a time to trust
    old and new CA, then onto certificates of the new CA, then to trust the new CA only."""
    from datetime import UTC, datetime

    from kustos.etcd.carotation import ROTATE_CA_ANNOTATION
    from kustos.runtime.times import rfc3339

    value = rfc3339(datetime.now(UTC))
    annotate = _annotate_cluster(kubeconfig, context, namespace, name, ROTATE_CA_ANNOTATION, value)
    cluster = asyncio.run(annotate)
    if cluster is None:
        print(f"EtcdCluster {namespace}/{name} not found", file=sys.stderr)
        sys.exit(1)
    if ((cluster.get("spec") or {}).get("tls") or {}).get("secrets"):
        print(f"{namespace}/{name} uses your own TLS Secrets: rotate their CA yourself", file=sys.stderr)
        sys.exit(1)
    print(f"asked the operator to rotate the CA of {namespace}/{name} ({ROTATE_CA_ANNOTATION}={value})")
    where = "-o jsonpath='{.status.tls.caRotation}'"
    print(f"follow it with: kubectl get etcdcluster {name} -n {namespace} {where}")


@etcd.command("images")
def images(
    repository: Annotated[
        str | None, typer.Option(help="spec.repository (default: the EtcdCluster default).")
    ] = None,
    repositories: Annotated[
        bool, typer.Option("--repositories", help="List the repositories kustos knows instead.")
    ] = False,
) -> None:
    """The etcd images kustos pulls: one per version it proves, in spec.repository's tag scheme
    (one per line, to mirror them); --repositories: each known repository, its tags, what it has."""
    from kustos.images import DEFAULT_ETCD_REPOSITORY, ETCD_REPOSITORIES, PROVEN_ETCD_VERSIONS, etcd_image

    if repositories:
        for known in ETCD_REPOSITORIES:
            tag = known.tag_format.format(version=PROVEN_ETCD_VERSIONS[-1])
            default = " (default)" if known.name == DEFAULT_ETCD_REPOSITORY else ""
            print(f"{known.name}{default}\ttag {tag}\t{known.carries}")
        return
    for version in PROVEN_ETCD_VERSIONS:
        print(etcd_image(repository or DEFAULT_ETCD_REPOSITORY, version))


async def _annotate_cluster(
    kubeconfig: Path | None, context: str | None, namespace: str, name: str, key: str, value: str
) -> dict[str, Any] | None:
    from kustos.etcd.resources import ETCDCLUSTERS
    from kustos.runtime.api import Api, ApiStatusError
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics

    clients = connect(load_config(kubeconfig, context), Metrics())
    try:
        patch = {"metadata": {"annotations": {key: value}}}
        return await Api(clients.raw).patch(ETCDCLUSTERS, namespace, name, patch)
    except ApiStatusError as err:
        if err.not_found:
            return None
        raise
    finally:
        await clients.close()
