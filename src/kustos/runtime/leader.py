"""Lease-based leader election (coordination.k8s.io/v1), with client-go's timings and rules.

A candidate takes the Lease when it is free or its holder has not renewed it for a
whole lease duration, measured on the candidate's own clock from the moment it
last saw the record change (so clock skew between nodes does not matter). The
leader renews every ``retry_period``; if it cannot renew for ``renew_deadline`` it
has lost, and says so at once so the process stands down before anyone else can
take over. Releasing on shutdown empties the holder so a standby takes over
immediately instead of after a lease duration.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2

from kustos.runtime.api import ApiStatusError, raise_for
from kustos.runtime.kube import api_path
from kustos.runtime.metrics import Metrics
from kustos.runtime.times import micro_rfc3339

log = logging.getLogger(__name__)

Lease = dict[str, Any]  # a coordination.k8s.io/v1 Lease as the API server sends it


def holder_host(holder: str) -> str:
    """A Lease's holderIdentity ``<hostname>_<random id>`` (the manager's identity) -> the
    hostname, which is the pod's name when the operator runs in a pod."""
    return holder.rpartition("_")[0] or holder


@dataclass(frozen=True)
class LeaderElectionConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    def __init__(
        self, client: httpx2.AsyncClient, config: LeaderElectionConfig, metrics: Metrics | None = None
    ) -> None:
        self._client = client
        self.config = config
        self._metrics = metrics
        self._path = api_path("coordination.k8s.io", "v1", "leases", config.namespace, config.name)
        self._observed: tuple[str | None, str | None] | None = None
        self._observed_at = 0.0
        self._held: Lease | None = None  # the Lease as this replica last wrote it
        self.is_leader = False

    async def run(self, on_started_leading: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Acquire, then lead until the lease is lost; return (never raise) when it is.

        ``on_started_leading`` runs as a task while we lead and is cancelled when we lose.
        """
        await self._acquire()
        leading = asyncio.create_task(on_started_leading())
        try:
            await self._renew_until_lost(leading)
        finally:
            self._set_leader(False)
            if not leading.done():
                leading.cancel()

    async def release(self) -> None:
        """Give the lease up (on clean shutdown), so a standby need not wait for expiry.

        Checked against the Lease itself, not our flag: ``run`` clears the flag when it
        is cancelled, which is exactly when releasing matters.
        """
        try:
            lease = await self._get()
            if lease is not None and _spec(lease).get("holderIdentity") == self.config.identity:
                lease["spec"] = {**_spec(lease), "holderIdentity": None, "leaseDurationSeconds": 1,
                                 "renewTime": _now()}  # fmt: skip
                await self._replace(lease)
                log.info("released lease %s/%s", self.config.namespace, self.config.name)
        except Exception as err:  # the API server may be gone: say so in one line and go on exiting
            log.warning("could not release the lease: %s", _one_line(err))
        self._set_leader(False)

    async def _acquire(self) -> None:
        log.info("waiting to lead as %s (lease %s/%s)", self.config.identity, self.config.namespace,
                 self.config.name)  # fmt: skip
        failing = False
        while True:
            try:
                if await self._try_acquire_or_renew():
                    break
                failing = False
            except Exception as err:  # the API server is away: a standby keeps trying, as client-go's
                if not failing:
                    log.warning("acquiring the lease failed, retrying: %s", _one_line(err))
                failing = True
            await asyncio.sleep(self.config.retry_period)
        log.info("became the leader")
        self._set_leader(True)

    async def _renew_until_lost(self, leading: asyncio.Task[None]) -> None:
        last_renewed = time.monotonic()
        last_error = ""
        while True:
            if leading.done():
                return
            await asyncio.sleep(self.config.retry_period)
            try:
                async with asyncio.timeout(self.config.renew_deadline):  # cancel-safe, unlike wait_for
                    renewed = await self._try_acquire_or_renew()
            except (TimeoutError, Exception) as err:
                # The first failure of a streak is news; the rest would only repeat it.
                (log.debug if last_error else log.warning)("renewing the lease failed: %s", _one_line(err))
                last_error = _one_line(err)
                renewed = False
            if renewed:
                last_renewed, last_error = time.monotonic(), ""
            elif time.monotonic() - last_renewed >= self.config.renew_deadline:
                cfg, why = self.config, f" ({last_error})" if last_error else ""
                log.error("lost the lease %s/%s: not renewed for %.0fs%s; standing down",
                          cfg.namespace, cfg.name, cfg.renew_deadline, why)  # fmt: skip
                return
            elif not await self._still_ours():
                log.error("lost the lease %s/%s: another replica holds it; standing down",
                          self.config.namespace, self.config.name)  # fmt: skip
                return

    async def _still_ours(self) -> bool:
        try:
            lease = await self._get()
        except Exception:
            return True  # unknown: keep trying until the renew deadline
        return lease is not None and _spec(lease).get("holderIdentity") == self.config.identity

    async def _try_acquire_or_renew(self) -> bool:
        now = _now()
        cfg = self.config
        if await self._renew_held(now):
            return True
        lease = await self._get()
        if lease is None:
            fresh: Lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": cfg.identity,
                    "leaseDurationSeconds": int(cfg.lease_duration),
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                self._held = await self._write("POST", self._path.rpartition("/")[0], fresh)
            except ApiStatusError as err:
                if err.conflict:
                    return False
                raise
            self._observed, self._observed_at = (cfg.identity, now), time.monotonic()
            return True
        spec = _spec(lease)
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        holder = spec.get("holderIdentity")
        duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
        expired = time.monotonic() - self._observed_at > duration
        if holder and holder != cfg.identity and not expired:
            return False
        if holder != cfg.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=cfg.identity, leaseDurationSeconds=int(cfg.lease_duration), renewTime=now)
        lease["spec"] = spec
        try:
            # replace carries the resourceVersion: a concurrent writer makes this fail with 409.
            self._held = await self._replace(lease)
        except ApiStatusError as err:
            if err.conflict:
                return False
            raise
        self._observed, self._observed_at = (cfg.identity, now), time.monotonic()
        return True

    async def _renew_held(self, now: str) -> bool:
        """client-go's fast path: the leader renews the Lease as it last wrote it, one request
        instead of a read and a write. Its resourceVersion makes any write by someone else since
        fail (409); then, or on any other failure, the full read-and-decide path runs."""
        held, self._held = self._held, None
        if held is None or not self.is_leader:
            return False
        if time.monotonic() - self._observed_at > self.config.lease_duration:
            return False  # not renewed for a whole lease: someone may hold it now
        held["spec"] = {**_spec(held), "renewTime": now}
        try:
            self._held = await self._replace(held)
        except Exception as err:  # the read-and-decide path runs, and reports what persists
            log.debug("renewing the lease as last written failed: %s", _one_line(err))
            return False
        self._observed, self._observed_at = (self.config.identity, now), time.monotonic()
        return True

    # The Lease is read and written with the raw client, not ``Api``: a renewal is not one of
    # the controllers' writes (the proof suite's crash points count those).
    async def _get(self) -> Lease | None:
        response = await self._client.get(self._path)
        if response.status_code == 404:
            return None
        raise_for(response)
        lease: Lease = response.json()
        return lease

    async def _replace(self, lease: Lease) -> Lease:
        return await self._write("PUT", self._path, lease)

    async def _write(self, method: str, path: str, lease: Lease) -> Lease:
        response = await self._client.request(method, path, json=lease)
        raise_for(response)
        written: Lease = response.json()
        return written

    def _set_leader(self, value: bool) -> None:
        self.is_leader = value
        if self._metrics is not None:
            self._metrics.leader.labels(self.config.name).set(1 if value else 0)


def _now() -> str:
    return micro_rfc3339(datetime.now(UTC))


def _spec(lease: Lease) -> dict[str, Any]:
    spec: dict[str, Any] = dict(lease.get("spec") or {})
    return spec


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
