"""One admission pass: from a snapshot of the cluster, what to write, create and delete.

Pure, like `status.py`: the scheduler (`scheduler.py`) hands in what its caches hold and the
estimates it has, and carries out the returned actions in order: status writes first (an
admission's write carries the job's resourceVersion, so a stale decision fails instead of
overwriting), then the workloads of the admissions whose write landed, then deletions.

A pass, in the order Kueue's scheduler does it:

1. **Admitted jobs.** Their workload's state flows into Running / Succeeded / Failed; a
   finished job holds nothing from this pass on (the snapshot below no longer counts it); a
   suspended one gives its GPUs back and its workload is deleted; a missing workload (the
   operator stopped between the admission write and the create) is created again. A spec
   change other than `suspend` is ignored and said so (`SpecLocked`), as is any change to a
   finished job's spec (the webhook refuses both; this is for when it is off).
2. **Jobs not admitted.** Estimated (or their estimate's failure recorded); those that are
   estimated and have a trainer template are decided together by `plan_on`, each admission
   assumed before the next decision; a job without a template is told what admission would
   do, and holds nothing.

Every status write holds only keys that differ from the job's status, so a pass over an
unchanged cluster writes nothing. A queued job's message carries live numbers; a change of
the message alone is written at most every `message_refresh`.

An admitted job's observed peak per GPU (`observed.py`) is carried from pass to pass
(`PassInput.peaks` in, `PassOutput.peaks` out) and written to `status.observed` when it grew
enough. Each write says what it records for the metrics (`Recorded`: a decision, the job's
end), counted once the write lands, so a decision is counted once however often it is made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from controller.admission import kueue, learned, observed
from controller.admission import status as status_rules
from controller.admission.cluster import (
    ClusterObjects,
    finished,
    has_template,
    job_key,
    job_request,
    queue_name,
    reservation,
    snapshot,
)
from controller.admission.failures import Failure
from controller.api import conditions as cond
from controller.api.enums import AdmissionPolicy, ConditionStatus
from controller.api.finetunejob import NodePlacement, Placement
from controller.decision import (
    ADVISE,
    AdmissionSettings,
    Decision,
    JobRequest,
    Outcome,
    plan_on,
)
from controller.decision.decide import decide_placed
from controller.estimator import Estimate
from controller.jobs.spec import JobPlan
from controller.learning import Correction, KeyRecord, LearningSettings
from controller.packing.inventory import NodeGpus
from controller.packing.view import ClusterView
from controller.workload import (
    Admission,
    Queued,
    Remains,
    WorkloadError,
    WorkloadState,
    build_queued_workload,
    build_workload,
    ending,
    workload_conditions,
    workload_name,
    workload_problem,
    workload_state,
)

#: A queued job's message (free memory now, the numbers it waits for) is rewritten at most
#: this often when nothing but the numbers changed: 1,000 queued jobs must not cost 1,000
#: writes for every GPUNode heartbeat.
MESSAGE_REFRESH = timedelta(seconds=30)
_WORKLOAD_TYPES = (cond.RUNNING, cond.SUCCEEDED, cond.FAILED)
_QUIET_REASONS = {
    cond.REASON_WAITING_FOR_VRAM,
    cond.REASON_WAITING_FOR_NODES,
    cond.REASON_WAITING_FOR_GPUS,
    cond.REASON_WAITING_IN_QUEUE,
    cond.REASON_SUSPENDED,
    cond.REASON_NO_TEMPLATE,
}


@dataclass(frozen=True, slots=True)
class Estimated:
    """The estimator's answer for one job at `generation`: a plan and its estimate, or the
    failure to record, or a plan whose estimate is being traced (`tracing`). `stored`: the
    traced estimate as status keeps it, so that no replica traces the job again."""

    generation: int
    plan: JobPlan | None = None
    estimate: Estimate | None = None
    failure: Failure | None = None
    tracing: status_rules.Tracing | None = None
    stored: status_rules.Stored | None = None


@dataclass(frozen=True)
class PassInput:
    objects: ClusterObjects  # nodes, GPUNodes, pods and FineTuneJobs (key namespace/name)
    workloads: Mapping[str, Mapping[str, Any]]  # FineTuneJob key -> its batch/v1 Job
    job_pods: Mapping[str, Sequence[Mapping[str, Any]]]  # FineTuneJob key -> its pods
    estimates: Mapping[str, Estimated]  # FineTuneJob key -> estimate (absent: not yet)
    settings: AdmissionSettings
    now: datetime
    last_written: Mapping[str, datetime] = field(default_factory=dict)
    message_refresh: timedelta = MESSAGE_REFRESH
    #: Admitted jobs' peaks from earlier passes, by job uid (`PassOutput.peaks` of the last).
    peaks: Mapping[str, observed.Peaks] = field(default_factory=dict)
    #: What missing workloads left behind, by job key (read for `PassOutput.lookups`).
    remains: Mapping[str, Remains] = field(default_factory=dict)
    #: The uid of the workload this operator created, by job key, until status records it.
    created: Mapping[str, str] = field(default_factory=dict)
    #: Workloads the API server refused for good, by job key.
    refused: Mapping[str, Refused] = field(default_factory=dict)
    #: What admission learned, by key name (`learned.records` of the LearnedCorrections),
    #: and how it corrects a waiting job's per-GPU figure.
    learned: Mapping[str, KeyRecord] = field(default_factory=dict)
    learning: LearningSettings = field(default_factory=LearningSettings)
    #: Each template image string's latest reported digest (`learned.image_digests`): what a
    #: waiting job's key names its image by. None: built by the pass from `objects.jobs`.
    image_digests: Mapping[str, str] | None = None
    #: How long Kueue waits before it asks again about a Workload that waits for memory.
    kueue_retry_seconds: int = kueue.DEFAULT_RETRY_SECONDS
    #: Workloads not to decide nor size this pass (the scheduler's: an answer refused for
    #: good a moment ago, a Job sized whose gate the cache still shows).
    kueue_skip: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Refused:
    """The API server refused the workload of the FineTuneJob of `uid` admitted at
    `generation` with a permanent error (400, 422: its pod template is invalid)."""

    uid: str
    generation: int
    message: str


@dataclass(frozen=True)
class Recorded:
    """What a status write records, for the metrics (counted once the write lands).

    `decision` (Admit, Resize, Queue, Reject, Advise) and `reason` when the write changes the
    job's Admitted condition to a decision; `first` when it is the job's first. `finished`
    (the Succeeded or Failed condition's reason) when the write ends the job, with its
    highest observed peak and its predicted per-GPU bytes.
    """

    decision: str | None = None
    reason: str | None = None
    first: bool = False
    finished: str | None = None
    peak_bytes: int = 0
    predicted_bytes: int = 0
    profile: str = ""


@dataclass(frozen=True)
class StatusWrite:
    """A merge patch of one job's status. `resource_version` is set on admissions: the write
    must fail if the job changed since the snapshot. `releases`: the write gives GPUs back
    (the job ended, was suspended, or its workload was refused), and is written before the
    pass's admissions, so the API never shows a GPU promised twice."""

    key: str
    uid: str
    patch: dict[str, Any]
    events: tuple[status_rules.Event, ...] = ()
    resource_version: str | None = None
    recorded: Recorded | None = None
    releases: bool = False


@dataclass(frozen=True)
class CreateWorkload:
    """The objects to create for an admitted job, once the write of `key` has landed (or at
    once, `after_write` False, for a job admitted earlier whose workload never ran), built
    from the job's spec at the generation admitted."""

    key: str
    objects: tuple[dict[str, Any], ...]
    after_write: bool = True


@dataclass(frozen=True)
class DeleteWorkload:
    key: str
    objects: tuple[dict[str, Any], ...]  # apiVersion, kind, metadata.namespace and name


@dataclass(frozen=True)
class LookUp:
    """Read what the missing workload `name` (uid `workload_uid`) of the job `key` (uid
    `uid`) left behind, and hand it to the next pass as `PassInput.remains`."""

    key: str
    uid: str
    namespace: str
    name: str
    workload_uid: str


@dataclass
class PassOutput:
    writes: list[StatusWrite] = field(default_factory=list)
    creates: list[CreateWorkload] = field(default_factory=list)
    deletes: list[DeleteWorkload] = field(default_factory=list)
    lookups: list[LookUp] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    #: Every admitted, unfinished job's peaks now, by job uid: the next pass's `peaks`.
    peaks: dict[str, observed.Peaks] = field(default_factory=dict)
    #: The answers to Kueue's AdmissionChecks (`kueue.py`): Workloads decided this pass.
    checks: list[kueue.CheckWrite] = field(default_factory=list)
    #: Batch Jobs Kueue holds for vramgate to size (`kueue.to_resize`), sized this pass.
    resizes: list[kueue.ResizeWrite] = field(default_factory=list)


def admission_pass(inp: PassInput) -> PassOutput:
    out = PassOutput()
    if inp.image_digests is None:  # from the jobs as the caches hold them, as a plan reads
        inp = replace(inp, image_digests=learned.image_digests(inp.objects.jobs.values()))
    jobs = dict(inp.objects.jobs)
    drafts: dict[str, _Draft] = {}

    usage: observed.PodUsage | None = None  # read from the GPUNodes once, if needed
    for key, job in inp.objects.jobs.items():
        if _admitted(job):  # a finished job holds no reservation: not admitted any more
            draft = drafts[key] = _Draft(job)
            if usage is None and inp.job_pods.get(key):
                usage = observed.pod_usage(inp.objects.gpunodes)
            jobs[key] = _follow_admitted(inp, key, draft, out, usage or {})

    # Built before the waiting jobs are read: a learned correction is capped by what the
    # cluster's largest GPU holds (`_correction`).
    objects = replace(inp.objects, jobs=jobs)
    view = ClusterView(snapshot(objects, inp.now), inp.settings.packing)
    requests: list[JobRequest] = []
    template_less: set[str] = set()
    owned: dict[str, Mapping[str, Any]] | None = None
    for key, job in inp.objects.jobs.items():
        if key in drafts:  # admitted and running: followed above
            continue
        if _template_refused(job):
            continue  # until its spec changes
        if finished(job):
            if (edited := _edited_after_it_finished(job)) is not None:
                drafts[key] = draft = _Draft(job)
                _lock(
                    inp, draft, edited,
                    f"the job has finished; the change to generation {_generation(job)} is "
                    "ignored: a finished job runs nothing again (delete it and apply it again "
                    "to rerun it)",
                )  # fmt: skip
            continue
        if queue_name(job) is not None:  # Kueue decides it, with vramgate's check
            drafts[key] = draft = _Draft(job)
            if usage is None and inp.job_pods.get(key):
                usage = observed.pod_usage(inp.objects.gpunodes)
            if owned is None:  # Kueue Workloads by the uid of the Job that owns each
                owned = kueue.by_owner(inp.objects.kueue_workloads.values())
            _kueue_job(inp, key, draft, out, view, usage or {}, owned)
            continue
        found = inp.estimates.get(key)
        if found is None or found.generation != _generation(job):
            continue  # still estimating this generation
        draft = drafts[key] = _Draft(job)
        templated = has_template(job)
        # Before the estimate is recorded: recording it (Estimated=True) and then the
        # template's error (False) would move lastTransitionTime, a write every pass.
        problem = _template_error(job, inp) if templated and found.failure is None else None
        if problem is not None:
            draft.apply(status_rules.invalid(problem, _generation(job), draft.status, inp.now))
            continue
        request = _estimated(inp, draft, found, view)
        if request is None:
            continue
        if not templated:
            template_less.add(key)
        requests.append(request)

    checked = _check_requests(inp, view, out)
    requests.extend(request for _, request in checked.values())
    for decision in plan_on(view, requests, inp.settings, inp.now, template_less):
        if decision.job in checked:
            workload, check = checked[decision.job][0], _our_check(inp, checked[decision.job][0])
            out.checks.append(
                kueue.check_state(
                    workload, check, decision, inp.now, _hostnames(inp), inp.kueue_retry_seconds
                )
            )
            out.decisions.append(decision)
        elif decision.reason == cond.REASON_NO_TEMPLATE:
            _no_template(inp, drafts[decision.job], decision)
            out.decisions.append(decision)
        else:
            _record(inp, drafts[decision.job], decision, out, view)

    _resizes(inp, view, out)
    for key, draft in drafts.items():
        write = draft.write(inp.last_written.get(key), inp.now, inp.message_refresh)
        if write is not None:
            out.writes.append(write)
    # Releases first, then admissions: a GPU freed and promised again in one pass is never
    # shown promised twice, and a stale admission fails before the other writes.
    out.writes.sort(key=lambda w: (not w.releases, w.resource_version is None))
    return out


# -- Kueue's Workloads whose vramgate check is pending (`kueue.py`) -------------------------


def _kueue_job(
    inp: PassInput,
    key: str,
    draft: _Draft,
    out: PassOutput,
    view: ClusterView,
    usage: observed.PodUsage,
    owned: Mapping[str, Mapping[str, Any]],
) -> None:
    """A FineTuneJob handed to Kueue (spec.queueName): its batch Job is created suspended in
    the LocalQueue once it is estimated, and vramgate's AdmissionCheck places its Workload
    like any other (the ledger holds it there, not here: `cluster.reservation`; status.queueName
    records the handing, so an edit of spec.queueName never moves the hold). The job's status
    follows: QueuedInKueue with the check's latest answer while Kueue holds the Job; admitted,
    on the placement the check gave, once Kueue starts it; Running, Succeeded or Failed as its
    workload goes; queued again if Kueue preempts it (it suspends the Job)."""
    job = draft.job
    spec = job.get("spec") or {}
    workload = inp.workloads.get(key)
    handed = bool(draft.status.get("queueName"))
    queue = str(draft.status.get("queueName") or spec.get("queueName") or "")
    admitted = cond.find_condition(_conditions(draft), cond.ADMITTED) or {}
    ran = admitted.get("status") == "True"
    at = admitted.get("observedGeneration")
    if spec.get("suspend"):
        if handed or workload is not None:
            out.deletes.append(DeleteWorkload(key, (_queued_job_ref(job),)))
            _release(
                inp, draft, ConditionStatus.FALSE, cond.REASON_SUSPENDED,
                "spec.suspend is true: its workload was taken out of Kueue and deleted",
            )  # fmt: skip
            draft.status.pop("queueName", None)
        else:
            _set_admitted(
                inp, draft, ConditionStatus.FALSE, cond.REASON_SUSPENDED,
                "spec.suspend is true: not handed to Kueue, and holds no GPU memory",
            )  # fmt: skip
        return
    refused = inp.refused.get(key)
    if refused is not None and refused.uid == _uid(job) and refused.generation == at and not ran:
        for taken in ("workloadRef", "queueName"):
            draft.status.pop(taken, None)
        _set_admitted(
            inp, draft, ConditionStatus.FALSE, cond.REASON_INVALID_TEMPLATE,
            f"the API server refuses the workload built from spec.template: {refused.message}; "
            "it is handed to Kueue again once its spec changes",
            generation=refused.generation,
        )  # fmt: skip
        return
    if workload is None and not ran:
        if not _deleting(job):  # not handed yet, or its Job went before it ran: hand it
            _hand_to_kueue(inp, key, draft, out, view, queue)
        return
    if workload is None:  # it ran, and its Job is gone: how it ended, as for any job
        state = _missing_workload(inp, key, draft, out, admitted)
        if state is not None:
            _follow_state(inp, key, draft, out, usage, state, at)
        return
    if workload:  # {}: being created, not in the caches yet
        _record_workload(draft, workload)
    edited = at is not None and at != _generation(job) and not _deleting(job)
    if not workload or (workload.get("spec") or {}).get("suspend"):
        if workload and not ran and edited:
            # Edited while it waits in Kueue: its Job, built from the old spec, is deleted,
            # and the job handed again from the new one.
            out.deletes.append(DeleteWorkload(key, (_queued_job_ref(job),)))
            for taken in ("workloadRef", "queueName"):
                draft.status.pop(taken, None)
            _set_admitted(
                inp, draft, ConditionStatus.UNKNOWN, cond.REASON_PENDING,
                f"the spec changed to generation {_generation(job)} while it waited in Kueue: "
                "its workload is made again from the new spec",
            )  # fmt: skip
            return
        said = _check_said(inp, owned.get(str((workload.get("metadata") or {}).get("uid"))))
        message = f"waits in Kueue's LocalQueue {queue}" + (f"; {said}" if said else "")
        if ran:  # Kueue suspended it again (a preemption): it holds nothing now
            ref = draft.status.get("workloadRef")
            _release(inp, draft, ConditionStatus.FALSE, cond.REASON_QUEUED_IN_KUEUE,
                     f"suspended by Kueue (preempted); {message}")  # fmt: skip
            if ref is not None:
                draft.status["workloadRef"] = ref
        else:
            _set_admitted(
                inp, draft, ConditionStatus.FALSE, cond.REASON_QUEUED_IN_KUEUE, message, at
            )
        return
    if ran and edited:
        _lock(
            inp, draft, admitted,
            f"admitted by Kueue at generation {at}; the change to generation "
            f"{_generation(job)} is ignored: only spec.suspend may change once a job runs",
        )  # fmt: skip
    template = (workload.get("spec") or {}).get("template") or {}
    read = kueue.read_placement(
        ((template.get("metadata") or {}).get("annotations") or {}).get(kueue.PLACEMENT_ANNOTATION)
    )
    if read is None:  # started by Kueue with no placement of vramgate's
        warned = "without vramgate's AdmissionCheck"
        message = (
            f"started by Kueue (LocalQueue {queue}) {warned} on its ClusterQueue: its GPU "
            "memory was not checked, and vramgate's ledger does not hold it"
        )
        if warned not in str(admitted.get("message") or ""):
            draft.events.append(
                status_rules.Event(status_rules.WARNING, cond.REASON_QUEUED_IN_KUEUE, message)
            )
        _set_admitted(inp, draft, ConditionStatus.FALSE, cond.REASON_QUEUED_IN_KUEUE, message, at)
    else:
        nodes, per_gpu = read
        placement = Placement(
            nodes=[
                NodePlacement(node=p.node, gpu_indices=list(p.indices), gpu_uuids=list(p.uuids))
                for p in nodes
            ],
            requested_gpus=sum(len(p.indices) for p in nodes),
            admitted_gpus=sum(len(p.indices) for p in nodes),
            per_gpu_bytes=per_gpu,
        ).model_dump(mode="json", by_alias=True)
        if draft.status.get("placement") != placement:  # placed, or placed anew
            draft.status["placement"] = placement
            draft.urgent = True
        where = ", ".join(p.node for p in nodes)
        message = (
            f"admitted by Kueue (LocalQueue {queue}) once vramgate's AdmissionCheck placed it "
            f"on {where}"
        )
        locked = ran and edited  # SpecLocked stays said while the change is ignored
        if not locked and _set_admitted(
            inp, draft, ConditionStatus.TRUE, cond.REASON_FITS, message, at
        ):
            _decided(draft, Outcome.ADMIT.value, cond.REASON_FITS)
    state = workload_state(workload, inp.job_pods.get(key, ()), inp.now)
    at = (cond.find_condition(_conditions(draft), cond.ADMITTED) or {}).get("observedGeneration")
    _follow_state(inp, key, draft, out, usage, state, at)


def _hand_to_kueue(
    inp: PassInput, key: str, draft: _Draft, out: PassOutput, view: ClusterView, queue: str
) -> None:
    """Once estimated, create the job's batch Job suspended in its LocalQueue (with policy
    Resize, gated for vramgate to size it first), unless no AdmissionCheck of vramgate's
    would place it: Kueue alone would start it with no GPU memory checked."""
    job = draft.job
    spec = job.get("spec") or {}
    if not inp.objects.kueue_checks:
        _set_admitted(
            inp, draft, ConditionStatus.FALSE, cond.REASON_QUEUED_IN_KUEUE,
            f"spec.queueName {queue}: not handed to Kueue until vramgate answers its "
            "AdmissionChecks (the operator's kueueAdmissionCheck, and an AdmissionCheck of "
            f"controllerName {kueue.CONTROLLER}): Kueue alone would start it with no GPU "
            "memory checked",
        )  # fmt: skip
        return
    found = inp.estimates.get(key)
    if found is None or found.generation != _generation(job):
        return
    problem = _template_error(job, inp) if found.failure is None else None
    if problem is not None:
        draft.apply(status_rules.invalid(problem, _generation(job), draft.status, inp.now))
        return
    if _estimated(inp, draft, found, view) is None or found.plan is None:
        return
    plan, est = found.plan, found.estimate
    assert est is not None
    queued = Queued(
        queue,
        {kueue.SPEC_ANNOTATION: kueue.spec_annotation(spec)},
        kueue.UUIDS_ANNOTATION,
        job_annotations=(
            {kueue.GATE_ANNOTATION: kueue.CONTROLLER}
            if plan.admission_policy is AdmissionPolicy.RESIZE
            else {}
        ),
        node_selector=plan.gpu_selector,
        priority_class=plan.priority_class_name,
    )
    try:
        objects = build_queued_workload(
            job, plan.gpus, est.per_gpu_bytes(plan.gpus, plan.parallelism), queued
        )
    except WorkloadError as error:
        draft.apply(status_rules.invalid(str(error), _generation(job), draft.status, inp.now))
        return
    after_write = "workloadRef" not in (job.get("status") or {})
    name = str((job.get("metadata") or {}).get("name") or "")
    draft.status["workloadRef"] = {
        "apiVersion": "batch/v1", "kind": "Job", "name": workload_name(name),
    }  # fmt: skip
    draft.status["queueName"] = queue
    message = (
        f"handed to Kueue's LocalQueue {queue}: Kueue reserves quota, then vramgate's "
        "AdmissionCheck places it by GPU memory"
    )
    if _set_admitted(inp, draft, ConditionStatus.FALSE, cond.REASON_QUEUED_IN_KUEUE, message,
                     _generation(job)):  # fmt: skip
        _decided(draft, Outcome.QUEUE.value, cond.REASON_QUEUED_IN_KUEUE)
    out.creates.append(CreateWorkload(key, tuple(objects), after_write=after_write))


def _queued_job_ref(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "namespace": str(meta.get("namespace") or "default"),
            "name": workload_name(str(meta.get("name") or "")),
        },
    }


#: Kueue's own message on a check entry it reset at an eviction: not an answer of vramgate's.
_RESET = "Reset to Pending after eviction"


def _check_said(inp: PassInput, workload: Mapping[str, Any] | None) -> str:
    """What Kueue and vramgate's check say of the Kueue Workload of a handed job's batch Job:
    a deactivation (the check rejected it, whose reason the Job's Events keep), Kueue's reason
    for reserving no quota (a LocalQueue that does not exist, say), or the check's answer."""
    if workload is None:
        return ""
    if (workload.get("spec") or {}).get("active") is False:
        return (
            "Kueue deactivated its Workload: vramgate's AdmissionCheck rejected it "
            "(`kubectl describe job` says why); delete the job or change its spec"
        )
    conditions = (workload.get("status") or {}).get("conditions") or []
    quota = cond.find_condition(conditions, "QuotaReserved") or {}
    if quota.get("status") == "False" and quota.get("message"):
        return f"Kueue: {quota['message']}"
    entry = kueue.check_of(workload, inp.objects.kueue_checks) or {}
    said = str(entry.get("message") or "")
    return "" if said.startswith(_RESET) else said


def _hostnames(inp: PassInput) -> dict[str, str]:
    found = {}
    for name, node in inp.objects.nodes.items():
        label = ((node.get("metadata") or {}).get("labels") or {}).get(kueue.HOSTNAME_LABEL)
        if isinstance(label, str) and label:
            found[name] = label
    return found


def _our_check(inp: PassInput, workload: Mapping[str, Any]) -> str:
    entry = kueue.check_of(workload, inp.objects.kueue_checks)
    return str((entry or {}).get("name"))


def _check_requests(
    inp: PassInput, view: ClusterView, out: PassOutput
) -> dict[str, tuple[Mapping[str, Any], JobRequest]]:
    """The Workloads to decide, each as a request; those that cannot be estimated are
    answered here (Rejected, or Retry while a ConfigMap is missing); those being estimated
    wait, Pending."""
    found: dict[str, tuple[Mapping[str, Any], JobRequest]] = {}
    checks = inp.objects.kueue_checks
    for key, workload in inp.objects.kueue_workloads.items():
        if key in inp.kueue_skip or not kueue.to_decide(workload, checks):
            continue
        check = _our_check(inp, workload)
        try:
            job = kueue.check_job(workload, inp.objects.kueue_flavors)
        except kueue.CheckProblem as problem:
            out.checks.append(kueue.problem_state(workload, check, str(problem), inp.now))
            continue
        request = _workload_request(inp, key, workload, job, view)
        if isinstance(request, Failure):
            write = kueue.problem_state(workload, check, request.message, inp.now, request.reason)
            if request.retry_s is None:
                out.checks.append(write)
            else:
                entry = {**write.entry, "state": kueue.RETRY}
                entry["requeueAfterSeconds"] = max(1, int(request.retry_s))
                out.checks.append(replace(write, entry=entry, rejected=False))
            continue
        if request is None:
            continue  # being estimated or traced: Kueue waits while the check is Pending
        found[key] = (workload, request)
    return found


def _workload_request(
    inp: PassInput,
    key: str,
    workload: Mapping[str, Any],
    job: Mapping[str, Any],
    view: ClusterView,
) -> JobRequest | Failure | None:
    """The Workload's request, its estimate's failure, or None while it is being estimated."""
    estimated = inp.estimates.get(key)
    if estimated is None or estimated.generation != _generation(job):
        return None
    if estimated.failure is not None:
        return estimated.failure
    if estimated.plan is None or estimated.estimate is None:
        return None
    plan, est = estimated.plan, estimated.estimate
    corrected = _correction(inp, job, plan, est, plan.gpus, view)
    est = replace(est, correction_percent=corrected.factor_percent)
    request = job_request(job, plan, est)
    assert request.constraints is not None  # a Workload's job has its podSet's template
    return replace(
        request,
        key=key,
        # Its pods are pinned by one nodeSelector per podSet: one node.
        constraints=replace(request.constraints, one_node=True),
        # Kueue ranked it (its PriorityClass or WorkloadPriorityClass, resolved).
        priority=_int((workload.get("spec") or {}).get("priority")),
        priority_problem=None,
        warnings=(),
    )


def _resizes(inp: PassInput, view: ClusterView, out: PassOutput) -> None:
    """Size each Workload Kueue holds for vramgate (`kueue.to_resize`) on what this pass's
    decisions left, charging nothing: it holds GPUs only once the check admits it."""
    for key, workload in inp.objects.kueue_workloads.items():
        if key in inp.kueue_skip or not kueue.to_resize(workload):
            continue
        write: kueue.ResizeWrite | None
        try:
            job = kueue.check_job(workload, inp.objects.kueue_flavors)
        except kueue.CheckProblem as problem:
            write = kueue.resize_of(workload, None, f"not resized: {problem}")
        else:
            request = _workload_request(inp, key, workload, job, view)
            if isinstance(request, Failure):  # one that lasts: ungated, the check says why
                lasts = request.retry_s is None
                write = kueue.resize_of(workload, None, request.message) if lasts else None
            elif request is None:
                write = None
            else:
                decision, placed = decide_placed(request, view)
                write = kueue.resize_of(workload, decision, None)
                if placed is not None and write is not None and write.gpus is not None:
                    view.assume(placed)  # two gated Jobs are not sized onto the same GPUs
        if write is not None:
            out.resizes.append(write)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- the status a pass builds for one job ---------------------------------------------------


class _Draft:
    """One job's status as the pass wants it, built from the status it has."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        self.job = job
        self.key = job_key(job)
        self.current: dict[str, Any] = dict(job.get("status") or {})
        self.status: dict[str, Any] = dict(self.current)
        self.events: list[status_rules.Event] = []
        self.admission = False
        self.releases = False  # the write gives the job's GPUs back
        self.urgent = False  # something other than a message changed
        self.recorded: Recorded | None = None

    def apply(self, update: status_rules.StatusUpdate) -> None:
        self.status.update(update.patch)
        if update.event is not None:
            self.events.append(update.event)
        if update.patch:
            self.urgent = True

    def set_conditions(self, conditions: list[dict[str, Any]]) -> None:
        before = {c.get("type"): c for c in self.status.get("conditions") or []}
        for c in conditions:
            old = before.get(c["type"])
            if old is None or any(old.get(k) != c.get(k) for k in c if k != "message"):
                self.urgent = True
        self.status["conditions"] = conditions

    def write(self, last: datetime | None, now: datetime, refresh: timedelta) -> StatusWrite | None:
        patch = {
            key: value
            for key, value in self.status.items()
            if not status_rules.same(key, self.current.get(key), value)
        }
        patch.update({key: None for key in self.current if key not in self.status})
        if not patch:
            return None
        if not self.urgent and last is not None and now - last < refresh:
            return None  # only a message's numbers changed, and recently written
        meta = self.job.get("metadata") or {}
        version = meta.get("resourceVersion") if self.admission else None
        events = self.events
        if len(events) > 1:
            # One Event per write where the decision says it all: an Event is an API write too,
            # and 1,000 new jobs must not cost 2,000 of them. The estimate stays in its condition.
            events = [e for e in events if e.reason != cond.REASON_ESTIMATED] or events
        return StatusWrite(
            self.key,
            str(meta.get("uid")),
            patch,
            tuple(events),
            version,
            self.recorded,
            self.releases,
        )


def _generation(job: Mapping[str, Any]) -> int:
    return int((job.get("metadata") or {}).get("generation") or 0)


def _conditions(draft: _Draft) -> list[dict[str, Any]]:
    return [dict(c) for c in draft.status.get("conditions") or []]


def _admitted(job: Mapping[str, Any]) -> bool:
    return reservation(job, []) is not None


def _set_admitted(
    inp: PassInput,
    draft: _Draft,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None = None,
) -> bool:
    """Set Admitted; True when its status or reason changed (a new decision)."""
    conditions = _conditions(draft)
    old = cond.find_condition(conditions, cond.ADMITTED)
    message = status_rules.one_line(message)
    draft.set_conditions(
        cond.set_condition(
            conditions,
            cond.ADMITTED,
            status,
            reason,
            message,
            _generation(draft.job) if generation is None else generation,
            inp.now,
        )
    )
    if old is None or (old.get("status"), old.get("reason")) != (status.value, reason):
        normal = status is ConditionStatus.TRUE or reason in _QUIET_REASONS
        kind = status_rules.NORMAL if normal else status_rules.WARNING
        draft.events.append(status_rules.Event(kind, reason, message))
        return True
    return False


def _decided(draft: _Draft, decision: str, reason: str) -> None:
    """Record that the write of `draft` carries a new decision."""
    before = cond.find_condition(draft.current.get("conditions") or [], cond.ADMITTED)
    first = before is None or before.get("reason") in cond.BEFORE_ADMISSION
    estimate = draft.status.get("estimate") or {}
    draft.recorded = Recorded(
        decision=decision, reason=reason, first=first, profile=str(estimate.get("profile") or "")
    )


# -- 1. admitted jobs -----------------------------------------------------------------------


def _follow_admitted(
    inp: PassInput, key: str, draft: _Draft, out: PassOutput, usage: observed.PodUsage
) -> Mapping[str, Any]:
    """Workload state -> conditions; suspend releases; returns the job as the snapshot should
    see it (without a reservation once it finished or was suspended)."""
    job = draft.job
    spec = job.get("spec") or {}
    admitted = cond.find_condition(_conditions(draft), cond.ADMITTED) or {}
    admitted_at = admitted.get("observedGeneration")

    if spec.get("suspend"):
        out.deletes.append(DeleteWorkload(key, _workload_objects(inp, job)))
        _release(
            inp, draft, ConditionStatus.FALSE, cond.REASON_SUSPENDED,
            "spec.suspend is true: the workload was deleted and its GPUs released",
        )  # fmt: skip
        return {**job, "status": draft.status}

    refused = inp.refused.get(key)
    if refused is not None and refused.uid == _uid(job) and refused.generation == admitted_at:
        out.deletes.append(DeleteWorkload(key, _workload_objects(inp, job)))  # any made
        _release(
            inp, draft, ConditionStatus.FALSE, cond.REASON_INVALID_TEMPLATE,
            f"the API server refuses the workload built from spec.template: {refused.message}; "
            "its GPUs are released, and the job is decided again once its spec changes",
            generation=refused.generation,
        )  # fmt: skip
        return {**job, "status": draft.status}

    workload = inp.workloads.get(key)
    if workload is None:
        state = _missing_workload(inp, key, draft, out, admitted)
        if state is None:  # reading what it left behind, or to be decided again
            if _uid(job) in inp.peaks:
                out.peaks[_uid(job)] = inp.peaks[_uid(job)]
            return {**job, "status": draft.status}
    else:
        _record_workload(draft, workload)
        state = workload_state(workload, inp.job_pods.get(key, ()), inp.now)

    if admitted_at is not None and _generation(job) != admitted_at and not _deleting(job):
        _lock(
            inp,
            draft,
            admitted,
            f"admitted at generation {admitted_at}; the change to generation "
            f"{_generation(job)} is ignored: only spec.suspend may change once a job is "
            "admitted (suspend it, edit it, and resume it to change the rest)",
        )
    _follow_state(inp, key, draft, out, usage, state, admitted_at)
    return {**job, "status": draft.status}


def _follow_state(
    inp: PassInput,
    key: str,
    draft: _Draft,
    out: PassOutput,
    usage: observed.PodUsage,
    state: WorkloadState,
    admitted_at: Any,
) -> None:
    """The workload's state -> Running, Succeeded or Failed (an Event on each change), the
    GPUs given back at its end, and its pods' peaks observed."""
    before = {c.get("type"): (c.get("status"), c.get("reason")) for c in _conditions(draft)}
    conditions = workload_conditions(state, _conditions(draft), admitted_at, inp.now)
    draft.set_conditions(conditions)
    ended = None
    for c in conditions:
        changed = before.get(c["type"]) != (c["status"], c["reason"])
        if changed and c["type"] in _WORKLOAD_TYPES and c["status"] == "True":
            kind = status_rules.WARNING if c["type"] == cond.FAILED else status_rules.NORMAL
            draft.events.append(status_rules.Event(kind, c["reason"], c["message"]))
            if c["type"] != cond.RUNNING:
                ended = str(c["reason"])
    if ended is not None:
        draft.releases = True
    running = any(c["type"] == cond.RUNNING and c["status"] == "True" for c in conditions)
    _observe(inp, key, draft, out, ended, usage, running)


def _release(
    inp: PassInput,
    draft: _Draft,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None = None,
) -> None:
    """The job gives its GPUs back without finishing: no placement, no workload, no Running."""
    draft.releases = True
    for released in ("placement", "workloadRef", "observed"):
        draft.status.pop(released, None)
    _set_admitted(inp, draft, status, reason, message, generation)
    draft.set_conditions([c for c in _conditions(draft) if c.get("type") != cond.RUNNING])


def _missing_workload(
    inp: PassInput, key: str, draft: _Draft, out: PassOutput, admitted: Mapping[str, Any]
) -> WorkloadState | None:
    """The state of an admitted job whose workload the caches do not hold.

    A workload is created once (`controller.workload.lost`). One that was created (its uid
    recorded) ends the job as it ended, or as deleted, once what it left behind is read (a
    `LookUp`, answered in the next pass's `remains`; None meanwhile). One never created is
    created now, from the spec admitted; if that spec changed since (the webhook off), it is
    gone, so the job gives its GPUs back and is decided again at its new spec (None)."""
    job = draft.job
    meta = job.get("metadata") or {}
    ref = draft.status.get("workloadRef") or {}
    name = str(ref.get("name") or workload_name(str(meta.get("name") or "")))
    created = ref.get("uid") or inp.created.get(key)
    if created:
        remains = inp.remains.get(key)
        if remains is None or remains.job_uid != _uid(job) or remains.name != name:
            namespace = str(meta.get("namespace") or "default")
            out.lookups.append(LookUp(key, _uid(job), namespace, name, str(created)))
            return None
        if remains.exists:
            return None  # there after all: the caches have not seen it yet
        return ending(remains, inp.job_pods.get(key, ()), str(created))
    admitted_at = admitted.get("observedGeneration")
    if admitted_at is not None and _generation(job) != admitted_at and not _deleting(job):
        _release(
            inp, draft, ConditionStatus.UNKNOWN, cond.REASON_PENDING,
            f"admitted at generation {admitted_at}, but the spec changed to generation "
            f"{_generation(job)} before its workload was created: nothing ran, so its GPUs "
            "are released and it is decided again at its new spec",
        )  # fmt: skip
        return None
    objects = _workload_objects(inp, job)  # built only when needed: most passes never do
    if objects:
        out.creates.append(CreateWorkload(key, objects, after_write=False))
    return workload_state(None, inp.job_pods.get(key, ()), inp.now)


def _record_workload(draft: _Draft, workload: Mapping[str, Any]) -> None:
    """The workload's uid into status.workloadRef once the caches hold it: from then on, its
    going missing means it was deleted, never that it is still to be created. Written with
    the job's next status write (its Running, for one), not on its own."""
    uid = (workload.get("metadata") or {}).get("uid")
    ref = draft.status.get("workloadRef") or {}
    if uid and ref.get("uid") != uid:
        name = (workload.get("metadata") or {}).get("name")
        draft.status["workloadRef"] = {
            "apiVersion": "batch/v1", "kind": "Job", "name": name, **ref, "uid": str(uid),
        }  # fmt: skip


def _template_refused(job: Mapping[str, Any]) -> bool:
    """The API server refused the workload of the job's current generation (InvalidTemplate):
    nothing to decide until its spec changes."""
    admitted = cond.find_condition((job.get("status") or {}).get("conditions") or [], cond.ADMITTED)
    return (
        admitted is not None
        and admitted.get("reason") == cond.REASON_INVALID_TEMPLATE
        and admitted.get("observedGeneration") == _generation(job)
    )


def _uid(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("uid"))


def _lock(inp: PassInput, draft: _Draft, admitted: Mapping[str, Any], message: str) -> None:
    """Admitted stays True at the generation admitted, its reason SpecLocked: the change is
    ignored, and said once (the Warning goes with the first pass that sees it)."""
    if admitted.get("reason") != cond.REASON_SPEC_LOCKED:
        draft.events.append(
            status_rules.Event(status_rules.WARNING, cond.REASON_SPEC_LOCKED, message)
        )
    draft.set_conditions(
        cond.set_condition(
            _conditions(draft),
            cond.ADMITTED,
            ConditionStatus.TRUE,
            cond.REASON_SPEC_LOCKED,
            message,
            admitted.get("observedGeneration"),
            inp.now,
        )
    )


def _edited_after_it_finished(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Admitted condition of a finished job whose spec changed since its admission (the
    webhook refuses that unless it is off), else None."""
    admitted = cond.find_condition((job.get("status") or {}).get("conditions") or [], cond.ADMITTED)
    if admitted is None or admitted.get("status") != "True":
        return None
    at = admitted.get("observedGeneration")
    return admitted if at is not None and _generation(job) != at and not _deleting(job) else None


def _deleting(job: Mapping[str, Any]) -> bool:
    """Being deleted: the API server bumps the generation when it sets deletionTimestamp
    (a foreground deletion, a finalizer), which is no change of the spec to speak of."""
    return bool((job.get("metadata") or {}).get("deletionTimestamp"))


def _observe(
    inp: PassInput,
    key: str,
    draft: _Draft,
    out: PassOutput,
    ended: str | None,
    usage: observed.PodUsage,
    running: bool = False,
) -> None:
    """The job's peaks: carried to the next pass while it runs, written when due (or with
    any other write), and recorded with the write that ends it; what the job taught
    (`learned`), once its running peak is steady and with its end."""
    uid = str((draft.job.get("metadata") or {}).get("uid"))
    written = observed.from_status(draft.current.get("observed"))
    pod_uids = {str((p.get("metadata") or {}).get("uid")) for p in inp.job_pods.get(key, ())}
    peaks = observed.merged(written, inp.peaks.get(uid, {}), observed.seen_now(pod_uids, usage))
    if peaks:  # kept until a pass sees the job finished: its end's write may fail
        out.peaks[uid] = peaks
    before = draft.current.get("observed")
    # The trainer image's digest: written once, with the write that first sees a pod report
    # it (its Running, mostly), so that it outlives the pods and the operator.
    image = observed.image_seen(before)
    fresh = None
    if image is None:
        digest = observed.reported_digest(draft.job.get("spec") or {}, inp.job_pods.get(key, ()))
        fresh = image = None if digest is None else observed.ImageSeen(digest, inp.now)

    def write_observed() -> None:
        since = observed.peak_since(before, peaks, inp.now) if peaks else None
        draft.status["observed"] = observed.status(peaks, since, image)
        draft.urgent = True

    # A running job's peaks written before `peakSince` existed get it now, once: the wait
    # for a steady peak starts here.
    dated = not running or not written or observed.steady_since(before) is not None
    if fresh is not None or (
        peaks and (draft.urgent or ended is not None or observed.due(written, peaks) or not dated)
    ):
        write_observed()
    elif running and peaks and ended is None:
        taught = learned.running_sample(
            draft.status,
            learned.sample_key(
                draft.job, draft.status.get("estimate") or {}, draft.status.get("observed")
            ),
            observed.highest(peaks.values()),
            inp.now,
            inp.learning,
        )
        if taught is not None:
            draft.status["learnedSample"] = taught
            write_observed()
    if ended is not None:
        status = draft.status
        taught = learned.sample(
            status,
            ended,
            learned.sample_key(draft.job, status.get("estimate") or {}, status.get("observed")),
            observed.highest(peaks.values()),
            inp.now,
        )
        if taught is not None:  # in place of a running sample (`learned.revised`)
            status["learnedSample"] = taught
        draft.recorded = Recorded(
            finished=ended,
            peak_bytes=observed.highest(peaks.values()),
            predicted_bytes=int((status.get("placement") or {}).get("perGpuBytes") or 0),
            profile=str((status.get("estimate") or {}).get("profile") or ""),
        )


def _workload_objects(inp: PassInput, job: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    placement = (job.get("status") or {}).get("placement") or {}
    nodes = tuple(
        NodeGpus(
            str(part["node"]),
            tuple(int(i) for i in part.get("gpuIndices") or []),
            tuple(str(u) for u in part.get("gpuUUIDs") or []),
        )
        for part in placement.get("nodes") or []
    )
    admission = Admission(
        nodes, int(placement.get("perGpuBytes") or 0), inp.settings.packing.gpu_mode
    )
    try:
        return tuple(build_workload(job, admission))
    except WorkloadError:
        return ()  # refused before admission; an edited template after it is SpecLocked


# -- 2. jobs not admitted -------------------------------------------------------------------


def _estimated(
    inp: PassInput, draft: _Draft, found: Estimated, view: ClusterView
) -> JobRequest | None:
    generation = _generation(draft.job)
    if found.failure is not None:
        failure = found.failure
        if failure.reason == cond.REASON_INVALID_SPEC:
            draft.apply(status_rules.invalid(failure.message, generation, draft.status, inp.now))
        else:
            draft.apply(
                status_rules.not_estimated(
                    failure.reason, failure.message, generation, draft.status, inp.now
                )
            )
        return None
    if found.tracing is not None:  # decided once traced; no other job waits for it
        assert found.plan is not None
        draft.apply(
            status_rules.tracing(found.plan, found.tracing, generation, draft.status, inp.now)
        )
        return None
    assert found.plan is not None and found.estimate is not None
    plan, est = found.plan, found.estimate
    corrected = _correction(inp, draft.job, plan, est, plan.gpus, view)
    draft.apply(
        status_rules.estimated(
            plan, est, generation, draft.status, inp.now, found.stored,
            learned.correction_status(corrected),
        )
    )  # fmt: skip
    ranked_by = inp.objects.priorities(inp.settings.raw_priority_namespaces)
    # The one figure every decision reads: the estimate x what was learned (`Estimate.
    # correction_percent`); status keeps the estimator's own beside the correction.
    est = replace(est, correction_percent=corrected.factor_percent)
    return job_request(draft.job, plan, est, ranked_by)


def _correction(
    inp: PassInput,
    job: Mapping[str, Any],
    plan: JobPlan,
    est: Estimate,
    gpus: int,
    view: ClusterView | None = None,
) -> Correction:
    """What was learned of jobs like `job`, on its figure at `gpus` (`learned.corrected`).
    Worked out on every pass while it waits: a key that learned meanwhile moves its figure."""
    return learned.corrected(
        job, plan, est, gpus, inp.learned, inp.learning, view, inp.now, inp.image_digests
    )


#: Template checks by (uid, generation, mode): a waiting job's template is checked once, not
#: on every pass (the check builds its whole workload).
_TEMPLATE_CHECKS: dict[tuple[str, int, str], str | None] = {}
_TEMPLATE_CHECKS_MAX = 20_000


def _template_error(job: Mapping[str, Any], inp: PassInput) -> str | None:
    """The error the job's template meets when its workload is built, or None: found before
    any GPU is promised to it, so an unusable template is an invalid spec, not an admission
    that fails over and over."""
    mode = inp.settings.packing.gpu_mode
    key = (str((job.get("metadata") or {}).get("uid")), _generation(job), mode.value)
    if key in _TEMPLATE_CHECKS:
        return _TEMPLATE_CHECKS[key]
    found = workload_problem(job, mode)
    if len(_TEMPLATE_CHECKS) >= _TEMPLATE_CHECKS_MAX:
        _TEMPLATE_CHECKS.clear()
    _TEMPLATE_CHECKS[key] = found
    return found


def _record(
    inp: PassInput, draft: _Draft, decision: Decision, out: PassOutput, view: ClusterView
) -> None:
    out.decisions.append(decision)
    job = draft.job
    if not decision.admitted:
        if _set_admitted(
            inp,
            draft,
            ConditionStatus.FALSE,
            decision.reason,
            decision.message,
        ):
            _decided(draft, decision_name(decision), decision.reason)
        return
    placement = Placement(
        nodes=[
            NodePlacement(
                node=part.node, gpu_indices=list(part.indices), gpu_uuids=list(part.uuids)
            )
            for part in decision.placement
        ],
        requested_gpus=decision.requested_gpus,
        admitted_gpus=decision.admitted_gpus or decision.requested_gpus,
        per_gpu_bytes=decision.per_gpu_bytes,
    ).model_dump(mode="json", by_alias=True)
    mode = inp.settings.packing.gpu_mode
    objects = tuple(
        build_workload(job, Admission(decision.placement, decision.per_gpu_bytes, mode))
    )
    name = (job.get("metadata") or {}).get("name") or ""
    draft.status["placement"] = placement
    found = inp.estimates.get(decision.job)
    if found is not None and found.plan is not None and found.estimate is not None:
        # Resized: the estimate, and the Estimated condition's message, at the count that
        # runs, so `kubectl get ftj` and `kubectl describe ftj` show one estimate.
        gpus = placement["admittedGPUs"]
        corrected = _correction(inp, job, found.plan, found.estimate, gpus, view)
        draft.apply(
            status_rules.admitted_estimate(
                found.plan,
                found.estimate,
                placement["admittedGPUs"],
                _generation(job),
                draft.status,
                inp.now,
                found.stored,
                learned.correction_status(corrected),
            )
        )
    draft.status["workloadRef"] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": workload_name(name),
    }
    draft.admission = True
    draft.urgent = True
    message = decision.message + "".join(
        f"; warning: {w}" for w in decision.warnings if w != decision.message
    )
    if _set_admitted(inp, draft, ConditionStatus.TRUE, decision.reason, message):
        _decided(draft, decision_name(decision), decision.reason)
    state = workload_state(None, ())
    draft.set_conditions(workload_conditions(state, _conditions(draft), _generation(job), inp.now))
    out.creates.append(CreateWorkload(draft.key, objects))


def _no_template(inp: PassInput, draft: _Draft, decision: Decision) -> None:
    """Admitted stays False; the advice (worded by `controller.decision.plan`) is the message."""
    message = decision.message
    if _set_admitted(inp, draft, ConditionStatus.FALSE, cond.REASON_NO_TEMPLATE, message):
        _decided(draft, ADVISE, cond.REASON_NO_TEMPLATE)


def decision_name(decision: Decision) -> str:
    """Admit, Resize, Queue, Reject, or Advise for an admission by policy Advise."""
    if decision.reason == cond.REASON_ADVISED:
        return ADVISE
    return decision.outcome.value
