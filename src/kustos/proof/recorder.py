"""Record a history: concurrent clients and watchers against an etcd cluster's JSON gateway.

Each client loops over random calls on a few keys under one prefix (gets, puts, deletes, and
compare-and-swap transactions on the revision it last saw), paced so that all clients
together keep ``rate`` calls a second, and writes each call to the history file as it ends
(``history.py`` says what the file holds). Watchers watch the whole prefix from the first
revision on and resume where they stopped when their member goes away. A client whose call
fails moves to the next endpoint, as etcd's own client does; with ``follow_members`` the
endpoints are refreshed every second from etcd's member list, as etcd's client's auto-sync
does (a rolling upgrade replaces every member, addresses and all). With TLS, the CA and
client certificate files are read again every second and a changed set is used from the next
call on (``_ClientTLS``): a CA rotation or a renewal replaces the client certificate while
the load runs, as a mounted Secret changes under a pod.

The recorder is bounded in calls and time and talks only to loopback, private or cluster
addresses: it is load for test clusters, never for someone else's etcd. It must be the only
writer of the cluster while it records: the checker counts every revision.

Its own transport rather than ``kustos.etcd.client``: the operator's client turns every
failure into one error type, while a history must tell a write that was never sent (no
effect) from one whose answer was lost (maybe applied), and keep etcd's raw answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import random
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import httpx2 as httpx  # the API client's httpx2: one HTTP stack loaded, not two

from kustos.etcd.client import EtcdTLS, parse_members, prefix_end
from kustos.proof.history import (
    Event,
    EventKind,
    Header,
    Operation,
    Read,
    WatchEvents,
    WatchStart,
    header_line,
    record_line,
)

__all__ = ["Recording", "Workload", "WorkloadError", "record"]

MAX_CLIENTS = 64
MAX_DURATION = 4 * 3600.0
MAX_OPERATIONS = 2_000_000
MAX_RATE = 5_000.0
CLUSTER_DOMAINS = (".svc", ".cluster.local")
WATCH_SILENCE = 5.0  # seconds without a watch response before the watch is resumed elsewhere
TLS_RELOAD_EVERY = 1.0  # seconds between reads of the TLS files (a change is used from the next call)


class WorkloadError(ValueError):
    """A workload setting out of bounds; the message names the field."""


def _allowed_host(host: str) -> bool:
    """Loopback, private (RFC 1918, ULA) or in-cluster DNS names: test clusters only."""
    if host == "localhost" or host.endswith(CLUSTER_DOMAINS) or host.endswith(CLUSTER_DOMAINS[0] + "."):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


@dataclass(frozen=True)
class Workload:
    """What to record: where, how many clients, how fast, and for how long at most."""

    endpoints: tuple[str, ...]
    clients: int = 4
    watchers: int = 2
    keys: int = 6
    prefix: str = "/kustos-proof/"
    duration: float = 10.0
    max_operations: int = 20_000
    rate: float = 200.0
    request_timeout: float = 2.0
    scenario: str = ""
    seed: int | None = None
    tls: EtcdTLS | None = None  # its files are read again while recording: see _ClientTLS
    follow_members: bool = False  # refresh the endpoints from etcd's member list every second
    # Relative weights of the calls a client makes.
    mix: Mapping[str, int] = field(default_factory=lambda: {"get": 4, "put": 3, "txn": 2, "delete": 1})

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise WorkloadError("endpoints: at least one etcd client URL is needed")
        for endpoint in self.endpoints:
            url = urlsplit(endpoint)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise WorkloadError(f"endpoints: {endpoint!r} is not an http(s)://host:port URL")
            if not _allowed_host(url.hostname):
                raise WorkloadError(
                    f"endpoints: {endpoint!r} is not a loopback, private or cluster address; "
                    "the recorder only loads test clusters"
                )
        bounds: list[tuple[str, float, float, float]] = [
            ("clients", self.clients, 1, MAX_CLIENTS),
            ("watchers", self.watchers, 0, MAX_CLIENTS),
            ("keys", self.keys, 1, 1000),
            ("duration", self.duration, 0.1, MAX_DURATION),
            ("max_operations", self.max_operations, 1, MAX_OPERATIONS),
            ("rate", self.rate, 0.1, MAX_RATE),
            ("request_timeout", self.request_timeout, 0.05, 60),
        ]
        for name, value, low, high in bounds:
            if not low <= value <= high:
                raise WorkloadError(f"{name}: {value} is outside {low:g}..{high:g}")
        if not self.prefix or not self.prefix.isprintable():
            raise WorkloadError(f"prefix: {self.prefix!r} must be a non-empty printable string")
        unknown = set(self.mix) - {"get", "put", "txn", "delete"}
        if unknown or not any(w > 0 for w in self.mix.values()) or any(w < 0 for w in self.mix.values()):
            raise WorkloadError(f"mix: {dict(self.mix)} must weigh get, put, txn and delete (>= 0, one > 0)")

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(f"{self.prefix}k{i}" for i in range(self.keys))


@dataclass(frozen=True)
class Recording:
    """What a recording did, for the report (the file says everything else)."""

    path: Path
    operations: int
    indeterminate: int
    failed: int
    watch_events: int
    watch_resumes: int  # watches started again after their stream broke
    seconds: float
    clock_zero: float  # time.monotonic() at the history's time 0: places a caller's events on it
    tls_reloads: int = 0  # changed TLS files taken while recording (a renewal, a CA rotation)


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode("ascii")


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode("utf-8", "replace")


def _int(obj: Mapping[str, Any], name: str) -> int:
    return int(obj.get(name) or 0)


def _read(kvs: list[Mapping[str, Any]] | None) -> Read | None:
    if not kvs:
        return None
    return Read(_text(kvs[0].get("value", "")), _int(kvs[0], "mod_revision"))


class _Answer(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")


class _Journal:
    """The history file, written a line at a time as calls end (one event loop: no locks)."""

    def __init__(self, out: TextIO, started: int) -> None:
        self.out = out
        self.started = started
        self.operations = 0
        self.indeterminate = 0
        self.failed = 0
        self.events = 0
        self.watch_starts = 0
        self.newest_revision = 0
        self.watched: dict[int, int] = {}  # watcher -> the newest revision it delivered
        self.watch_progress = asyncio.Event()
        self.watchers_gone: set[int] = set()  # watchers that cannot go on (their revisions compacted)

    def now(self) -> int:
        return time.monotonic_ns() - self.started

    def write(self, line: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(line) + "\n")

    def operation(self, op: Operation) -> None:
        self.operations += 1
        self.indeterminate += op.outcome == "indeterminate"
        self.failed += op.outcome == "failed"
        if op.outcome == "ok" and op.revision is not None:
            self.newest_revision = max(self.newest_revision, op.revision)
        self.write(record_line(op))


class _Endpoints:
    """The client URLs every client and watcher of one recording picks from."""

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls = urls

    def update(self, urls: tuple[str, ...]) -> None:
        allowed = tuple(u for u in urls if _allowed_host(urlsplit(u).hostname or ""))
        if allowed:
            self.urls = allowed


class _ClientTLS:
    """The workload's CA and client certificate files as one SSL context, shared by a
    recording's clients, read again at most every ``TLS_RELOAD_EVERY`` seconds.

    Why files, re-read: a CA rotation reissues the client certificate mid-run (kustos's
    ``<name>-client-tls``), and a Secret mounted in a pod changes in place (the kubelet swaps
    every file at once), so a recorder started on the old files keeps loading the cluster on
    the new ones, with no history cut in two. A set that does not load (a key that does not
    match its certificate yet, while someone writes the files one by one) is skipped: the
    last good one is used until the files agree.
    """

    def __init__(self, tls: EtcdTLS | None) -> None:
        self.tls = tls
        # Files that do not load when the recording starts are the caller's error: raised.
        self.context: ssl.SSLContext | None = tls.shared_ssl_context() if tls is not None else None
        self.checked = time.monotonic()
        self.reloads = 0

    def current(self) -> ssl.SSLContext | None:
        if self.tls is None or time.monotonic() - self.checked < TLS_RELOAD_EVERY:
            return self.context
        self.checked = time.monotonic()
        try:
            context = self.tls.shared_ssl_context()  # the same object while the contents are
        except (OSError, ssl.SSLError, ValueError):
            return self.context
        if context is not self.context:
            self.context = context
            self.reloads += 1
        return self.context


class _Gateway:
    """One HTTP connection pool per endpoint; a client moves to the next on failure. Its pool
    is replaced (between calls) when the TLS files changed: new connections, new handshakes."""

    def __init__(
        self,
        workload: Workload,
        first: int,
        endpoints: _Endpoints | None = None,
        tls: _ClientTLS | None = None,
    ) -> None:
        self.workload = workload
        self.endpoints = endpoints or _Endpoints(workload.endpoints)
        self.index = first
        self.tls = tls or _ClientTLS(workload.tls)
        self.context = self.tls.current()
        self.http = self._pool()

    def _pool(self) -> httpx.AsyncClient:
        verify: Any = self.context if self.context is not None else True
        return httpx.AsyncClient(timeout=self.workload.request_timeout, verify=verify, trust_env=False)

    async def _current(self) -> httpx.AsyncClient:
        """The pool for the TLS files as they are now (every call of a gateway is sequential, so
        the old pool has nothing in flight when it is closed)."""
        context = self.tls.current()
        if context is not self.context:
            self.context = context
            old, self.http = self.http, self._pool()
            await old.aclose()
        return self.http

    @property
    def endpoint(self) -> str:
        urls = self.endpoints.urls
        return urls[self.index % len(urls)].rstrip("/")

    def next_endpoint(self) -> None:
        self.index += 1

    async def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        http = await self._current()
        response = await http.post(self.endpoint + path, json=body)
        if response.status_code != 200:
            raise _Answer(response.status_code, response.text)
        payload = response.json()
        if not isinstance(payload, dict):
            raise _Answer(response.status_code, response.text)
        return payload

    @asynccontextmanager
    async def stream(self, path: str, body: Mapping[str, Any]) -> AsyncIterator[httpx.Response]:
        # A watch of a member that vanished without closing its connections would wait forever:
        # a silent stream is given up and resumed elsewhere (harmless when it was only quiet).
        timeout = httpx.Timeout(self.workload.request_timeout, read=WATCH_SILENCE)
        http = await self._current()
        async with http.stream("POST", self.endpoint + path, json=body, timeout=timeout) as response:
            yield response


def _never_sent(exc: BaseException) -> bool:
    """The request never left: the connection could not be made, so a write had no effect."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))


async def _call(gateway: _Gateway, journal: _Journal, op: Operation) -> Operation:
    """Send one call; the same operation with its answer, its outcome and its return time."""
    key = {"key": _b64(op.key)}
    body: dict[str, Any]
    if op.kind == "get":
        path, body = "/v3/kv/range", key
    elif op.kind == "put":
        path, body = "/v3/kv/put", {**key, "value": _b64(op.value or "")}
    elif op.kind == "delete":
        path, body = "/v3/kv/deleterange", key
    else:
        compare = {"target": "MOD", "result": "EQUAL", **key, "mod_revision": op.expected_mod_revision}
        put = {"request_put": {**key, "value": _b64(op.value or "")}}
        failure = [{"request_range": key}]
        path, body = "/v3/kv/txn", {"compare": [compare], "success": [put], "failure": failure}
    call = journal.now()
    try:
        answer = await gateway.post(path, body)
    except (httpx.HTTPError, OSError, ValueError, _Answer) as exc:
        ended = journal.now()
        outcome = "failed" if op.kind == "get" or _never_sent(exc) else "indeterminate"
        ret = ended if outcome == "failed" else None
        error = f"{gateway.endpoint}: {type(exc).__name__}: {exc}"[:500]
        return Operation(**{**_fields(op), "call": call, "ret": ret, "outcome": outcome, "error": error})
    ret = journal.now()
    revision = _int(answer.get("header") or {}, "revision")
    result: dict[str, Any] = {"call": call, "ret": ret, "outcome": "ok", "revision": revision}
    if op.kind == "get":
        result["read"] = _read(answer.get("kvs"))
    elif op.kind == "delete":
        result["deleted"] = _int(answer, "deleted")
    elif op.kind == "txn":
        result["succeeded"] = bool(answer.get("succeeded"))
        if not result["succeeded"]:
            responses = answer.get("responses") or [{}]
            result["read"] = _read((responses[0].get("response_range") or {}).get("kvs"))
    return Operation(**{**_fields(op), **result})


def _fields(op: Operation) -> dict[str, Any]:
    return {name: getattr(op, name) for name in Operation.__dataclass_fields__}


async def _client(
    number: int,
    workload: Workload,
    endpoints: _Endpoints,
    tls: _ClientTLS,
    journal: _Journal,
    deadline: float,
    budget: list[int],
    rng: random.Random,
) -> None:
    gateway = _Gateway(workload, number, endpoints, tls)
    kinds, weights = zip(*workload.mix.items(), strict=True)
    seen: dict[str, int] = {}  # key -> the mod revision this client last saw (for its txns)
    interval = workload.clients / workload.rate
    next_at = time.monotonic()
    sequence = 0
    try:
        while time.monotonic() < deadline and budget[0] > 0:
            budget[0] -= 1
            kind = rng.choices(kinds, weights)[0]
            key = rng.choice(workload.key_names)
            sequence += 1
            value = f"c{number}-{sequence}" if kind in ("put", "txn") else None
            expected = seen.get(key, 0) if kind == "txn" else None
            op = Operation(number, kind, key, 0, "ok", value=value, expected_mod_revision=expected)
            done = await _call(gateway, journal, op)
            journal.operation(done)
            if done.outcome != "ok":
                gateway.next_endpoint()
            elif done.kind == "get" or (done.kind == "txn" and not done.succeeded):
                seen[key] = done.read.mod_revision if done.read is not None else 0
            elif done.kind == "delete":
                seen[key] = 0
            else:
                seen[key] = done.revision or 0
            # After a slow call, go on at the rate rather than in a burst that catches up.
            next_at = max(next_at + interval, time.monotonic() - interval)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await gateway.http.aclose()


async def _watcher(
    number: int,
    workload: Workload,
    endpoints: _Endpoints,
    tls: _ClientTLS,
    journal: _Journal,
    start: int,
    stop: asyncio.Event,
) -> None:
    """Watch the prefix from ``start``; resume after the last revision seen when the stream breaks."""
    gateway = _Gateway(workload, number, endpoints, tls)
    prefix = workload.prefix.encode()
    next_revision = start
    try:
        while not stop.is_set():
            body = {
                "create_request": {
                    "key": _b64(prefix),
                    "range_end": _b64(prefix_end(prefix)),
                    "start_revision": next_revision,
                }
            }
            journal.watch_starts += 1
            journal.write(record_line(WatchStart(number, journal.now(), next_revision, gateway.endpoint)))
            try:
                async with gateway.stream("/v3/watch", body) as response:
                    if response.status_code != 200:
                        raise _Answer(response.status_code, (await response.aread()).decode(errors="replace"))
                    async for line in _lines_until(response, stop):
                        result = json.loads(line).get("result") or {}
                        if result.get("compact_revision"):
                            # The revisions it needs are compacted away: it can never resume
                            # without a gap, so it stops (the checks see where its coverage ends).
                            journal.watchers_gone.add(number)
                            journal.watch_progress.set()
                            return
                        if result.get("canceled"):
                            raise _Answer(200, line)
                        events = [_event(e) for e in result.get("events") or []]
                        if events:
                            journal.events += len(events)
                            journal.write(record_line(WatchEvents(number, journal.now(), tuple(events))))
                            next_revision = events[-1].mod_revision + 1
                            journal.watched[number] = events[-1].mod_revision
                            journal.watch_progress.set()
            except (httpx.HTTPError, OSError, ValueError, _Answer):
                gateway.next_endpoint()
                await asyncio.sleep(0.1)
    finally:
        await gateway.http.aclose()


async def _lines_until(response: httpx.Response, stop: asyncio.Event) -> AsyncIterator[str]:
    """The stream's lines until it ends or ``stop`` is set (a watch never ends by itself)."""
    lines = response.aiter_lines()

    async def next_line() -> str:
        return await anext(lines)

    stopped = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            line = asyncio.create_task(next_line())
            await asyncio.wait({stopped, line}, return_when=asyncio.FIRST_COMPLETED)
            if not line.done():
                line.cancel()
                return
            try:
                yield line.result()
            except StopAsyncIteration:
                return
    finally:
        stopped.cancel()


def _event(obj: Mapping[str, Any]) -> Event:
    kv = obj.get("kv") or {}
    kind: EventKind = "delete" if obj.get("type") == "DELETE" else "put"
    return Event(kind, _text(kv.get("key", "")), _int(kv, "mod_revision"), _text(kv.get("value", "")))


async def _initial_state(workload: Workload, tls: _ClientTLS, deadline: float) -> tuple[int, dict[str, Read]]:
    """The store revision and the prefix's keys before the first call (retried until ``deadline``)."""
    gateway = _Gateway(workload, 0, tls=tls)
    prefix = workload.prefix.encode()
    body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
    try:
        while True:
            try:
                answer = await gateway.post("/v3/kv/range", body)
                kvs = {_text(kv["key"]): Read(_text(kv.get("value", "")), _int(kv, "mod_revision"))
                       for kv in answer.get("kvs") or []}  # fmt: skip
                return _int(answer.get("header") or {}, "revision"), kvs
            except (httpx.HTTPError, OSError, ValueError, _Answer) as exc:
                if time.monotonic() > deadline:
                    what = f"no etcd member answered a read of {workload.prefix}: {exc}"
                    raise ConnectionError(what) from exc
                gateway.next_endpoint()
                await asyncio.sleep(0.2)
    finally:
        await gateway.http.aclose()


async def _final_reads(
    workload: Workload, endpoints: _Endpoints, tls: _ClientTLS, journal: _Journal, deadline: float
) -> None:
    """A linearizable read of every key after the load, by one more client: what survived."""
    gateway = _Gateway(workload, 0, endpoints, tls)
    try:
        for key in workload.key_names:
            while True:
                op = await _call(gateway, journal, Operation(workload.clients, "get", key, 0, "ok"))
                journal.operation(op)
                if op.outcome == "ok" or time.monotonic() > deadline:
                    break
                gateway.next_endpoint()
                await asyncio.sleep(0.2)
    finally:
        await gateway.http.aclose()


async def _follow_members(
    workload: Workload, endpoints: _Endpoints, tls: _ClientTLS, stop: asyncio.Event
) -> None:
    """Every second, the started voting members' client URLs from etcd's member list (etcd's
    client's auto-sync leaves learners and members not started yet out too)."""
    gateway = _Gateway(workload, 0, endpoints, tls)
    try:
        while not stop.is_set():
            try:
                answer = await gateway.post("/v3/cluster/member/list", {"linearizable": True})
                members = parse_members(answer)
                endpoints.update(
                    tuple(u for m in members if m.name and not m.is_learner for u in m.client_urls)
                )
            except (httpx.HTTPError, OSError, ValueError, _Answer):
                gateway.next_endpoint()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        await gateway.http.aclose()


async def _watchers_caught_up(journal: _Journal, watchers: int, initial: int, timeout: float) -> None:
    """Until every watcher delivered the newest revision a client was told of (or ``timeout``)."""
    deadline = time.monotonic() + timeout

    def behind() -> bool:
        going = (i for i in range(watchers) if i not in journal.watchers_gone)
        return any(journal.watched.get(i, initial) < journal.newest_revision for i in going)

    while behind():
        journal.watch_progress.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            await asyncio.wait_for(journal.watch_progress.wait(), left)
        except TimeoutError:
            return


async def record(workload: Workload, path: Path, settle: float = 30.0) -> Recording:
    """Record one history into ``path``: at most ``workload.duration`` seconds of load (and at
    most ``settle`` seconds before and after it to read the first and last state and let the
    watchers catch up) and ``workload.max_operations`` calls."""
    began = time.monotonic()
    tls = _ClientTLS(workload.tls)
    initial_revision, initial = await _initial_state(workload, tls, began + settle)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        journal = _Journal(out, time.monotonic_ns())
        header = Header(
            prefix=workload.prefix,
            keys=workload.key_names,
            clients=workload.clients,
            watchers=workload.watchers,
            endpoints=workload.endpoints,
            started=datetime.now(UTC).isoformat(timespec="seconds"),
            initial_revision=initial_revision,
            initial=initial,
            scenario=workload.scenario,
        )
        journal.write(header_line(header))
        stop = asyncio.Event()
        rng = random.Random(workload.seed)
        endpoints = _Endpoints(workload.endpoints)
        watchers = [
            asyncio.create_task(_watcher(i, workload, endpoints, tls, journal, initial_revision + 1, stop))
            for i in range(workload.watchers)
        ]
        if workload.follow_members:
            watchers.append(asyncio.create_task(_follow_members(workload, endpoints, tls, stop)))
        load_started = time.monotonic()
        budget = [workload.max_operations]
        deadline = load_started + workload.duration
        try:
            await asyncio.gather(
                *(
                    _client(
                        i, workload, endpoints, tls, journal, deadline, budget, random.Random(rng.random())
                    )
                    for i in range(workload.clients)
                )
            )
            await _final_reads(workload, endpoints, tls, journal, time.monotonic() + settle)
            await _watchers_caught_up(journal, workload.watchers, initial_revision, settle)
        finally:
            stop.set()
            await asyncio.gather(*watchers, return_exceptions=True)
        return Recording(
            path=path,
            operations=journal.operations,
            indeterminate=journal.indeterminate,
            failed=journal.failed,
            watch_events=journal.events,
            watch_resumes=journal.watch_starts - workload.watchers,
            seconds=time.monotonic() - load_started,
            clock_zero=journal.started / 1e9,
            tls_reloads=tls.reloads,
        )
