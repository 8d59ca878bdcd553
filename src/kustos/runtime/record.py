"""The one place a reconcile pass writes its status, and the Events that go with it.

Every reconcile follows the same shape::

    observed = await observe(...)
    step = plan(observed)                              # pure
    failure = None
    try:
        await act(step)                                # one safe step
    except ReconcileError as err:
        failure = err
    await record(api, ref, obj, status(observed, step, now, failure), events)
    if failure:
        raise failure

``status`` is pure and computes the WHOLE status (a replace, so a field can be
cleared); ``record`` writes it only when it differs from what the object holds, and
emits an Event for each condition that changed status or reason: Events say what
changed, not that a pass ran. A failure's message reaches a condition through
``note_failure`` so ``kubectl describe`` shows why an object is stuck.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from kustos.runtime.api import Api, ApiStatusError, without_nulls
from kustos.runtime.conditions import Condition, note_failure
from kustos.runtime.events import NORMAL, WARNING, EventRecorder
from kustos.runtime.informer import ResourceRef
from kustos.runtime.steps import Note

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# Conditions that are bad news when True (the rest are bad news when False).
NEGATIVE_POLARITY = frozenset({"Degraded", "Failed", "Stalled", "Blocked"})


def warning(condition: Condition) -> bool:
    """The default polarity: Degraded-like conditions warn when True, Ready-like ones when False."""
    status = condition.get("status")
    if condition.get("type") in NEGATIVE_POLARITY:
        return status == "True"
    return status == "False" and condition.get("type") in ("Ready", "Available", "SpecValid")


def transitions(old: Iterable[Condition] | None, new: Iterable[Condition] | None) -> list[Condition]:
    """Conditions of ``new`` whose status or reason differs from ``old``'s of the same type.

    A condition new to the status counts only when it warns: a fresh object's first
    status must not produce one Event per condition.
    """
    before = {c.get("type"): c for c in old or []}
    changed = []
    for condition in new or []:
        previous = before.get(condition.get("type"))
        if previous is None:
            if warning(condition):
                changed.append(condition)
        elif any(previous.get(field) != condition.get(field) for field in ("status", "reason")):
            changed.append(condition)
    return changed


def status_changed(obj: Obj, status: Obj) -> bool:
    """Whether writing ``status`` (stamped with observedGeneration) would change ``obj``."""
    generation = (obj.get("metadata") or {}).get("generation")
    wanted = without_nulls({**status, "observedGeneration": generation})
    return bool(wanted != without_nulls(obj.get("status") or {}))


async def record(
    api: Api,
    ref: ResourceRef,
    obj: Obj,
    status: Obj,
    events: EventRecorder | None,
    *,
    notes: Iterable[Note] = (),
    announce: Collection[str] | None = None,
    is_warning: Callable[[Condition], bool] = warning,
) -> Obj:
    """Write ``status`` if it changed, then emit Events for its condition transitions and ``notes``.

    Returns the object as written (``obj`` itself when nothing changed or the object is
    gone). A conflict (409) raises: the pass is retried on fresh state, and nothing is
    announced that was not recorded. ``announce`` limits Events to those condition types.
    """
    notes = list(notes)
    if not status_changed(obj, status):
        updated = obj
    else:
        try:
            updated = await api.replace_status(ref, obj, status)
        except ApiStatusError as err:
            if err.not_found:
                log.debug("status not written, the object is gone: %s", err)
                return obj
            raise
    if events is None:
        return updated
    old = (obj.get("status") or {}).get("conditions")
    for condition in transitions(old, status.get("conditions")):
        if announce is not None and condition.get("type") not in announce:
            continue
        type_ = WARNING if is_warning(condition) else NORMAL
        message = condition.get("message") or f"{condition.get('type')} is {condition.get('status')}"
        await events.record(updated, type_, str(condition.get("reason") or condition.get("type")), message)
    for note in notes:
        await events.record(updated, note.type, note.reason, note.message)
    return updated


__all__ = ["NEGATIVE_POLARITY", "Note", "note_failure", "record", "status_changed", "transitions", "warning"]
