"""Where a member pod's replacement spends its time after the old pod is gone, milestone by
milestone, for kustos and a peer operator side by side (issue 28, item 3).

    .venv/bin/python -m benchmarks.replacement_timeline [--rounds 16] [--fresh]
        [--peer BINARY --peer-crd CRD.yaml [--peer-commit SHA]]

``peer_bench`` times the whole step (delete 1 member pod -> 3 healthy) and splits it where the
deleted pod's object goes: before, its etcd's exit, which no operator acts in; after, the part
each operator acts in. This breaks that second part down. Each system (the peer as in
``peer_bench``: built by whoever runs this) gets one 3-member cluster, etcd 3.6.16 on 64Mi
volumes, and the clusters' second member pods are deleted ``--rounds`` times, the systems taking
turns, each deletion 6-10 s after the last step of its cluster (as ``peer_bench``'s). Every
milestone is in ms after the old pod's DELETED event, as one watch of the namespace's pods
delivers both:

- created: the new pod's ADDED event (the operator's reaction, its checks and its create),
- scheduled / addressed: its node, then its IP (the scheduler, kwok),
- etcd started / etcd serving: its etcd's first log line, and "serving client traffic" (the
  pod runner's start of the process, etcd's own start),
- etcd healthy: ``peer_bench``'s outside check first saw every member serve,
- status: the operator's status agreed (the peer's agrees before etcd serves: negative),
- end: both, as ``peer_bench`` ends the step.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.integration.api_reads import ReadingCluster

from benchmarks.etcd_bench import bench_cluster
from benchmarks.operator_cpu_bench import Operator
from benchmarks.peer_bench import (
    FAST_EXIT,
    SETTLE,
    StatusWatch,
    System,
    deletion_offsets,
    follow,
    healthy_since,
    kustos_system,
    peer_arguments,
    peer_parser,
    peer_system,
    start_peer,
)  # fmt: skip
from kustos.runtime import objects

NAME = "bench"
MILESTONES = (
    "created", "scheduled", "addressed", "etcd started", "etcd serving", "etcd healthy", "status", "end",
)  # fmt: skip
# etcd's log is stamped in wall-clock time; the watches in time.monotonic.
WALL_OFFSET = time.time() - time.monotonic()


@dataclass(frozen=True)
class PodEvent:
    at: float  # time.monotonic when delivered
    kind: str
    name: str
    uid: str
    node: str | None
    ip: str | None


class PodEvents:
    """Every pod event of one namespace, timed as delivered."""

    def __init__(self, cluster: ReadingCluster, namespace: str) -> None:
        reads = cluster.reads()
        self._url, self._client = f"{reads.server}/api/v1/namespaces/{namespace}/pods", reads.client
        self._version = self._client.get(self._url).raise_for_status().json()["metadata"]["resourceVersion"]
        self.events: list[PodEvent] = []
        self._stopped = False
        threading.Thread(
            target=follow, args=(self._client, self._url, lambda: {"resourceVersion": self._version},
                                 self._deliver, lambda: self._stopped),
            daemon=True, name=f"pods of {namespace}",
        ).start()  # fmt: skip

    def _deliver(self, event: dict[str, Any]) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return
        pod = event["object"]
        self._version = pod["metadata"]["resourceVersion"]
        self.events.append(PodEvent(
            time.monotonic(), event["type"], objects.name(pod), objects.uid(pod) or "",
            objects.pod_node(pod), (pod.get("status") or {}).get("podIP"),
        ))  # fmt: skip

    def stop(self) -> None:
        self._stopped = True  # its watch ends within its timeoutSeconds


def etcd_log_times(cluster: ReadingCluster, namespace: str, pod: str) -> tuple[float | None, float | None]:
    """When the pod's etcd logged its first line, and when it began serving clients
    (``time.monotonic``; None: not in its log)."""
    first = serving = None
    for line in cluster.kubectl("logs", "-n", namespace, pod).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        stamp = entry.get("ts") if isinstance(entry, dict) else None
        if not stamp:
            continue
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - WALL_OFFSET
        first = first if first is not None else at
        if serving is None and "serving client traffic" in entry.get("msg", ""):
            serving = at
    return first, serving


@dataclass
class Replaced:
    """One system's cluster, whose second member pod is deleted round after round (with
    ``--fresh``: a new cluster each round)."""

    cluster: ReadingCluster
    system: System
    namespace: str = ""
    status: StatusWatch = field(init=False)
    pods: PodEvents = field(init=False)
    following: bool = False  # its watches run (``create`` to ``stop``)
    milestones: dict[str, list[float]] = field(default_factory=dict)  # ms after the old pod's end
    exits: list[float] = field(default_factory=list)  # s from the delete to the old pod's end

    def create(self, namespace: str) -> None:
        self.namespace = namespace
        self.cluster.kubectl("create", "namespace", self.namespace)
        self.status = StatusWatch(self.cluster, self.system, self.namespace, NAME)
        self.pods = PodEvents(self.cluster, self.namespace)
        self.following = True
        manifest = self.system.manifest(self.namespace, NAME, 3)
        self.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))
        healthy_since(self.cluster, self.system, self.status, self.namespace, NAME, 3)

    def replace_one(self, round_: int) -> None:
        listed = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l", self.system.selector(NAME), "-o", "json"
        )
        victim = sorted(json.loads(listed)["items"], key=objects.name)[1]
        name, uid = objects.name(victim), objects.uid(victim)
        seen = len(self.pods.events)
        deleted = time.monotonic()
        self.cluster.kubectl("delete", "-n", self.namespace, f"pod/{name}", "--wait=false")
        etcd_ok, agreed = healthy_since(self.cluster, self.system, self.status, self.namespace, NAME, 3)
        events = self.pods.events[seen:]
        gone = next(e.at for e in events if e.kind == "DELETED" and e.uid == uid)
        new = [e for e in events if e.name == name and e.uid != uid]
        started, serving = etcd_log_times(self.cluster, self.namespace, name)
        times = {
            "created": next((e.at for e in new if e.kind == "ADDED"), None),
            "scheduled": next((e.at for e in new if e.node), None),
            "addressed": next((e.at for e in new if e.ip), None),
            "etcd started": started, "etcd serving": serving, "etcd healthy": etcd_ok,
            "status": agreed, "end": max(etcd_ok, agreed),
        }  # fmt: skip
        self.exits.append(gone - deleted)
        cells = []
        for milestone, at in times.items():
            if at is not None:
                self.milestones.setdefault(milestone, []).append((at - gone) * 1000)
            cells.append(f"{milestone} {'—' if at is None else f'{(at - gone) * 1000:.0f}'}")
        print(f"  {self.system.name} round {round_}: old pod gone after {gone - deleted:.3f} s; ms after: "
              + ", ".join(cells), flush=True)  # fmt: skip

    def stop(self, delete: bool = False) -> None:
        """Stop following the cluster (``delete``: and delete its namespace)."""
        if not self.following:
            return
        self.following = False
        self.status.stop()
        self.pods.stop()
        if delete:
            self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false")


def table(replaced: list[Replaced]) -> str:
    lines = ["| ms after the old pod's end | " + " | ".join(r.system.name for r in replaced) + " |"]
    lines.append("|---" * (len(replaced) + 1) + "|")
    for milestone in MILESTONES:
        cells = [f"{statistics.median(r.milestones[milestone]):.0f}" if r.milestones.get(milestone) else "—"
                 for r in replaced]  # fmt: skip
        lines.append(f"| {milestone} | " + " | ".join(cells) + " |")
    fast = ", ".join(
        f"{r.system.name} {sum(t < FAST_EXIT for t in r.exits)} of {len(r.exits)}" for r in replaced
    )
    return "\n".join(lines) + f"\n\nold pods gone in under {FAST_EXIT:.0f} s: {fast}"


def main() -> None:
    parser = peer_parser(__doc__ or "", rounds=16)
    parser.add_argument(
        "--fresh", action="store_true",
        help="a new cluster each round, its pod deleted 6-10 s after it is whole (as peer_bench's step)",
    )  # fmt: skip
    args, out = peer_arguments(parser, "replacement-timeline")
    cluster = bench_cluster("bench-timeline", ReadingCluster)
    operator: Operator | None = None
    peer: subprocess.Popen[bytes] | None = None
    replaced: list[Replaced] = []
    try:
        operator = Operator(cluster, out, profile=False)
        pid = operator.pid
        systems = [kustos_system(lambda: pid)]
        if args.peer is not None:
            peer = start_peer(cluster, args.peer, args.peer_crd, out)
            systems.append(peer_system(peer))
        replaced = [Replaced(cluster, system) for system in systems]
        if not args.fresh:
            for one in replaced:
                one.create(f"timeline-{one.system.name}")
        for round_ in range(args.rounds):
            for one in replaced if round_ % 2 == 0 else replaced[::-1]:
                if args.fresh:
                    one.create(f"timeline-{one.system.name}-{round_}")
                # as peer_bench's deletions: at a point of the peers' probe cycle drawn per round
                time.sleep(SETTLE + deletion_offsets(round_)[0])
                one.replace_one(round_)
                if args.fresh:
                    one.stop(delete=True)
        print(f"\nload average at end: {os.getloadavg()}; {args.rounds} rounds"
              + (f"; peer commit {args.peer_commit}" if args.peer_commit else ""))  # fmt: skip
        print(table(replaced))
    finally:
        for one in replaced:
            one.stop()
        if peer is not None:
            peer.send_signal(signal.SIGTERM)
            peer.wait(30)
        if operator is not None:
            operator.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
