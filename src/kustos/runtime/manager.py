"""The manager: shared informers, controllers, leader election, probes and webhooks.

Informers start at once on every replica, so a standby has warm caches; the
controllers (and the webhook configurations they own) run only on the leader.
Losing the lease stops the controllers and ends ``run`` so that the process exits:
two leaders never act at once.

A family of controllers may load on the first object of its kind (``load_on_first``): until then
it costs only that kind's watch, so an operator that runs etcd alone does not hold the modules,
watches and caches of the node and storage families. What a family adds while the manager runs
(informers, controllers) starts at once, and a late controller is handed every object already
cached.

Each controller starts as soon as ITS caches have synced (controller-runtime's
per-controller WaitForCacheSync): a controller whose resource is not served (a CRD
that is absent, e.g. Rook's on a cluster without Rook) is reported after
``cache_sync_timeout`` (a log line, ``kustos_controller_caches_synced`` at 0, a
line in /readyz) and waits for it, while every other controller runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.controller import Controller, ControllerRunner
from kustos.runtime.events import EventRecorder
from kustos.runtime.informer import Informer, InformerOptions, NamespacesInformer, ResourceRef
from kustos.runtime.kube import KubeClients, connect, object_key
from kustos.runtime.leader import LeaderElectionConfig, LeaderElector
from kustos.runtime.metrics import Metrics
from kustos.runtime.observations import Observations
from kustos.runtime.server import ProbeServer, WebhookServer
from kustos.runtime.webhook import CertificateSource, ServingCertificate, Webhook, webhook_configurations

log = logging.getLogger(__name__)


@dataclass
class ManagerOptions:
    namespaces: tuple[str, ...] = ()
    """The namespaces watched (and admitted by the webhooks); empty: every namespace."""
    leader_election: bool = True
    lease_name: str = "kustos-operator"
    lease_namespace: str = "default"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}")
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_address: str = ":8080"
    webhook_address: str = ":9443"
    webhook_url: str | None = None  # how the API server reaches us from outside the cluster
    webhook_service: dict[str, Any] | None = None  # {namespace, name, port} inside the cluster
    webhook_configuration_name: str = "kustos"
    certificate: ServingCertificate | None = None
    certificate_source: CertificateSource | None = None
    """Read again every ``certificate_check_interval`` seconds: a new certificate is served at
    once and a new CA bundle written into the webhook configurations (None: ``certificate``
    for the process's life)."""
    certificate_check_interval: float = 60.0
    shutdown_timeout: float = 30.0
    cache_sync_timeout: float = 120.0
    """Seconds /readyz waits for every cache; after it a controller still waiting is reported."""

    @property
    def webhooks_reachable(self) -> bool:
        """Whether a webhook configuration can say where we are: without a URL or a Service the
        API server refuses the configuration, and the operator must still run (kustos dev up)."""
        return bool(self.webhook_url or self.webhook_service)


class Manager:
    def __init__(self, clients: KubeClients, options: ManagerOptions, metrics: Metrics | None = None) -> None:
        self.clients = clients
        self.options = options
        self.metrics = metrics or Metrics()
        # What controllers saw and do not record in status, for the domain metrics.
        self.observations = Observations()
        self.api = Api(clients.raw)
        self.events = EventRecorder(self.api)
        self.probes = ProbeServer(self.metrics, options.metrics_address)
        self._informers: dict[tuple[ResourceRef, str | None, str | None, str | None], Informer] = {}
        self._informer_tasks: list[asyncio.Task[None]] = []
        self._late_informers: list[Informer] = []  # created by a family loaded while running
        self._leading = False
        self._starters: list[asyncio.Task[None]] = []
        self._controllers: list[ControllerRunner] = []
        self._sources: dict[str, list[Informer]] = {}  # controller name -> its informers
        self._started_at: float | None = None
        self._webhooks: list[Webhook] = []
        self.webhook_server: WebhookServer | None = None
        self._applied_ca_bundle: str | None = None  # what the leader last wrote in its configurations
        self._ca_bundle_listeners: list[Callable[[], None]] = []
        self._stop = asyncio.Event()
        self.elector: LeaderElector | None = None
        self.probes.add_readiness_check("informers", self._informers_synced)
        self.probes.add_readiness_note("controllers", self._controllers_waiting)

    @classmethod
    def from_config(cls, config: Any, options: ManagerOptions) -> Manager:
        metrics = Metrics()
        return cls(connect(config, metrics), options, metrics)

    # ---- wiring --------------------------------------------------------------------

    def informer(self, resource: ResourceRef, options: InformerOptions | None = None) -> Informer:
        """The shared informer for a resource (and selector); created on first use."""
        options = options or InformerOptions()
        namespaces = self.options.namespaces
        if options.namespace == "" and not namespaces:
            options.namespace = None  # every namespace either way: one watch, not two
        several = options.namespace is None and resource.namespaced and len(namespaces) > 1
        if options.namespace is None and resource.namespaced and len(namespaces) == 1:
            options.namespace = namespaces[0]
        watched = ",".join(namespaces) if several else options.namespace
        key = (resource, watched, options.label_selector, options.field_selector)
        if key not in self._informers:
            if several:
                # One list/watch per namespace: Roles there grant no list across namespaces.
                self._informers[key] = NamespacesInformer(
                    self.clients.raw, resource, namespaces, options, self.metrics
                )
            else:
                self._informers[key] = Informer(self.clients.raw, resource, options, self.metrics)
            if self._started_at is not None:
                self._late_informers.append(self._informers[key])
                self._informer_tasks.append(asyncio.create_task(self._informers[key].run()))
        return self._informers[key]

    def add_controller(self, controller: Controller) -> ControllerRunner:
        runner = ControllerRunner(controller, self.metrics)
        primary = self.informer(controller.primary, controller.primary_options)
        sources = self._sources.setdefault(controller.name, [primary])

        primary_matters = controller.primary_matters or (lambda _old, _new: True)

        def enqueue_primary(kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
            key = object_key(obj)
            if kind == "DELETED":
                self.api.forget_status_writes(controller.primary, obj)
            elif (
                kind == "MODIFIED" and old is not None
                # The failed pass's own status record: its backoff decides the next pass. Or the
                # echo of a pass's own status write: that pass has already asked for the next.
                and (runner.queue.failures(key) or (
                    not controller.wakes_on_own_status
                    and self.api.own_status_echo(controller.name, controller.primary, obj)))
                and not objects.changed_beyond_status(old, obj)
            ):  # fmt: skip
                return
            if kind == "MODIFIED" and old is not None and not primary_matters(old, obj):
                return  # nothing the controller decides on changed
            runner.enqueue(key)

        primary.add_handler(enqueue_primary)
        for watch in controller.watches:

            def enqueue_mapped(
                kind: str, obj: dict[str, Any], old: dict[str, Any] | None, mapper: Any = watch.map_keys,
                matters: Any = watch.matters,
            ) -> None:  # fmt: skip
                if kind == "MODIFIED" and old is not None and not objects.changed_beyond_heartbeat(old, obj):
                    return  # a heartbeat changes nothing a controller decides on
                if kind == "MODIFIED" and old is not None and matters is not None and not matters(old, obj):
                    return
                keys = set(mapper(obj))
                if old is not None:
                    keys |= set(mapper(old))  # e.g. a label moved from one owner to another
                for key in keys:
                    runner.enqueue(key)

            informer = self.informer(watch.resource, watch.options)
            informer.add_handler(enqueue_mapped)
            if informer not in sources:
                sources.append(informer)
        self._controllers.append(runner)
        if self._started_at is not None:
            self.metrics.caches_synced.labels(controller.name).set(0)
        if self._leading:
            self._starters.append(asyncio.create_task(self._start_when_synced(runner)))
        return runner

    def load_on_first(self, resource: ResourceRef, load: Callable[[], None], what: str) -> None:
        """Call ``load`` (once) on the first object of ``resource``, on every replica: a family
        registers its controllers then, which start at once (see the module's docstring)."""
        loaded = False

        def on_event(kind: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
            nonlocal loaded
            if loaded or kind == "DELETED":
                return
            loaded = True
            log.info("loading %s: the first %s is %s", what, resource.kind, object_key(obj))
            load()

        self.informer(resource).add_handler(on_event)

    def add_webhook(self, webhook: Webhook) -> None:
        if self._started_at is not None:
            # The server's routes and the shared configuration are made at start: a webhook
            # added later would never be called. A family loaded late serves its webhooks
            # from the start (kustos.controllers, Family.serves_at_start).
            raise RuntimeError(f"webhook {webhook.name} added after the manager started")
        self._webhooks.append(webhook)

    def on_ca_bundle_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the served CA bundle changes (a rotation), so that a family
        keeping a configuration of its own (``own_webhook_configurations``) applies it again."""
        self._ca_bundle_listeners.append(listener)

    def _informers_synced(self) -> tuple[bool, str]:
        """Not ready while caches sync; past the sync timeout a cache still waiting (a CRD that is
        absent) no longer fails readiness: the controllers that do not need it run."""
        # A family loaded later is not a reason to stop serving (its controllers' note says why
        # they wait): /readyz took its verdict on the caches there were at start.
        late = self._late_informers
        waiting = sorted({_describe(i) for i in self._informers.values() if not (i.has_synced or i in late)})
        if not waiting:
            return True, ""
        return self._sync_deadline_passed(), "caches not synced: " + ", ".join(waiting)

    def _sync_deadline_passed(self) -> bool:
        started = self._started_at
        return started is not None and time.monotonic() - started >= self.options.cache_sync_timeout

    def _controllers_waiting(self) -> str:
        """Each controller still waiting for its caches, and for what (a note: never fails /readyz)."""
        return "; ".join(
            f"controller {name} waits for " + ", ".join(_describe(i) for i in informers if not i.has_synced)
            for name, informers in self._sources.items()
            if not all(i.has_synced for i in informers)
        )

    def waiting_controllers(self) -> dict[str, list[str]]:
        """Controllers whose caches have not synced yet, with the resources they wait for."""
        return {
            name: [_describe(i) for i in informers if not i.has_synced]
            for name, informers in self._sources.items()
            if not all(i.has_synced for i in informers)
        }

    # ---- running -------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT (or ``request_stop``), or until leadership is lost."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop.set)
        self._started_at = time.monotonic()
        for runner in self._controllers:
            self.metrics.caches_synced.labels(runner.controller.name).set(0)
        await self.probes.start()
        if self._webhooks:
            await self._start_webhooks()
        self._informer_tasks = [asyncio.create_task(i.run()) for i in self._informers.values()]
        if self.webhook_server is not None and self.options.certificate_source is not None:
            self._informer_tasks.append(asyncio.create_task(self._keep_certificate_current()))
        lost = False
        try:
            if self.options.leader_election:
                lost = await self._run_with_election()
            else:
                await self._lead_until_stopped()
        finally:
            tasks = self._informer_tasks
            for task in tasks:
                task.cancel()
            if tasks:
                # Bounded: a task that swallowed its cancel must not keep the process alive.
                await asyncio.wait(tasks, timeout=5)
            if self.webhook_server is not None:
                await self.webhook_server.stop()
            await self.probes.stop()
        if lost:
            raise LeadershipLost("the leader election lease was lost")

    async def _run_with_election(self) -> bool:
        o = self.options
        self.elector = LeaderElector(
            self.clients.raw,
            LeaderElectionConfig(
                o.lease_name,
                o.lease_namespace,
                o.identity,
                o.lease_duration,
                o.renew_deadline,
                o.retry_period,
            ),
            self.metrics,
        )
        election = asyncio.create_task(self.elector.run(self._lead_until_stopped))
        stopped = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait([election, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped in done:
            # A leader keeps renewing while its in-flight reconciles finish (the leading task
            # sees the stop itself), and only then gives the lease up: never two actors at once.
            if not self.elector.is_leader:
                election.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await election
            await self.elector.release()
            return False
        stopped.cancel()
        return True  # the elector returned: the lease is gone

    async def _lead_until_stopped(self) -> None:
        self._leading = True
        starters = self._starters = [
            asyncio.create_task(self._start_when_synced(r)) for r in self._controllers
        ]
        try:
            if self._webhooks:
                # The webhooks read the caches: point the API server at them once those synced (or
                # the sync timeout passed, so an absent CRD does not keep every webhook away).
                await self._wait_synced(list(self._informers.values()), self.options.cache_sync_timeout)
                await self._apply_webhook_configurations_until_done()
            await self._stop.wait()
        except asyncio.CancelledError:
            # Leadership lost: another leader may act soon, so in-flight work is abandoned now.
            self._leading = False
            for task in starters:
                task.cancel()
            for runner in self._controllers:
                runner.abandon()
            raise
        self._leading = False
        for task in starters:
            task.cancel()
        await asyncio.gather(*starters, return_exceptions=True)
        # Stopped: take no new work and let in-flight reconciles finish within the timeout.
        try:
            await asyncio.gather(*(r.stop(self.options.shutdown_timeout) for r in self._controllers))
        except asyncio.CancelledError:
            # The lease was lost while draining: nothing may act without it.
            for runner in self._controllers:
                runner.abandon()
            raise

    async def _start_when_synced(self, runner: ControllerRunner) -> None:
        """Start ``runner`` once its own caches have synced; report it if that takes too long."""
        name = runner.controller.name
        informers = self._sources.get(name, [])
        if not await self._wait_synced(informers, self.options.cache_sync_timeout):
            if self._stop.is_set():
                return
            waiting = ", ".join(_describe(i) for i in informers if not i.has_synced)
            log.warning("controller %s: caches not synced after %.0fs, waiting for %s; the other "
                        "controllers run", name, self.options.cache_sync_timeout, waiting)  # fmt: skip
            await self._wait_synced(informers, None)
        if self._stop.is_set():
            return
        # Every object cached so far: a controller added after its primary informer listed (a
        # family loaded late, a resource shared with another controller) saw none of them.
        primary = self._sources[name][0]
        for key in primary.keys():  # noqa: SIM118 (an Informer, not a dict)
            runner.enqueue(key)
        runner.start()
        self.metrics.caches_synced.labels(name).set(1)
        log.info("controller %s started", name)

    async def _wait_synced(self, informers: list[Informer], timeout: float | None) -> bool:
        """Wait until ``informers`` synced (True), the timeout passed or a stop was asked (False)."""
        synced: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(i.wait_synced() for i in informers))
        )
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([synced, stopped], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (synced, stopped):
                if not future.done():
                    future.cancel()
                future.add_done_callback(_retrieve)
        return all(i.has_synced for i in informers) and not self._stop.is_set()

    async def _start_webhooks(self) -> None:
        certificate = self.options.certificate
        if certificate is None:
            host = self.options.webhook_url or "https://127.0.0.1"
            hostname = host.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
            ips = [hostname] if hostname.replace(".", "").isdigit() else ["127.0.0.1"]
            certificate = ServingCertificate.self_signed([n for n in (hostname, "localhost") if n], ips)
        self.webhook_server = WebhookServer(self.options.webhook_address, certificate)
        for webhook in self._webhooks:
            self.webhook_server.register(webhook)
        await self.webhook_server.start()
        server = self.webhook_server
        self.probes.add_readiness_check("webhooks", lambda: (server.serving, "webhook server not serving"))

    async def _keep_certificate_current(self) -> None:
        """Serve what the certificate source says, and (leader) point the API server at its CA."""
        source, server = self.options.certificate_source, self.webhook_server
        assert source is not None and server is not None
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.options.certificate_check_interval)
            if self._stop.is_set():
                return
            # Only a leader whose configurations are in place may rotate: each step must reach them.
            leading = self._applied_ca_bundle is not None and (self.elector is None or self.elector.is_leader)
            try:
                fresh = await source.current(leading)
                if fresh.cert_pem != server.certificate.cert_pem:
                    log.info("webhook certificate reloaded (valid until %s)", fresh.not_after.date())
                server.reload(fresh)
                if leading and self._applied_ca_bundle != fresh.ca_bundle:
                    await self._apply_webhook_configurations()
                    log.info("webhook configurations now trust the CA bundle of %d certificate(s)",
                             fresh.ca_pem.count(b"BEGIN CERTIFICATE"))  # fmt: skip
                    for listener in self._ca_bundle_listeners:
                        listener()
            except Exception as err:  # an API blip: the served certificate stays, checked again later
                log.warning("checking the webhook certificate failed: %s", err)

    async def _apply_webhook_configurations_until_done(self) -> None:
        """Apply the webhook configurations, retrying with capped backoff: a refusal (RBAC, an
        invalid configuration) is logged and shown in /readyz, never taken for a lost lease."""
        delay, failure = 1.0, ""
        self.probes.add_readiness_check("webhook-configurations", lambda: (not failure, failure))
        while not self._stop.is_set():
            try:
                await self._apply_webhook_configurations()
                failure = ""
                return
            except Exception as err:  # an API refusal or blip: the controllers keep running
                failure = f"applying the webhook configurations failed: {err}"
                log.error("%s; retrying in %.0fs", failure, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, 60.0)

    async def _apply_webhook_configurations(self) -> None:
        """Point the API server at our webhooks, with the CA that signed our certificate."""
        assert self.webhook_server is not None
        selector = namespace_selector(self.options.namespaces)
        if selector:
            # A namespace-scoped operator admits only what it manages.
            for webhook in self._webhooks:
                webhook.namespace_selector = webhook.namespace_selector or selector
        shared = [w for w in self._webhooks if w.configuration is None]
        bundle = self.webhook_server.certificate.ca_bundle
        configurations = webhook_configurations(
            self.options.webhook_configuration_name,
            shared,
            bundle,
            base_url=self.options.webhook_url,
            service=self.options.webhook_service,
        )
        for ref, obj in configurations:
            await self.api.apply(ref, obj)
        self._applied_ca_bundle = bundle

    def own_webhook_configurations(self, configuration: str) -> list[tuple[ResourceRef, dict[str, Any]]]:
        """The configurations of the webhooks that belong to ``configuration`` (their family
        applies and removes them), with the current CA bundle; empty until the server serves."""
        chosen = [w for w in self._webhooks if w.configuration == configuration]
        if self.webhook_server is None or not chosen:
            return []
        selector = namespace_selector(self.options.namespaces)
        if selector:
            for webhook in chosen:
                webhook.namespace_selector = webhook.namespace_selector or selector
        return webhook_configurations(
            configuration,
            chosen,
            self.webhook_server.certificate.ca_bundle,
            base_url=self.options.webhook_url,
            service=self.options.webhook_service,
        )


def namespace_selector(namespaces: tuple[str, ...]) -> dict[str, Any] | None:
    """The webhooks' namespaceSelector of an operator watching ``namespaces`` (None: every one)."""
    if not namespaces:
        return None
    values = list(dict.fromkeys(namespaces))
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": values}]}


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a cancelled wait's outcome as seen (asyncio would log it as never retrieved)."""
    if not future.cancelled():
        future.exception()


def _describe(informer: Informer) -> str:
    why = f" ({informer.last_error})" if informer.last_error else ""
    return f"{informer.resource}{why}"


class LeadershipLost(RuntimeError):
    """Raised by ``Manager.run`` so that the process exits and restarts as a standby."""
