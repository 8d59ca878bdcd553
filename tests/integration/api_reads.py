"""``kubectl get ... -o json`` answered by one HTTP client per cluster instead of a kubectl process.

The tests poll the API server with thousands of ``kubectl get`` calls a run. Each costs about
0.07 CPU-s, most of it the Go binary's start: about 9 % of the 2 cores with two sessions
(docs/benchmarks.md, issue 26 item 5). ``ReadingCluster.kubectl`` serves the plain JSON reads
from a pooled client with the kubeconfig's own credentials, and prints what kubectl would;
anything else (another output format, a flag it does not know, an unreachable server) goes to
kubectl as before.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import yaml

from kustos.devcluster.cluster import DevCluster, DevClusterError

Obj = dict[str, Any]

# A name discovery did not know is looked up again at most this often (a CRD installed since).
REDISCOVER_SECONDS = 2.0
# Resources still read by kubectl. Events: the operator records an Event just after the status
# write it follows, and tests that read Events right after seeing that status relied on a kubectl
# start's ~0.06 s to see it (one failed in a full run when served in-process). Those tests should
# wait for the Event; until then their reads keep kubectl's timing.
KUBECTL_ONLY = frozenset({"events", "event", "ev", "events.events.k8s.io"})
# Flags of ``kubectl get`` this serves, with the query part each sets; a flag not named here
# (or a resource with a comma or a slash) sends the call to kubectl.
VALUE_FLAGS = {
    "-n": "namespace", "--namespace": "namespace",
    "-o": "output", "--output": "output",
    "-l": "labelSelector", "--selector": "labelSelector",
    "--field-selector": "fieldSelector",
}  # fmt: skip
SWITCHES = {"-A": "all", "--all-namespaces": "all", "--ignore-not-found": "ignore"}


@dataclass(frozen=True)
class Read:
    """One ``kubectl get`` call as a request: what, where, and which selectors."""

    resource: str
    name: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False
    ignore_not_found: bool = False
    label_selector: str | None = None
    field_selector: str | None = None


@dataclass(frozen=True)
class Resource:
    """A resource as discovery names it: where its objects are, and their kind."""

    base: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return self.base.removeprefix("/apis/").removeprefix("/api/")


def parse(args: Sequence[str]) -> Read | None:
    """The read these kubectl arguments ask for, or None when they are not a plain JSON get."""
    values: dict[str, str] = {}
    switches: set[str] = set()
    positional: list[str] = []
    tokens = list(args)
    while tokens:
        token = tokens.pop(0)
        flag, equals, inline = token.partition("=")
        if flag in VALUE_FLAGS:
            if not equals and not tokens:
                return None
            values[VALUE_FLAGS[flag]] = inline if equals else tokens.pop(0)
        elif token in SWITCHES:
            switches.add(SWITCHES[token])
        elif token.startswith("-o") and len(token) > 2 and not equals:
            values["output"] = token[2:]
        elif token.startswith("-"):
            return None
        else:
            positional.append(token)
    if values.get("output") != "json" or not 2 <= len(positional) <= 3 or positional[0] != "get":
        return None
    resource = positional[1]
    if "," in resource or "/" in resource or resource.lower() in KUBECTL_ONLY:
        return None
    return Read(
        resource=resource.lower(),
        name=positional[2] if len(positional) == 3 else None,
        namespace=values.get("namespace"),
        all_namespaces="all" in switches,
        ignore_not_found="ignore" in switches,
        label_selector=values.get("labelSelector"),
        field_selector=values.get("fieldSelector"),
    )


def resource_names(entry: Obj, group: str) -> list[str]:
    """Every name kubectl accepts for a discovery entry: plural, singular, short names, kind,
    each also with its group."""
    names = [entry["name"], entry.get("singularName") or "", entry["kind"], *entry.get("shortNames", [])]
    names = [n.lower() for n in names if n]
    return names + [f"{n}.{group}" for n in names] if group else names


class ApiReads:
    """The pooled client and the discovery map of one cluster's API server."""

    def __init__(self, server: str, client: httpx.Client, default_namespace: str) -> None:
        self.server = server
        self.client = client
        self.default_namespace = default_namespace
        self.resources: dict[str, Resource] = {}
        self.discovered_at = float("-inf")
        self.lock = threading.Lock()

    def discover(self) -> None:
        """Names to resources, in the API server's group order (the first to claim a name keeps
        it, as kubectl resolves ``events`` to the core group)."""
        found: dict[str, Resource] = {}
        bases = [("", "/api/v1")]
        for group in self._json("/apis")["groups"]:
            bases.append((group["name"], f"/apis/{group['preferredVersion']['groupVersion']}"))
        for group, base in bases:
            try:
                entries = self._json(base)["resources"]
            except httpx.HTTPStatusError:
                continue  # an aggregated API that is not serving: kubectl skips it too
            for entry in entries:
                if "/" in entry["name"]:
                    continue  # a subresource
                resource = Resource(base, entry["name"], entry["namespaced"], entry["kind"])
                for name in resource_names(entry, group):
                    found.setdefault(name, resource)
        self.resources = found
        self.discovered_at = time.monotonic()

    def resolve(self, name: str) -> Resource | None:
        """The resource a name means, discovering again once for one not seen (a CRD installed
        since)."""
        with self.lock:
            if name not in self.resources and time.monotonic() - self.discovered_at > REDISCOVER_SECONDS:
                self.discover()
            return self.resources.get(name)

    def answer(self, read: Read) -> tuple[str, str | None] | None:
        """kubectl's stdout and, when it would fail, its error; None: let kubectl answer."""
        resource = self.resolve(read.resource)
        if resource is None:
            return None
        path = resource.base
        if resource.namespaced and not read.all_namespaces:
            path += f"/namespaces/{read.namespace or self.default_namespace}"
        path += f"/{resource.plural}" + (f"/{read.name}" if read.name else "")
        params = {
            key: value
            for key, value in (("labelSelector", read.label_selector), ("fieldSelector", read.field_selector))
            if value
        }
        response = self.client.get(self.server + path, params=params)
        body = response.json()
        if response.status_code != 200:
            if response.status_code == 404 and read.ignore_not_found and read.name:
                return "", None
            reason = body.get("reason", response.status_code)
            return "", f"Error from server ({reason}): {body.get('message', '')}"
        body = as_kubectl_list(body, resource) if read.name is None else without_managed_fields(body)
        return json.dumps(body, indent=4, ensure_ascii=False) + "\n", None

    def _json(self, path: str) -> Obj:
        response = self.client.get(self.server + path)
        response.raise_for_status()
        return dict(response.json())


def without_managed_fields(obj: Obj) -> Obj:
    """An object as kubectl prints it: without ``metadata.managedFields``
    (``--show-managed-fields`` is off by default)."""
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata} if "metadata" in obj else obj


def as_kubectl_list(listing: Obj, resource: Resource) -> Obj:
    """A list as kubectl prints it: kind List, each item with its apiVersion and kind."""
    typed = {"apiVersion": resource.api_version, "kind": resource.kind}
    items = [without_managed_fields({**typed, **item}) for item in listing.get("items") or []]
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


class ReadingCluster(DevCluster):
    """The dev cluster whose ``kubectl get -o json`` calls are served in-process."""

    _reads: ApiReads | None = None
    _reads_lock = threading.Lock()
    served = 0  # calls answered in-process, and sent to kubectl: printed at the session's end
    forwarded = 0

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> str:
        read = parse(args) if input_text is None else None
        if read is not None:
            try:
                answered = self.reads().answer(read)
            except (httpx.HTTPError, OSError, ValueError, KeyError, yaml.YAMLError):
                answered = None  # kubectl says it as a person would read it
            if answered is not None:
                stdout, error = answered
                self.served += 1
                if error is not None and check:
                    raise DevClusterError(f"kubectl {' '.join(args)} failed: {error}")
                return stdout
        self.forwarded += 1
        return super().kubectl(*args, check=check, input_text=input_text)

    def reads(self) -> ApiReads:
        with self._reads_lock:
            if self._reads is None:
                server, context = self._api_access()
                config = yaml.safe_load(self.kubeconfig.read_text())
                contexts = config.get("contexts") or [{}]
                namespace = (contexts[0].get("context") or {}).get("namespace") or "default"
                self._reads = ApiReads(server, httpx.Client(verify=context, timeout=30), namespace)
            return self._reads

    def stop(self) -> None:
        if self._reads is not None:
            self._reads.client.close()
            self._reads = None
        super().stop()


__all__ = ["ApiReads", "Read", "ReadingCluster", "parse"]
