"""``kustos etcd ...``: commands the operator runs in its agent pods (and people may run by hand)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

etcd = typer.Typer(help="etcd helpers: the snapshot agent the operator runs in backup pods.")


@etcd.command("snapshot")
def snapshot(
    endpoint: Annotated[str, typer.Option(help="Client URL of the member to stream from.")],
    name: Annotated[str, typer.Option(help="Snapshot name; stored as <name>.db.")],
    cluster: Annotated[str, typer.Option(help="The EtcdCluster's name (for retention).")],
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
    """Stream a snapshot, verify etcd's checksum, store it; print the result as the last line.

    S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    """
    from kustos.etcd.client import EtcdTLS
    from kustos.etcd.snapshot import (
        ERROR_MARKER,
        Destination,
        DirectoryDestination,
        S3Destination,
        s3_store,
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
    try:
        tls = EtcdTLS(cacert, cert, key) if endpoint.startswith("https://") else None
        result = asyncio.run(take_snapshot(endpoint, member, name, destination, spool, cluster, keep, tls))
    except Exception as err:  # the operator reads this line from the pod's log
        first_line = (str(err).strip().splitlines() or [""])[0]
        print(f"{ERROR_MARKER}{type(err).__name__}: {first_line}", flush=True)
        sys.exit(1)
    print(result.line(), flush=True)
