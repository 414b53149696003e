"""kopf handlers for FineTuneJobs: estimate every new or changed spec and record it in status.

One level-triggered reconcile serves the three causes kopf distinguishes (created, spec
changed, found at operator start): it computes what the status should say from the whole
spec and writes only what differs, so running it twice, or after a restart, changes nothing.

What a failure records, and whether kopf retries it, is decided in one place,
`controller.operator.errors`: an invalid spec is recorded and never retried, an unreadable
ConfigMap is retried every `configmap_retry_s`, a profile the operator lacks is retried
later, and anything else is a bug, logged with its traceback. (ConfigMaps are not watched
yet: a ConfigMap whose content is fixed after an InvalidSpec needs a spec change, or an
operator restart, to be re-read.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, cast

import kopf

from controller.api import conditions as cond
from controller.api.base import GROUP, VERSION
from controller.api.finetunejob import PLURAL
from controller.estimator import SpecErrors
from controller.jobspec import config_map_ref, estimate_plan, translate
from controller.operator import status as status_rules
from controller.operator.configmaps import (
    ConfigMapReader,
    ConfigMapUnavailable,
    read_model_config,
)
from controller.operator.errors import failure_of
from controller.webhook.validating import validate_finetunejob

#: Seconds between retries while a job's ConfigMap cannot be read: the ConfigMap is usually
#: created by the same `kubectl apply`, and a GET every 30 s per waiting job is cheap.
CONFIGMAP_RETRY_S = 30
ESTIMATE_HANDLER = "estimate"
VALIDATE_HANDLER = "validate-finetunejob"


def register(
    registry: kopf.OperatorRegistry,
    *,
    validating_webhook: bool,
    configmap_retry_s: float = CONFIGMAP_RETRY_S,
    now: Callable[[], datetime] = cond.now_utc,
) -> None:
    """Register the FineTuneJob handlers in `registry` (and the webhook when asked)."""

    async def estimate(**kwargs: Any) -> None:
        await reconcile(now=now, configmap_retry_s=configmap_retry_s, **kwargs)

    resource = (GROUP, VERSION, PLURAL)
    kopf.on.create(*resource, id=ESTIMATE_HANDLER, registry=registry)(estimate)
    kopf.on.resume(*resource, id=ESTIMATE_HANDLER, registry=registry)(estimate)
    kopf.on.update(*resource, id=ESTIMATE_HANDLER, field="spec", registry=registry)(estimate)
    if validating_webhook:
        kopf.on.validate(
            *resource,
            id=VALIDATE_HANDLER,
            operations=["CREATE", "UPDATE"],
            # The webhook is fast feedback; the operator enforces validity in status. An
            # unreachable webhook must not block every FineTuneJob write in the cluster.
            ignore_failures=True,
            registry=registry,
        )(cast(Any, validate_finetunejob))  # kopf passes every kwarg; it reads three


async def reconcile(
    *,
    body: kopf.Body,
    spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    now: Callable[[], datetime],
    configmap_retry_s: float = CONFIGMAP_RETRY_S,
    **_: Any,
) -> None:
    """Estimate the job's current spec and record the result in its status; a failure is
    recorded as `failure_of` classifies it, and raised to kopf when it is to be retried."""
    generation = int(meta.get("generation") or 0)
    current = dict(status)

    def fail(error: Exception) -> None:
        failure = failure_of(error, temporary_retry_s=configmap_retry_s)
        if failure.is_bug:
            logger.error("the estimator failed on a valid spec", exc_info=error)
        if failure.reason == cond.REASON_INVALID_SPEC:
            update = status_rules.invalid(failure.message, generation, current, now())
        else:
            update = status_rules.not_estimated(
                failure.reason, failure.message, generation, current, now()
            )
        _apply(update, body, patch)
        if failure.retry_s is not None:
            raise kopf.TemporaryError(failure.message, delay=failure.retry_s) from None

    config = None
    ref = config_map_ref(spec)
    if ref is not None:
        try:
            core: ConfigMapReader = memo["core"]
            config = await asyncio.to_thread(read_model_config, core, namespace, ref)
        except ConfigMapUnavailable as error:
            fail(error)
            return
    plan, errors = translate(dict(spec), config)
    if plan is None:
        fail(SpecErrors(errors))
        return
    try:
        est = estimate_plan(plan)
    except Exception as error:
        fail(error)
        return
    _apply(status_rules.estimated(plan, est, generation, current, now()), body, patch)


def _apply(update: status_rules.StatusUpdate, body: kopf.Body, patch: kopf.Patch) -> None:
    for key, value in update.patch.items():
        patch.status[key] = value
    if update.event is not None:
        event = update.event
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
