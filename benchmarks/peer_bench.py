"""kustos beside a peer etcd operator on one dev cluster: issue 28's table (item 4).

    .venv/bin/python -m benchmarks.peer_bench [--rounds 4]
        [--peer BINARY --peer-crd CRD.yaml [--peer-commit SHA]] [--compare CHECKOUT] [--log-level info]

The peer is the official operator (github.com/etcd-io/etcd-operator), built by whoever runs
this from its own source (``go build ./cmd`` in a checkout; its CRD is
``config/crd/bases/operator.etcd.io_etcdclusters.yaml``): nothing of it is in this repository.
Without ``--peer`` only kustos's figures are printed.

Each round gives every system a fresh namespace, alternating which goes first, and times, on
members with 64Mi volumes, at etcd 3.6.16: create 3 members, delete 1 member pod, scale 3 -> 5,
scale 5 -> 3, delete 2 of 3 pods (the leader's and a follower's: quorum lost, volumes kept),
each step 6 s after the one before (a deletion a further 0-4 s, drawn per round:
``PROBE_PERIOD``). A step ends when the system is
healthy by the same outside check for both: the member list read from a member pod shows N
started voters, every member pod answers etcd's /health (one whose container is not running
yet does not, unasked), and the operator's status agrees (kustos: N/N ready and Running; the
peer: readyReplicas and memberCount N). etcd is looked at every 20 ms, the status as the
operator writes it (its EtcdCluster is watched), and the step ends when both first said so,
each side timed as it came true (``until_healthy``). CPU is the operator process's utime + stime
over the create. The two deletion steps also print how long the deleted pods' objects lasted
(their etcd's exit, before any operator can bring them back) and the rest of the step (from
then to healthy: the part the operator acts in).
Idle CPU (per 10 s over 30 s) and RSS are taken with no cluster, first, each operator leading
(leader election on for both). Medians are printed as a markdown table.

``--compare CHECKOUT`` runs another kustos checkout (with its own .venv) as one more system, in
its own rounds: a before/after at equal load. Two kustos operators would share one Lease, so
each then runs only during its own rounds (started before, stopped after) and no idle figures
are taken. ``--log-level info`` keeps each step kustos takes, with its time, in
``operator.log`` under the output directory printed first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from tests.integration.api_reads import ReadingCluster

from benchmarks.etcd_bench import bench_cluster, healthy, rss_mib
from benchmarks.operator_cpu_bench import REPO, Operator, cpu_seconds
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.network import operator_argv
from kustos.etcd.client import EtcdClient, EtcdError
from kustos.runtime import objects

VERSION = "3.6.16"
VOLUME = "64Mi"
STEP_TIMEOUT = 240.0
CHECK_EVERY = 0.02  # seconds between two looks of the outside check
STEPS = (
    "create 3 members → all healthy",
    "delete 1 member pod → 3 healthy",
    "scale 3 → 5",
    "scale 5 → 3",
    "delete 2 of 3 pods (quorum lost, volumes kept)",
)
CPU_ROW = "operator CPU seconds for one 3-member create"
# How long the deleted pods' objects lasted (their etcd's exit: the pod runner removes a pod once
# its process is gone), the part of the two deletion steps no operator acts in.
GONE_ROWS = {
    STEPS[1]: "… the deleted pod gone (its etcd exited)",
    STEPS[4]: "… both deleted pods gone (their etcd exited)",
}
# The rest of those steps, from the deleted pods gone to healthy: the part each operator acts in.
# The etcd exit before it is drawn by chance (etcd gives its peer listener up to 1 s to close, and
# whether a stop needs it varies run by run, for any operator's pods: docs/benchmarks.md).
AFTER_ROWS = {
    STEPS[1]: "… from the pod gone to 3 healthy",
    STEPS[4]: "… from both pods gone to 3 healthy",
}
# A deleted member's etcd exits in a few ms, or waits out the 1 s etcd gives its peer listener's
# shutdown: a peer connection whose short request was answered is held active while its read
# waits for etcd's 5 s deadline (goroutine dumps, docs/benchmarks.md stop 47). Which one a stop
# gets follows where in the peers' probe cycle it lands (``PROBE_PERIOD``), the same for any
# operator's members; the count says how each run drew.
FAST_EXIT = 1.0
SETTLE = 6.0  # seconds after a step before the next one's change: etcd's 5 s after a member (re)joins
# Each peer probes a member every 4 s (rafthttp's prober: its 5 s read timeout less 1 s), and
# the connection held active is freed by the peer's next probe on it, or at the end of the 1 s
# (docs/benchmarks.md, stop 49). A fixed wait after a step puts every round's deletion at the
# same point of that cycle, a point each operator's own timing of its member adds sets: one
# operator's members then draw the slow exit every round. So a deletion waits a point of the
# cycle more, drawn per round.
PROBE_PERIOD = 4.0
NAMESPACES = {"kustos (compare)": "kustos-compare"}  # a system's namespaces, when its name is no DNS label


@dataclass
class System:
    """One operator under test: how to drive its EtcdCluster and read its status."""

    name: str
    pid: Callable[[], int]
    manifest: Callable[[str, str, int], dict[str, Any]]
    selector: Callable[[str], str]  # the label selector of a cluster's member pods
    agrees: Callable[[dict[str, Any], int], bool]  # its status says N healthy members
    resource: str  # kubectl's name of its EtcdCluster kind
    figures: dict[str, list[float]] = field(default_factory=dict)

    def record(self, row: str, value: float) -> None:
        self.figures.setdefault(row, []).append(value)


def kustos_system(pid: Callable[[], int], name: str = "kustos") -> System:
    def manifest(namespace: str, name: str, size: int) -> dict[str, Any]:
        return {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"size": size, "version": VERSION, "memberFailureTimeout": "5s",
                         "storage": {"type": "pvc", "size": VOLUME}}}  # fmt: skip

    return System(
        name,
        pid,
        manifest,
        lambda cluster: f"kustos.dev/cluster={cluster}",
        healthy,
        "etcdclusters.kustos.dev",
    )


def peer_system(process: subprocess.Popen[bytes]) -> System:
    def manifest(namespace: str, name: str, size: int) -> dict[str, Any]:
        return {"apiVersion": "operator.etcd.io/v1alpha1", "kind": "EtcdCluster",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"size": size, "version": f"v{VERSION}",
                         "storageSpec": {"volumeSizeRequest": VOLUME}}}  # fmt: skip

    def agrees(status: dict[str, Any], size: int) -> bool:
        return status.get("readyReplicas") == size and status.get("memberCount") == size

    return System(
        "official", lambda: process.pid, manifest, lambda name: f"app={name}", agrees,
        "etcdclusters.operator.etcd.io",
    )  # fmt: skip


# ---- the outside check -------------------------------------------------------------------------


def _pod_ips(cluster: DevCluster, namespace: str, selector: str) -> list[str | None]:
    """Each member pod's IP, None for one whose container is not running yet (it has an IP on
    no link for a while: a request to it waits for an ARP answer that never comes, a second)."""
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))
    return [p["status"]["podIP"] if p["status"].get("podIP") and objects.pod_running(p) else None
            for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]  # fmt: skip


async def _etcd_healthy(ips: list[str | None], size: int) -> bool:
    """N started voters in the member list, and every member pod answers /health."""
    running = [ip for ip in ips if ip is not None]
    if len(ips) != size or len(running) != size:
        return False
    try:
        async with EtcdClient(f"http://{running[0]}:2379", timeout=2.0) as client:
            members = (await client.member_list()).members
        voters = [m for m in members if m.is_started and not m.is_learner]
        if len(members) != size or len(voters) != size:
            return False
        for ip in running:
            async with EtcdClient(f"http://{ip}:2379", timeout=2.0) as client:
                if not await client.health():
                    return False
    except EtcdError:
        return False
    return True


async def _leader_first(ips: list[str | None], names: list[str]) -> list[str]:
    """``names`` (member pods, sorted), the leader's first: a quorum loss takes the leader's pod
    and a follower's for every system alike, whichever member leads its cluster by then (each
    operator's history decides; a leader hands over before it stops, and a surviving one keeps
    messaging the stopping members, so the roles shape the step: docs/benchmarks.md, stop 49)."""
    running = [ip for ip in ips if ip is not None]
    async with EtcdClient(f"http://{running[0]}:2379", timeout=2.0) as client:
        leader_id = (await client.status()).leader_id
        members = (await client.member_list()).members
    leader = next((f"pod/{m.name}" for m in members if m.id == leader_id), None)
    return sorted(names, key=lambda name: name != leader)


def follow(
    client: httpx.Client,
    url: str,
    query: Callable[[], dict[str, str]],
    deliver: Callable[[dict[str, Any]], None],
    stopped: Callable[[], bool],
) -> None:
    """Hand each event of a watch of ``url`` to ``deliver``, watch after watch (30 s each, a
    failed one retried 0.1 s later), until ``stopped``; each starts with ``query()``'s
    parameters, which may name the last version seen."""
    while not stopped():
        params = {**query(), "watch": "1", "timeoutSeconds": "30"}
        try:
            timeout = httpx.Timeout(10.0, read=40.0)
            with client.stream("GET", url, params=params, timeout=timeout) as answer:
                for line in answer.iter_lines():
                    if line:
                        deliver(json.loads(line))
        except httpx.HTTPError:
            time.sleep(0.1)


class StatusWatch:
    """An EtcdCluster's status as its watch delivers it, with a wake-up on every change.

    The outside check reads the operator's word when it is written, as its look at etcd sees
    etcd's: a starting member's /health answers when it serves. Polled instead, a status
    written just after etcd served (kustos's, which follows its own look at etcd) was seen up
    to a look late, while the peer's, which agrees before etcd serves, was not."""

    def __init__(self, cluster: ReadingCluster, system: System, namespace: str, name: str) -> None:
        reads = cluster.reads()
        resource = reads.resolve(system.resource)
        if resource is None:
            raise RuntimeError(f"the API server does not serve {system.resource}")
        self._url = f"{reads.server}{resource.base}/namespaces/{namespace}/{resource.plural}"
        self._client, self._name = reads.client, name
        self._changed = threading.Condition()
        self._stopped = False
        self._delivered: list[tuple[float, dict[str, Any]]] = []  # (time.monotonic, status), in order
        # Each watch starts with the object as it is (ADDED).
        query = {"fieldSelector": f"metadata.name={name}"}
        threading.Thread(
            target=follow,
            args=(self._client, self._url, lambda: query, self._deliver, lambda: self._stopped),
            daemon=True, name=f"watch {namespace}/{name}",
        ).start()  # fmt: skip

    def _deliver(self, event: dict[str, Any]) -> None:
        if event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return  # a watch error or bookmark: the next watch starts afresh
        gone = event.get("type") == "DELETED"
        status = {} if gone else dict((event.get("object") or {}).get("status") or {})
        with self._changed:
            self._delivered.append((time.monotonic(), status))
            self._changed.notify_all()

    @property
    def changes(self) -> int:
        """Statuses delivered so far."""
        return len(self._delivered)

    def agreeing_since(self, agrees: Callable[[dict[str, Any]], bool]) -> float | None:
        """When the statuses delivered began to agree without a break up to the last one (None:
        the last one does not)."""
        since = None
        with self._changed:
            for delivered, status in reversed(self._delivered):
                if not agrees(status):
                    break
                since = delivered
        return since

    def wait(self, seen: int, timeout: float) -> None:
        """Until a status after the ``seen``-th is delivered, or ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(lambda: self.changes > seen, timeout)

    def stop(self) -> None:
        self._stopped = True  # its watch ends within its timeoutSeconds


def until_healthy(
    cluster: DevCluster, system: System, watch: StatusWatch, namespace: str, name: str, size: int
) -> float:
    """The moment (``time.monotonic``) from which etcd and the operator's status both said the
    cluster was healthy (``healthy_since``)."""
    return max(healthy_since(cluster, system, watch, namespace, name, size))


def healthy_since(
    cluster: DevCluster, system: System, watch: StatusWatch, namespace: str, name: str, size: int
) -> tuple[float, float]:
    """The moments (``time.monotonic``) from which etcd, and the operator's status, said the
    cluster was healthy, once a look at etcd begun after the status agreed confirms it.

    etcd is looked at all along, whatever the status says, and each side is timed as it came
    true: etcd by the end of the first of the healthy looks in a row, the status by its
    delivery. Before, etcd was looked at only once the status agreed, so an operator whose
    status came last (kustos's follows its own look at etcd) was timed a whole look later, while
    one whose status agreed before etcd served (the peer's) was timed by a look already waiting
    on the starting etcd, which answers as it serves."""
    deadline = time.monotonic() + STEP_TIMEOUT
    etcd_since: float | None = None  # the end of the first healthy look in the current run

    def agrees(status: dict[str, Any]) -> bool:
        return system.agrees(status, size)

    while time.monotonic() < deadline:
        seen, started = watch.changes, time.monotonic()
        healthy = asyncio.run(_etcd_healthy(_pod_ips(cluster, namespace, system.selector(name)), size))
        etcd_since = (etcd_since or time.monotonic()) if healthy else None
        agreed = watch.agreeing_since(agrees)
        if etcd_since is not None and agreed is not None and agreed <= started:
            return etcd_since, agreed
        watch.wait(seen, CHECK_EVERY)
    raise RuntimeError(f"{system.name}: {namespace}/{name} not healthy at size {size} in {STEP_TIMEOUT}s")


# ---- one round ---------------------------------------------------------------------------------


def deletion_offsets(round_: int) -> tuple[float, float]:
    """The wait beyond ``SETTLE`` before each of a round's two deletions, uniform over one probe
    cycle: drawn from the round's number, the same for every system and every run."""
    draw = random.Random(round_)
    return draw.uniform(0, PROBE_PERIOD), draw.uniform(0, PROBE_PERIOD)


def run_round(cluster: ReadingCluster, system: System, namespace: str, round_: int) -> None:
    name = "bench"
    offsets = deletion_offsets(round_)
    kubectl = cluster.kubectl
    kubectl("create", "namespace", namespace)
    watch = StatusWatch(cluster, system, namespace, name)

    def apply(size: int) -> None:
        kubectl("apply", "-f", "-", input_text=json.dumps(system.manifest(namespace, name, size)))

    def pods() -> list[str]:
        out = kubectl("get", "pods", "-n", namespace, "-l", system.selector(name), "-o", "name")
        return sorted(out.split())

    def timed(row: str, action: Callable[[], None], size: int) -> None:
        cpu, started = cpu_seconds(system.pid()), time.monotonic()
        action()
        ended = until_healthy(cluster, system, watch, namespace, name, size)
        system.record(row, ended - started)
        parts = ""  # the two parts of a deletion step, printed to the millisecond
        if row in GONE_ROWS:
            deleting.join()
            if gone:  # else they outlived the wait, which said so
                system.record(GONE_ROWS[row], gone[-1] - started)
                system.record(AFTER_ROWS[row], ended - gone[-1])
                parts = f" (gone after {gone[-1] - started:.3f} s, healthy {ended - gone[-1]:.3f} s later)"
        if row == STEPS[0]:
            system.record(CPU_ROW, cpu_seconds(system.pid()) - cpu)
        print(f"  {system.name} {namespace}: {row}: {ended - started:.1f} s{parts}", flush=True)
        time.sleep(SETTLE)

    timed(STEPS[0], lambda: apply(3), 3)
    gone: list[float] = []  # when the last delete's pods were gone (time.monotonic)
    deleting = threading.Thread()

    def delete(victims: list[str]) -> None:
        """Delete ``victims`` (the step's check starts once the API server has taken the
        deletion, or it could find the cluster whole before it) and, beside the step, note when
        their objects are gone."""
        nonlocal deleting
        gone.clear()

        reads = cluster.reads()
        pods_url = f"{reads.server}/api/v1/namespaces/{namespace}/pods"
        listed = reads.client.get(pods_url).raise_for_status().json()
        uids = {objects.uid(pod) for pod in listed["items"] if f"pod/{objects.name(pod)}" in victims}
        kubectl("delete", "-n", namespace, *victims, "--wait=false")

        def wait() -> None:
            """Their DELETED events, on a watch from the list the UIDs came from: timed as the
            operators' informers see them. A list polled every 50 ms put the end of the exit
            up to a poll and a read late, and the part after it as much early."""
            # By UID, not by name: the operator recreates a member under its old name.
            left = set(uids)
            if not left:  # none of them was there to delete
                gone.append(time.monotonic())
                return
            query = {"watch": "1", "resourceVersion": listed["metadata"]["resourceVersion"],
                     "timeoutSeconds": "120"}  # fmt: skip
            with reads.client.stream(
                "GET", pods_url, params=query, timeout=httpx.Timeout(10.0, read=130.0)
            ) as answer:
                for line in answer.iter_lines():
                    event = json.loads(line) if line else {}
                    if event.get("type") == "DELETED":
                        left.discard(objects.uid(event["object"]))
                        if not left:
                            gone.append(time.monotonic())
                            return
            print(f"  the deleted pods {victims} were still there after 120 s", flush=True)

        deleting = threading.Thread(target=wait)
        deleting.start()

    time.sleep(offsets[0])
    timed(STEPS[1], lambda: delete(pods()[1:2]), 3)
    timed(STEPS[2], lambda: apply(5), 5)
    timed(STEPS[3], lambda: apply(3), 3)
    time.sleep(offsets[1])
    victims = asyncio.run(_leader_first(_pod_ips(cluster, namespace, system.selector(name)), pods()))[:2]
    print(f"  {system.name} {namespace}: the leader's pod and a follower's: {' '.join(victims)}", flush=True)
    timed(STEPS[4], lambda: delete(victims), 3)
    watch.stop()
    kubectl("delete", "namespace", namespace, "--wait=false")


def idle(system: System) -> None:
    """CPU per 10 s over 30 s, and RSS, with no cluster to manage."""
    cpu = cpu_seconds(system.pid())
    time.sleep(30)
    system.record("idle CPU per 10 s", (cpu_seconds(system.pid()) - cpu) / 3)
    system.record("idle RSS (MiB)", rss_mib(system.pid()))


def table(systems: list[System]) -> str:
    head = "| step | " + " | ".join(s.name for s in systems)
    head += " | kustos ÷ official |" if len(systems) == 2 else " |"
    lines = [head, "|---" * (len(systems) + 1 + (len(systems) == 2)) + "|"]
    rows = tuple(
        r for step in STEPS for r in (step, GONE_ROWS.get(step), AFTER_ROWS.get(step)) if r is not None
    )
    for row in (*rows, CPU_ROW, "idle RSS (MiB)", "idle CPU per 10 s"):
        medians = [statistics.median(s.figures[row]) if s.figures.get(row) else None for s in systems]
        fine = "CPU" in row or row in AFTER_ROWS.values()  # tenths would hide what the ratio says
        cells = [("—" if m is None else f"{m:.2f}" if fine else f"{m:.1f}") for m in medians]
        if len(systems) == 2:
            k, o = medians
            cells.append(f"{k / o:.2f}" if k is not None and o else "—")
        unit = " s" if row in rows else ""
        lines.append(f"| {row}{unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def exit_draws(systems: list[System]) -> str:
    """For each deletion step, in how many rounds each system's deleted pods were gone in under
    ``FAST_EXIT``: the medians of the whole steps follow these draws."""
    lines = []
    for row in GONE_ROWS.values():
        gone = {s.name: s.figures.get(row, []) for s in systems}
        counts = [f"{name} {sum(t < FAST_EXIT for t in ts)} of {len(ts)}" for name, ts in gone.items()]
        lines.append(f"{row.removeprefix('… ')} in under {FAST_EXIT:.0f} s: " + ", ".join(counts))
    return "\n".join(lines)


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PEER_LEASE_NAMESPACE = "default"
PEER_LEAD_TIMEOUT = 60.0  # seconds: controller-runtime's Lease lasts 15 s


def start_peer(cluster: DevCluster, binary: Path, crd: Path, out: Path) -> subprocess.Popen[bytes]:
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    cluster.wait_established("etcdclusters.operator.etcd.io")
    log = (out / "peer.log").open("ab")
    # As kustos's: the host's network, cluster DNS for the members' names (the peer dials
    # <pod>.<cluster>.<ns>.svc.cluster.local), and leader election on, so both idle figures are
    # a leader's (Lease renewals included). Outside a pod controller-runtime takes its Lease's
    # namespace from the service account's namespace file only: the peer's private mount
    # namespace gets one, bound over the host's path (made, empty, when missing).
    account = out / "peer-serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "namespace").write_text(PEER_LEASE_NAMESPACE)
    SERVICE_ACCOUNT_DIR.mkdir(parents=True, exist_ok=True)
    argv = ["sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(account),
            str(SERVICE_ACCOUNT_DIR), str(binary), "--kubeconfig", str(cluster.kubeconfig), "--leader-elect",
            "--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:0"]  # fmt: skip
    process = subprocess.Popen(operator_argv(cluster.resolv_conf, argv), stdout=log, stderr=log)
    deadline = time.monotonic() + PEER_LEAD_TIMEOUT  # a Lease its last run left must expire first
    while "successfully acquired lease" not in (out / "peer.log").read_text(errors="replace").lower():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the peer never led: see {out / 'peer.log'}")
        time.sleep(0.5)
    return process


def peer_parser(description: str, rounds: int) -> argparse.ArgumentParser:
    """The command line of a bench that runs kustos beside a peer operator: ``--rounds`` and the
    peer's binary, CRD and commit (``peer_arguments`` checks them)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--peer", type=Path, help="the peer operator's binary")
    parser.add_argument("--peer-crd", type=Path, help="the peer's EtcdCluster CRD")
    parser.add_argument("--peer-commit", default="", help="the peer's commit, printed with the table")
    return parser


def peer_arguments(parser: argparse.ArgumentParser, out_prefix: str) -> tuple[argparse.Namespace, Path]:
    """The parsed command line, and a fresh output directory for the operators' logs."""
    args = parser.parse_args()
    if args.peer is not None and args.peer_crd is None:
        parser.error("--peer needs --peer-crd")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"{out_prefix}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    return args, out


def main() -> None:
    parser = peer_parser(__doc__ or "", rounds=4)
    parser.add_argument("--compare", type=Path, help="another kustos checkout, run in its own rounds")
    parser.add_argument("--log-level", default="warning", help="kustos's log level (operator.log)")
    args, out = peer_arguments(parser, "peer-bench")
    # The outside check's kubectl reads served in-process: a kubectl process a read lagged every
    # step's end by ~0.3 s a look, more for kustos, whose status follows its own look at etcd.
    cluster = bench_cluster("bench-peer", ReadingCluster)
    operators: dict[str, Operator] = {}  # by system name: the kustos operators running
    peer = None
    trees = {"kustos": REPO, **({"kustos (compare)": args.compare.resolve()} if args.compare else {})}

    def start(name: str) -> None:
        operators[name] = Operator(cluster, out, profile=False, source=trees[name], log_level=args.log_level)

    try:
        systems = [kustos_system(partial(lambda name: operators[name].pid, name), name) for name in trees]
        if args.compare is None:
            start("kustos")
        if args.peer is not None:
            peer = start_peer(cluster, args.peer, args.peer_crd, out)
            systems.append(peer_system(peer))
        if args.compare is None:
            for system in systems:
                idle(system)
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else systems[::-1]
            for system in order:
                own = args.compare is not None and system.name in trees
                if own:
                    start(system.name)
                try:
                    run_round(cluster, system, f"{NAMESPACES.get(system.name, system.name)}-{round_}", round_)
                finally:
                    if own:
                        operators.pop(system.name).stop()
        print(f"\nload average at end: {os.getloadavg()}; etcd {VERSION}; {args.rounds} rounds"
              + (f"; peer commit {args.peer_commit}" if args.peer_commit else ""))  # fmt: skip
        print(table(systems))
        print(exit_draws(systems))
    finally:
        if peer is not None:
            peer.send_signal(signal.SIGTERM)
            peer.wait(30)
        for operator in operators.values():
            operator.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
