"""List-then-watch loops for the dev cluster's helpers (runner and provisioner).

Small on purpose: the helpers hold no cache beyond what they act on, so a relist
after any watch failure, with synthetic DELETED events for objects that vanished
meanwhile, is all the consistency they need.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.core.resource import NamespacedResource

Handler = Callable[[str, dict[str, Any]], Awaitable[None]]

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
WATCH_TIMEOUT_SECONDS = 60


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or ''}/{meta['name']}"


async def _dispatch(handler: Handler, event: str, obj: dict[str, Any]) -> None:
    try:
        await handler(event, obj)
    except Exception:
        # One bad object must not stop the loop that serves all the others.
        log.exception("handling %s %s failed", event, _key(obj))


async def watch_forever(client: AsyncClient, resource: Any, handler: Handler) -> None:
    """Feed ``handler`` every ADDED/MODIFIED/DELETED of ``resource`` in all namespaces."""
    extra: dict[str, Any] = {"namespace": "*"} if issubclass(resource, NamespacedResource) else {}
    known: dict[str, dict[str, Any]] = {}
    while True:
        try:
            listing = client.list(resource, **extra)
            seen: dict[str, dict[str, Any]] = {}
            async for item in listing:
                obj = item.to_dict()
                seen[_key(obj)] = obj
            version = listing.resourceVersion
            for key, obj in known.items():
                if key not in seen:
                    await _dispatch(handler, "DELETED", obj)
            known = seen
            for obj in seen.values():
                await _dispatch(handler, "ADDED", obj)
            watch = client.watch(
                resource, resource_version=version, server_timeout=WATCH_TIMEOUT_SECONDS, **extra
            )
            async for event, item in watch:
                obj = item.to_dict()
                if event == "DELETED":
                    known.pop(_key(obj), None)
                else:
                    known[_key(obj)] = obj
                await _dispatch(handler, event, obj)
        except asyncio.CancelledError:
            raise
        except ApiError as err:
            if err.status.code != 410:
                log.warning("watch of %s failed: %s", resource.__name__, err)
        except Exception as err:  # connection loss, API server restart
            log.warning("watch of %s interrupted: %s", resource.__name__, err)
        await asyncio.sleep(RETRY_SECONDS)
