"""The base of the families that act on the MaintenancePolicy named ``default`` but record no
status of their own: Envoy restarts and the pod image overrides' webhook configuration.

They record no status because the policy's status has one writer, the node-maintenance
controller (``runtime.record`` replaces the whole status: a second writer would erase the
first's), and because the policy may be absent, in which case its defaults apply: the pass
runs on a policy named default with an empty spec, as if one existed.

Everything else is ``runtime.reconciler``'s: validate, observe, plan, act one step, a typed
failure the runner backs off (an invalid spec a ``TerminalError``). What a user sees instead
of a status is Events on the policy (when there is one): the pass's notes, and each failure
with its reason and message, the field named.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

from kustos.api.maintenance import POLICY_NAME, MaintenancePolicy
from kustos.runtime import objects
from kustos.runtime.controller import Result
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import WARNING
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note

Obj = dict[str, Any]
ObservedT = TypeVar("ObservedT")
StepT = TypeVar("StepT")


def default_policy() -> Obj:
    """The policy that applies when none exists: its defaults."""
    crd = MaintenancePolicy.crd
    return {"apiVersion": crd.api_version, "kind": crd.kind, "metadata": {"name": POLICY_NAME}, "spec": {}}


class PolicyFollower(FamilyReconciler[MaintenancePolicy, ObservedT, StepT], Generic[ObservedT, StepT]):
    """A statusless family on the policy named default (see the module's docstring)."""

    model: ClassVar[type[MaintenancePolicy]] = MaintenancePolicy
    plans_deletion = True  # a policy being deleted is observed like any other (it has no finalizer)

    def fetch(self, key: str) -> Obj | None:
        if key != POLICY_NAME:
            return None  # only the policy named default is acted on
        return self.cache.get(key) or default_policy()

    async def reconcile(self, key: str) -> Result | None:
        try:
            return await super().reconcile(key)
        except ReconcileError as failure:
            await self.tell(key, [Note(failure.reason, failure.message[:1000], WARNING)])
            raise

    def status(self, observed: ObservedT, step: StepT, now: datetime, failure: ReconcileError | None) -> Obj:
        """None of its own: the pass's failure is an Event (``reconcile``)."""
        return {}

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """No status to write: only the pass's Events, on the policy."""
        await self.tell(objects.name(raw), notes)

    async def tell(self, key: str, notes: list[Note]) -> None:
        """Events on the policy as it exists (none when it is absent: nothing to attach them to)."""
        policy = self.cache.get(key)
        if policy is None:
            return
        for note in notes:
            await self.manager.events.record(policy, note.type, note.reason, note.message)


__all__ = ["PolicyFollower", "default_policy"]
