"""TLS Secrets of an EtcdCluster: the pod side (flags, volumes) and the operator side
(issue, renew, forget), on top of the pure certificate code in ``tls.py``.

Certificates the operator issues live in Secrets labelled with the cluster:

* ``<cluster>-ca``: the cluster's CA (ca.crt, ca.key), owned by the cluster;
* ``<cluster>-client-tls``: the operator's client certificate (also used by backup
  pods, and usable by people), owned by the cluster;
* ``<pod>-tls``: one member's certificate, owned by its pod and issued for that pod
  (its uid is recorded on the Secret) once the pod exists: with pod-IP addressing it
  names the pod's IP, which nobody knows before the pod is scheduled. The member's
  container waits for the Secret, as a kubelet waits for a Secret volume's Secret.

A member's certificate is never replaced under a running member: when it must be
renewed (too little lifetime left, another CA, a renewal asked for with the
``kustos.dev/renew-certificates`` annotation, or a user's Secret that changed) the
member is marked stale and the planner restarts members one at a time; a new pod gets
a new certificate.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import tempfile
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kustos.api.etcd import EtcdCluster
from kustos.api.etcd_tls import RENEW_ANNOTATION, CARotationStatus, CertificateStatus, TLSStatus
from kustos.etcd import carotation
from kustos.etcd.client import EtcdTLS
from kustos.runtime import objects
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.informer import Informer, InformerOptions
from kustos.runtime.resources import PODS, SECRETS
from kustos.runtime.times import parse_duration, rfc3339

if TYPE_CHECKING:
    from kustos.etcd import tls  # imported where used: cryptography costs ~8 MiB resident
    from kustos.runtime.manager import Manager

log = logging.getLogger(__name__)

Obj = dict[str, Any]


CLUSTER_LABEL = "kustos.dev/cluster"  # the same label as pods.CLUSTER_LABEL
MEMBER_LABEL = "kustos.dev/member"
POD_UID_ANNOTATION = "kustos.dev/pod-uid"
REQUEST_ANNOTATION = "kustos.dev/renewal-request"
FINGERPRINT_ANNOTATION = "kustos.dev/tls-fingerprint"

TLS_DIR = "/etc/etcd/tls"  # operator-issued: one certificate for both listeners
PEER_DIR = "/etc/etcd/peer-tls"  # user Secrets
SERVER_DIR = "/etc/etcd/server-tls"
CLIENT_DIR = "/etc/etcd/client-tls"  # backup pods: the operator's client certificate
METRICS_PORT = 2381


def ca_secret_name(cluster: str) -> str:
    return f"{cluster}-ca"


def member_secret_name(pod: str) -> str:
    return f"{pod}-tls"


def client_secret_name(cluster: EtcdCluster) -> str:
    """The Secret with the client certificate the operator and its backup pods use."""
    spec = cluster.spec.tls
    if spec is not None and spec.secrets is not None:
        return spec.secrets.operator_client
    return f"{cluster.metadata['name']}-client-tls"


# ---- the pod side (pure) ---------------------------------------------------------------


def secure_member_pod(cluster: EtcdCluster, pod: Obj) -> Obj:
    """Turn a member pod manifest into a TLS one: https listeners (made by ``pods``),
    certificate flags, the Secret volumes, and a readiness probe on the plain-http
    metrics listener (the client port asks every caller for a certificate)."""
    spec = cluster.spec.tls
    assert spec is not None
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    if spec.secrets is None:
        peer_dir = server_dir = TLS_DIR
        volumes = [{"name": "tls", "secret": {"secretName": member_secret_name(name)}}]
        mounts = [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}]
    else:
        peer_dir, server_dir = PEER_DIR, SERVER_DIR
        volumes = [
            {"name": "peer-tls", "secret": {"secretName": spec.secrets.peer}},
            {"name": "server-tls", "secret": {"secretName": spec.secrets.server}},
        ]
        mounts = [
            {"name": "peer-tls", "mountPath": PEER_DIR, "readOnly": True},
            {"name": "server-tls", "mountPath": SERVER_DIR, "readOnly": True},
        ]
    container["args"] += [
        "--client-cert-auth",
        f"--trusted-ca-file={server_dir}/ca.crt",
        f"--cert-file={server_dir}/tls.crt",
        f"--key-file={server_dir}/tls.key",
        "--peer-client-cert-auth",
        f"--peer-trusted-ca-file={peer_dir}/ca.crt",
        f"--peer-cert-file={peer_dir}/tls.crt",
        f"--peer-key-file={peer_dir}/tls.key",
        f"--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}",
    ]
    container["ports"].append({"name": "metrics", "containerPort": METRICS_PORT})
    container["readinessProbe"]["httpGet"]["port"] = METRICS_PORT
    container["volumeMounts"] += mounts
    pod["spec"]["volumes"] += volumes
    return pod


def secret_problem(name: str, secret: Obj | None) -> str | None:
    """Why a TLS Secret (tls.crt, tls.key, ca.crt) cannot be used, or None (pure)."""
    missing = [k for k in ("tls.crt", "tls.key", "ca.crt") if _decode(secret, k) is None]
    if secret is None or missing:
        what = "does not exist" if secret is None else f"lacks {', '.join(missing)}"
        return f"TLS Secret {name} {what}"
    return None


def _decode(secret: Obj | None, key: str) -> bytes | None:
    raw = ((secret or {}).get("data") or {}).get(key)
    return base64.b64decode(raw) if raw else None


def _encode(value: bytes) -> str:
    return base64.b64encode(value).decode()


def secret_manifest(
    cluster: EtcdCluster, name: str, data: dict[str, bytes], owner: Obj,
    annotations: dict[str, str] | None = None, member: str | None = None,
) -> Obj:  # fmt: skip
    labels = {"app.kubernetes.io/managed-by": "kustos", CLUSTER_LABEL: cluster.metadata["name"]}
    if member:
        labels[MEMBER_LABEL] = member
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls" if "tls.crt" in data else "Opaque",
        "metadata": {
            "name": name,
            "namespace": cluster.metadata["namespace"],
            "labels": labels,
            "annotations": annotations or {},
            "ownerReferences": [owner],
        },
        "data": {k: _encode(v) for k, v in data.items()},
    }


def _cluster_owner(cluster: EtcdCluster) -> Obj:
    return {
        "apiVersion": EtcdCluster.crd.api_version, "kind": EtcdCluster.crd.kind,
        "name": cluster.metadata["name"], "uid": cluster.metadata["uid"],
    }  # fmt: skip


def _pod_owner(pod: Obj) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "name": objects.name(pod), "uid": objects.uid(pod)}


@dataclass(frozen=True)
class MemberPod:
    """What the certificate code needs of a member pod."""

    name: str
    uid: str
    ip: str | None
    running: bool
    deleting: bool
    fingerprint: str | None = None  # user Secrets the pod started with (annotation)


def ca_verdict(
    secret: Obj | None, now: datetime, lifetime: timedelta
) -> tuple[tls.KeyPair | None, str | None, str | None]:
    """(the CA to reuse, why it cannot be used, a warning) from its Secret (pure).

    (None, None, None): there is none yet, create one. A CA that exists is never
    replaced silently: every member trusts it, so a new one would split the cluster.
    """
    from kustos.etcd import tls

    pair = _pair(secret, "ca.crt", "ca.key")
    if secret is None:
        return None, None, None
    if pair is None:
        return None, "it lacks ca.crt or ca.key", None
    try:
        info = tls.info(pair.cert)
        if info.not_after <= now:
            return None, f"it expired at {rfc3339(info.not_after)}", None
        probe = tls.issue(pair, "probe", now, timedelta(minutes=1))
    except ValueError as err:
        return None, f"it is unusable ({err})", None
    if not tls.signed_by(probe.cert, pair.cert):
        return None, "its ca.key does not belong to its ca.crt", None
    if not tls.ca_usable(info, now, lifetime):
        return pair, None, f"it expires at {rfc3339(info.not_after)}; certificates it issues are cut short"
    return pair, None, None


def member_renewal_reason(
    secret: Obj | None, pod: MemberPod, ca_pem: bytes, request: str, now: datetime, renew_before_percent: int,
    bundle: bytes | None = None,
) -> str | None:  # fmt: skip
    """Why a running member must restart onto a new certificate, or None (pure).

    ``bundle``: the CAs it must trust (ca.crt), when not only ``ca_pem`` (a CA rotation)."""
    from kustos.etcd import tls

    if secret is None:
        return None  # not issued yet: the pod waits for it
    annotations = objects.annotations(secret)
    cert = _decode(secret, "tls.crt")
    if annotations.get(POD_UID_ANNOTATION) != pod.uid:
        return "its certificate was issued for an earlier pod of the same name" if pod.running else None
    if cert is None:
        return "its certificate Secret is empty"
    if tls.bundle_ids(_decode(secret, "ca.crt") or b"") != tls.bundle_ids(bundle or ca_pem):
        return "the CAs it must trust changed (CA rotation)"
    if not tls.signed_by(cert, ca_pem):
        return "its certificate is not signed by the cluster's CA"
    if annotations.get(REQUEST_ANNOTATION, "") != request:
        return "a renewal was asked for"
    if tls.needs_renewal(tls.info(cert), now, renew_before_percent):
        return "its certificate is due for renewal"
    return None


CA_KEYS = ("ca.crt", "ca.key")
NEXT_KEYS = ("next.crt", "next.key")  # the CA a rotation made, trusted but not yet signing
PREVIOUS_KEY = "previous.crt"  # the CA a rotation replaced, trusted until every leaf is new


def ca_bundle(ca_secret: Obj | None) -> bytes:
    """What members and clients must trust: the signing CA, then the rotation's other one."""
    return b"".join(_decode(ca_secret, k) or b"" for k in ("ca.crt", "next.crt", PREVIOUS_KEY))


def ca_record(ca_secret: Obj) -> carotation.CARecord:
    from kustos.etcd import tls

    def ident(key: str) -> str | None:
        pem = _decode(ca_secret, key)
        return tls.ca_id(pem) if pem else None

    current = ident("ca.crt")
    assert current is not None
    timing = carotation.Timing.load(_annotation(ca_secret, carotation.RECORD_ANNOTATION, None))
    return carotation.CARecord(current, ident("next.crt"), ident(PREVIOUS_KEY), timing)


def member_trust(pod: MemberPod, secret: Obj | None, cas: list[bytes]) -> carotation.MemberTrust:
    """What a member runs on, for the rotation planner (pure)."""
    from kustos.etcd import tls

    cert = _decode(secret, "tls.crt")
    return carotation.MemberTrust(
        name=pod.name,
        settled=secret is not None and pod.running and _annotation(secret, POD_UID_ANNOTATION) == pod.uid,
        bundle=tls.bundle_ids(_decode(secret, "ca.crt") or b""),
        leaf_issuer=tls.issuer_in(cert, cas) if cert else None,
    )


def rotated_ca_data(
    step: carotation.Step, ca_secret: Obj, new_ca: tls.KeyPair | None
) -> dict[str, str | None]:
    """The CA Secret's data keys a rotation step changes (None deletes one) (pure)."""
    data: dict[str, str | None] = {}
    if isinstance(step, carotation.Start):
        assert new_ca is not None
        data = {"next.crt": _encode(new_ca.cert), "next.key": _encode(new_ca.key)}
    elif isinstance(step, carotation.Promote):
        raw = ca_secret.get("data") or {}
        data = {"ca.crt": raw["next.crt"], "ca.key": raw["next.key"], PREVIOUS_KEY: raw["ca.crt"],
                "next.crt": None, "next.key": None}  # fmt: skip
    elif isinstance(step, carotation.DropOld):
        data = {PREVIOUS_KEY: None}
    return data


def rotation_status(record: carotation.CARecord) -> CARotationStatus | None:
    timing = record.timing
    if not timing.started:
        return None
    phase = record.phase
    return CARotationStatus(
        phase=phase.value if phase is not None else None, reason=timing.reason, started=timing.started,
        phase_started=timing.phase_started, old_ca_dropped=timing.old_ca_dropped, completed=timing.completed,
    )  # fmt: skip


# ---- the operator side -----------------------------------------------------------------


@dataclass
class ClusterTLS:
    """The outcome of one pass: who must restart, how the operator connects, what to record."""

    client: EtcdTLS | None
    stale: dict[str, str] = field(default_factory=dict)  # pod name -> why it must restart
    status: TLSStatus = field(default_factory=TLSStatus)
    issued: list[str] = field(default_factory=list)  # Secrets issued this pass
    problem: str | None = None  # a user Secret missing or unusable, or an unusable CA
    warning: str | None = None  # the CA expires soon


class CertificateManager:
    """Issues and renews a cluster's certificates; keeps the operator's client files.

    Without ``workdir`` the files go to a private temporary directory, made when the first
    client files are, and removed when this object is collected, at the latest when the
    process exits (a SIGKILL leaves it behind; an operator with no TLS cluster leaves none).
    """

    def __init__(self, api: Api, secrets: Informer, workdir: Path | None = None) -> None:
        self.api = api
        self.secrets = secrets
        self._tempdir: tempfile.TemporaryDirectory[str] | None = None
        self._workdir = workdir

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="kustos-etcd-tls-")
            self._workdir = Path(self._tempdir.name)
        return self._workdir

    def cleanup(self) -> None:
        """Remove the temporary directory now (one given as ``workdir`` is left alone)."""
        if self._tempdir is not None:
            self._tempdir.cleanup()

    async def client_tls(self, cluster: EtcdCluster) -> tuple[EtcdTLS | None, str | None]:
        """(how to connect, why it cannot) for a controller that only talks to members.

        Read-only: the operator's client certificate as the EtcdCluster controller keeps
        it (the generated ``<cluster>-client-tls`` or the user's ``operatorClient``
        Secret). Issuing and renewing stay with that controller. (None, None): no TLS.
        """
        if cluster.spec.tls is None:
            return None, None
        name = client_secret_name(cluster)
        secret = await self._secret(cluster.metadata["namespace"], name)
        problem = secret_problem(name, secret)
        if problem is not None:
            return None, problem
        assert secret is not None
        return self._client_files(cluster, secret), None

    def _cached(self, namespace: str, name: str) -> Obj | None:
        return self.secrets.get(f"{namespace}/{name}")

    async def _secret(self, namespace: str, name: str) -> Obj | None:
        """From the cache, else from the API (the cache only holds kustos's own Secrets)."""
        return self._cached(namespace, name) or await self.api.get(SECRETS, namespace, name)

    async def _create(self, manifest: Obj) -> Obj:
        try:
            return await self.api.create(SECRETS, manifest)
        except ApiStatusError as err:
            if not err.conflict:
                raise
            meta = manifest["metadata"]
            current = await self.api.get(SECRETS, meta["namespace"], meta["name"])
            if current is None:
                raise
            return current

    async def forget(self, cluster: EtcdCluster, pod: str) -> None:
        """A member pod is going: its certificate goes with it (a new pod gets its own)."""
        spec = cluster.spec.tls
        if spec is None or spec.secrets is not None:
            return
        with contextlib.suppress(ApiStatusError):
            await self.api.delete(SECRETS, cluster.metadata["namespace"], member_secret_name(pod))

    async def reconcile(self, cluster: EtcdCluster, pods: list[Obj], now: datetime) -> ClusterTLS:
        spec = cluster.spec.tls
        assert spec is not None
        members = [_member_pod(p) for p in pods]
        if spec.secrets is not None:
            return await self._user_secrets(cluster, members)
        return await self._operator_issued(cluster, members, now)

    async def _user_secrets(self, cluster: EtcdCluster, members: list[MemberPod]) -> ClusterTLS:
        spec = cluster.spec.tls
        assert spec is not None and spec.secrets is not None
        namespace = cluster.metadata["namespace"]
        found: dict[str, Obj] = {}
        for name in (spec.secrets.peer, spec.secrets.server, spec.secrets.operator_client):
            secret = await self._secret(namespace, name)
            problem = secret_problem(name, secret)
            if problem is not None:
                return ClusterTLS(client=None, problem=problem)
            assert secret is not None
            found[name] = secret
        client = found[spec.secrets.operator_client]
        current = user_fingerprint(found[spec.secrets.peer], found[spec.secrets.server])
        stale = {
            m.name: "its TLS Secrets changed"
            for m in members
            if not m.deleting and m.fingerprint is not None and m.fingerprint != current
        }
        for m in members:
            if m.fingerprint is None and m.running and not m.deleting:
                # It waited for the Secrets and started on what is there now.
                patch = {"metadata": {"annotations": {FINGERPRINT_ANNOTATION: current}}}
                with contextlib.suppress(ApiStatusError):
                    await self.api.patch(PODS, cluster.metadata["namespace"], m.name, patch)
        certificates = [
            _status_of(name, found[name], "", spec.renew_before_percent) for name in sorted(found)
        ]
        status = TLSStatus(certificates=certificates, renewing=bool(stale))
        return ClusterTLS(client=self._client_files(cluster, client), stale=stale, status=status)

    async def _operator_issued(
        self, cluster: EtcdCluster, members: list[MemberPod], now: datetime
    ) -> ClusterTLS:
        from kustos.etcd import tls

        spec = cluster.spec.tls
        assert spec is not None
        name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
        lifetime = parse_duration(spec.lifetime)
        request = (cluster.metadata.get("annotations") or {}).get(RENEW_ANNOTATION, "")
        issued: list[str] = []

        ca_secret = await self._secret(namespace, ca_secret_name(name))
        ca, problem, warning = ca_verdict(ca_secret, now, lifetime)
        if problem is not None:
            return ClusterTLS(client=None, problem=f"CA Secret {ca_secret_name(name)}: {problem}")
        if ca is None:
            ca = tls.new_ca(f"{name}.{namespace} etcd CA", now)
            data = {"ca.crt": ca.cert, "ca.key": ca.key}
            ca_secret = await self._create(
                secret_manifest(cluster, ca_secret_name(name), data, _cluster_owner(cluster))
            )
            ca = _pair(ca_secret, "ca.crt", "ca.key")
            assert ca is not None
            issued.append(ca_secret_name(name))
        assert ca_secret is not None
        ca_secret = await self._rotate_ca(cluster, ca_secret, members, now, lifetime)
        ca = _pair(ca_secret, "ca.crt", "ca.key")
        assert ca is not None
        bundle = ca_bundle(ca_secret)
        record = ca_record(ca_secret)

        client_name = client_secret_name(cluster)
        client_secret = await self._secret(namespace, client_name)
        client_pair = _pair(client_secret, "tls.crt", "tls.key")
        client_fresh = (
            client_pair is not None
            and tls.signed_by(client_pair.cert, ca.cert)
            and _decode(client_secret, "ca.crt") == bundle
            and _annotation(client_secret, REQUEST_ANNOTATION) == request
            and not tls.needs_renewal(tls.info(client_pair.cert), now, spec.renew_before_percent)
            and tls.info(client_pair.cert).common_name == ""
        )  # fmt: skip
        if not client_fresh:
            # No Common Name: with etcd authentication on, etcd's JSON gateway refuses every
            # request whose client certificate has one (embed/serve.go); the operator logs in.
            pair = tls.issue(ca, "", now, lifetime, server=False, client=True)
            manifest = secret_manifest(
                cluster, client_name, {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": bundle},
                _cluster_owner(cluster), {REQUEST_ANNOTATION: request},
            )  # fmt: skip
            client_secret = await self.api.apply(SECRETS, manifest)
            issued.append(client_name)
        assert client_secret is not None

        stale: dict[str, str] = {}
        certificates = [
            _status_of(ca_secret_name(name), ca_secret, "", spec.renew_before_percent, key="ca.crt"),
            _status_of(client_name, client_secret, "", spec.renew_before_percent),
        ]
        for pod in members:
            if pod.deleting:
                continue
            secret_name = member_secret_name(pod.name)
            secret = await self._secret(namespace, secret_name)
            reason = member_renewal_reason(
                secret, pod, ca.cert, request, now, spec.renew_before_percent, bundle
            )
            if reason is not None:
                stale[pod.name] = reason
            owner_uid = _annotation(secret, POD_UID_ANNOTATION, None)
            if secret is None or (owner_uid != pod.uid and not pod.running):
                if cluster.spec.addressing == "podIP" and not pod.ip:
                    continue  # its certificate must name its IP: wait until it has one
                secret = await self._issue_member(cluster, ca, bundle, pod, request, now, lifetime)
                issued.append(secret_name)
            certificates.append(_status_of(secret_name, secret, pod.name, spec.renew_before_percent))
        status = TLSStatus(
            certificates=certificates, renewing=bool(stale),
            renewal_request=request or None, ca_rotation=rotation_status(record),
        )  # fmt: skip
        return ClusterTLS(
            client=self._client_files(cluster, client_secret), stale=stale, status=status, issued=issued,
            warning=warning and f"CA Secret {ca_secret_name(name)}: {warning}",
        )  # fmt: skip

    async def _issue_member(
        self, cluster: EtcdCluster, ca: tls.KeyPair, bundle: bytes, pod: MemberPod, request: str,
        now: datetime, lifetime: timedelta,
    ) -> Obj:  # fmt: skip
        from kustos.etcd import tls

        name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
        pair = tls.issue(
            ca, pod.name, now, lifetime,
            dns_names=tls.member_names(name, namespace, pod.name), ips=tls.member_ips(pod.ip),
        )  # fmt: skip
        manifest = secret_manifest(
            cluster, member_secret_name(pod.name),
            {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": bundle},
            {**_pod_owner({"metadata": {"name": pod.name, "uid": pod.uid}})},
            {POD_UID_ANNOTATION: pod.uid, REQUEST_ANNOTATION: request}, member=pod.name,
        )  # fmt: skip
        log.info("issued a certificate for %s/%s", namespace, pod.name)
        return await self.api.apply(SECRETS, manifest)

    async def _rotate_ca(
        self, cluster: EtcdCluster, ca_secret: Obj, members: list[MemberPod], now: datetime,
        lifetime: timedelta,
    ) -> Obj:  # fmt: skip
        """Take the CA rotation's next step, if any: one conditional write of the CA Secret.

        The members' rolls between steps are the planner's (they show as stale members).
        """
        from kustos.etcd import tls

        spec = cluster.spec.tls
        assert spec is not None
        name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
        record = ca_record(ca_secret)
        cas = tls.split_bundle(ca_bundle(ca_secret))
        trust = []
        for pod in members:
            if not pod.deleting:
                secret = await self._secret(namespace, member_secret_name(pod.name))
                trust.append(member_trust(pod, secret, cas))
        request = (cluster.metadata.get("annotations") or {}).get(carotation.ROTATE_CA_ANNOTATION, "")
        current = tls.info(_decode(ca_secret, "ca.crt") or b"")
        due = carotation.rotation_due(
            current.not_before, current.not_after, now, lifetime, spec.renew_before_percent
        )
        step = carotation.plan(record, trust, request, due)
        if step is None or isinstance(step, carotation.Wait):
            return ca_secret
        starting = isinstance(step, carotation.Start)
        new_ca = tls.new_ca(f"{name}.{namespace} etcd CA", now) if starting else None
        timing = carotation.timing_after(step, record.timing, request, now)
        patch = {
            "metadata": {
                "resourceVersion": ca_secret["metadata"]["resourceVersion"],  # a conditional write
                "annotations": {carotation.RECORD_ANNOTATION: timing.dump()},
            },
            "data": rotated_ca_data(step, ca_secret, new_ca),
        }
        log.info("CA rotation of %s/%s: %s", namespace, name, type(step).__name__)
        return await self.api.patch(SECRETS, namespace, ca_secret_name(name), patch)

    def _client_files(self, cluster: EtcdCluster, secret: Obj) -> EtcdTLS:
        """The client certificate as files (Python's ssl loads certificates from files only)."""
        directory = self.workdir / cluster.metadata["namespace"] / cluster.metadata["name"]
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths = {}
        for key in ("ca.crt", "tls.crt", "tls.key"):
            value = _decode(secret, key) or b""
            path = directory / key
            if not path.exists() or path.read_bytes() != value:
                partial = path.with_suffix(".part")
                partial.touch(mode=0o600)
                partial.write_bytes(value)
                partial.replace(path)
            paths[key] = path
        return EtcdTLS(paths["ca.crt"], paths["tls.crt"], paths["tls.key"])


_SHARED: weakref.WeakKeyDictionary[Manager, CertificateManager] = weakref.WeakKeyDictionary()


def operator_certificates(manager: Manager) -> CertificateManager:
    """The manager's one CertificateManager, shared by every controller that talks to
    TLS members (one copy of the client key on disk, one Secret cache)."""
    if manager not in _SHARED:
        secrets = manager.informer(SECRETS, InformerOptions(label_selector=CLUSTER_LABEL))
        _SHARED[manager] = CertificateManager(manager.api, secrets)
    return _SHARED[manager]


def user_fingerprint(peer: Obj, server: Obj) -> str:
    from kustos.etcd import tls

    return tls.fingerprint(*(_decode(s, k) or b"" for s in (peer, server) for k in ("tls.crt", "ca.crt")))


def _annotation(secret: Obj | None, key: str, default: str | None = "") -> str | None:
    return (((secret or {}).get("metadata") or {}).get("annotations") or {}).get(key, default)


def _pair(secret: Obj | None, cert_key: str, key_key: str) -> tls.KeyPair | None:
    from kustos.etcd import tls

    cert, key = _decode(secret, cert_key), _decode(secret, key_key)
    return tls.KeyPair(cert, key) if cert and key else None


def _member_pod(pod: Obj) -> MemberPod:
    return MemberPod(
        name=objects.name(pod),
        uid=objects.uid(pod) or "",
        ip=(pod.get("status") or {}).get("podIP"),
        running=objects.pod_running(pod),
        deleting=objects.deleting(pod),
        fingerprint=objects.annotations(pod).get(FINGERPRINT_ANNOTATION),
    )


def _status_of(
    name: str, secret: Obj | None, pod: str, percent: int, key: str = "tls.crt"
) -> CertificateStatus:
    from kustos.etcd import tls

    cert = _decode(secret, key)
    if cert is None:
        return CertificateStatus(name=name, pod=pod)
    info = tls.info(cert)
    return CertificateStatus(
        name=name, pod=pod, serial=info.serial, not_after=rfc3339(info.not_after),
        renew_after=rfc3339(tls.renewal_due(info, percent)) if key == "tls.crt" else "",
    )  # fmt: skip
