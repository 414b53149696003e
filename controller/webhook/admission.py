"""The FineTuneJob webhooks: what can be said at `kubectl apply` time, said then.

Validating (CREATE and UPDATE):

* every invalid field, as the operator would record it (`validating.validate_finetunejob`);
* an admitted job's spec is locked: only `spec.suspend` may change; a finished job's spec
  may not change at all (nothing would run it again: delete it and create it anew);
* a job that can never fit this cluster, even empty, is refused with the numbers of the
  Reject decision (`InsufficientVRAM`, `NoMatchingGPU`, `InsufficientGPUs`), except in an
  UPDATE that only suspends or resumes it (the cluster may have shrunk since its create);
* a raw `spec.priority` in a namespace not allowed to set one (`rawPriorityNamespaces`) is
  allowed with a warning that it is ignored (`controller.admission.priority`): the manifest stays
  valid everywhere, and its author learns at once that the number ranks nothing there.
* a pod template the Job API refuses, found by a server-side dry run of the batch Job the
  operator would create (`dry_run.py`), last, as it is the one check that calls the API
  server; for a create or a spec change only, as the rest.

Mutating (CREATE, and an UPDATE that changes the GPU count): with `admissionPolicy:
Resize`, a requested GPU count that can never fit is rewritten to the count nearest it in
`[minGPUs, maxGPUs]` that fits the empty cluster, with an admission warning kubectl prints,
and the count asked for is kept in the annotation `REQUESTED_GPUS_ANNOTATION`. That is what
lets the same manifest be applied again: `kubectl apply` sends the count the manifest asks
for, and an UPDATE of an admitted or finished job that differs from it only in asking for
the annotated count (and in `suspend`) gets the stored count back, whatever the cluster
looks like now, so the locked spec does not change. A job not yet admitted, and any other
count, is resized afresh; an update that changes the rest of the spec forgets the
annotation.

The cluster checks need the operator's inventory (`view`, the latest pass's view): before it
has one (the operator just started, or no GPU reported yet), and for jobs it cannot estimate
here (a model in a ConfigMap, the Trace profile: seconds of work), they pass and the
operator decides. Both webhooks fail open (`ignore_failures`): an operator that is down must
not block every write, and the operator still decides every job.

Each request's duration is handed to `observe(webhook, result, seconds)` (the operator's
metrics), measured inside the handler: webhook `validating` or `mutating`, result `allowed`,
`denied` (refused with a reason) or `error` (the handler failed; the request fails open).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Set
from dataclasses import dataclass
from typing import Any

import kopf

from controller.admission.cluster import admitted_by_kueue, finished, job_request, reservation
from controller.admission.priority import ignored_priority
from controller.api import conditions as cond
from controller.api.base import REQUESTED_GPUS_ANNOTATION
from controller.api.enums import AdmissionPolicy
from controller.base.units import format_gib
from controller.decision import Outcome, decide
from controller.decision.decide import resize_counts
from controller.estimator import MAX_GPUS, Estimate, Parallelism, Profile
from controller.jobs.spec import JobPlan, config_map_ref, estimate_plan, translate
from controller.packing.constraints import NodeConstraints, from_pod_template
from controller.packing.fit import plural
from controller.packing.inventory import GpuMode
from controller.packing.view import ClusterView, Selection
from controller.webhook.dry_run import WorkloadDryRun
from controller.webhook.validating import INVALID, but_suspend, validate_finetunejob
from controller.workload import workload_problem

_NEVER = {cond.REASON_INSUFFICIENT_VRAM, cond.REASON_NO_MATCHING_GPU, cond.REASON_INSUFFICIENT_GPUS}
_CACHE_SIZE = 1024
VALIDATING, MUTATING = "validating", "mutating"
ALLOWED, DENIED, ERROR = "allowed", "denied", "error"


def _ignore(webhook: str, result: str, seconds: float) -> None:
    pass


@dataclass(frozen=True)
class Mutation:
    """What the mutating webhook changes in a job: its `spec.resources` (None: as it is), and
    the annotation of the GPU count asked for (`requested`: set to it; `forget`: removed)."""

    resources: dict[str, Any] | None = None
    requested: int | None = None
    forget: bool = False

    def __bool__(self) -> bool:
        return self.resources is not None or self.requested is not None or self.forget


class AdmissionWebhook:
    def __init__(
        self,
        view: Callable[[], Awaitable[ClusterView | None]],
        observe: Callable[[str, str, float], None] = _ignore,
        dry_run: WorkloadDryRun | None = None,
        raw_priority_namespaces: Set[str] = frozenset(),
    ) -> None:
        self.view = view
        self.observe = observe
        self.dry_run = dry_run
        self.raw_priority_namespaces = raw_priority_namespaces
        self._estimates: dict[str, tuple[JobPlan, Estimate] | None] = {}
        self._validated: dict[str, tuple[kopf.AdmissionError | None, tuple[str, ...]]] = {}
        self._workload_problems: dict[tuple[str, GpuMode], str | None] = {}

    async def validate(
        self,
        body: Mapping[str, Any],
        spec: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        operation: str | None,
        warnings: list[str] | None = None,
        **_: Any,
    ) -> None:
        started, result = time.perf_counter(), ERROR
        try:
            await self._validate(body, spec, old, operation, warnings)
            result = ALLOWED
        except kopf.AdmissionError:
            result = DENIED
            raise
        finally:
            self.observe(VALIDATING, result, time.perf_counter() - started)

    async def mutate(
        self,
        body: Mapping[str, Any],
        spec: Mapping[str, Any],
        patch: kopf.Patch,
        warnings: list[str] | None = None,
        old: Mapping[str, Any] | None = None,
        operation: str | None = None,
        **_: Any,
    ) -> None:
        """kopf's mutating handler: `mutation`, written into kopf's patch."""
        found = await self.mutation(
            {**body, "spec": spec}, warnings, old if operation == "UPDATE" else None
        )
        if found.resources is not None:
            patch.spec["resources"] = found.resources
        if found.requested is not None:
            patch.metadata.annotations[REQUESTED_GPUS_ANNOTATION] = str(found.requested)
        elif found.forget:
            patch.metadata.annotations[REQUESTED_GPUS_ANNOTATION] = None

    async def mutation(
        self,
        body: Mapping[str, Any],
        warnings: list[str] | None = None,
        old: Mapping[str, Any] | None = None,
    ) -> Mutation:
        """The GPU count rewritten, and the count asked for annotated (the review server
        turns it into a JSON patch). With `old` (an UPDATE), only a GPU count that differs
        from the stored one is looked at."""
        started, result = time.perf_counter(), ERROR
        spec = body.get("spec") or {}
        try:
            if old is not None and _gpus(old.get("spec")) == _gpus(spec):
                result = ALLOWED
                # The count stays; another change (model, method) makes the annotated count
                # one asked for another spec: forgotten, so no later update matches it.
                stale = REQUESTED_GPUS_ANNOTATION in _annotations(body) and _but_count(
                    old.get("spec")
                ) != _but_count(spec)
                return Mutation(forget=stale)
            found = None
            if old is not None and _spec_change_refusal(old) is not None:
                found = _as_at_create(spec, old, warnings)  # locked: what it was given stays
            if found is None:
                found = await self._mutate(spec, warnings)
            if found is None and REQUESTED_GPUS_ANNOTATION in _annotations(body):
                found = Mutation(forget=True)  # the count is as asked: nothing to remember
            result = ALLOWED
            return found or Mutation()
        except kopf.AdmissionError:
            result = DENIED
            raise
        finally:
            self.observe(MUTATING, result, time.perf_counter() - started)

    async def _validate(
        self,
        body: Mapping[str, Any],
        spec: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        operation: str | None,
        warnings: list[str] | None,
    ) -> None:
        plain = dict(spec)
        key = _key(plain)  # once per request: each cache below is keyed by the spec
        self._validate_spec(plain, key, old, operation, warnings)
        self._ignored_priority(body, plain, old, warnings)
        if operation == "UPDATE" and old is not None:
            if finished(old) and dict(old.get("spec") or {}) != plain:
                raise kopf.AdmissionError(_FINISHED, code=INVALID)  # suspend included
            if but_suspend(old.get("spec")) == but_suspend(plain):
                return  # the spec as it was, suspended or resumed: nothing new to judge
            refusal = _spec_change_refusal(old)
            if refusal is not None:
                raise kopf.AdmissionError(refusal, code=INVALID)
        view = await self.view()
        if view is not None and plain.get("template"):
            problem = self._workload_problem(body, plain, key, view.gpu_mode)
            if problem is not None:
                raise kopf.AdmissionError(problem, code=INVALID)
        found = self._estimate(plain, key)
        if found is not None and view is not None and view.select({}).gpus > 0:
            plan, estimate = found
            request = job_request(dict(body), plan, estimate)
            decision = decide(request, view, nodes_waited_for=False)
            if decision.outcome is Outcome.REJECT and decision.reason in _NEVER:
                raise kopf.AdmissionError(
                    f"vramgate: {decision.reason}: {decision.message}", code=INVALID
                )
        if self.dry_run is not None and plain.get("template"):
            job = {"metadata": dict(body.get("metadata") or {}), "spec": plain}
            refused = await self.dry_run.refusal(job, key)
            if refused is not None:
                raise kopf.AdmissionError(refused, code=INVALID)

    async def _mutate(self, spec: Mapping[str, Any], warnings: list[str] | None) -> Mutation | None:
        plain = dict(spec)
        found = self._estimate(plain, _key(plain))
        view = await self.view()
        if found is None or view is None:
            return None
        plan, estimate = found
        if plan.admission_policy is not AdmissionPolicy.RESIZE:
            return None
        template = plain.get("template")
        constraints = from_pod_template(template) if template else None
        where = view.select(plan.gpu_selector, constraints)
        if where.gpus == 0:
            return None
        if view.fits_empty(estimate, plan.parallelism, plan.gpus, where):
            return None
        high = min(plan.max_gpus or MAX_GPUS, where.gpus)
        for n in resize_counts(plan.gpus, plan.min_gpus, high):
            if view.fits_empty(estimate, plan.parallelism, n, where):
                resources = dict(plain.get("resources") or {})
                resources["gpus"] = n
                if warnings is not None:
                    warnings.append(_resized(plan, estimate, view, where, n, constraints))
                return Mutation(resources, requested=plan.gpus)
        return None

    def _validate_spec(
        self,
        spec: dict[str, Any],
        key: str,
        old: Mapping[str, Any] | None,
        operation: str | None,
        warnings: list[str] | None,
    ) -> None:
        """`validate_finetunejob`, remembered by spec: a thousand jobs of one spec (a sweep's
        names differ, their specs do not) are validated once."""
        if operation == "UPDATE" and old is not None:
            validate_finetunejob(spec=spec, old=old, operation=operation, warnings=warnings)
            return
        found = self._validated.get(key)
        if found is None:
            said: list[str] = []
            try:
                validate_finetunejob(spec=spec, old=None, operation=operation, warnings=said)
                found = (None, tuple(said))
            except kopf.AdmissionError as refused:
                found = (refused, ())
            if len(self._validated) >= _CACHE_SIZE:
                self._validated.pop(next(iter(self._validated)))
            self._validated[key] = found
        refusal, said_before = found
        if refusal is not None:
            raise refusal
        if warnings is not None:
            warnings.extend(said_before)

    def _ignored_priority(
        self,
        body: Mapping[str, Any],
        spec: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        warnings: list[str] | None,
    ) -> None:
        """Warn of a spec.priority its namespace may not set, when the write sets it (a
        create, or an update that changes it), not at every later update of the job."""
        raw = spec.get("priority", 0)
        if warnings is None or type(raw) is not int:
            return  # not a number: refused above
        if old is not None and (old.get("spec") or {}).get("priority", 0) == raw:
            return
        namespace = str((body.get("metadata") or {}).get("namespace") or "default")
        said = ignored_priority(namespace, raw, self.raw_priority_namespaces)
        if said is not None:
            warnings.append(f"vramgate: {said}")

    def _workload_problem(
        self, body: Mapping[str, Any], spec: dict[str, Any], key: str, mode: GpuMode
    ) -> str | None:
        """What the operator would record as InvalidSpec when it builds the workload (a pod
        template the Job cannot use), remembered by spec and GPU mode."""
        cached = (key, mode)
        if cached not in self._workload_problems:
            if len(self._workload_problems) >= _CACHE_SIZE:
                self._workload_problems.pop(next(iter(self._workload_problems)))
            job = {"metadata": dict(body.get("metadata") or {}), "spec": spec}
            self._workload_problems[cached] = workload_problem(job, mode)
        return self._workload_problems[cached]

    def _estimate(self, spec: dict[str, Any], key: str) -> tuple[JobPlan, Estimate] | None:
        """The spec's plan and estimate when they can be had in microseconds, else None."""
        if config_map_ref(spec) is not None:
            return None
        profile = (spec.get("estimator") or {}).get("profile")
        if profile in (Profile.TRACE.api, Profile.TRACE.value):
            return None  # seconds of work: the operator estimates it in a worker thread
        if key in self._estimates:
            return self._estimates[key]
        plan, errors = translate(spec, generic="defer")
        found = None
        if plan is not None and not errors:
            try:
                found = (plan, estimate_plan(plan))
            except Exception:  # the operator records and reports it
                found = None
        if len(self._estimates) >= _CACHE_SIZE:
            self._estimates.pop(next(iter(self._estimates)))
        self._estimates[key] = found
        return found


_FINISHED = (
    "spec: the job has finished, and a finished job is final: changing its spec would run "
    "nothing; to run it again, delete it and apply it again"
)


def _spec_change_refusal(old: Mapping[str, Any]) -> str | None:
    """Why the spec of `old` may not change beyond `suspend`, or None: a finished job runs
    nothing again, and an admitted job's GPUs were chosen for the spec it has."""
    if finished(old):
        return _FINISHED
    if reservation(old, []) is not None or admitted_by_kueue(old):
        return (
            "spec is locked once the job is admitted: only spec.suspend may change (set "
            "spec.suspend: true, edit the spec, then set it false)"
        )
    return None


def _as_at_create(
    spec: Mapping[str, Any], old: Mapping[str, Any], warnings: list[str] | None
) -> Mutation | None:
    """The stored count of a locked job (admitted or finished) with policy Resize, when the
    update asks again for the count annotated at create and changes nothing else but
    `suspend` (the manifest applied again); else None."""
    asked, stored = _annotations(old).get(REQUESTED_GPUS_ANNOTATION), _gpus(old.get("spec"))
    # The API server applies the CRD's default (1) before the webhooks; other callers may not.
    requested = 1 if _gpus(spec) is None else _gpus(spec)
    if type(requested) is not int or str(requested) != asked or type(stored) is not int:
        return None
    if _but_count(old.get("spec")) != _but_count(spec) or (spec.get("admissionPolicy") or "") != (
        AdmissionPolicy.RESIZE.value
    ):
        return None
    if warnings is not None:
        warnings.append(
            f"vramgate: spec.resources.gpus {asked} -> {stored}, as resized when the job was "
            f"created (annotation {REQUESTED_GPUS_ANNOTATION})"
        )
    return Mutation({**(spec.get("resources") or {}), "gpus": stored}, requested=requested)


def _resized(
    plan: JobPlan,
    estimate: Estimate,
    view: ClusterView,
    where: Selection,
    n: int,
    constraints: NodeConstraints | None = None,
) -> str:
    """The warning of a count rewritten to n. Up, the request is too small: the job needs
    n. Down, the request can never fit the empty cluster whatever the memory (more GPUs than
    it has, or no placement the parallelism can use) or in no placement that holds it, and
    n is the nearest count that can (with more GPUs asked than there are, the most)."""
    mode = plan.parallelism.api
    each = format_gib(estimate.per_gpu_bytes(n, plan.parallelism))
    change = f"spec.resources.gpus {plan.gpus} -> {n}"
    if n > plan.gpus:
        return f"vramgate: needs {plural(n)} with {mode} ({each} each): {change}"
    nearest = "the nearest count that can"
    narrowed = ["spec.resources.gpuSelector"] if plan.gpu_selector else []
    if constraints is not None and (template := constraints.describe()):
        narrowed.append(f"its pod template's {template}")
    matching = f" that match {' and '.join(narrowed)}" if narrowed else ""
    nodes = f"the nodes{matching}" if narrowed else "its nodes"
    if plan.gpus > where.gpus:
        nearest = "the most that can"  # every count above n is more GPUs than there are
        why = f", which has {where.gpus}{matching}"
    elif not view.shapes_empty(estimate, plan.parallelism, plan.gpus, where):
        if plan.parallelism is Parallelism.DEVICE_MAP or view.one_node:
            device_map = plan.parallelism is Parallelism.DEVICE_MAP
            keeps = "a device map" if device_map else "GPU mode visibleDevices"
            widest = plural(view.widest_empty(where))
            why = f": {keeps} keeps a job on one node, and {nodes} have at most {widest} each"
        else:
            why = (
                f": {mode} runs them as k nodes x g GPUs, the same g on every node, and no k "
                f"of {nodes} have g GPUs each with k x g = {plan.gpus}"
            )
    else:
        asked = format_gib(estimate.per_gpu_bytes(plan.gpus, plan.parallelism))
        why = (
            f": with {mode} each needs {asked}, and no {plan.gpus} of its GPUs that {mode} can "
            "use together hold that, even when they are idle"
        )
    return (
        f"vramgate: {plural(plan.gpus)} can never fit this cluster{why}; {nearest} is {n} "
        f"({each} each with {mode}): {change}"
    )


def _but_count(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    rest = but_suspend(spec)
    rest["resources"] = {k: v for k, v in (rest.get("resources") or {}).items() if k != "gpus"}
    return rest


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _gpus(spec: Mapping[str, Any] | None) -> object:
    return ((spec or {}).get("resources") or {}).get("gpus")


def _key(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()
