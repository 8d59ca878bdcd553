"""Kubernetes Events for what controllers do, with repeats folded into a count.

A reconcile loop that hits the same problem every pass must not flood etcd with
Events: a repeat of (object, type, reason, message) bumps the first Event's count
and lastTimestamp instead, as kubelet's recorder does.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.informer import ResourceRef
from kustos.runtime.steps import NORMAL as NORMAL
from kustos.runtime.steps import WARNING as WARNING

log = logging.getLogger(__name__)

EVENTS = ResourceRef("", "v1", "events", "Event")


class EventRecorder:
    def __init__(self, api: Api, component: str = "kustos", cache_size: int = 4096) -> None:
        self._api = api
        self._component = component
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, str, int]] = OrderedDict()
        self._cache_size = cache_size

    async def record(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event about ``obj``; never raises (an Event is never worth a failed reconcile)."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        key = (str(meta.get("uid")), type_, reason, message)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            seen = self._seen.get(key)
            if seen is not None:
                name, ns, count = seen
                await self._api.patch(EVENTS, ns, name, {"count": count + 1, "lastTimestamp": now})
                self._remember(key, (name, ns, count + 1))
                return
            name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj.get("apiVersion"),
                    "kind": obj.get("kind"),
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "type": type_,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": self._component},
                "reportingComponent": self._component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            await self._api.create(EVENTS, event)
            self._remember(key, (name, namespace, 1))
        except ApiStatusError as err:
            if err.not_found:
                self._seen.pop(key, None)  # the folded Event expired: the next one starts afresh
            log.warning("event %s/%s not recorded: %s", reason, meta.get("name"), err)
        except Exception as err:
            log.warning("event %s/%s not recorded: %s", reason, meta.get("name"), err)

    def _remember(self, key: tuple[str, str, str, str], value: tuple[str, str, int]) -> None:
        self._seen[key] = value
        self._seen.move_to_end(key)
        while len(self._seen) > self._cache_size:
            self._seen.popitem(last=False)
