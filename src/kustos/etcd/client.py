"""A thin typed async client for etcd's v3 gRPC-gateway JSON API (``/v3/...``).

Why our own: no Python gRPC etcd client covers learners, promote, snapshots, TLS
client certificates and DNS endpoints with asyncio together (see DESIGN.md). The
gateway is served by every etcd on its client URL, so plain HTTPS with httpx does.

One :class:`EtcdClient` talks to exactly one member endpoint and never fails over:
membership work needs to know which member answered (``member_id`` is in every
result), and some calls only work on the leader or never on a learner.

What the gateway does, checked against etcd v3.5.35, v3.6.16 and v3.7.3 (test_etcd_client.py):

* JSON uses proto field names (``cluster_id``, ``peerURLs``, ``dbSizeInUse``);
  64-bit integers are JSON strings, ``uint32`` (the KV hash) is a number, bytes
  are standard base64, and zero values are left out (``false``, ``0``, ``""``,
  empty lists): an unstarted member has no ``name`` and no ``clientURLs``.
* Errors are ``{"error", "code", "message"}`` on v3.5 and ``{"code", "message",
  "details"}`` on v3.6, with an HTTP status derived from the gRPC code. The same
  condition can carry a different code per version ("rpc not supported for
  learner" is 14 on v3.5 and 9 on v3.6), so errors are mapped by message first.
* Streams (the snapshot) are newline-delimited ``{"result": ...}`` objects, or an
  ``{"error": ...}`` object when the stream fails after it started.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import socket
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, NamedTuple, Self, TypeAlias, cast

import httpx2 as httpx  # the API client's httpx2: one HTTP stack loaded, not two

from kustos.runtime import crashpoints
from kustos.runtime.errors import ReconcileError
from kustos.runtime.transport import H11Transport

__all__ = [
    "CREDENTIALS",
    "Alarm",
    "AuthFailed",
    "AuthNotEnabled",
    "AuthRequired",
    "AuthStatus",
    "BadLeaderTransferee",
    "Compacted",
    "CredentialBook",
    "EtcdClient",
    "EtcdCredentials",
    "EtcdError",
    "EtcdTLS",
    "EtcdTLSError",
    "EtcdUnavailable",
    "FutureRevision",
    "HashKV",
    "InvalidPeerURLs",
    "KeyValue",
    "LearnerNotReady",
    "Member",
    "MemberAddResult",
    "MemberList",
    "MemberNotFound",
    "MemberNotLearner",
    "NoSpace",
    "NotEnoughStartedMembers",
    "NotLeader",
    "NotSupportedForLearner",
    "PeerURLExists",
    "PermissionDenied",
    "RangeResult",
    "RolePermission",
    "SnapshotInfo",
    "Status",
    "TooManyLearners",
    "UnhealthyCluster",
    "cluster_health",
    "error_from_response",
    "parse_alarms",
    "parse_hash_kv",
    "parse_member",
    "parse_member_add",
    "parse_member_list",
    "parse_members",
    "parse_range",
    "parse_status",
    "prefix_end",
]

# gRPC status codes the mapping needs (google.golang.org/grpc/codes).
GRPC_DEADLINE_EXCEEDED = 4
GRPC_NOT_FOUND = 5
GRPC_UNAVAILABLE = 14

SNAPSHOT_SHA256_SIZE = 32


# --------------------------------------------------------------------------- errors


class EtcdError(ReconcileError):
    """Any failure of an etcd call; ``code`` is the gRPC code (None: no answer from etcd).

    A ``ReconcileError``: a pass it fails is retried with backoff, and its message reaches
    the object's conditions. ``message`` stays etcd's own (without the endpoint).
    """

    def __init__(
        self,
        message: str,
        code: int | None = None,
        endpoint: str = "",
        http_status: int | None = None,
    ) -> None:
        self.message = message
        self.code = code
        self.endpoint = endpoint
        self.http_status = http_status
        where = f"{endpoint}: " if endpoint else ""
        what = f" (gRPC code {code})" if code is not None else ""
        super().__init__(f"{where}{message}{what}", "EtcdError")
        self.message = message


class EtcdUnavailable(EtcdError):
    """The member did not answer, or cannot serve now (no leader, timed out): retry later."""


class EtcdTLSError(EtcdError):
    """The TLS handshake failed (bad CA, name mismatch, client certificate missing or refused).

    Not an :class:`EtcdUnavailable`: waiting does not fix configuration.
    """


class MemberNotFound(EtcdError):
    """No member with that ID (also for a removed ID)."""


class PeerURLExists(EtcdError):
    """A member with these peer URLs exists already.

    etcd derives a new member's ID from its peer URLs and the current second, so a
    duplicate add within the same second says "member ID already exist" instead;
    both land here.
    """


class TooManyLearners(EtcdError):
    """The cluster has its maximum of learners (``--max-learners``, default 1)."""


class LearnerNotReady(EtcdError):
    """The learner has not caught up with the leader yet: retry the promote later."""


class MemberNotLearner(EtcdError):
    """Promote of a member that is already a voter."""


class UnhealthyCluster(EtcdError):
    """A membership change was refused because it could break quorum.

    etcd says so when the member handling the request has not been connected to
    enough peers for the last 5 s (its ``HealthInterval``), which is also true for
    a few seconds after any member (re)starts: retry later.
    """


class NotEnoughStartedMembers(UnhealthyCluster):
    """Refused: too few members have started (published a name) for the change to be safe."""


class NotLeader(EtcdError):
    """The call must be sent to the leader (move_leader)."""


class BadLeaderTransferee(EtcdError):
    """move_leader to a member that cannot lead (a learner, or unknown)."""


class NotSupportedForLearner(EtcdError):
    """A learner serves only status and serializable reads."""


class InvalidPeerURLs(EtcdError):
    """The peer URLs given to member_add or member_update do not parse."""


class Compacted(EtcdError):
    """The revision asked for (or compacted to) has been compacted already."""


class FutureRevision(EtcdError):
    """The revision asked for (or compacted to) is newer than the store's."""


class NoSpace(EtcdError):
    """The NOSPACE alarm is raised: writes fail until defragment and alarm_disarm."""


class AuthRequired(EtcdError):
    """etcd authentication is on and the request carried no token, or one etcd no longer takes
    (expired, its user's password changed, or the auth store moved on): log in and send again."""


class AuthFailed(EtcdError):
    """The user name or password was refused."""


class AuthNotEnabled(EtcdError):
    """Authenticate while etcd authentication is off: no token is needed."""


class PermissionDenied(EtcdError):
    """The logged-in user's roles do not allow this request."""


_BY_MESSAGE: dict[str, type[EtcdError]] = {
    "etcdserver: member not found": MemberNotFound,
    "etcdserver: member ID already exist": PeerURLExists,
    "etcdserver: Peer URLs already exists": PeerURLExists,
    "etcdserver: too many learner members in cluster": TooManyLearners,
    "etcdserver: can only promote a learner member which is in sync with leader": LearnerNotReady,
    "etcdserver: can only promote a learner member": MemberNotLearner,
    "etcdserver: unhealthy cluster": UnhealthyCluster,
    "etcdserver: re-configuration failed due to not enough started members": NotEnoughStartedMembers,
    "etcdserver: not leader": NotLeader,
    "etcdserver: bad leader transferee": BadLeaderTransferee,
    "etcdserver: rpc not supported for learner": NotSupportedForLearner,
    "etcdserver: given member URLs are invalid": InvalidPeerURLs,
    "etcdserver: mvcc: required revision has been compacted": Compacted,
    "etcdserver: mvcc: required revision is a future revision": FutureRevision,
    "etcdserver: mvcc: database space exceeded": NoSpace,
    "etcdserver: user name is empty": AuthRequired,
    "etcdserver: invalid auth token": AuthRequired,
    "etcdserver: revision of auth store is old": AuthRequired,
    "etcdserver: authentication failed, invalid user ID or password": AuthFailed,
    "etcdserver: authentication is not enabled": AuthNotEnabled,
    "etcdserver: permission denied": PermissionDenied,
}


_GATEWAY_TLS_HINT = (
    " (etcd's JSON gateway dials the member's own gRPC port presenting --cert-file as a client"
    " certificate when --client-cert-auth is on: that certificate must allow client auth too,"
    " or give the member --client-cert-file/--client-key-file)"
)


def _error_class(message: str, code: int | None, http_status: int | None) -> type[EtcdError]:
    """Message first (codes differ between versions), then the code, then the HTTP status."""
    cls = _BY_MESSAGE.get(message.strip())
    if cls is not None:
        return cls
    if code == GRPC_UNAVAILABLE and any(s in message for s in ("tls:", "x509:", "certificate")):
        return EtcdTLSError  # the gateway cannot reach its own gRPC server: see _GATEWAY_TLS_HINT
    if code in (GRPC_UNAVAILABLE, GRPC_DEADLINE_EXCEEDED):
        return EtcdUnavailable
    if code == GRPC_NOT_FOUND and "member" in message:
        return MemberNotFound
    if code is None and http_status in (502, 503, 504):
        return EtcdUnavailable
    return EtcdError


def error_from_response(http_status: int, body: bytes | str, endpoint: str = "") -> EtcdError:
    """The typed error for a gateway error response (either version's JSON, or plain text)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        return _error_from_json(payload, endpoint, http_status)
    message = text.strip() or f"HTTP {http_status}"
    return _error_class(message, None, http_status)(message, None, endpoint, http_status)


def _error_from_json(payload: Mapping[str, Any], endpoint: str, http_status: int | None) -> EtcdError:
    # v3.5 (grpc-gateway v1): {"error": msg, "code": n, "message": msg}
    # v3.6 (grpc-gateway v2): {"code": n, "message": msg, "details": []}
    # stream errors: {"error": {"grpc_code"|"code": n, "message": msg, ...}}
    inner = payload.get("error")
    if isinstance(inner, Mapping):
        payload = inner
    message = payload.get("message") or (inner if isinstance(inner, str) else "") or "unknown error"
    raw_code = payload.get("code", payload.get("grpc_code"))
    code = int(raw_code) if isinstance(raw_code, int | str) and str(raw_code).isdigit() else None
    message = str(message)
    cls = _error_class(message, code, http_status)
    if cls is EtcdTLSError:
        message += _GATEWAY_TLS_HINT
    return cls(message, code, endpoint, http_status)


# httpx wraps network failures, except an ssl.SSLError raised while reading (a TLS alert).
_TRANSPORT_ERRORS = (httpx.HTTPError, ssl.SSLError)
_TIMEOUTS = (httpx.TimeoutException, TimeoutError)


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _describe(exc: BaseException) -> str:
    """The messages along the cause chain (httpx's own are often empty)."""
    parts = [str(e) or type(e).__name__ for e in _causes(exc)]
    return ": ".join(dict.fromkeys(parts))


def _tls_reason(exc: BaseException) -> str | None:
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            return None  # the peer went away mid-handshake: not a TLS setting
        if isinstance(cause, ssl.SSLError):
            return str(cause)
    return None


def _tls_probe(host: str, port: int, context: ssl.SSLContext, timeout: float) -> str | None:
    """Why the server refuses our TLS session, or None when it does not.

    With TLS 1.3 the client finishes its handshake before the server has checked the
    client certificate; the server's alert follows, and if our request crossed it
    the kernel discards the alert with the connection reset. Reading before
    writing anything receives the alert intact.
    """
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.settimeout(min(timeout, 1.0))
            tls.recv(1)
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):  # closed without saying why: not TLS
        return None
    except ssl.SSLError as err:
        return str(err)
    except OSError:  # includes the timeout of a server that is happy with us
        return None
    return None


def _tls_error(reason: str, endpoint: str) -> EtcdTLSError:
    return EtcdTLSError(
        f"TLS failed: {reason} (check the CA, the server name and the client certificate)", None, endpoint
    )


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Member:
    """One member as the cluster records it.

    ``name == ""`` (and no client URLs) means added but not started yet: etcd
    learns a member's name only when that member publishes it after joining.
    """

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool

    @property
    def is_started(self) -> bool:
        return self.name != ""


@dataclass(frozen=True)
class MemberList:
    cluster_id: int
    member_id: int
    """The member that answered."""
    members: list[Member]
    raft_term: int = 0

    def by_id(self, member_id: int) -> Member | None:
        return next((m for m in self.members if m.id == member_id), None)

    def by_name(self, name: str) -> Member | None:
        return next((m for m in self.members if m.name == name), None)

    @property
    def voters(self) -> list[Member]:
        return [m for m in self.members if not m.is_learner]

    @property
    def learners(self) -> list[Member]:
        return [m for m in self.members if m.is_learner]


@dataclass(frozen=True)
class MemberAddResult:
    member: Member
    """The new member: ``name`` is empty until its process starts and joins."""
    members: list[Member]
    """The whole membership after the add, the new member included."""


@dataclass(frozen=True)
class Status:
    cluster_id: int
    member_id: int
    leader_id: int
    """0 when this member knows no leader."""
    raft_term: int
    raft_index: int
    raft_applied_index: int
    revision: int
    """The store revision (response header)."""
    db_size: int
    db_size_in_use: int
    version: str
    is_learner: bool
    errors: tuple[str, ...]
    storage_version: str = ""
    """v3.6 and later; empty on v3.5."""
    db_size_quota: int = 0
    """v3.6 and later; 0 on v3.5."""
    downgrade_enabled: bool = False
    """v3.6 and later: a cluster downgrade is enabled (``downgradeInfo.enabled``)."""
    downgrade_target: str = ""
    """v3.6 and later: the downgrade's target version (``downgradeInfo.targetVersion``, e.g. 3.5.0)."""

    @property
    def is_leader(self) -> bool:
        return self.leader_id != 0 and self.leader_id == self.member_id

    @property
    def has_leader(self) -> bool:
        return self.leader_id != 0


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    count: int
    """All keys in the range, whatever ``limit`` (or ``count_only``) returned."""
    more: bool
    revision: int


@dataclass(frozen=True)
class Alarm:
    member_id: int
    alarm: str
    """``NOSPACE`` or ``CORRUPT``."""


class HashKV(NamedTuple):
    """``hash_kv`` result; members agree on ``hash`` at the same ``revision`` unless corrupt."""

    hash: int
    compact_revision: int
    revision: int


@dataclass(frozen=True)
class SnapshotInfo:
    size: int
    """Bytes written to the sink: the database plus etcd's 32-byte SHA-256 trailer."""
    db_size: int
    sha256: str
    """Hex SHA-256 of the database bytes, as etcd sent it in the trailer (verified)."""
    revision: int | None
    """The store revision in the snapshot, when no write raced it (None otherwise)."""
    storage_version: str = ""
    """v3.6 and later (e.g. ``3.6.0``); empty on v3.5."""


@dataclass(frozen=True)
class AuthStatus:
    enabled: bool
    revision: int
    """etcd's auth revision: it moves with every change of users, roles or permissions."""


@dataclass(frozen=True)
class RolePermission:
    """One key range of a role, as etcd stores it (``range_end`` empty: the key alone)."""

    type: str
    """``READ``, ``WRITE`` or ``READWRITE``."""
    key: bytes
    range_end: bytes = b""


SnapshotSink: TypeAlias = BinaryIO | Callable[[bytes], Awaitable[None]]


# --------------------------------------------------------------------------- decoding


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _get(obj: Mapping[str, Any], name: str) -> Any:
    """A field by proto name or by its lowerCamel JSON name (the gateway emits proto names)."""
    if name in obj:
        return obj[name]
    return obj.get(_camel(name))


def _int(obj: Mapping[str, Any], name: str) -> int:
    value = _get(obj, name)
    return 0 if value in (None, "") else int(value)


def _bool(obj: Mapping[str, Any], name: str) -> bool:
    value = _get(obj, name)
    return value is True or value == "true"


def _str(obj: Mapping[str, Any], name: str) -> str:
    value = _get(obj, name)
    return "" if value is None else str(value)


def _strings(obj: Mapping[str, Any], name: str) -> tuple[str, ...]:
    return tuple(str(v) for v in _get(obj, name) or ())


def _bytes(obj: Mapping[str, Any], name: str) -> bytes:
    value = _get(obj, name)
    if not value:
        return b""
    text = str(value)
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:  # protojson accepts URL-safe base64 too
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _header(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    header = payload.get("header")
    return header if isinstance(header, Mapping) else {}


def parse_member(obj: Mapping[str, Any]) -> Member:
    return Member(
        id=_int(obj, "ID"),
        name=_str(obj, "name"),
        peer_urls=_strings(obj, "peerURLs"),
        client_urls=_strings(obj, "clientURLs"),
        is_learner=_bool(obj, "isLearner"),
    )


def parse_members(payload: Mapping[str, Any]) -> list[Member]:
    return [parse_member(m) for m in payload.get("members") or ()]


def parse_member_list(payload: Mapping[str, Any]) -> MemberList:
    header = _header(payload)
    return MemberList(
        cluster_id=_int(header, "cluster_id"),
        member_id=_int(header, "member_id"),
        members=parse_members(payload),
        raft_term=_int(header, "raft_term"),
    )


def parse_member_add(payload: Mapping[str, Any]) -> MemberAddResult:
    return MemberAddResult(member=parse_member(payload.get("member") or {}), members=parse_members(payload))


def parse_status(payload: Mapping[str, Any]) -> Status:
    header = _header(payload)
    return Status(
        cluster_id=_int(header, "cluster_id"),
        member_id=_int(header, "member_id"),
        leader_id=_int(payload, "leader"),
        raft_term=_int(payload, "raftTerm") or _int(header, "raft_term"),
        raft_index=_int(payload, "raftIndex"),
        raft_applied_index=_int(payload, "raftAppliedIndex"),
        revision=_int(header, "revision"),
        db_size=_int(payload, "dbSize"),
        db_size_in_use=_int(payload, "dbSizeInUse"),
        version=_str(payload, "version"),
        is_learner=_bool(payload, "isLearner"),
        errors=_strings(payload, "errors"),
        storage_version=_str(payload, "storageVersion"),
        db_size_quota=_int(payload, "dbSizeQuota"),
        downgrade_enabled=_bool(_get(payload, "downgrade_info") or {}, "enabled"),
        downgrade_target=_str(_get(payload, "downgrade_info") or {}, "target_version"),
    )


DOWNGRADE_ACTIONS = ("VALIDATE", "ENABLE", "CANCEL")
UNDECIDED_CLUSTER_VERSION = "not_decided"  # /version's etcdcluster before the leader decides one


def _parse_kv(obj: Mapping[str, Any]) -> KeyValue:
    return KeyValue(
        key=_bytes(obj, "key"),
        value=_bytes(obj, "value"),
        create_revision=_int(obj, "create_revision"),
        mod_revision=_int(obj, "mod_revision"),
        version=_int(obj, "version"),
        lease=_int(obj, "lease"),
    )


def parse_range(payload: Mapping[str, Any]) -> RangeResult:
    return RangeResult(
        kvs=[_parse_kv(kv) for kv in payload.get("kvs") or ()],
        count=_int(payload, "count"),
        more=_bool(payload, "more"),
        revision=_int(_header(payload), "revision"),
    )


def parse_alarms(payload: Mapping[str, Any]) -> list[Alarm]:
    names = {0: "NONE", 1: "NOSPACE", 2: "CORRUPT"}
    alarms = []
    for obj in payload.get("alarms") or ():
        raw = _get(obj, "alarm")
        alarm = names.get(raw, str(raw)) if isinstance(raw, int) else str(raw or "NONE")
        alarms.append(Alarm(member_id=_int(obj, "memberID"), alarm=alarm))
    return alarms


def parse_hash_kv(payload: Mapping[str, Any]) -> HashKV:
    return HashKV(
        hash=_int(payload, "hash"),
        compact_revision=_int(payload, "compact_revision"),
        revision=_int(_header(payload), "revision"),
    )


def parse_role_permissions(payload: Mapping[str, Any]) -> list[RolePermission]:
    """A role's permissions; READ is the zero value, which the gateway leaves out."""
    return [
        RolePermission(_str(p, "permType") or "READ", _bytes(p, "key"), _bytes(p, "range_end"))
        for p in payload.get("perm") or ()
    ]


# --------------------------------------------------------------------------- keys


def prefix_end(prefix: bytes) -> bytes:
    """etcd's ``range_end`` for all keys starting with ``prefix`` (clientv3 ``GetPrefixRangeEnd``).

    Increment the last byte below 0xff and cut after it. With no such byte (empty
    or all-0xff prefix) there is no upper bound and etcd's convention is ``b"\\0"``,
    which means "every key >= key".
    """
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


# --------------------------------------------------------------------------- client


@dataclass(frozen=True)
class EtcdTLS:
    """Client TLS: the CA that signed the members' certificates, and our client certificate.

    ``ca_file=None`` trusts the system store; ``cert_file=None`` sends no client
    certificate (members with ``--client-cert-auth`` then refuse the handshake).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("EtcdTLS: key_file needs cert_file")
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        return context

    def shared_ssl_context(self) -> ssl.SSLContext:
        """``ssl_context()`` built once per contents of the files, not once per client.

        Loading the CA store (the system's ~150 certificates when ``ca_file`` is None) costs
        ~40 ms of CPU; the operator builds a client per member per pass. The key is the
        files' contents: a certificate rewritten in place (a renewal) gets a new context.
        """
        files = (self.ca_file, self.cert_file, self.key_file)
        key = (self, tuple(p.read_bytes() if p is not None else None for p in files))
        context = _CONTEXTS.pop(key, None) or self.ssl_context()
        _CONTEXTS[key] = context  # the newest last: the oldest is dropped past the bound
        while len(_CONTEXTS) > _CONTEXTS_KEPT:
            del _CONTEXTS[next(iter(_CONTEXTS))]
        return context


# TLS contexts by settings and file contents, least recently used first (one per cluster with
# TLS, and kubeadm's; its certificates come in temporary files, a new key each time).
_CONTEXTS: dict[tuple[EtcdTLS, tuple[bytes | None, ...]], ssl.SSLContext] = {}
_CONTEXTS_KEPT = 64


# How long an idle connection to a member is kept: longer than the 10 s between an idle
# cluster's passes, so each pass reuses the last one's connections (etcd's server keeps them).
KEEPALIVE_SECONDS = 30.0
_POOLS_KEPT = 256  # endpoints with pooled connections, per event loop, whatever their age
_clock = time.monotonic


@dataclass(eq=False)
class _Pool:
    """The HTTP client (its connections) of one member endpoint and TLS context, and whether
    anyone uses it."""

    http: httpx.AsyncClient
    used_at: float
    in_flight: int = 0
    closing: bool = False

    @contextlib.contextmanager
    def busy(self) -> Iterator[httpx.AsyncClient]:
        self.in_flight += 1
        try:
            yield self.http
        finally:
            self.in_flight -= 1
            self.used_at = _clock()

    @property
    def usable(self) -> bool:
        """Neither closed nor being closed: a new request may start on it."""
        return not self.closing and not self.http.is_closed

    def idle(self, now: float) -> bool:
        """Nothing in flight and nothing asked for a keep-alive's time: its kept connections
        have expired, and the HTTP client closes expired ones only when it is asked again."""
        return self.in_flight == 0 and now - self.used_at > KEEPALIVE_SECONDS


_POOLS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, ssl.SSLContext | None], _Pool]
] = weakref.WeakKeyDictionary()
_CLOSING: set[asyncio.Task[None]] = set()


def _connections(endpoint: str, context: ssl.SSLContext | None) -> _Pool:
    """The pool of one member endpoint and TLS context, shared by every :class:`EtcdClient`
    of this event loop.

    Why: the operator makes short clients, one per member per pass; each built its own HTTP
    client and opened (and, with TLS, handshook) a new connection. A renewed certificate is a
    new context, hence a new pool; a member that went away closed its connections, which the
    pool notices before it reuses one. Timeouts are given per request.

    A pool nobody asked for a keep-alive's time is closed: a member that left (replaced,
    removed, its pod IP gone) is never asked again, and its connections, closed by the member,
    would otherwise hold their file descriptors (the nightly soak's hour of replacements found
    that). The 256-endpoint bound stays for anything else.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # built outside a loop (never used there): a client of its own
        return _Pool(_new_http(endpoint, context), _clock())
    for closed in [other for other in _POOLS if other.is_closed()]:  # its clients hold it alive
        del _POOLS[closed]
    pools = _POOLS.setdefault(loop, {})
    now = _clock()
    key = (endpoint, context)
    pool = pools.pop(key, None)
    if pool is None or not pool.usable:
        pool = _Pool(_new_http(endpoint, context), now)
    pool.used_at = max(pool.used_at, now)  # a client is built to be used: not idle before it is
    for old in [k for k, p in pools.items() if p.idle(now)]:
        _close(loop, pools.pop(old))
    # Past the bound: the least recently asked for first, none with a request in flight.
    over = len(pools) + 1 - _POOLS_KEPT
    for old in [k for k, p in pools.items() if p.in_flight == 0][: max(0, over)]:
        _close(loop, pools.pop(old))
    pools[key] = pool  # the newest last
    return pool


def _close(loop: asyncio.AbstractEventLoop, pool: _Pool) -> None:
    pool.closing = True  # no new request starts on it (``EtcdClient._http`` takes another)
    task = loop.create_task(pool.http.aclose())
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


def _new_http(endpoint: str, context: ssl.SSLContext | None) -> httpx.AsyncClient:
    transport = H11Transport(context, max_idle_per_host=8, keepalive_expiry=KEEPALIVE_SECONDS)
    return httpx.AsyncClient(base_url=endpoint, transport=transport, trust_env=False)


@dataclass(frozen=True)
class EtcdCredentials:
    """A user and password to log in with (the password never shows in a repr)."""

    user: str
    password: str = field(repr=False)


class CredentialBook:
    """Whom the operator logs in as, by member endpoint: one process-wide book.

    Why a book and not a parameter: every kustos path reaches members through its own short
    client (observation, membership changes, defragmentation, snapshots, recovery), and
    each would otherwise carry the credentials through every call between. The EtcdCluster
    and maintenance controllers write the book each pass from the operator's root Secret;
    a client with no credentials of its own looks its endpoint up here. Each entry is a list
    tried in order, so a password being rotated (the new one, then the old) never locks out.
    Each entry names the cluster it is for, so a deleted cluster's passwords are dropped with it
    (``forget``), and never offered to whatever answers at its members' addresses next.
    """

    def __init__(self) -> None:
        self._by_endpoint: dict[str, tuple[str, tuple[EtcdCredentials, ...]]] = {}

    def remember(self, cluster: str, endpoints: Iterable[str], candidates: Sequence[EtcdCredentials]) -> None:
        """``cluster`` (its namespace/name) logs in with ``candidates`` at these endpoints."""
        for endpoint in endpoints:
            self._by_endpoint[endpoint.rstrip("/")] = (cluster, tuple(candidates))

    def forget(self, cluster: str) -> None:
        """Drop what ``cluster`` remembered: an address since taken by another cluster is kept."""
        for endpoint in [e for e, (owner, _) in self._by_endpoint.items() if owner == cluster]:
            del self._by_endpoint[endpoint]

    def get(self, endpoint: str) -> tuple[EtcdCredentials, ...]:
        return self._by_endpoint.get(endpoint.rstrip("/"), ("", ()))[1]


CREDENTIALS = CredentialBook()

# etcd's simple tokens live 300 s unless used (--auth-token-ttl) and only on the member that
# issued them; a login costs a bcrypt check there, so tokens are kept per member and user.
TOKEN_REUSE_SECONDS = 240.0
_TokenKey: TypeAlias = tuple[str, str, str]
_TOKENS: dict[_TokenKey, tuple[str, float]] = {}


def _token_key(endpoint: str, credentials: EtcdCredentials) -> _TokenKey:
    return endpoint, credentials.user, hashlib.sha256(credentials.password.encode()).hexdigest()


class EtcdClient:
    """Async client of one etcd member's JSON gateway; no retries, no fail-over.

    ``endpoint`` is a client URL, ``http://127.2.1.3:2379`` or
    ``https://name.ns.svc:2379``; with https the server certificate must name the
    host used here. ``timeout`` bounds each connect, read and write.
    """

    def __init__(
        self,
        endpoint: str,
        tls: EtcdTLS | None = None,
        timeout: float = 5.0,
        credentials: Sequence[EtcdCredentials] | None = None,
    ) -> None:
        url = httpx.URL(endpoint)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"etcd endpoint must be http(s)://host:port, not {endpoint!r}")
        if url.scheme == "http" and tls is not None:
            raise ValueError(f"TLS settings given for a plain-http endpoint {endpoint!r}")
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        # Without credentials of its own: whatever the operator's book holds for this member.
        self.credentials = tuple(credentials) if credentials is not None else CREDENTIALS.get(self.endpoint)
        self.logged_in_as: EtcdCredentials | None = None
        """The credentials whose token this client last sent (None: none was needed yet)."""
        self._url = url
        self._ssl = (tls or EtcdTLS()).shared_ssl_context() if url.scheme == "https" else None
        self._pool = _connections(self.endpoint, self._ssl)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to free: the connections stay in the shared pool for the next client."""

    def __repr__(self) -> str:
        return f"EtcdClient({self.endpoint!r})"

    @contextlib.contextmanager
    def _http(self) -> Iterator[httpx.AsyncClient]:
        """The endpoint's shared HTTP client for one request: counted in flight, so the pool is
        not closed under it; a client kept past its pool's close takes the endpoint's new one."""
        if not self._pool.usable:
            self._pool = _connections(self.endpoint, self._ssl)
        with self._pool.busy() as http:
            yield http

    @contextlib.asynccontextmanager
    async def _snapshot_stream(self, timeout: float, token: str | None) -> AsyncIterator[httpx.Response]:
        """The snapshot's streamed answer, the pool in use until the stream ends."""
        headers = {"Authorization": token} if token else None
        with self._http() as http:
            path = "/v3/maintenance/snapshot"
            async with http.stream("POST", path, json={}, timeout=timeout, headers=headers) as response:
                yield response

    # ----------------------------------------------------------------- transport

    async def _failure(self, exc: Exception) -> EtcdError:
        """The typed error for a request that got no HTTP answer."""
        if isinstance(exc, _TIMEOUTS):
            return EtcdUnavailable(f"timed out: {_describe(exc)}", None, self.endpoint)
        reason = _tls_reason(exc)
        if reason is None and self._ssl is not None and not isinstance(exc, httpx.ConnectError):
            host, port = self._url.host, self._url.port or 443
            reason = await asyncio.to_thread(_tls_probe, host, port, self._ssl, self.timeout)
        if reason is not None:
            return _tls_error(reason, self.endpoint)
        return EtcdUnavailable(f"cannot reach member: {_describe(exc)}", None, self.endpoint)

    def _cached_token(self) -> str | None:
        now = time.monotonic()
        for credentials in self.credentials:
            token, until = _TOKENS.get(_token_key(self.endpoint, credentials), ("", 0.0))
            if token and until > now:
                self.logged_in_as = credentials
                return token
        return None

    async def login(self) -> str | None:
        """A fresh token from the first of ``credentials`` etcd accepts (None: auth is off).

        Raises :class:`AuthFailed` naming the users tried when etcd takes none of them.
        """
        for credentials in self.credentials:
            _TOKENS.pop(_token_key(self.endpoint, credentials), None)
        for credentials in self.credentials:
            body = {"name": credentials.user, "password": credentials.password}
            try:
                payload = await self._send("/v3/auth/authenticate", body, None, None)
            except AuthNotEnabled:
                return None
            except AuthFailed:
                continue
            token = _str(payload, "token")
            now = time.monotonic()
            for expired in [key for key, (_, until) in _TOKENS.items() if until <= now]:
                del _TOKENS[expired]  # a replaced member's token would otherwise stay for good
            _TOKENS[_token_key(self.endpoint, credentials)] = (token, now + TOKEN_REUSE_SECONDS)
            self.logged_in_as = credentials
            return token
        users = ", ".join(dict.fromkeys(c.user for c in self.credentials))
        raise AuthFailed(f"etcd refused the password of {users}", None, self.endpoint)

    async def _post(self, path: str, body: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One request; with authentication on, it logs in (once per token) and sends it again."""
        try:
            return await self._send(path, body, timeout, self._cached_token())
        except AuthRequired:
            if not self.credentials:
                raise
        return await self._send(path, body, timeout, await self.login())

    async def _send(
        self, path: str, body: Mapping[str, Any], timeout: float | None, token: str | None
    ) -> dict[str, Any]:
        headers = {"Authorization": token} if token else None
        try:
            with self._http() as http:
                response = await http.post(path, json=body, timeout=timeout or self.timeout, headers=headers)
        except _TRANSPORT_ERRORS as exc:
            raise await self._failure(exc) from exc
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, self.endpoint)
        try:
            payload = response.json()
        except ValueError as exc:
            raise EtcdError(f"{path}: not JSON: {response.text[:200]!r}", None, self.endpoint) from exc
        if not isinstance(payload, dict):
            raise EtcdError(f"{path}: unexpected answer {payload!r:.200}", None, self.endpoint)
        crashpoints.etcd_write(self.endpoint, path, body)  # every call goes through here
        return payload

    # ----------------------------------------------------------------- cluster

    async def member_list(self, linearizable: bool = True) -> MemberList:
        """All members. Linearizable (the default) reads through the leader, so the
        answer includes every committed change; a learner refuses member_list either way
        (:class:`NotSupportedForLearner`).
        """
        payload = await self._post("/v3/cluster/member/list", {"linearizable": linearizable})
        return parse_member_list(payload)

    async def member_add(self, peer_urls: Sequence[str], is_learner: bool = False) -> MemberAddResult:
        """Add a member; start its process afterwards with ``--initial-cluster-state existing``.

        Prefer learners: a voter that is added but not started counts against quorum.
        """
        body = {"peerURLs": list(peer_urls), "isLearner": is_learner}
        return parse_member_add(await self._post("/v3/cluster/member/add", body))

    async def member_remove(self, member_id: int) -> list[Member]:
        """Remove a member; returns the membership after it."""
        return parse_members(await self._post("/v3/cluster/member/remove", {"ID": str(member_id)}))

    async def member_promote(self, member_id: int) -> list[Member]:
        """Make a learner a voter once in sync (else :class:`LearnerNotReady`: retry later).

        Any member may be asked; followers forward to the leader.
        """
        return parse_members(await self._post("/v3/cluster/member/promote", {"ID": str(member_id)}))

    async def member_update(self, member_id: int, peer_urls: Sequence[str]) -> list[Member]:
        """Change a member's peer URLs (its process must be restarted with them)."""
        body = {"ID": str(member_id), "peerURLs": list(peer_urls)}
        return parse_members(await self._post("/v3/cluster/member/update", body))

    # ----------------------------------------------------------------- maintenance

    async def status(self) -> Status:
        """This member's view: leader, raft progress, db size, version. Learners answer too."""
        return parse_status(await self._post("/v3/maintenance/status", {}))

    async def health(self, serializable: bool = False) -> bool:
        """etcd's own ``/health``: a leader, no alarms, and a read that succeeds.

        With ``serializable`` the read is local, so a member that cannot reach the
        leader still passes. Any error counts as unhealthy.
        """
        params = {"serializable": "true"} if serializable else None
        try:
            with self._http() as http:
                response = await http.get("/health", params=params, timeout=self.timeout)
            return response.status_code == 200 and response.json().get("health") == "true"
        except (*_TRANSPORT_ERRORS, ValueError, AttributeError):
            return False

    async def cluster_version(self) -> str:
        """The cluster version etcd's leader decided (``/version``'s ``etcdcluster``, like
        "3.6.0"): raised once every member runs a newer minor, lowered by a finished downgrade;
        "" before it has decided one."""
        try:
            with self._http() as http:
                response = await http.get("/version", timeout=self.timeout)
        except _TRANSPORT_ERRORS as exc:
            raise await self._failure(exc) from exc
        if response.status_code != 200:
            raise error_from_response(response.status_code, response.content, self.endpoint)
        try:
            decided = str(response.json().get("etcdcluster") or "")
        except (ValueError, AttributeError) as exc:
            raise EtcdError(f"/version: not JSON: {response.text[:200]!r}", None, self.endpoint) from exc
        return "" if decided == UNDECIDED_CLUSTER_VERSION else decided

    async def alarm_list(self) -> list[Alarm]:
        """Active alarms of the whole cluster (not only this member's)."""
        return parse_alarms(await self._post("/v3/maintenance/alarm", {"action": "GET", "alarm": "NONE"}))

    async def alarm_disarm(self, member_id: int, alarm: str) -> list[Alarm]:
        """Clear one alarm (``NOSPACE`` after freeing space); returns the alarms cleared."""
        body = {"action": "DEACTIVATE", "memberID": str(member_id), "alarm": alarm}
        return parse_alarms(await self._post("/v3/maintenance/alarm", body))

    async def defragment(self, timeout: float | None = 60.0) -> None:
        """Defragment this member's backend; it blocks the member's reads and writes while it runs,
        so do one member at a time. The default timeout is longer than for other calls.
        """
        await self._post("/v3/maintenance/defragment", {}, timeout=timeout)

    async def downgrade(self, action: str, version: str = "") -> str:
        """etcd's downgrade API (v3.6+): VALIDATE or ENABLE a downgrade of the cluster to
        ``version`` ("3.5"), or CANCEL one. Answers the cluster version etcd reports
        (checked on v3.6.16: "3.6" for all three; an invalid target is an EtcdError with
        "invalid downgrade target version"). ``status()`` shows the enabled downgrade.
        """
        if action not in DOWNGRADE_ACTIONS:
            raise ValueError(f"downgrade action must be one of {DOWNGRADE_ACTIONS}, not {action!r}")
        body: dict[str, Any] = {"action": action}
        if version:
            body["version"] = version
        payload = await self._post("/v3/maintenance/downgrade", body)
        return _str(payload, "version")

    async def move_leader(self, target_member_id: int, timeout: float | None = None) -> None:
        """Hand leadership to a voting member.

        Must be sent to the current leader (others answer :class:`NotLeader`); find it
        with ``status().leader_id``. A learner or unknown target is a
        :class:`BadLeaderTransferee`.
        """
        await self._post("/v3/maintenance/transfer-leadership", {"targetID": str(target_member_id)}, timeout)

    async def hash_kv(self, revision: int = 0) -> HashKV:
        """Hash of the MVCC keyspace up to ``revision`` (0: the latest), for corruption checks."""
        return parse_hash_kv(await self._post("/v3/maintenance/hashkv", {"revision": str(revision)}))

    async def snapshot(self, sink: SnapshotSink, timeout: float | None = None) -> SnapshotInfo:
        """Stream this member's database into ``sink`` (a binary file, or an async callback).

        What lands in the sink is what ``etcdctl snapshot save`` writes: the bolt
        database followed by etcd's 32-byte SHA-256 of it (the gateway passes that
        last message on like any other), so ``etcdutl snapshot status`` and
        ``restore`` (which checks the hash) accept the file. The checksum is
        verified here; on any error the sink holds a partial file: discard it.

        The stream carries no revision, so status is read before and after: when they
        agree, that is the snapshot's revision.
        """
        before = await self.status()  # logs in first where etcd wants a token for status (3.6+)
        token = self._cached_token() or (await self.login() if self.credentials else None)
        write = _sink_writer(sink)
        total: int | None = None
        received = 0
        written = 0
        digest = hashlib.sha256()
        trailer = b""
        storage_version = ""
        try:
            async with self._snapshot_stream(timeout or self.timeout, token) as response:
                if response.status_code != 200:
                    raise error_from_response(response.status_code, await response.aread(), self.endpoint)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    message = json.loads(line)
                    if "result" not in message:
                        raise _error_from_json(message, self.endpoint, None)
                    result = message["result"] or {}
                    blob = _bytes(result, "blob")
                    storage_version = _str(result, "version") or storage_version
                    if total is None:  # the first message tells the database size
                        total = _int(result, "remaining_bytes") + len(blob)
                    data = blob[: max(0, total - received)]
                    received += len(data)
                    digest.update(data)
                    trailer += blob[len(data) :]
                    await write(blob)
                    written += len(blob)
        except _TRANSPORT_ERRORS as exc:
            raise await self._failure(exc) from exc
        except (json.JSONDecodeError, binascii.Error) as exc:
            raise EtcdError(f"snapshot stream is not JSON: {exc}", None, self.endpoint) from exc
        if total is None or received != total:
            raise EtcdError(f"snapshot stream ended after {received} of {total} bytes", None, self.endpoint)
        if len(trailer) != SNAPSHOT_SHA256_SIZE:
            raise EtcdError(f"snapshot stream has a {len(trailer)}-byte trailer, not SHA-256", None,
                            self.endpoint)  # fmt: skip
        if trailer != digest.digest():
            raise EtcdError("snapshot checksum mismatch", None, self.endpoint)
        after = await self.status()
        return SnapshotInfo(
            size=written,
            db_size=total,
            sha256=trailer.hex(),
            revision=before.revision if before.revision == after.revision else None,
            storage_version=storage_version,
        )

    # ----------------------------------------------------------------- KV

    async def put(self, key: bytes | str, value: bytes | str, lease: int = 0) -> int:
        """Write one key; returns the store revision after the write."""
        body: dict[str, Any] = {"key": _b64(_as_bytes(key)), "value": _b64(_as_bytes(value))}
        if lease:
            body["lease"] = str(lease)
        return _int(_header(await self._post("/v3/kv/put", body)), "revision")

    async def get(self, key: bytes | str, serializable: bool = False) -> KeyValue | None:
        result = await self.range(key, serializable=serializable)
        return result.kvs[0] if result.kvs else None

    async def range(
        self,
        key: bytes | str,
        range_end: bytes | str | None = None,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        count_only: bool = False,
        keys_only: bool = False,
        serializable: bool = False,
    ) -> RangeResult:
        """Keys in ``[key, range_end)`` (one key without ``range_end``; all with ``key``
        as prefix when ``prefix``). ``serializable`` reads locally: the only read a
        learner serves, possibly stale.
        """
        body = self._key_range(key, range_end, prefix)
        body.update(
            {
                "limit": str(limit),
                "revision": str(revision),
                "count_only": count_only,
                "keys_only": keys_only,
                "serializable": serializable,
            }
        )
        return parse_range(await self._post("/v3/kv/range", body))

    async def delete(
        self, key: bytes | str, prefix: bool = False, range_end: bytes | str | None = None
    ) -> int:
        """Delete one key (or a prefix or range); returns how many keys were deleted."""
        return _int(
            await self._post("/v3/kv/deleterange", self._key_range(key, range_end, prefix)), "deleted"
        )

    async def compact(self, revision: int, physical: bool = False) -> None:
        """Drop history before ``revision``; compacting to an already compacted revision
        raises :class:`Compacted`. ``physical`` waits until the backend has dropped it.
        """
        await self._post("/v3/kv/compaction", {"revision": str(revision), "physical": physical})

    # ----------------------------------------------------------------- auth (etcdctl user/role/auth)

    async def auth_status(self) -> AuthStatus:
        payload = await self._post("/v3/auth/status", {})
        return AuthStatus(_bool(payload, "enabled"), _int(payload, "authRevision"))

    async def auth_enable(self) -> None:
        """Turn authentication on; etcd refuses unless user root exists with role root."""
        await self._post("/v3/auth/enable", {})

    async def auth_disable(self) -> None:
        await self._post("/v3/auth/disable", {})

    async def user_list(self) -> list[str]:
        return list(_strings(await self._post("/v3/auth/user/list", {}), "users"))

    async def user_roles(self, user: str) -> list[str]:
        return list(_strings(await self._post("/v3/auth/user/get", {"name": user}), "roles"))

    async def user_add(self, user: str, password: str | None) -> None:
        """Add a user; with no password it logs in only by client certificate (its CN)."""
        body: dict[str, Any] = {"name": user, "password": password or ""}
        if password is None:
            body["options"] = {"no_password": True}
        await self._post("/v3/auth/user/add", body)

    async def user_delete(self, user: str) -> None:
        await self._post("/v3/auth/user/delete", {"name": user})

    async def user_change_password(self, user: str, password: str) -> None:
        """etcd drops the user's tokens: its clients log in again."""
        await self._post("/v3/auth/user/changepw", {"name": user, "password": password})

    async def user_grant_role(self, user: str, role: str) -> None:
        await self._post("/v3/auth/user/grant", {"user": user, "role": role})

    async def user_revoke_role(self, user: str, role: str) -> None:
        await self._post("/v3/auth/user/revoke", {"name": user, "role": role})

    async def role_list(self) -> list[str]:
        return list(_strings(await self._post("/v3/auth/role/list", {}), "roles"))

    async def role_permissions(self, role: str) -> list[RolePermission]:
        return parse_role_permissions(await self._post("/v3/auth/role/get", {"role": role}))

    async def role_add(self, role: str) -> None:
        await self._post("/v3/auth/role/add", {"name": role})

    async def role_delete(self, role: str) -> None:
        await self._post("/v3/auth/role/delete", {"role": role})

    async def role_grant_permission(self, role: str, permission: RolePermission) -> None:
        """Grant a key range; granting a range the role has already replaces its type."""
        perm: dict[str, Any] = {"permType": permission.type, "key": _b64(permission.key)}
        if permission.range_end:
            perm["range_end"] = _b64(permission.range_end)
        await self._post("/v3/auth/role/grant", {"name": role, "perm": perm})

    async def role_revoke_permission(self, role: str, key: bytes, range_end: bytes = b"") -> None:
        body: dict[str, Any] = {"role": role, "key": _b64(key)}
        if range_end:
            body["range_end"] = _b64(range_end)
        await self._post("/v3/auth/role/revoke", body)

    @staticmethod
    def _key_range(key: bytes | str, range_end: bytes | str | None, prefix: bool) -> dict[str, Any]:
        raw = _as_bytes(key)
        if prefix and range_end is not None:
            raise ValueError("give either prefix or range_end, not both")
        end = prefix_end(raw) if prefix else (_as_bytes(range_end) if range_end is not None else None)
        if prefix and not raw:  # etcd refuses an empty key; "\0" to "\0" is every key
            raw = b"\x00"
        body: dict[str, Any] = {"key": _b64(raw)}
        if end is not None:
            body["range_end"] = _b64(end)
        return body


def _sink_writer(sink: SnapshotSink) -> Callable[[bytes], Awaitable[None]]:
    if hasattr(sink, "write"):
        file = cast(BinaryIO, sink)

        async def write_file(data: bytes) -> None:
            file.write(data)

        return write_file
    if callable(sink):
        return sink
    raise TypeError(f"snapshot sink must be a binary file or an async callable, not {sink!r}")


def refused(err: BaseException) -> bool:
    """Nothing listens at the member's address (yet): the connection was refused."""
    return any(isinstance(cause, ConnectionRefusedError) for cause in _causes(err))


def unresolved(err: BaseException) -> bool:
    """The member's host name did not resolve (yet)."""
    return any(isinstance(cause, socket.gaierror) for cause in _causes(err))


# How often a member given ``patience`` is asked again while its address refuses connections
# or its name does not resolve.
REFUSED_RETRY = 0.02


async def cluster_health(
    endpoints: Iterable[str],
    tls: EtcdTLS | None = None,
    timeout: float = 2.0,
    patience: Mapping[str, float] | None = None,
) -> dict[str, Status | EtcdError]:
    """Every member's status, asked concurrently, each bounded by ``timeout``.

    How the operator observes a cluster: one failure does not hide the others, and
    the statuses tell who leads, who is a learner and whether members agree on the
    cluster ID, raft term and revision. An endpoint given ``patience`` (seconds) is asked
    again while it refuses connections or its name does not resolve, that long: an etcd that
    has just started listens a few tens of milliseconds later, and one that listens answers
    once it serves; a pod's DNS name resolves once its EndpointSlice has the pod's address,
    which after a lost quorum came up to 0.7 s after the pod ran on the dev cluster.
    """
    loop = asyncio.get_running_loop()

    async def one(endpoint: str) -> Status | EtcdError:
        until = loop.time() + (patience or {}).get(endpoint, 0.0)
        while True:
            answer = await ask(endpoint)
            missing = isinstance(answer, EtcdError) and (refused(answer) or unresolved(answer))
            again = missing and loop.time() + REFUSED_RETRY < until
            if not again:
                return answer
            await asyncio.sleep(REFUSED_RETRY)

    async def ask(endpoint: str) -> Status | EtcdError:
        try:
            async with EtcdClient(endpoint, tls, timeout) as client:
                async with asyncio.timeout(timeout * 2):
                    return await client.status()
        except EtcdError as err:
            return err
        except TimeoutError:
            return EtcdUnavailable(f"no status within {timeout * 2:.1f}s", None, endpoint)
        except OSError as err:
            return EtcdUnavailable(str(err) or type(err).__name__, None, endpoint)

    wanted = list(dict.fromkeys(endpoints))
    results = await asyncio.gather(*(one(e) for e in wanted))
    return dict(zip(wanted, results, strict=True))
