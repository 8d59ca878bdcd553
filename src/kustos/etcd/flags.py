"""etcd flags that a minor version removed, and what replaces each (pure).

A member started with a flag its etcd no longer knows exits at once, so the webhook refuses
such an ``extraArgs`` entry when it is written (naming the entry and its replacement) rather
than leaving the member crash-looping mid-upgrade. Read from etcd's changelogs and checked
against the binaries: the diff of ``etcd --help`` of v3.6.16 and v3.7.3, whose v3.6 help says
what replaces each ``--experimental-*`` flag (docs/etcdcluster.md, "etcd 3.7").
"""

from __future__ import annotations

from kustos.etcd.versions import parse

# minor -> {flag removed in that minor: what to use instead ("" when nothing replaces it)}.
REMOVED_FLAGS: dict[tuple[int, int], dict[str, str]] = {
    # CHANGELOG-3.6 "Flags Removed": the v2 API and the v2 proxy.
    (3, 6): {
        "enable-v2": "",
        "experimental-enable-v2v3": "",
        "proxy": "",
        "proxy-failure-wait": "",
        "proxy-refresh-interval": "",
        "proxy-dial-timeout": "",
        "proxy-write-timeout": "",
        "proxy-read-timeout": "",
    },
    # CHANGELOG-3.7 "Removed all deprecated experimental flags" (etcd-io/etcd#19959), each
    # graduated in 3.6 to a flag or a feature gate that 3.6 already accepts.
    (3, 7): {
        "experimental-bootstrap-defrag-threshold-megabytes": "--bootstrap-defrag-threshold-megabytes",
        "experimental-compact-hash-check-enabled": "--feature-gates=CompactHashCheck=true",
        "experimental-compact-hash-check-time": "--compact-hash-check-time",
        "experimental-compaction-batch-limit": "--compaction-batch-limit",
        "experimental-compaction-sleep-interval": "--compaction-sleep-interval",
        "experimental-corrupt-check-time": "--corrupt-check-time",
        "experimental-distributed-tracing-address": "--distributed-tracing-address",
        "experimental-distributed-tracing-instance-id": "--distributed-tracing-instance-id",
        "experimental-distributed-tracing-sampling-rate": "--distributed-tracing-sampling-rate",
        "experimental-distributed-tracing-service-name": "--distributed-tracing-service-name",
        "experimental-downgrade-check-time": "--downgrade-check-time",
        "experimental-enable-distributed-tracing": "--enable-distributed-tracing",
        "experimental-enable-lease-checkpoint": "--feature-gates=LeaseCheckpoint=true",
        "experimental-enable-lease-checkpoint-persist": "--feature-gates=LeaseCheckpointPersist=true",
        "experimental-initial-corrupt-check": "--feature-gates=InitialCorruptCheck=true",
        "experimental-memory-mlock": "--memory-mlock",
        "experimental-peer-skip-client-san-verification": "--peer-skip-client-san-verification",
        "experimental-snapshot-catchup-entries": "--snapshot-catchup-entries",
        "experimental-stop-grpc-service-on-defrag": "--feature-gates=StopGRPCServiceOnDefrag=true",
        "experimental-txn-mode-write-with-shared-buffer": "--feature-gates=TxnModeWriteWithSharedBuffer=true",
        "experimental-warning-apply-duration": "--warning-apply-duration",
        "experimental-warning-unary-request-duration": "--warning-unary-request-duration",
        "experimental-watch-progress-notify-interval": "--watch-progress-notify-interval",
    },
}


def removed_flag(version: str, flag: str) -> str | None:
    """Why etcd ``version`` refuses ``flag`` (a name without dashes), or None when it may know it."""
    parsed = parse(version)
    if parsed is None:
        return None
    for (major, minor), removed in sorted(REMOVED_FLAGS.items()):
        if flag in removed and (parsed[0], parsed[1]) >= (major, minor):
            instead = removed[flag]
            use = f"; use {instead} instead (etcd {major}.{minor - 1} accepts it too)" if instead else ""
            return f"--{flag} was removed in etcd {major}.{minor}{use}"
    return None
