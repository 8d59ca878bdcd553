"""Writes that controllers make, on plain dicts for any resource type.

Server-side apply with field manager ``kustos`` is how controllers create and
update what they own: the API server merges, and the managed fields say who owns
what. Status goes through the status subresource; finalizers through JSON patches
guarded by the object's resourceVersion, so a concurrent change is never lost.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

from kustos.runtime import crashpoints
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import ResourceRef
from kustos.runtime.kube import FIELD_MANAGER, api_path
from kustos.runtime.logs import current_controller

Obj = dict[str, Any]


class ApiStatusError(ReconcileError):
    """The API server refused: its status code, reason and message.

    A ``ReconcileError``: a pass it fails is retried with backoff and logged in one line.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        causes: tuple[str, ...] = (),
        cause_types: tuple[str, ...] = (),
    ) -> None:
        # A Status without a reason (a 500 from server-side apply has none) still needs one: the
        # failure condition refuses an empty reason, and then nothing at all would be recorded.
        reason = reason or f"Http{code}"
        super().__init__(f"{code} {reason}: {message}", reason)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes
        """The messages of the Status's details.causes (a PDB's refusal names the budget there)."""
        self.cause_types = cause_types
        """The types of those causes (``NamespaceTerminating``: see ``namespace_terminating``)."""

    @property
    def not_found(self) -> bool:
        return self.code == 404

    @property
    def conflict(self) -> bool:
        return self.code == 409

    @property
    def too_many_requests(self) -> bool:
        """429: for an eviction, a PodDisruptionBudget allows no disruption now."""
        return self.code == 429


def namespace_terminating(err: BaseException) -> bool:
    """Whether ``err``, or an error it was raised from, is the API server refusing new content in a
    namespace being deleted: nothing can be made there again, and the pass's own objects are going."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ApiStatusError) and "NamespaceTerminating" in seen.cause_types:
            return True
        seen = seen.__cause__
    return False


class ApiUnreachable(ReconcileError):
    """The request never got an answer: a refused or dropped connection, a timeout.

    A ``ReconcileError`` like a refusal, so the pass that met it records it in the object's
    conditions and backs off, instead of escaping as an untyped exception.
    """

    def __init__(self, method: str, path: str, err: Exception) -> None:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        what = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
        super().__init__(f"API server unreachable ({method} {path}): {what}", "ApiUnreachable")


def raise_for(response: httpx2.Response) -> None:
    """An answer of 400 or more as ``ApiStatusError``, with the server's reason, message and causes."""
    if response.status_code < 400:
        return
    causes: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    try:
        body = response.json()
        reason, message = body.get("reason", ""), body.get("message", response.text)
        listed = (body.get("details") or {}).get("causes") or []
        causes = tuple(str(c.get("message") or c.get("reason")) for c in listed)
        types = tuple(str(c.get("reason") or "") for c in listed)  # a StatusCause's type is "reason"
    except (ValueError, AttributeError):
        reason, message = "", response.text
    raise ApiStatusError(response.status_code, reason, message, causes, types)


class Api:
    """Typed-enough access for controllers: one instance per operator."""

    def __init__(self, raw: httpx2.AsyncClient, field_manager: str = FIELD_MANAGER) -> None:
        self._raw = raw
        self.field_manager = field_manager
        # (controller, resource, key) -> the resourceVersion of that controller's last status
        # write: its watch event is then known as the controller's own echo (``own_status_echo``).
        self._status_writes: dict[tuple[str, str, str], str] = {}

    def own_status_echo(self, controller: str, ref: ResourceRef, obj: Obj) -> bool:
        """Whether ``obj`` (a watch event's object) is exactly what ``controller`` last wrote to
        its status: the same resourceVersion, so nobody else has written it since."""
        meta = obj.get("metadata") or {}
        key = (controller, ref.plural, f"{meta.get('namespace')}/{meta.get('name')}")
        written = self._status_writes.get(key)
        if written is None or written != meta.get("resourceVersion"):
            return False
        del self._status_writes[key]
        return True

    def forget_status_writes(self, ref: ResourceRef, obj: Obj) -> None:
        """The object is gone: no echo of a write to it is coming."""
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        for key in [k for k in self._status_writes if k[1:] == (ref.plural, name)]:
            del self._status_writes[key]

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        """One request; a transport failure (connect, read, timeout) raises ``ApiUnreachable``.

        Every request goes through here, so it is where an accepted write is counted (a crash
        point of the proof suite's crash tests)."""
        try:
            response = await self._raw.request(method, path, **kwargs)
        except httpx2.TransportError as err:
            raise ApiUnreachable(method, path, err) from err
        crashpoints.api_write(method, path, response.status_code)
        return response

    @staticmethod
    def path(ref: ResourceRef, namespace: str | None, name: str = "", sub: str = "") -> str:
        path = api_path(ref.group, ref.version, ref.plural, namespace if ref.namespaced else None, name)
        return f"{path}/{sub}" if sub else path

    async def get(self, ref: ResourceRef, namespace: str | None, name: str) -> Obj | None:
        response = await self._send("GET", self.path(ref, namespace, name))
        if response.status_code == 404:
            return None
        raise_for(response)
        result: Obj = response.json()
        return result

    async def list_objects(
        self, ref: ResourceRef, namespace: str | None = None,
        label_selector: str | None = None, field_selector: str | None = None,
    ) -> list[Obj]:  # fmt: skip
        """Every object that matches (all pages), straight from the API server, not a cache."""
        params: dict[str, str] = {"limit": "500"}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        items: list[Obj] = []
        while True:
            response = await self._send("GET", self.path(ref, namespace), params=params)
            raise_for(response)
            body = response.json()
            for item in body.get("items") or []:
                item.setdefault("apiVersion", ref.api_version)
                item.setdefault("kind", ref.kind)
                items.append(item)
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return items
            params["continue"] = token

    async def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        """Evict a pod through the Eviction API (policy/v1), which honours PodDisruptionBudgets.

        Raises ``ApiStatusError``: 429 when a budget allows no disruption now, 404 if it is gone.
        """
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        path = api_path("", "v1", "pods", namespace, name) + "/eviction"
        response = await self._send(
            "POST", path, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        raise_for(response)

    async def logs(
        self, namespace: str, pod: str, container: str, tail_lines: int = 50, previous: bool = False
    ) -> str:
        """The tail of a container's log (agent pods report their result there); ``previous``:
        of its last terminated run, which a crash loop's is whether it waits or runs again."""
        path = api_path("", "v1", "pods", namespace, pod) + "/log"
        params = {"container": container, "tailLines": str(tail_lines)}
        if previous:
            params["previous"] = "true"
        response = await self._send("GET", path, params=params)
        raise_for(response)
        return response.text

    async def create(self, ref: ResourceRef, obj: Obj) -> Obj:
        namespace = obj["metadata"].get("namespace")
        response = await self._send("POST", self.path(ref, namespace), json=obj,
                                         params={"fieldManager": self.field_manager})  # fmt: skip
        raise_for(response)
        result: Obj = response.json()
        return result

    async def apply(self, ref: ResourceRef, obj: Obj, force: bool = True, subresource: str = "") -> Obj:
        """Server-side apply of ``obj`` (which names its own namespace and name)."""
        meta = obj["metadata"]
        body = {"apiVersion": ref.api_version, "kind": ref.kind, **obj}
        params = {"fieldManager": self.field_manager}
        if force:
            params["force"] = "true"
        response = await self._send(
            "PATCH",
            self.path(ref, meta.get("namespace"), meta["name"], subresource),
            content=json.dumps(body),
            params=params,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        raise_for(response)
        result: Obj = response.json()
        return result

    async def patch(
        self, ref: ResourceRef, namespace: str | None, name: str, patch: Any,
        kind: str = "merge", subresource: str = "",
    ) -> Obj:  # fmt: skip
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[kind]
        response = await self._send(
            "PATCH",
            self.path(ref, namespace, name, subresource),
            content=json.dumps(patch),
            params={"fieldManager": self.field_manager},
            headers={"Content-Type": content_type},
        )
        raise_for(response)
        result: Obj = response.json()
        return result

    async def replace_status(self, ref: ResourceRef, obj: Obj, status: Obj) -> Obj:
        """Replace ``obj``'s whole status through the subresource, stamping observedGeneration.

        A PUT, so a field left out (or None) is cleared, unlike a merge patch. It carries
        ``obj``'s resourceVersion: if anyone wrote the object since it was read, the API
        server answers 409 (an ``ApiStatusError``, a ``ReconcileError``) and the pass is
        retried on fresh state.
        """
        meta = obj["metadata"]
        body = {
            "apiVersion": obj.get("apiVersion") or ref.api_version,
            "kind": obj.get("kind") or ref.kind,
            "metadata": {k: v for k, v in meta.items() if k != "managedFields"},
            "spec": obj.get("spec"),
            "status": without_nulls({**status, "observedGeneration": meta.get("generation")}),
        }
        if body["spec"] is None:
            del body["spec"]
        response = await self._send(
            "PUT",
            self.path(ref, meta.get("namespace"), meta["name"], "status"),
            content=json.dumps(body),
            params={"fieldManager": self.field_manager},
            headers={"Content-Type": "application/json"},
        )
        raise_for(response)
        result: Obj = response.json()
        writer = current_controller()
        if writer is not None:
            key = (writer, ref.plural, f"{meta.get('namespace')}/{meta['name']}")
            self._status_writes[key] = str((result.get("metadata") or {}).get("resourceVersion"))
        return result

    async def delete(
        self, ref: ResourceRef, namespace: str | None, name: str,
        uid: str | None = None, propagation: str = "Background", grace_seconds: int | None = None,
    ) -> bool:  # fmt: skip
        """Delete; ``uid`` makes sure it is the incarnation we looked at. False if already gone."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        response = await self._send(
            "DELETE", self.path(ref, namespace, name), content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        if response.status_code == 404:
            return False
        raise_for(response)
        return True

    async def add_finalizer(self, ref: ResourceRef, obj: Obj, finalizer: str) -> Obj:
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if finalizer in finalizers:
            return obj
        return await self._set_finalizers(ref, obj, [*finalizers, finalizer])

    async def remove_finalizer(self, ref: ResourceRef, obj: Obj, finalizer: str) -> Obj:
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if finalizer not in finalizers:
            return obj
        return await self._set_finalizers(ref, obj, [f for f in finalizers if f != finalizer])

    async def _set_finalizers(self, ref: ResourceRef, obj: Obj, finalizers: list[str]) -> Obj:
        meta = obj["metadata"]
        patch = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]},
            {"op": "replace" if "finalizers" in meta else "add", "path": "/metadata/finalizers",
             "value": finalizers},
        ]  # fmt: skip
        return await self.patch(ref, meta.get("namespace"), meta["name"], patch, kind="json")


def without_nulls(value: Any) -> Any:
    """Drop None values, recursively: in a replaced status an absent field and a null are alike,
    and the API server's schema need not allow nulls."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
