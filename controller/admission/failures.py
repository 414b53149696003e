"""The one adapter from vramgate's errors to a FineTuneJob's status and kopf's retries.

Handlers do not decide per exception what to record or whether to retry: they hand whatever a
reconcile raised to `failure_of`, which reads the branch of `controller.base.errors` it belongs to.

* permanent (a bad spec): InvalidSpec, never retried; the next spec change reconciles again.
* temporary (a ConfigMap not readable yet): its own reason, retried after `temporary_retry_s`.
* deployment (a profile not installed): ProfileUnavailable, retried after `profile_retry_s`,
  so that a job waits rather than fails while the operator is redeployed with the extra.
* anything else: a vramgate bug, recorded as EstimationFailed and not retried (the same input
  would fail the same way); the handler logs its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.api import conditions as cond
from controller.base.errors import (
    ConfigMapUnavailable,
    PermanentError,
    ProfileUnavailable,
    TemporaryError,
)

#: Seconds between retries of a job whose profile is not installed: only a redeployed operator
#: can estimate it, and a check every 10 minutes per waiting job costs nothing.
PROFILE_RETRY_S = 600

#: The condition reason of each temporary error a reconcile can meet. A new temporary error
#: needs its documented reason in `controller.api.conditions` and a line here; until then it
#: is recorded as the bug it is.
TEMPORARY_REASONS: dict[type[TemporaryError], str] = {
    ConfigMapUnavailable: cond.REASON_CONFIGMAP_UNAVAILABLE,
}


@dataclass(frozen=True)
class Failure:
    """How a failed reconcile is recorded: the reason and message of its conditions, and the
    seconds until kopf retries it (None: never)."""

    reason: str
    message: str
    retry_s: float | None

    @property
    def is_bug(self) -> bool:
        """True when no branch of the hierarchy explains the error: log its traceback."""
        return self.reason == cond.REASON_ESTIMATION_FAILED


def failure_of(
    error: Exception, *, temporary_retry_s: float, profile_retry_s: float = PROFILE_RETRY_S
) -> Failure:
    """What to record, and when to retry, for `error` raised while reconciling a job."""
    if isinstance(error, PermanentError):
        return Failure(cond.REASON_INVALID_SPEC, str(error), None)
    if isinstance(error, TemporaryError):
        for kind, reason in TEMPORARY_REASONS.items():
            if isinstance(error, kind):
                return Failure(reason, str(error), temporary_retry_s)
    if isinstance(error, ProfileUnavailable):
        return Failure(cond.REASON_PROFILE_UNAVAILABLE, str(error), profile_retry_s)
    return Failure(
        cond.REASON_ESTIMATION_FAILED,
        f"the estimator failed: {type(error).__name__}: {error}",
        None,
    )
