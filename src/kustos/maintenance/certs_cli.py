"""``kustos maintenance certs``: kubeadm's certificates on this node, listed or renewed.

``--dry-run`` lists every certificate, its expiry and whether it is within the threshold
(EKCO's ``rotateCertsThreshold``). Without it, the certificates within the threshold are
renewed (``kubeadm_certs.renew``), the static pods that read them at start are restarted by
moving their manifests out and back, and the command waits until the API server on this node
answers ``/readyz`` on the certificate now on disk. This is what the short-lived pod the
MaintenancePolicy controller pins to each control-plane node runs (``certrotation``); a person
can run it too. The last line, also written to ``--summary-file`` (the pod's termination
message), says what was renewed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from kustos.maintenance.certrotation import TERMINATION_MESSAGE_PATH
from kustos.maintenance.certrotation_act import served_certificate
from kustos.maintenance.purge_cli import load_spec
from kustos.runtime.times import parse_duration

maintenance = typer.Typer(help="Node maintenance on this node (kubeadm's certificates).")

DEFAULT_APISERVER = "127.0.0.1:6443"
KUBERNETES_DIR = Path("/etc/kubernetes")
TERMINATION_LOG = Path(TERMINATION_MESSAGE_PATH)


def await_apiserver(root: Path, address: str, timeout: float) -> str:
    """Wait until the API server answers /readyz with 200 on the certificate in pki/apiserver.crt."""
    # cryptography is imported where used: every other kustos command loads this module.
    from cryptography import x509

    from kustos.maintenance import kubeadm_certs

    wanted = x509.load_pem_x509_certificate((root / "pki" / "apiserver.crt").read_bytes()).serial_number
    deadline = time.monotonic() + timeout
    last = "not reached"
    while True:
        try:
            der, status = served_certificate(address)
            served = x509.load_der_x509_certificate(der).serial_number
            if served == wanted and " 200 " in f"{status} ":
                return f"the API server at {address} is ready on its certificate (serial {wanted:x})"
            last = f"serves serial {served:x}, {status!r}"
        except (OSError, ValueError) as err:
            last = str(err)
        if time.monotonic() > deadline:
            raise kubeadm_certs.RenewalError(f"the API server at {address} after {timeout:.0f}s: {last}")
        time.sleep(1)


def restart_static_pod(root: Path, pod: str, absent: float) -> None:
    """kubeadm's advice: the manifest out of the manifests directory, a wait, then back. A
    manifest left out by an earlier run that died between the moves is put back first."""
    manifest = root / "manifests" / f"{pod}.yaml"
    parked = root / f"{pod}.yaml"
    if parked.exists() and not manifest.exists():
        parked.replace(manifest)
    manifest.replace(parked)
    try:
        time.sleep(absent)
    finally:
        parked.replace(manifest)


@maintenance.command("certs")
def certs(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list the certificates and their expiry.")
    ] = False,
    config: Annotated[
        Path | None, typer.Option("--config", help="A MaintenancePolicy (or its spec) as YAML.")
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option(
            "--threshold", help="Renew what expires within this (default: rotateCertsThreshold, 720h)."
        ),
    ] = None,
    kubernetes_dir: Annotated[
        Path, typer.Option("--kubernetes-dir", help="kubeadm's directory (pki/, manifests/, kubeconfigs).")
    ] = KUBERNETES_DIR,
    validity: Annotated[
        str, typer.Option(help="A renewed certificate's validity (kubeadm's: 8760h).")
    ] = "8760h",
    apiserver: Annotated[str, typer.Option(help="This node's API server, host:port.")] = DEFAULT_APISERVER,
    manifest_absent: Annotated[
        float,
        typer.Option(
            help="Seconds a restarted static pod's manifest stays out (the kubelet looks every 20 s)."
        ),
    ] = 20.0,
    apiserver_timeout: Annotated[float, typer.Option(help="Seconds to wait for the API server.")] = 300.0,
    summary_file: Annotated[
        Path | None, typer.Option(help="Where the last line goes too (default: the pod's termination log).")
    ] = None,
) -> None:
    """List kubeadm's certificates (--dry-run), or renew those within the threshold."""
    from kustos.maintenance import kubeadm_certs

    spec = load_spec(config)
    try:
        within = parse_duration(threshold or spec.rotate_certs_threshold)
        lifetime = parse_duration(validity)
    except (ValueError, KeyError) as err:
        raise typer.BadParameter(f"not a duration: {err}", param_hint="--threshold/--validity") from err
    now = dt.datetime.now(dt.UTC)
    try:
        found = kubeadm_certs.expiries(kubernetes_dir)
    except (OSError, ValueError, kubeadm_certs.RenewalError) as err:
        _fail(summary_file, f"cannot read the certificates under {kubernetes_dir}: {err}")
    if not found:
        _fail(summary_file, f"no kubeadm certificates under {kubernetes_dir}")
    for line in kubeadm_certs.describe(found, now, within):
        typer.echo(line)
    if dry_run:
        return
    due = [e for e in found if e.due(now, within)]
    try:
        done = [kubeadm_certs.renew(kubernetes_dir, e.kind, now, lifetime) for e in due]
        for expiry in done:
            typer.echo(
                f"renewed {expiry.kind.name}: valid until {expiry.not_after.isoformat(timespec='seconds')}"
            )
        for pod in kubeadm_certs.restart_order(e.kind for e in done):
            typer.echo(f"restarting static pod {pod}")
            restart_static_pod(kubernetes_dir, pod, manifest_absent)
        typer.echo(await_apiserver(kubernetes_dir, apiserver, apiserver_timeout))
    except (OSError, kubeadm_certs.RenewalError) as err:
        _fail(summary_file, f"failed: {err}")
    names = ", ".join(e.kind.name for e in done)
    _summary(
        summary_file,
        f"renewed {len(done)}: {names}"
        if done
        else f"none within {threshold or spec.rotate_certs_threshold}",
    )


def _summary(path: Path | None, line: str, err: bool = False) -> None:
    """The line printed, and written where the pod's termination message is read."""
    typer.echo(line, err=err)
    target = path if path is not None else (TERMINATION_LOG if TERMINATION_LOG.exists() else None)
    if target is not None:
        with contextlib.suppress(OSError):
            target.write_text(line[:4000])


def _fail(path: Path | None, line: str) -> NoReturn:
    _summary(path, line, err=True)
    raise typer.Exit(1)
