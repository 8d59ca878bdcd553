"""Per-controller cache sync: a controller whose resource is not served waits, reported, while
the others run; it starts once the resource appears."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from kustos.runtime.controller import Controller, ControllerRunner
from kustos.runtime.informer import Informer, ResourceRef
from kustos.runtime.kube import KubeClients
from kustos.runtime.kubeconfig import KubeAccess
from kustos.runtime.manager import Manager, ManagerOptions
from kustos.runtime.metrics import Metrics
from kustos.runtime.webhook import AdmissionResponse, Webhook

THINGS = ResourceRef("kustos.dev", "v1alpha1", "things", "Thing")
GHOSTS = ResourceRef("kustos.dev", "v1alpha1", "ghosts", "Ghost")
EMPTIES = ResourceRef("kustos.dev", "v1alpha1", "empties", "Empty")


class FakeApiServer:
    """Serves lists of one object per resource, watches that stay silent; ghosts 404 until served."""

    def __init__(self) -> None:
        self.ghosts_served = False

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        plural = request.url.path.rsplit("/", 1)[-1]
        if plural == "ghosts" and not self.ghosts_served:
            return httpx2.Response(
                404, json={"reason": "NotFound", "message": "the server could not find it"}
            )
        if request.url.params.get("watch"):
            return httpx2.Response(200, content=_silence())
        items = [
            {"metadata": {"name": f"{plural}-{n}", "namespace": "ns", "resourceVersion": "1"}}
            for n in range(1, 1 if plural == "empties" else 3)
        ]
        return httpx2.Response(200, json={"items": items, "metadata": {"resourceVersion": "1"}})


async def _allow(_request: dict[str, Any]) -> AdmissionResponse:
    return AdmissionResponse.allow()


async def _wakes(
    runner: ControllerRunner, informer: Informer, kind: str, obj: dict[str, Any], old: dict[str, Any] | None
) -> int:
    """How many keys of ``runner``'s controller one event of ``informer`` queues (drained after)."""
    for handler in informer._handlers:
        handler(kind, obj, old)
    woke = len(runner.queue)
    while len(runner.queue):
        runner.queue.done(await runner.queue.get())
    return woke


async def _absent(informer: Informer) -> None:
    """Until the informer's list has found its resource not served (no event says so)."""
    for _ in range(500):
        if informer.absent:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{informer.resource} never found absent")


async def _silence() -> AsyncIterator[bytes]:
    await asyncio.sleep(3600)
    yield b""


def _sample(metrics: Metrics, controller: str) -> float | None:
    return metrics.registry.get_sample_value("kustos_controller_caches_synced", {"controller": controller})


async def test_a_controller_with_an_absent_crd_waits_without_stopping_the_others() -> None:
    server = FakeApiServer()
    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    clients = KubeClients(config=KubeAccess(server="https://k8s"), raw=raw)
    # 2 s: long enough that the first checks fall inside it on a loaded machine (0.3 s did not
    # once, with four test sessions beside it).
    options = ManagerOptions(leader_election=False, metrics_address="127.0.0.1:0", cache_sync_timeout=2)
    manager = Manager(clients, options)
    reconciled: dict[str, asyncio.Event] = {"things": asyncio.Event(), "ghosts": asyncio.Event()}

    def reconciler(plural: str) -> Any:
        async def reconcile(key: str) -> None:
            reconciled[plural].set()

        return reconcile

    manager.add_controller(Controller("things", THINGS, reconciler("things")))
    manager.add_controller(Controller("ghost", GHOSTS, reconciler("ghosts")))
    running = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(reconciled["things"].wait(), 2)
        ready, detail = manager._informers_synced()
        assert not ready and "ghosts.kustos.dev" in detail  # within the sync timeout: not ready
        assert _sample(manager.metrics, "things") == 1 and _sample(manager.metrics, "ghost") == 0
        await asyncio.sleep(options.cache_sync_timeout)  # the wait began before the checks above
        ready, detail = manager._informers_synced()
        assert ready, detail  # past it: the absent CRD no longer fails readiness ...
        waiting = manager._controllers_waiting()
        assert waiting == "controller ghost waits for ghosts.kustos.dev (not served (is its CRD installed?))"
        assert manager.waiting_controllers() == {
            "ghost": ["ghosts.kustos.dev (not served (is its CRD installed?))"]
        }
        assert not reconciled["ghosts"].is_set()

        server.ghosts_served = True  # the CRD is installed: the controller starts
        await asyncio.wait_for(reconciled["ghosts"].wait(), 10)
        assert _sample(manager.metrics, "ghost") == 1
        assert manager.waiting_controllers() == {}
    finally:
        manager.request_stop()
        await asyncio.wait_for(running, 10)
        await raw.aclose()


async def test_a_family_loads_on_its_first_object_and_a_late_controller_gets_what_is_cached() -> None:
    """``load_on_first``: a family registers once, on the first object of its kind, never for a
    kind with none; what it adds while the manager leads starts at once, handed every object
    already cached, and its caches still syncing do not make the replica unready."""
    server = FakeApiServer()
    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    clients = KubeClients(config=KubeAccess(server="https://k8s"), raw=raw)
    options = ManagerOptions(leader_election=False, metrics_address="127.0.0.1:0", cache_sync_timeout=60)
    manager = Manager(clients, options)
    loads: list[str] = []
    reconciled: dict[str, set[str]] = {"things": set(), "late": set()}
    done = asyncio.Event()

    def reconciler(name: str) -> Any:
        async def reconcile(key: str) -> None:
            reconciled[name].add(key)
            if len(reconciled["things"]) == 2 and len(reconciled["late"]) == 2:
                done.set()

        return reconcile

    def load(kind: str) -> Any:
        def register() -> None:
            loads.append(kind)
            if kind == "things":
                manager.add_controller(Controller("things", THINGS, reconciler("things")))

        return register

    manager.load_on_first(THINGS, load("things"), "the things family")
    manager.load_on_first(EMPTIES, load("empties"), "the empties family")
    running = asyncio.create_task(manager.run())
    try:
        await asyncio.wait_for(manager.informer(THINGS).wait_synced(), 5)
        await asyncio.wait_for(manager.informer(EMPTIES).wait_synced(), 5)
        # Added once both things are cached: it saw neither event, and gets both all the same.
        manager.add_controller(Controller("late", THINGS, reconciler("late")))
        # A controller whose late cache never syncs (a CRD not installed) waits, said in the note.
        manager.add_controller(Controller("stuck", THINGS, reconciler("late")).watch(GHOSTS, lambda _o: []))
        await asyncio.wait_for(done.wait(), 5)
        await _absent(manager.informer(GHOSTS))  # its first list answered
        assert loads == ["things"]
        assert reconciled == {
            "things": {"ns/things-1", "ns/things-2"},
            "late": {"ns/things-1", "ns/things-2"},
        }
        assert manager._informers_synced() == (True, "")
        assert manager.waiting_controllers() == {
            "stuck": ["ghosts.kustos.dev (not served (is its CRD installed?))"]
        }
        assert _sample(manager.metrics, "late") == 1 and _sample(manager.metrics, "stuck") == 0
        # A webhook is routed and configured at start: one added later would never be called.
        late_webhook = Webhook("late.kustos.dev", "/late", "validating", [], _allow)
        with pytest.raises(RuntimeError, match=r"late\.kustos\.dev added after the manager started"):
            manager.add_webhook(late_webhook)
    finally:
        manager.request_stop()
        await asyncio.wait_for(running, 10)
        await raw.aclose()


async def test_stopping_while_caches_never_sync_is_prompt() -> None:
    server = FakeApiServer()
    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    clients = KubeClients(config=KubeAccess(server="https://k8s"), raw=raw)
    options = ManagerOptions(leader_election=False, metrics_address="127.0.0.1:0", cache_sync_timeout=60)
    manager = Manager(clients, options)

    async def nothing(key: str) -> None:
        return None

    manager.add_controller(Controller("ghost", GHOSTS, nothing))
    running = asyncio.create_task(manager.run())
    await asyncio.sleep(0.2)
    manager.request_stop()
    await asyncio.wait_for(running, 5)
    await raw.aclose()
    assert json.dumps(manager.waiting_controllers())


async def test_a_status_write_wakes_other_passes_but_not_the_writer_that_asked_for_its_own() -> None:
    """A controller whose every pass requeues (``wakes_on_own_status=False``) is not woken again by
    the watch event of its own status write (issue 28: a pass per write); anyone else's write, a
    spec change, or that controller's older write overtaken by another, still wakes it."""
    from kustos.runtime.logs import reconcile_context

    written = {"metadata": {"name": "t", "namespace": "ns", "resourceVersion": "7", "generation": 1}}

    async def server(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json=written)

    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(server), base_url="https://k8s")
    manager = Manager(
        KubeClients(config=KubeAccess(server="https://k8s"), raw=raw), ManagerOptions(leader_election=False)
    )

    async def reconcile(key: str) -> None:
        return None

    quiet = manager.add_controller(Controller("quiet", THINGS, reconcile, wakes_on_own_status=False))
    plain = manager.add_controller(Controller("plain", THINGS, reconcile))
    handlers = manager.informer(THINGS)._handlers
    before = {"metadata": {**written["metadata"], "resourceVersion": "6"}, "status": {"a": 1}}

    def event(resource_version: str, **change: Any) -> None:
        obj = {"metadata": {**written["metadata"], "resourceVersion": resource_version}, "status": {"a": 2}}
        for handler in handlers:
            handler("MODIFIED", {**obj, **change}, before)

    async def woken() -> tuple[int, int]:
        woke = (len(quiet.queue), len(plain.queue))
        for runner in (quiet, plain):
            while len(runner.queue):  # emptied, as a worker would
                runner.queue.done(await runner.queue.get())
        return woke

    with reconcile_context("quiet", "ns/t", "1"):
        await manager.api.replace_status(THINGS, before, {"a": 2})
    event("7")
    assert await woken() == (0, 1)  # its own echo: only the other controller wakes
    event("7")
    assert await woken() == (1, 1)  # seen once: a repeat of that version (a relist) wakes it
    with reconcile_context("quiet", "ns/t", "2"):
        await manager.api.replace_status(THINGS, before, {"a": 2})
    event("8")
    assert await woken() == (1, 1)  # someone else wrote after it
    with reconcile_context("quiet", "ns/t", "3"):
        await manager.api.replace_status(THINGS, before, {"a": 2})
    event("7", spec={"size": 5})
    assert await woken() == (1, 1)  # more than the status changed
    await raw.aclose()


async def test_an_owned_object_update_the_owner_does_not_decide_on_wakes_nobody() -> None:
    """A member volume's binding (the scheduler's selected node, the binder's volume name) does
    not wake its EtcdCluster for a pass; its phase turning Bound, its creation and deletion do."""
    from kustos.etcd.controller import claim_change_matters
    from kustos.runtime.resources import CLAIMS

    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(FakeApiServer()), base_url="https://k8s")
    manager = Manager(
        KubeClients(config=KubeAccess(server="https://k8s"), raw=raw), ManagerOptions(leader_election=False)
    )

    async def reconcile(key: str) -> None:
        return None

    runner = manager.add_controller(
        Controller("things", THINGS, reconcile).owns(CLAIMS, None, claim_change_matters)
    )
    claims = manager.informer(CLAIMS)
    owner = {"apiVersion": "kustos.dev/v1alpha1", "kind": "Thing", "name": "t"}
    meta = {
        "name": "data-t-0",
        "namespace": "ns",
        "ownerReferences": [owner],
        "labels": {"kustos.dev/cluster": "t"},
    }
    created = {"metadata": meta, "spec": {}, "status": {"phase": "Pending"}}
    selected = {
        **created,
        "metadata": {**created["metadata"], "annotations": {"volume.kubernetes.io/selected-node": "w1"}},
    }
    bound_spec = {**selected, "spec": {"volumeName": "pvc-1"}}
    bound = {**bound_spec, "status": {"phase": "Bound"}}

    assert await _wakes(runner, claims, "ADDED", created, None) == 1
    assert await _wakes(runner, claims, "MODIFIED", selected, created) == 0
    assert await _wakes(runner, claims, "MODIFIED", bound_spec, selected) == 0
    assert await _wakes(runner, claims, "MODIFIED", bound, bound_spec) == 1
    assert await _wakes(runner, claims, "DELETED", bound, None) == 1
    await raw.aclose()


async def test_a_budget_or_service_status_rewrite_wakes_no_etcd_cluster_pass() -> None:
    """The disruption controller rewrites a member budget's status whenever a member pod's
    readiness changes; the EtcdCluster controller reads the budget's spec only, so a status
    rewrite wakes no pass (each asked every member again). A spec change someone else made, an
    addition and a deletion still wake the cluster that owns it, as they do for its Services."""
    from kustos.etcd.controller import register
    from kustos.etcd.pods import CLUSTER_LABEL
    from kustos.runtime.deps import Deps
    from kustos.runtime.informer import InformerOptions
    from kustos.runtime.resources import DISRUPTION_BUDGETS, SERVICES

    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(FakeApiServer()), base_url="https://k8s")
    manager = Manager(
        KubeClients(config=KubeAccess(server="https://k8s"), raw=raw), ManagerOptions(leader_election=False)
    )
    register(manager, Deps())
    (runner,) = [r for r in manager._controllers if r.controller.name == "etcdcluster"]
    owner = {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster", "name": "e", "controller": True}
    meta = {"name": "e", "namespace": "ns", "ownerReferences": [owner], "labels": {CLUSTER_LABEL: "e"}}

    budgets = manager.informer(DISRUPTION_BUDGETS, InformerOptions(label_selector=CLUSTER_LABEL))
    budget = {"metadata": meta, "spec": {"minAvailable": 2}, "status": {"currentHealthy": 3}}
    one_down = {**budget, "status": {"currentHealthy": 2, "disruptionsAllowed": 0}}
    tightened = {**one_down, "metadata": {**meta, "generation": 2}, "spec": {"minAvailable": 4}}
    assert await _wakes(runner, budgets, "ADDED", budget, None) == 1
    assert await _wakes(runner, budgets, "MODIFIED", one_down, budget) == 0
    assert await _wakes(runner, budgets, "MODIFIED", tightened, one_down) == 1
    assert await _wakes(runner, budgets, "DELETED", tightened, None) == 1

    services = manager.informer(SERVICES)
    service = {"metadata": meta, "spec": {"type": "LoadBalancer"}, "status": {}}
    balanced = {**service, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}}
    retyped = {**balanced, "spec": {"type": "ClusterIP"}}
    assert await _wakes(runner, services, "MODIFIED", balanced, service) == 0
    assert await _wakes(runner, services, "MODIFIED", retyped, balanced) == 1
    await raw.aclose()


async def test_an_update_of_the_primary_that_a_controller_does_not_decide_on_wakes_only_the_others() -> None:
    """The EtcdCluster controller records every step in the status: the defragmentation and
    backup schedule controllers wake for what they decide on (the phase, the members, the
    spec), not for a step's message, while a controller without a filter wakes every time."""
    from kustos.etcd.backup_controller import schedule_change_matters
    from kustos.etcd.defragmentation_controller import cluster_change_matters

    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(FakeApiServer()), base_url="https://k8s")
    manager = Manager(
        KubeClients(config=KubeAccess(server="https://k8s"), raw=raw), ManagerOptions(leader_election=False)
    )

    async def reconcile(key: str) -> None:
        return None

    runners = [
        manager.add_controller(Controller(name, THINGS, reconcile, primary_matters=matters))
        for name, matters in (("defrag", cluster_change_matters), ("schedule", schedule_change_matters),
                              ("plain", None))
    ]  # fmt: skip
    handlers = manager.informer(THINGS)._handlers
    member = {"name": "e-0", "clientUrl": "http://e-0.e:2379"}

    def cluster(generation: int = 1, **status: Any) -> dict[str, Any]:
        meta = {"name": "e", "namespace": "ns", "generation": generation}
        return {"metadata": meta, "spec": {"size": generation}, "status": status}

    async def woken(obj: dict[str, Any], old: dict[str, Any]) -> tuple[int, ...]:
        for handler in handlers:
            handler("MODIFIED", obj, old)
        woke = tuple(len(runner.queue) for runner in runners)
        for runner in runners:
            while len(runner.queue):
                runner.queue.done(await runner.queue.get())
        return woke

    creating = cluster(phase="Creating", conditions=[{"type": "Progressing", "message": "CreatePod"}])
    stepped = cluster(phase="Creating", conditions=[{"type": "Progressing", "message": "AddMember"}])
    assert await woken(stepped, creating) == (0, 0, 1)
    joined = cluster(phase="Creating", members=[member])
    assert await woken(joined, stepped) == (1, 0, 1)
    formed = cluster(phase="Running", members=[member], clusterId="9a")
    assert await woken(formed, joined) == (1, 1, 1)
    full = cluster(phase="Running", members=[member], clusterId="9a",
                   conditions=[{"type": "SpaceAvailable", "status": "False"}])  # fmt: skip
    assert await woken(full, formed) == (1, 0, 1)
    assert await woken(cluster(2, phase="Running"), cluster(1, phase="Running")) == (1, 1, 1)
    await raw.aclose()
