"""Informers: list + watch one resource type into an in-memory cache, and tell handlers.

Controllers read the cache instead of calling the API. The informer keeps it true:
watch bookmarks keep the resourceVersion fresh, a closed watch resumes from it, a
410 Gone (or any failure to resume) relists and reports objects that vanished
meanwhile as deletions, and a watch that has been silent for longer than its
inactivity timeout (bookmarks arrive every minute or so on a healthy one) is
restarted, so an operator never stops reacting without noticing.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import json
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import httpx2

from kustos.runtime.kube import api_path, object_key
from kustos.runtime.metrics import Metrics
from kustos.runtime.refs import ResourceRef as ResourceRef  # its home before refs.py: re-exported

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# (event type, new object, previous object or None)
Handler = Callable[[str, Obj, Obj | None], Awaitable[None] | None]
Transform = Callable[[Obj], Obj]
# An index function: the values under which an object is found (none, one or several).
IndexFunc = Callable[[Obj], Iterable[str]]

NODE_NAME_INDEX = "spec.nodeName"


def pod_node_name(obj: Obj) -> Iterable[str]:
    """Index pods by the node they are bound to (unscheduled pods are not indexed)."""
    node = (obj.get("spec") or {}).get("nodeName")
    return (node,) if node else ()


def label_index(label: str) -> IndexFunc:
    """Index objects by the value of one label (objects without it are not indexed)."""

    def values(obj: Obj) -> Iterable[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
        return (value,) if value else ()

    return values


def label_index_name(label: str) -> str:
    return f"label:{label}"


class ResourceExpired(Exception):
    """The resourceVersion we would resume from is gone (410): relist."""


class ResourceNotServed(Exception):
    """The API server does not serve the resource (404 on the list): its CRD is absent."""


def new_state_only(handler: Callable[[str, Obj], Awaitable[None]]) -> Handler:
    """Adapt a handler that acts on the new state alone (most do) to ``Informer.add_handler``."""

    def adapted(kind: str, obj: Obj, _old: Obj | None) -> Awaitable[None]:
        return handler(kind, obj)

    return adapted


def drop_managed_fields(obj: Obj) -> Obj:
    """The default transform: managedFields are large and no controller of ours reads them."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


@dataclass
class InformerOptions:
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None
    page_size: int = 500
    watch_timeout: int = 300
    inactivity_timeout: float = 180.0
    transform: Transform | None = drop_managed_fields


class Informer:
    """One list/watch loop and its cache; many handlers may listen."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        resource: ResourceRef,
        options: InformerOptions | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.resource = resource
        self.options = options or InformerOptions()
        self._http = http
        self._metrics = metrics
        self._store: dict[str, Obj] = {}
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()
        self._version = ""
        self.absent = False
        """The last list found the resource not served (its CRD absent); lists go on until it is."""
        self.last_error: str | None = None
        self._indexers: dict[str, IndexFunc] = {}
        # index name -> value -> keys (a dict as an ordered set)
        self._indexes: dict[str, dict[str, dict[str, None]]] = {}
        self._count: Callable[[], int] = self.__len__
        """What the cached-objects gauge reports: this cache, or its facade's whole (namespaces)."""

    # ---- reading -------------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        return self._store.get(key)

    def list(self) -> Iterable[Obj]:
        return self._store.values()

    def keys(self) -> Iterable[str]:
        return self._store.keys()

    def __len__(self) -> int:
        return len(self._store)

    # ---- indexes ---------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Keep the cache indexed by ``fn`` under ``name``; adding a name twice keeps the first
        (informers are shared, and two controllers may ask for the same index)."""
        if name in self._indexers:
            return
        self._indexers[name] = fn
        self._indexes[name] = self._build(fn)

    def index_by_node_name(self) -> str:
        """Index pods by ``spec.nodeName``; returns the index name for ``by_index``."""
        self.add_index(NODE_NAME_INDEX, pod_node_name)
        return NODE_NAME_INDEX

    def index_by_label(self, label: str) -> str:
        """Index objects by the value of ``label``; returns the index name for ``by_index``."""
        name = label_index_name(label)
        self.add_index(name, label_index(label))
        return name

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        """The cached objects indexed under ``value`` (KeyError for an unknown index)."""
        keys = self._indexes[name].get(value) or {}
        return [self._store[k] for k in keys if k in self._store]

    def index_values(self, name: str) -> builtins.list[str]:
        """Every value under which some object is indexed."""
        return list(self._indexes[name])

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indexes[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.pop(key, None)
                    if not keys:
                        del index[value]

    def _index(self, key: str, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indexes[name]
            for value in fn(obj):
                index.setdefault(value, {})[key] = None

    def _build(self, fn: IndexFunc) -> dict[str, dict[str, None]]:
        index: dict[str, dict[str, None]] = {}
        for key, obj in self._store.items():
            for value in fn(obj):
                index.setdefault(value, {})[key] = None
        return index

    def _reindex(self) -> None:
        for name, fn in self._indexers.items():
            self._indexes[name] = self._build(fn)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    def add_handler(self, handler: Handler) -> None:
        """Handlers get every change from the next list on: add them before ``run``."""
        self._handlers.append(handler)

    # ---- running -------------------------------------------------------------------

    async def run(self) -> None:
        """List, then watch from there, forever; relist when resuming is not possible."""
        backoff = 0.2
        while True:
            try:
                await self._relist()
                backoff = 0.2
                while True:
                    await self._watch()
            except asyncio.CancelledError:
                raise
            except ResourceExpired:
                self._restarted("expired")
                continue
            except ResourceNotServed:
                if not self.absent:
                    log.warning("%s is not served (is its CRD installed?): listing again until it is",
                                self.resource)  # fmt: skip
                self.absent, self.last_error = True, "not served (is its CRD installed?)"
                self._restarted("absent")
                await asyncio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 30.0)
            except Exception as err:
                self._restarted("error")
                first = self.last_error is None
                self.last_error = _one_line(err)
                # Only the first failure of a streak is a warning, and an unreachable API server is
                # said once for every informer: it fails them all every few seconds, which must
                # not bury the log.
                unreachable = isinstance(err, httpx2.TransportError)
                if first and unreachable and not _outage["reported"]:
                    _outage["reported"] = True
                    log.warning("the API server is unreachable (%s); informers relist until it answers",
                                self.last_error)  # fmt: skip
                else:
                    (log.warning if first and not unreachable else log.debug)(
                        "informer %s failed, relisting in %.1fs: %s", self.resource, backoff, self.last_error
                    )
                await asyncio.sleep(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 30.0)

    def _restarted(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.watch_restarts.labels(str(self.resource), reason).inc()

    def _params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.options.label_selector:
            params["labelSelector"] = self.options.label_selector
        if self.options.field_selector:
            params["fieldSelector"] = self.options.field_selector
        return params

    def _path(self) -> str:
        r = self.resource
        return api_path(r.group, r.version, r.plural, self.options.namespace if r.namespaced else None)

    async def _relist(self) -> None:
        fresh: dict[str, Obj] = {}
        params = {**self._params(), "limit": str(self.options.page_size)}
        while True:
            response = await self._http.get(self._path(), params=params)
            if response.status_code == 410:
                params.pop("continue", None)  # a list page expired: start the list again
                fresh.clear()
                continue
            if response.status_code == 404:
                raise ResourceNotServed(str(self.resource))
            response.raise_for_status()
            body = response.json()
            for item in body.get("items") or []:
                item.setdefault("apiVersion", self.resource.api_version)
                item.setdefault("kind", self.resource.kind)
                obj = self._transform(item)
                fresh[object_key(obj)] = obj
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                self._version = body["metadata"]["resourceVersion"]
                break
            params["continue"] = token
        old, self._store = self._store, fresh
        self._reindex()
        for key, obj in old.items():
            if key not in fresh:
                await self._notify("DELETED", obj, obj)
        for key, obj in fresh.items():
            previous = old.get(key)
            if previous is None:
                await self._notify("ADDED", obj, None)
            elif previous["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                await self._notify("MODIFIED", obj, previous)
        self._update_gauge()
        if self.absent:
            log.info("%s is served now", self.resource)
        if _outage["reported"]:
            _outage["reported"] = False
            log.info("the API server answers again")
        self.absent, self.last_error = False, None
        self._synced.set()

    async def _watch(self) -> None:
        params = {
            **self._params(),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self._version,
            "timeoutSeconds": str(self.options.watch_timeout),
        }
        async with self._http.stream("GET", self._path(), params=params) as response:
            if response.status_code == 410:
                raise ResourceExpired()
            response.raise_for_status()
            lines = response.aiter_lines()
            while True:
                try:
                    # Not asyncio.wait_for: on 3.11 it swallows a cancel that lands as a line
                    # arrives, and a busy watch then never lets the operator shut down.
                    async with asyncio.timeout(self.options.inactivity_timeout):
                        line = await anext(lines)
                except StopAsyncIteration:
                    self._restarted("closed")
                    return
                except TimeoutError:
                    self._restarted("inactive")
                    log.info("watch of %s silent for %.0fs: restarting it", self.resource,
                             self.options.inactivity_timeout)  # fmt: skip
                    with contextlib.suppress(Exception):
                        await lines.aclose()  # type: ignore[attr-defined]
                    return
                if line:
                    await self._handle_line(line)

    async def _handle_line(self, line: str) -> None:
        event = json.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise ResourceExpired()
            raise RuntimeError(f"watch error: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self._version = version or self._version
            return
        obj.setdefault("apiVersion", self.resource.api_version)
        obj.setdefault("kind", self.resource.kind)
        obj = self._transform(obj)
        key = object_key(obj)
        previous = self._store.get(key)
        if previous is not None:
            self._unindex(key, previous)
        if kind == "DELETED":
            self._store.pop(key, None)
        else:
            self._store[key] = obj
            self._index(key, obj)
        if version:
            self._version = version
        self._update_gauge()
        await self._notify(kind, obj, previous)

    def _transform(self, obj: Obj) -> Obj:
        return self.options.transform(obj) if self.options.transform else obj

    def _update_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.cached_objects.labels(str(self.resource)).set(self._count())

    async def _notify(self, kind: str, obj: Obj, previous: Obj | None) -> None:
        for handler in self._handlers:
            try:
                result = handler(kind, obj, previous)
                if result is not None:
                    await result
            except Exception:
                log.exception("handler of %s failed on %s", self.resource, object_key(obj))


class NamespacesInformer(Informer):
    """One resource watched in several namespaces: one list/watch per namespace (an operator
    granted Roles in a list of namespaces may not list across all of them), read as one cache.

    Keys are ``namespace/name``, so the namespaces never collide; ``get`` asks the namespace's
    own informer. Handlers and indexes are shared by every part; synced once every part is.
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        resource: ResourceRef,
        namespaces: Iterable[str],
        options: InformerOptions | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        # No Informer state of its own: every reading method is answered by the parts.
        self.resource = resource
        self.options = options or InformerOptions()
        self.namespaces = tuple(dict.fromkeys(namespaces))
        if len(self.namespaces) < 2 or not all(self.namespaces):
            raise ValueError(f"NamespacesInformer needs two or more namespaces, got {self.namespaces}")
        self.parts: dict[str, Informer] = {
            ns: Informer(http, resource, replace(self.options, namespace=ns), metrics)
            for ns in self.namespaces
        }
        for part in self.parts.values():
            part._count = self.__len__

    # ---- reading -------------------------------------------------------------------

    def get(self, key: str) -> Obj | None:
        namespace, slash, _ = key.partition("/")
        part = self.parts.get(namespace) if slash else None
        return part.get(key) if part is not None else None

    def list(self) -> Iterable[Obj]:
        return [obj for part in self.parts.values() for obj in part.list()]

    def keys(self) -> Iterable[str]:
        return list(itertools.chain.from_iterable(part.keys() for part in self.parts.values()))

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts.values())

    # ---- indexes ---------------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        for part in self.parts.values():
            part.add_index(name, fn)

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        return [obj for part in self.parts.values() for obj in part.by_index(name, value)]

    def index_values(self, name: str) -> builtins.list[str]:
        return list(dict.fromkeys(v for part in self.parts.values() for v in part.index_values(name)))

    @property
    def has_synced(self) -> bool:
        return all(part.has_synced for part in self.parts.values())

    async def wait_synced(self) -> None:
        await asyncio.gather(*(part.wait_synced() for part in self.parts.values()))

    def add_handler(self, handler: Handler) -> None:
        for part in self.parts.values():
            part.add_handler(handler)

    @property
    def absent(self) -> bool:
        """Not served (its CRD absent): the API server says so for every namespace alike."""
        return any(part.absent for part in self.parts.values())

    @absent.setter
    def absent(self, value: bool) -> None:
        for part in self.parts.values():
            part.absent = value

    @property
    def last_error(self) -> str | None:
        errors = [f"{ns}: {part.last_error}" for ns, part in self.parts.items() if part.last_error]
        return "; ".join(errors) or None

    @last_error.setter
    def last_error(self, value: str | None) -> None:
        for part in self.parts.values():
            part.last_error = value

    # ---- running -------------------------------------------------------------------

    async def run(self) -> None:
        """Every namespace's list/watch at once; cancelling this cancels them all (a TaskGroup:
        none is left running behind the facade, whatever ends it)."""
        async with asyncio.TaskGroup() as group:
            for part in self.parts.values():
                group.create_task(part.run())


# Whether this process has said the API server is unreachable (once per outage, for all informers).
_outage = {"reported": False}


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
