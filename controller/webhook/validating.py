"""The validating admission webhook for FineTuneJobs: refuse a spec the operator could not
estimate, with the same one-line message the operator would record.

Three lines of substance: call the one validator, raise what it found. Two rules keep it
from getting in anyone's way:

* An UPDATE that leaves the spec as it was is allowed even if that spec is invalid (objects
  created while the webhook was down, or before a validator change). Otherwise metadata
  writes, such as kopf's own annotations or a user's labels, would fail on such an object.
* An UPDATE that changes only `spec.suspend` is allowed too: a job stored before a rule was
  added (and admitted, so its spec is locked) can still be suspended, then fixed.
* ConfigMaps are not read here: a model in a ConfigMap is checked by the operator, which
  reports problems in the `Estimated` condition. The webhook stays fast and needs no RBAC on
  ConfigMaps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from controller.estimator import SpecErrors
from controller.jobs.spec import translate

#: HTTP status of the refusal: 422 Unprocessable Entity, as the API server's own validation.
INVALID = 422


def validate_finetunejob(
    spec: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    warnings: list[str] | None = None,
    **_: Any,
) -> None:
    """kopf validating handler: raises kopf.AdmissionError naming every invalid field, and
    adds what is estimated but unusual (a sequence beyond the model's context) to the
    admission warnings, which kubectl prints."""
    plain = dict(spec)  # kopf passes a read-only view; compare and validate the plain dict
    if (
        operation == "UPDATE"
        and old is not None
        and but_suspend(old.get("spec")) == (but_suspend(plain))
    ):
        return
    plan, errors = translate(plain, generic="defer")
    if errors:
        raise kopf.AdmissionError(str(SpecErrors(errors)), code=INVALID)
    if plan is not None and warnings is not None:
        warnings.extend(f"vramgate: {warning}" for warning in plan.warnings)


def but_suspend(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The spec without `suspend`: two specs equal here differ at most in being suspended."""
    return {key: value for key, value in (spec or {}).items() if key != "suspend"}
