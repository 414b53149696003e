"""The TrainJob webhook (operator setting `trainJobSizing`): Kubeflow Trainer's TrainJobs
sized at create, the one time their trainer may change (`controller.admission.trainjob`).

Mutating, called for a TrainJob's CREATE when it carries the annotation
`vramgate.dev/finetune` or `vramgate.dev/admission-policy`, and for the UPDATE of one it
resized, whose manifest applied again asks for the count asked at create (`restore` keeps the
stored one; the configurations' matchConditions). Its view is the caches' cluster at most
`VIEW_MAX_AGE_S` old: a TrainJob is sized on the free memory now, which the FineTuneJob
webhooks' view, rebuilt only when a node's GPUs or readiness change, does not follow. The
runtime the TrainJob names comes from the caches too (`runtime`: None where it is not in
them, and the TrainJob is then sized only as far as it says its training itself). It fails
open like the others (`ignore_failures`; the review server answers 500 on an error, and the
configuration's failurePolicy is Ignore).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from controller.admission.trainer_runtime import RuntimeRef, runtime_ref
from controller.admission.trainjob import Sizing, restore, size
from controller.packing.view import ClusterView
from controller.webhook.admission import ALLOWED, DENIED, ERROR
from controller.webhook.validating import INVALID

#: The `webhook` label of its requests' durations (`vramgate_webhook_request_duration_seconds`).
TRAINJOB = "trainjob"
#: How old a view a TrainJob is sized on may be, in seconds: the caches' GPU readings move
#: every heartbeat, and a burst of creates (a sweep) shares one view.
VIEW_MAX_AGE_S = 1.0


def _ignore(webhook: str, result: str, seconds: float) -> None:
    pass


def _no_runtime(ref: RuntimeRef) -> Mapping[str, Any] | None:
    return None


class TrainJobWebhook:
    def __init__(
        self,
        view: Callable[[], Awaitable[ClusterView | None]],
        observe: Callable[[str, str, float], None] = _ignore,
        runtime: Callable[[RuntimeRef], Mapping[str, Any] | None] = _no_runtime,
    ) -> None:
        self.view = view
        self.observe = observe
        self.runtime = runtime

    async def sizing(self, body: Mapping[str, Any], warnings: list[str] | None = None) -> Sizing:
        """The TrainJob's sizing; kopf.AdmissionError (422) when it is refused."""
        started, result = time.perf_counter(), ERROR
        try:
            ref = runtime_ref(body)
            found = size(body, await self.view(),
                         runtime=None if ref is None else self.runtime(ref))  # fmt: skip
            if warnings is not None:
                warnings.extend(found.warnings)
            if found.refusal is not None:
                result = DENIED
                raise kopf.AdmissionError(found.refusal, code=INVALID)
            result = ALLOWED
            return found
        finally:
            self.observe(TRAINJOB, result, time.perf_counter() - started)

    async def mutate(
        self,
        body: Mapping[str, Any],
        patch: kopf.Patch,
        warnings: list[str] | None = None,
        operation: str | None = None,
        old: Mapping[str, Any] | None = None,
        **_: Any,
    ) -> None:
        """kopf's mutating handler: `sizing`'s operations written into kopf's patch (the
        review server answers with them as they are); on an UPDATE, `restore`'s."""
        if operation == "UPDATE":
            found = restore(old or {}, body)
            if warnings is not None:
                warnings.extend(found.warnings)
            ops = found.patch
        elif operation in (None, "CREATE"):
            ops = (await self.sizing(body, warnings)).patch
        else:
            return
        for op in ops:
            *parents, leaf = [_unescape(p) for p in op["path"].strip("/").split("/")]
            into: Any = patch
            for key in parents:
                into = into.setdefault(key, {})
            into[leaf] = op["value"]


def _unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")
