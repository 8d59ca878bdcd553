"""Typed reconcile failures: what the runner retries, how it logs them, what status shows.

- ``ReconcileError``: an expected failure (an API refusal, an unreachable etcd). The
  runner logs it as one line, counts it in ``controller_runtime_reconcile_errors_total``
  and retries the key with its exponential backoff; its message belongs in the
  object's Progressing or Degraded condition (``record`` puts it there).
- ``TerminalError``: retrying cannot help until the object changes (an invalid spec).
  Recorded and counted, not retried; a change to the object wakes it again.
- ``ReconcileTimeout``: the pass took longer than the controller's timeout.
- ``RetryAfter``: the answer said how long to wait (a cloud API's Retry-After, a PDB that
  blocks a drain for now): the key is retried after that many seconds instead of its
  growing backoff (counted as a failure all the same).

Any other exception is a bug: it is retried the same way but logged with its traceback.
"""

from __future__ import annotations


class ReconcileError(Exception):
    """A failed pass: ``message`` for people, ``reason`` (CamelCase) for conditions and Events."""

    def __init__(self, message: str, reason: str = "ReconcileFailed") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class TerminalError(ReconcileError):
    """Retrying will not help until the object changes."""


class RetryAfter(ReconcileError):
    """A failure whose answer said when to ask again (``retry_after`` seconds; None: not said)."""

    def __init__(self, message: str, retry_after: float | None = None, reason: str = "RetryAfter") -> None:
        super().__init__(message, reason)
        self.retry_after = retry_after


class ReconcileTimeout(ReconcileError):
    """The reconcile ran past its controller's timeout and was cancelled."""

    def __init__(self, message: str, reason: str = "ReconcileTimeout") -> None:
        super().__init__(message, reason)


def as_reconcile_error(err: Exception) -> ReconcileError:
    """``err`` as a ReconcileError, so that an unexpected failure (a network error the API
    client raised, a bug) reaches the object's conditions like an expected one."""
    if isinstance(err, ReconcileError):
        return err
    return ReconcileError(f"{type(err).__name__}: {err}", reason=type(err).__name__)


__all__ = ["ReconcileError", "ReconcileTimeout", "RetryAfter", "TerminalError", "as_reconcile_error"]
