"""Validating admission for EtcdCluster (F-OPS-2): what the CRD schema and its CEL rules
cannot say, refused when it is written rather than discovered by the controller later.

Two webhooks, each with its own failure policy (docs/etcdcluster.md, "Validation"):

- ``guard`` (failurePolicy Ignore): changes that would lose or strand data or fight the
  operator: a new addressing or storage type on a live cluster, a size change while a
  restore or recovery is under way, a version older than kustos supports, extraArgs
  that set what the operator sets or that spec.version's etcd removed (``flags``), and cron
  schedules that never fire (``schedule_denials``). All but the size and schedule rules are
  also CEL rules of the CRD, which the API server enforces with or without the operator; so an
  operator that is down (a crash, an upgrade) never blocks every edit of every EtcdCluster,
  and the webhook adds those two rules and messages that name each offending entry.
- ``version`` (failurePolicy Ignore): unsafe version jumps. The controller refuses them too
  (``versions.upgrade_refusal``, the UpgradeRefused event), so when the operator is down the
  write is admitted and held by the controller instead of blocked.

Updates are ratcheted: a rule is checked only on a field the update changes, so an object
admitted before the webhook existed can still have its finalizers removed and be deleted.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd.flags import removed_flag
from kustos.etcd.versions import parse, upgrade_refusal
from kustos.runtime.deps import Deps
from kustos.runtime.manager import Manager
from kustos.runtime.times import cron_ticks
from kustos.runtime.webhook import AdmissionResponse, Webhook

log = logging.getLogger(__name__)

Obj = dict[str, Any]

GUARD_NAME = "guard.etcdcluster.kustos.dev"
GUARD_PATH = "/validate-kustos-dev-v1alpha1-etcdcluster-guard"
VERSION_NAME = "version.etcdcluster.kustos.dev"
VERSION_PATH = "/validate-kustos-dev-v1alpha1-etcdcluster-version"

# etcd 3.4 is past its end of life and kustos drives clusters through APIs and flags of 3.5
# and later (learners promoted by the operator, the downgrade API of 3.6); the dev cluster
# builds and tests 3.5, 3.6 and 3.7 (kustos.images.PROVEN_ETCD_VERSIONS).
MIN_VERSION = "3.5.0"
# Where a schedule is tried from: any moment will do, a valid schedule fires within a few years.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

# Flags the operator sets on every member (etcd/pods.py member_pod): a second value would make
# the member forget its data, its identity or how its peers reach it. etcd accepts one or two
# leading dashes. --listen-metrics-urls stays free: it only adds a metrics listener.
OPERATOR_FLAGS = (
    "name",
    "data-dir",
    "initial-cluster",
    "initial-cluster-state",
    "initial-cluster-token",
    "initial-advertise-peer-urls",
    "advertise-client-urls",
    "listen-client-urls",
    "listen-peer-urls",
    "listen-client-http-urls",
)


def _spec(obj: Obj | None) -> Obj:
    return dict((obj or {}).get("spec") or {})


def _storage_type(spec: Obj) -> str:
    return str((spec.get("storage") or {}).get("type") or "emptyDir")


def _addressing(spec: Obj) -> str:
    return str(spec.get("addressing") or "dns")


def _flag_name(arg: str) -> str | None:
    """``--data-dir=/x``, ``-data-dir /x`` or ``--data-dir`` -> ``data-dir``; None for a value."""
    if not arg.startswith("-"):
        return None
    return arg.lstrip("-").split("=", 1)[0].strip()


def forbidden_args(args: list[str]) -> list[tuple[int, str]]:
    """(index, flag) of every extraArg that sets what the operator sets."""
    found = []
    for index, arg in enumerate(args):
        flag = _flag_name(str(arg))
        if flag in OPERATOR_FLAGS:
            found.append((index, flag))
    return found


def restoring(obj: Obj | None) -> bool:
    """A restore (spec.restore, not yet finished) or a disaster recovery is under way."""
    status = (obj or {}).get("status") or {}
    recovery = status.get("recovery") or {}
    if recovery.get("phase") == "Running":
        return True
    return bool(_spec(obj).get("restore")) and recovery.get("phase") != "Succeeded"


def guard_denials(obj: Obj, old: Obj | None) -> list[str]:
    """Why ``obj`` (replacing ``old``; None on create) is refused by the Fail-closed rules."""
    spec, old_spec = _spec(obj), _spec(old)
    denials: list[str] = []
    if old is not None:
        if _storage_type(spec) != _storage_type(old_spec):
            denials.append(
                f"spec.storage.type: cannot change from {_storage_type(old_spec)} to "
                f"{_storage_type(spec)} on a live cluster (its members' data would be left behind)"
            )
        if _addressing(spec) != _addressing(old_spec):
            denials.append(
                f"spec.addressing: cannot change from {_addressing(old_spec)} to {_addressing(spec)} "
                "on a live cluster (the members' peer URLs are registered in etcd's membership)"
            )
        old_size, size = old_spec.get("size", 3), spec.get("size", 3)
        if size != old_size and restoring(old):
            denials.append(
                f"spec.size: cannot change from {old_size} to {size} while a restore or recovery "
                "is under way; change it once status.recovery.phase is Succeeded"
            )
    version = str(spec.get("version") or "")
    if old is None or version != str(old_spec.get("version") or ""):
        parsed, minimum = parse(version), parse(MIN_VERSION)
        if parsed is not None and minimum is not None and parsed < minimum:
            denials.append(f"spec.version: {version} is older than {MIN_VERSION}, the oldest kustos supports")
    old_forbidden = {flag for _, flag in forbidden_args(list(old_spec.get("extraArgs") or []))}
    for index, flag in forbidden_args(list(spec.get("extraArgs") or [])):
        if flag not in old_forbidden:
            denials.append(
                f"spec.extraArgs[{index}]: --{flag} is set by the operator and cannot be overridden"
            )
    denials += removed_flag_denials(spec, old_spec)
    denials += schedule_denials(spec, old_spec)
    return denials


# The cron schedules of an EtcdCluster: the schema checks their five fields, this their values.
SCHEDULES = (("backup", "schedule"), ("maintenance", "defragmentation", "schedule"))


def schedule_denials(spec: Obj, old_spec: Obj) -> list[str]:
    """Cron schedules that never fire or do not parse ("99 * * * *"): refused as written,
    rather than found by a controller that cannot say so in a status of its own."""
    denials = []
    for path in SCHEDULES:
        schedule, old_schedule = _at(spec, path), _at(old_spec, path)
        if not isinstance(schedule, str) or schedule == old_schedule:
            continue
        try:
            next(cron_ticks(schedule, EPOCH))
        except ValueError as err:
            denials.append(f"spec.{'.'.join(path)}: {err}")
    return denials


def _at(spec: Obj, path: tuple[str, ...]) -> Any:
    found: Any = spec
    for key in path:
        found = found.get(key) if isinstance(found, dict) else None
    return found


def removed_flag_denials(spec: Obj, old_spec: Obj) -> list[str]:
    """extraArgs entries that spec.version's etcd no longer knows (a member would exit at once);
    checked when the version or the arguments change, so an old object can still be deleted."""
    version, args = str(spec.get("version") or ""), list(spec.get("extraArgs") or [])
    if version == str(old_spec.get("version") or "") and args == list(old_spec.get("extraArgs") or []):
        return []
    denials = []
    for index, arg in enumerate(args):
        flag = _flag_name(str(arg))
        why = removed_flag(version, flag) if flag else None
        if why:
            denials.append(f"spec.extraArgs[{index}]: {why} (spec.version is {version})")
    return denials


def version_denial(obj: Obj, old: Obj | None) -> str | None:
    """Why the version change is unsafe (skipped minors, a downgrade etcd cannot make), if it is."""
    if old is None:
        return None
    wanted = str(_spec(obj).get("version") or "")
    if wanted == str(_spec(old).get("version") or ""):
        return None
    # What the members run; a cluster that has not reported one yet is at its old spec.
    current = ((old.get("status") or {}).get("currentVersion")) or str(_spec(old).get("version") or "")
    refusal = upgrade_refusal(current or None, wanted)
    return f"spec.version: {refusal}" if refusal else None


def _rules() -> list[Obj]:
    crd = EtcdCluster.crd
    return [
        {
            "operations": ["CREATE", "UPDATE"],
            "apiGroups": [crd.group],
            "apiVersions": [crd.version],
            "resources": [crd.plural],
            "scope": "Namespaced",
        }
    ]


async def _guard(request: Obj) -> AdmissionResponse:
    denials = guard_denials(request.get("object") or {}, request.get("oldObject"))
    return AdmissionResponse.deny("; ".join(denials), code=422) if denials else AdmissionResponse.allow()


async def _version(request: Obj) -> AdmissionResponse:
    denial = version_denial(request.get("object") or {}, request.get("oldObject"))
    return AdmissionResponse.deny(denial, code=422) if denial else AdmissionResponse.allow()


def webhooks() -> list[Webhook]:
    """The two EtcdCluster validators, Fail-closed guard first."""
    return [
        Webhook(GUARD_NAME, GUARD_PATH, "validating", _rules(), _guard, failure_policy="Ignore"),
        Webhook(VERSION_NAME, VERSION_PATH, "validating", _rules(), _version, failure_policy="Ignore"),
    ]


def register(manager: Manager, deps: Deps) -> None:
    """Serve the validators when the API server can reach us (a webhook URL or Service)."""
    del deps  # the validators are pure: they need no clock or settings
    if not manager.options.webhooks_reachable:
        log.warning(
            "the EtcdCluster validating webhooks are off: the API server could not reach them "
            "(give kustos run --webhook-url, or run it in the cluster behind a webhook Service)"
        )
        return
    for webhook in webhooks():
        manager.add_webhook(webhook)


__all__ = ["MIN_VERSION", "OPERATOR_FLAGS", "guard_denials", "register", "version_denial", "webhooks"]
