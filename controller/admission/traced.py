"""A traced estimate read back from a job's status instead of tracing the job again.

The operator keeps each trace it ran in the job's status (`status.estimate.digest`, a
digest of what the estimate was computed from: `controller.jobs.spec.estimate_digest`, and
`.traced`, the estimate: `controller.estimator.codec`). Whoever would trace the same job
again (the operator after a restart or a failover, a second replica, `vramgate plan
--cluster` on a dump of the cluster) reads it back here where the digest is the one it
would compute itself, and traces only otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.admission.status import Stored
from controller.estimator import Estimate, Profile, codec


@dataclass(frozen=True)
class NotReadBack:
    """Why a job's status gives no traced estimate to reuse: `why` is "" where it keeps
    none for this digest (none at all, or one of another spec, ConfigMap or estimator), and
    says what is wrong otherwise; `suspect` where the status holds what no operator writes
    (edited by hand, or another codec version), as against a trace of other libraries."""

    why: str = ""
    suspect: bool = False


def read_back(
    job: Mapping[str, Any], digest: str, libraries: str | None = None
) -> tuple[Estimate, Stored] | NotReadBack:
    """The traced estimate the job's status keeps, if it was computed from what `digest`
    says (and, where `libraries` is given, traced with those trace libraries' versions).
    A reader that cannot trace passes no `libraries`: what a tracer with them traced is the
    best estimate it can have.

    A stored estimate is the trace's whatever profile the job names: a calibrated job of a
    family calibrated hands to the trace (`calibrated_hands_to_trace`) keeps the trace's."""
    estimate = (job.get("status") or {}).get("estimate")
    if not isinstance(estimate, Mapping) or estimate.get("digest") != digest:
        return NotReadBack()
    text = estimate.get("traced")
    try:
        est = codec.decode(text)
    except codec.CodecError as error:
        return NotReadBack(f"status.estimate.traced does not read back ({error})", True)
    if est.profile != Profile.TRACE.value:
        return NotReadBack(f"status.estimate.traced is of profile {est.profile}", True)
    made_by = codec.made_by(text)
    if libraries is not None and made_by != libraries:
        return NotReadBack(f"status.estimate.traced was traced with {made_by}, not {libraries}")
    return est, Stored(digest, str(text))
