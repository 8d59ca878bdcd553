"""A control-plane donor's kubeadm stacked etcd member, removed before the node goes.

kubeadm runs one etcd member per control-plane node, listening at the node's InternalIP.
The member to remove is the one whose peer or client URL names the donor's InternalIP; it
is removed through ``kustos.etcd.membership.remove_keeping_quorum`` (the one place that
changes etcd membership), which refuses when the remaining members would lose quorum.
Certificates come from a Secret (ca.crt, healthcheck-client.crt, healthcheck-client.key)
or from kubeadm's certificates directory.
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from kustos.api.nodeimage import StackedEtcd
from kustos.etcd.client import EtcdTLS
from kustos.etcd.membership import member_list, remove_keeping_quorum, statuses_of, why_no_member_list
from kustos.runtime.api import Api
from kustos.runtime.errors import ReconcileError
from kustos.runtime.resources import SECRETS

SECRET_FILES = ("ca.crt", "healthcheck-client.crt", "healthcheck-client.key")


async def tls_for(api: Api, spec: StackedEtcd, scratch: Path) -> EtcdTLS | None:
    if spec.scheme == "http":
        return None
    if spec.certificates_secret:
        namespace, _, name = spec.certificates_secret.partition("/")
        secret = await api.get(SECRETS, namespace, name)
        if secret is None:
            raise ReconcileError(
                f"etcd certificates Secret {spec.certificates_secret} not found", "EtcdCertificates"
            )
        data = secret.get("data") or {}
        missing = [f for f in SECRET_FILES if f not in data]
        if missing:
            raise ReconcileError(
                f"Secret {spec.certificates_secret} lacks {', '.join(missing)}", "EtcdCertificates"
            )
        for f in SECRET_FILES:
            (scratch / f).write_bytes(base64.b64decode(data[f]))
        return EtcdTLS(
            scratch / "ca.crt", scratch / "healthcheck-client.crt", scratch / "healthcheck-client.key"
        )
    pki = Path(spec.certificates_dir) / "etcd"
    return EtcdTLS(pki / "ca.crt", pki / "healthcheck-client.crt", pki / "healthcheck-client.key")


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


async def remove_member_at(
    api: Api, spec: StackedEtcd, donor_ip: str, control_plane_ips: Sequence[str], heir_ip: str = ""
) -> str | None:
    """Remove the member at ``donor_ip``: None once it is out (or was never in), else why not.

    With ``heir_ip``, only once a healthy member listens there: quorum arithmetic alone would
    let three members shrink to one while heirs that never joined etcd replace their donors."""
    if not donor_ip:
        return "the donor has no InternalIP to find its etcd member by"
    endpoints = [f"{spec.scheme}://{ip}:{spec.client_port}" for ip in control_plane_ips if ip]
    with tempfile.TemporaryDirectory(prefix="kustos-etcd-") as scratch:
        tls = await tls_for(api, spec, Path(scratch))
        statuses = await statuses_of(endpoints, tls)
        members = await member_list(statuses, tls)
        if members is None:
            return why_no_member_list(endpoints, statuses)
        victim = next(
            (m for m in members.members if any(_host(u) == donor_ip for u in (*m.peer_urls, *m.client_urls))),
            None,
        )
        if victim is None:
            return None  # not (or no longer) a member
        if heir_ip:
            heir = next((m for m in members.members if any(_host(u) == heir_ip for u in m.peer_urls)), None)
            answered = [u for u, st in statuses.items() if _host(u) == heir_ip and not st.errors]
            if heir is None or heir.is_learner or not answered:
                return f"the heir's etcd member at {heir_ip} has not joined, or is not healthy yet"
        others = [e for e in endpoints if _host(e) != donor_ip]
        return await remove_keeping_quorum(others or endpoints, tls, victim.id)


__all__ = ["remove_member_at", "tls_for"]
