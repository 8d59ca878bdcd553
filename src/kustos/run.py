"""``kustos run``: the operator, started without the rest of the command line.

The other ``kustos`` commands are a typer application of some forty commands; building it
costs the operator about 2.5 MiB it would keep for its whole life (the CLI's imports, click's
command objects and their copies: docs/benchmarks.md, issue 28). So ``kustos run`` parses its
options here, with the standard library, and ``kustos.entry`` dispatches to it before typer
is imported. ``kustos run --help`` lists them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kustos.install.certs import SharedCertificate
    from kustos.runtime.manager import Manager

log = logging.getLogger("kustos.run")

EXIT_LEADERSHIP_LOST = 3
"""A leader that lost its Lease exits with this, so that a fresh start waits as a standby."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kustos run",
        description="Run the operator: every kustos controller, against the current cluster.",
        allow_abbrev=False,  # a misspelt flag is an error, not silently another flag (as under typer)
    )
    flag = argparse.BooleanOptionalAction
    p.add_argument("--kubeconfig", type=Path, help="Default: in-cluster, else $KUBECONFIG.")
    p.add_argument("--context", help="Kubeconfig context.")
    p.add_argument(
        "--namespace", action="append", default=[],
        help="Watch only this namespace (repeatable: several; default: all).",
    )  # fmt: skip
    p.add_argument("--leader-elect", action=flag, default=True, help="Run only while holding the Lease.")
    p.add_argument("--lease-name", default="kustos-operator")
    p.add_argument("--lease-namespace", default="default")
    p.add_argument("--lease-duration", type=float, default=15.0, help="Seconds.")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="Seconds.")
    p.add_argument("--retry-period", type=float, default=2.0, help="Seconds.")
    p.add_argument("--metrics-address", default=":8080", help="host:port of /metrics and probes.")
    p.add_argument("--webhook-address", default=":9443", help="host:port of the HTTPS webhook server.")
    p.add_argument(
        "--webhook-url", help="URL the API server calls webhooks at (operator outside the cluster)."
    )
    p.add_argument(
        "--webhook-configuration-name", default="kustos",
        help="Name of the webhook configurations the operator keeps current.",
    )  # fmt: skip
    p.add_argument(
        "--webhook-service", type=_service,
        help="namespace/name:port of the webhook Service (operator in the cluster).",
    )  # fmt: skip
    p.add_argument(
        "--webhook-cert-secret",
        help="Secret every replica shares its certificate in (in the Service's namespace, else the "
        "Lease's); the leader rotates its CA before expiry or on kustos.dev/rotate-ca.",
    )
    p.add_argument(
        "--webhook-cert-check-interval", type=float, default=60.0,
        help="Seconds between reads of --webhook-cert-secret (rotation steps).",
    )  # fmt: skip
    p.add_argument("--webhook-cert", type=Path, help="PEM certificate (self-signed if unset).")
    p.add_argument("--webhook-key", type=Path, help="PEM key for --webhook-cert.")
    p.add_argument("--webhook-ca", type=Path, help="CA bundle for --webhook-cert.")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, help="Seconds for in-flight reconciles.")
    p.add_argument(
        "--cache-sync-timeout", type=float, default=120.0,
        help="Seconds before a controller still waiting for its caches is reported.",
    )  # fmt: skip
    p.add_argument("--log-level", default="info", help="debug, info, warning, error.")
    p.add_argument("--json-logs", action=flag, default=False, help="One JSON object per log line.")
    p.add_argument(
        "--controllers", default="all", help="Comma-separated controllers to run, 'all' or 'none'."
    )
    # module:function registering more controllers (benchmarks, tests).
    p.add_argument("--extra-controllers", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument(
        "--cloud-provider", default="none",
        help="Cloud provider node rollouts and fencing use: none, kwok, aws, gcp or azure.",
    )  # fmt: skip
    p.add_argument(
        "--cloud-option", action="append", default=[], help="key=value for the cloud provider (repeatable)."
    )
    return p


def main(argv: Sequence[str]) -> int:
    """Run until stopped; the exit status: 0, 1 (the API server refused where nothing could
    retry), 2 (bad options: argparse exits), or ``EXIT_LEADERSHIP_LOST``."""
    from kustos import controllers
    from kustos.nodes.cloud import parse_options, provider_from
    from kustos.runtime.controller import describe, expected
    from kustos.runtime.deps import Deps
    from kustos.runtime.kube import load_config
    from kustos.runtime.logs import setup_logging
    from kustos.runtime.manager import LeadershipLost, Manager, ManagerOptions
    from kustos.runtime.webhook import ServingCertificate

    options_parser = parser()
    args = options_parser.parse_args(argv)
    setup_logging(args.log_level, args.json_logs)
    try:
        cloud = provider_from(args.cloud_provider, parse_options(args.cloud_option))
    except (ValueError, ImportError) as err:
        options_parser.error(f"--cloud-provider/--cloud-option: {err}")
    certificate = None
    if args.webhook_cert and args.webhook_key:
        certificate = ServingCertificate.from_files(args.webhook_cert, args.webhook_key, args.webhook_ca)
    options = ManagerOptions(
        namespaces=tuple(dict.fromkeys(args.namespace)),
        leader_election=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        metrics_address=args.metrics_address,
        webhook_address=args.webhook_address,
        webhook_url=args.webhook_url,
        webhook_service=args.webhook_service,
        webhook_configuration_name=args.webhook_configuration_name,
        certificate=certificate,
        certificate_check_interval=args.webhook_cert_check_interval,
        shutdown_timeout=args.shutdown_timeout,
        cache_sync_timeout=args.cache_sync_timeout,
    )

    async def serve() -> None:
        manager = Manager.from_config(load_config(args.kubeconfig, args.context), options)
        secret = args.webhook_cert_secret
        if secret and (options.webhook_service or args.webhook_url) and certificate is None:
            source = _shared_certificate(manager, secret)
            options.certificate_source = source
            options.certificate = await source.current(leader=False)
        chosen = args.controllers
        names = None if chosen == "all" else [n for n in chosen.split(",") if n and n != "none"]
        bind = getattr(cloud, "bind", None)
        if bind is not None:
            bind(manager.api)  # a provider that keeps its state in the cluster (kwok)
        deps = Deps(cloud=cloud)
        controllers.register_all(manager, deps, names)
        for target in args.extra_controllers:
            controllers.resolve(target)(manager, deps)
        try:
            await manager.run()
        finally:
            await manager.clients.close()

    try:
        asyncio.run(serve())
    except LeadershipLost as err:
        log.error("%s: exiting so that a fresh start waits as a standby", err)
        return EXIT_LEADERSHIP_LOST
    except Exception as err:
        if not expected(err):
            raise  # a bug: its traceback is the report
        # The API server went away (or refused) where nothing could retry: one line, not a traceback.
        log.error("exiting: %s", describe(err))
        return 1
    return 0


def _shared_certificate(manager: Manager, secret: str) -> SharedCertificate:
    """The Secret the replicas share (install/certs.py), for the names the API server calls us by:
    the webhook Service's, or the host of --webhook-url (an operator outside the cluster)."""
    import datetime as dt
    import ipaddress
    from urllib.parse import urlsplit

    from kustos.install.certs import SharedCertificate, service_dns_names

    options = manager.options
    dns_names: list[str] = []
    ips: list[str] = []
    if options.webhook_service:
        namespace = options.webhook_service["namespace"]
        dns_names = service_dns_names(namespace, options.webhook_service["name"])
    else:
        namespace = options.lease_namespace
        host = urlsplit(options.webhook_url or "").hostname or "localhost"
        try:
            ips = [str(ipaddress.ip_address(host))]
        except ValueError:
            dns_names = [host]
    # A step waits for every replica's next read and for the API server to see the configurations.
    settle = dt.timedelta(seconds=2 * options.certificate_check_interval + 5)
    return SharedCertificate(manager.api, namespace, secret, dns_names, ips, settle)


def _service(value: str) -> dict[str, object]:
    """``namespace/name:port`` -> the clientConfig.service of a webhook configuration."""
    reference, _, port = value.partition(":")
    namespace, _, name = reference.partition("/")
    if not (namespace and name and port.isdigit()):
        raise argparse.ArgumentTypeError(f"{value!r}: expected namespace/name:port")
    return {"namespace": namespace, "name": name, "port": int(port)}
