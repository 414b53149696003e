"""kopf wiring: the caches, the events that wake the scheduler, the webhooks, start and stop.

Handlers write nothing. kopf keeps the indexes (`caches.py`); every event that can change a
decision wakes the one scheduling loop (`scheduler.py`), which writes every status and creates
every workload. So kopf stores no progress or diff-base annotations on FineTuneJobs: a job
is written by the scheduler alone, once per change, and the webhook is called only for the
users' own writes.

Events that wake the loop: a FineTuneJob created, changed or deleted; a GPUNode whose GPUs
or readiness changed (a heartbeat alone does not: a stale heartbeat is noticed by the
periodic resync); a Node cordoned, uncordoned, becoming (un)ready or losing GPUs; a GPU pod
or a workload changing phase; a PriorityClass created, deleted or given another value (the
queue's order, and a job that waits for its class); a LearnedCorrection changed or deleted.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from sys import intern
from typing import Any, cast

import kopf

from controller.admission import kueue, trainjob
from controller.admission.kueue import CONTROLLER
from controller.admission.trainer_runtime import RuntimeRef
from controller.api.base import GROUP, VERSION
from controller.api.finetunejob import PLURAL
from controller.api.gpunode import PLURAL as GPUNODE_PLURAL
from controller.api.learnedcorrection import PLURAL as LEARNED_PLURAL
from controller.operator import caches
from controller.operator.caches import Caches
from controller.operator.scheduler import Scheduler
from controller.webhook.admission import AdmissionWebhook
from controller.webhook.dry_run import WorkloadDryRun
from controller.webhook.registration import (
    MUTATE_HANDLER,
    MUTATE_TRAINJOB_HANDLER,
    VALIDATE_HANDLER,
)
from controller.webhook.trainjob import VIEW_MAX_AGE_S, TrainJobHolds, TrainJobWebhook

__all__ = [
    "MUTATE_HANDLER",
    "MUTATE_TRAINJOB_HANDLER",
    "VALIDATE_HANDLER",
    "register",
    "register_trainjobs",
]


def register(
    registry: kopf.OperatorRegistry,
    scheduler: Scheduler,
    *,
    webhooks: bool,
    background: Callable[[], list[Any]] = list,
    trainjobs: bool = False,
) -> AdmissionWebhook | None:
    """Register the caches, the wake-ups and (when asked) the webhooks in `registry`.
    `background` gives the coroutines to run for the operator's lifetime (the scheduler's
    loop, the leader election). Returns the webhooks, which the review server answers with
    (`controller.webhook.server`); kopf's registration of them names the paths (the
    configurations are the chart's, or `controller.webhook.registration`'s). `trainjobs`:
    the TrainJob webhook will be registered (`register_trainjobs`), and the caches keep
    Trainer's runtimes for it."""
    with_kueue = scheduler.options.kueue
    # Trainer's runtimes, which the TrainJob webhook reads (register_trainjobs).
    caches.register(registry, with_kueue=with_kueue, with_trainer=trainjobs)
    #: Object uid (unique across resources) -> digest of what a decision reads of it: a
    #: 20-byte digest per object, of up to 15,000 objects; and of the inventory's GPUNodes
    #: and Nodes, the digest of what the webhook's view reads (`inventory`).
    digests: dict[str, bytes] = {}
    inventories: dict[str, bytes] = {}

    def wake_on(
        resource: tuple[str, ...],
        relevant: Callable[[Mapping[str, Any]], Any] | None,
        inventory: Callable[[Mapping[str, Any]], Any] | None = None,
        **only: Any,
    ) -> None:
        assert relevant is not None or inventory is None, "an inventory needs a digest"

        # A coroutine: kopf runs a plain function in its thread pool, and the scheduler's
        # wake-up (an asyncio.Event) may only be set on the loop.
        async def on_event(body: kopf.Body, type: str | None, **kwargs: Any) -> None:
            scheduler.attach(Caches.of(kwargs), contextvars.copy_context())
            meta = body.get("metadata") or {}
            key = intern(str(meta.get("uid")))  # the cached object's own copy (caches.py)
            if type == "DELETED":
                digests.pop(key, None)
                if inventories.pop(key, None) is not None:
                    scheduler.inventory_changed()
                scheduler.wake()
                return
            if relevant is None:  # every event is a change
                scheduler.wake()
                return
            digest = _digest(relevant(body))
            if digests.get(key) != digest:
                digests[key] = digest
                scheduler.wake()
            if inventory is not None:
                seen = _digest(inventory(body))
                if inventories.get(key) != seen:
                    inventories[key] = seen
                    scheduler.inventory_changed()

        kopf.on.event(*resource, id=f"wake-{resource[-1]}", registry=registry, **only)(on_event)

    # Every FineTuneJob event wakes it: a digest of its whole body (the resourceVersion
    # included) would differ on each one anyway, and cost a JSON dump per event.
    wake_on((GROUP, VERSION, PLURAL), None)
    wake_on((GROUP, VERSION, GPUNODE_PLURAL), _gpunode_relevant, inventory=_gpunode_capacity)
    wake_on(("v1", "nodes"), caches.slim_node, inventory=caches.slim_node)
    wake_on(("v1", "pods"), _pod_relevant, when=caches.gpu_or_job_pod)
    wake_on(("batch", "v1", "jobs"), lambda body: body.get("status"), labels=caches.WORKLOAD_LABELS)
    wake_on(caches.PRIORITY_CLASS_RESOURCE, caches.slim_priority_class)
    # A pin, a reset or a deletion moves waiting jobs' figures (the leader's own status writes
    # wake it too: a key that learned re-corrects the queue).
    wake_on((GROUP, VERSION, LEARNED_PLURAL), lambda body: [body.get("spec"), body.get("status")])

    if with_kueue:
        # A Workload's quota reserved, its check set Pending, its end: a decision to make.
        wake_on(caches.KUEUE_WORKLOAD_RESOURCE, _kueue_workload_relevant)
        wake_on(caches.ADMISSION_CHECK_RESOURCE, caches.slim_admission_check)
        wake_on(caches.RESOURCE_FLAVOR_RESOURCE, caches.slim_resource_flavor)

        async def activate(body: kopf.Body, type: str | None, **_: Any) -> None:
            if type == "DELETED" or (body.get("spec") or {}).get("controllerName") != CONTROLLER:
                return
            if not kueue.active(body):
                await scheduler.activate(str((body.get("metadata") or {}).get("name")))

        kopf.on.event(
            *caches.ADMISSION_CHECK_RESOURCE, id="activate-admissionchecks", registry=registry
        )(activate)

    tasks: list[asyncio.Task[Any]] = []

    async def start(**_: Any) -> None:
        for coroutine in background():
            tasks.append(asyncio.get_running_loop().create_task(coroutine))

    async def stop(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await scheduler.close()

    kopf.on.startup(registry=registry)(start)
    kopf.on.cleanup(registry=registry)(stop)

    if not webhooks:
        return None
    # The dry run goes through the operator's own client: creating Jobs is in its RBAC.
    dry_run = WorkloadDryRun(
        scheduler.kube.create_dry_run, scheduler.options.admission.packing.gpu_mode
    )
    hook = AdmissionWebhook(
        scheduler.current_view,
        scheduler.metrics.observe_webhook,
        dry_run,
        raw_priority_namespaces=scheduler.options.admission.raw_priority_namespaces,
    )
    resource = (GROUP, VERSION, PLURAL)
    # The webhook is fast feedback; the operator decides and enforces in status. An
    # unreachable webhook must not block every FineTuneJob write in the cluster.
    kopf.on.validate(
        *resource, id=VALIDATE_HANDLER, operations=["CREATE", "UPDATE"],
        ignore_failures=True, registry=registry,
    )(cast(Any, hook.validate))  # fmt: skip
    kopf.on.mutate(
        *resource, id=MUTATE_HANDLER, operations=["CREATE", "UPDATE"],
        ignore_failures=True, registry=registry,
    )(cast(Any, hook.mutate))  # fmt: skip
    return hook


def register_trainjobs(
    registry: kopf.OperatorRegistry, scheduler: Scheduler, hold_s: float = 0
) -> TrainJobWebhook:
    """The TrainJob webhook (`trainJobSizing`): kopf's registration names its path (the
    configurations are the chart's, or `controller.webhook.registration`'s); the review
    server answers with the returned webhook. Nothing watches TrainJobs: each is sized once,
    at its create, and what it was sized onto is held for `hold_s` seconds at most
    (`trainJobHoldSeconds`; 0: nothing held) in a ledger of this process's memory, which
    the scheduler's passes charge too; the runtimes they name are read from the caches
    (`register` indexes them with trainJobSizing)."""

    def runtime(ref: RuntimeRef) -> Mapping[str, Any] | None:
        return None if scheduler.caches is None else scheduler.caches.runtime(ref)

    held = None if hold_s <= 0 else TrainJobHolds(hold_s, scheduler.clock.monotonic)
    scheduler.holds = held
    hook = TrainJobWebhook(
        functools.partial(scheduler.current_view, max_age_s=VIEW_MAX_AGE_S),
        scheduler.metrics.observe_webhook,
        runtime,
        held,
    )
    # Fails open as the FineTuneJob ones: a down operator must not block Trainer's users.
    kopf.on.mutate(
        trainjob.GROUP, trainjob.VERSION, trainjob.PLURAL, id=MUTATE_TRAINJOB_HANDLER,
        operations=["CREATE"], ignore_failures=True, registry=registry,
    )(cast(Any, hook.mutate))  # fmt: skip
    return hook


def _gpunode_relevant(body: Mapping[str, Any]) -> Any:
    """A GPUNode's status without its heartbeat: what a decision could change on."""
    status = dict(body.get("status") or {})
    status.pop("heartbeatTime", None)
    conditions = [
        {k: v for k, v in c.items() if k in ("type", "status", "reason")}
        for c in status.pop("conditions", None) or []
    ]
    return [status, conditions]


#: What changes with use, not with the hardware: the webhook judges a job against the empty
#: cluster (can it ever fit), so its view is not rebuilt for these.
_USAGE_FIELDS = frozenset({"freeBytes", "usedBytes", "reservedBytes", "pods", "freeGiB"})


def _gpunode_capacity(body: Mapping[str, Any]) -> Any:
    """A GPUNode's hardware and readiness, without its usage: what the webhook's view of the
    empty cluster could change on."""
    status, conditions = _gpunode_relevant(body)
    gpus = [
        {k: v for k, v in gpu.items() if k not in _USAGE_FIELDS}
        for gpu in status.get("gpus") or []
        if isinstance(gpu, Mapping)
    ]
    rest = {k: v for k, v in status.items() if k != "gpus" and k not in _USAGE_FIELDS}
    return [rest, gpus, conditions]


def _digest(value: Any) -> bytes:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).digest()


def _kueue_workload_relevant(body: Mapping[str, Any]) -> Any:
    """What a check's decision reads of a Workload: its active flag and its status."""
    status = body.get("status") or {}
    return [(body.get("spec") or {}).get("active"), status.get("conditions"),
            status.get("admissionChecks")]  # fmt: skip


def _pod_relevant(body: Mapping[str, Any]) -> Any:
    """Where a pod runs and in which phase: its GPU slot and its job's state."""
    return [(body.get("spec") or {}).get("nodeName"), (body.get("status") or {}).get("phase")]
