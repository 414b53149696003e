"""The operator's one scheduling loop: snapshot, estimate, decide, assume, persist, create.

kopf's handlers only keep the caches (`caches.py`) and wake this loop; the loop alone writes
admission state, one pass at a time, so two decisions never race for the same free memory:

1. **Snapshot** the caches in one synchronous read (one moment's view), with this replica's
   own writes that the caches have not caught up with laid over them (below).
2. **Estimate** jobs not estimated at their current generation in worker threads (the
   event loop and the webhook must not wait), at most `estimate_workers` at once, cached by
   spec; a pass never waits for an estimate, the estimate's arrival wakes the next one. A
   traced estimate (profile Trace: seconds to a minute) runs on workers of its own, at most
   `trace_workers` at once, so formula estimates (milliseconds) never queue behind one; its
   job shows `Estimated=False, Tracing` meanwhile (with the traces queued ahead of it). What
   a trace found, or why it failed for good, is kept by digest (`estimate_digest`: the
   fields of the spec an estimate depends on, the model config and the estimator's code), so
   jobs that differ in anything else share one trace and a ConfigMap read again to the same
   config traces nothing. It is kept in the job's status too (`status.estimate.digest` and
   `.traced`) and read back, while the digest matches, instead of tracing again: after a
   restart, on a new leader, on a second replica. A queued trace whose jobs were deleted or
   edited meanwhile is skipped; a trace whose job's ConfigMap changed while it ran is not
   published: the job is estimated again from the new config.
3. **Decide** with the pure pass (`admission.admission_pass`) in a worker thread.
4. **Persist** status writes concurrently; an admission's write carries the job's
   resourceVersion, so a decision made on a stale snapshot fails (409) and is forgotten.
5. **Create** the workloads of the admissions whose write landed; delete those released.
   These run on their own threads while the next pass decides: the reservation is the
   status write, already landed, and a pass must not wait for 100 Job creates (and the
   pods they set off) before it decides the next jobs. A workload being created counts as
   there, so no pass creates it twice.

**Assume.** A write that landed is not in the caches until its watch event arrives. Until
then the pass uses the object the API server returned (`_fresh`: kept while the cached
object is still the one the write started from), so the next pass cannot admit another job
onto the same memory, nor create the workload twice.

**Leader.** Only the Lease holder runs passes (`leader.py`); when it becomes the holder it
lists every FineTuneJob from the API server before its first decision, so the ledger is what
the API holds, not what a cache had time to see.

**Metrics** (`metrics.py`): each pass leaves the state gauges' view of the jobs as the pass
left them (`metric_view.py`), built by the next scrape; a write's `Recorded` (a decision, a
job's end) is counted once it has landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

import kopf

from controller.admission import admission_pass as admission
from controller.admission import holds, kueue, learned, observed
from controller.admission import status as status_rules
from controller.admission.cluster import (
    ClusterObjects,
    finished,
    parse_time,
    reservation,
    snapshot_and_settled,
)
from controller.admission.failures import Failure, failure_of
from controller.admission.metric_view import Gauge, accuracy_series, metric_view
from controller.admission.traced import NotReadBack, read_back
from controller.api import conditions as cond
from controller.api.learnedcorrection import object_name
from controller.base.backoff import Backoff
from controller.base.clock import Clock, SystemClock
from controller.decision import AdmissionSettings
from controller.estimator import Estimate, SpecErrors, codec
from controller.jobs.profiles import trace_extra_installed
from controller.jobs.spec import (
    JobPlan,
    config_map_ref,
    estimate_digest,
    estimate_plan,
    needs_trace,
    translate,
)
from controller.kube import ApiError, Conflict, Gone, Kube, StaleWrite, read_model_config
from controller.learning import LearningSettings
from controller.operator.caches import Caches, slim_job, slim_kueue_workload, slim_learned
from controller.operator.identity import estimate_identity, trace_libraries
from controller.operator.leader import Leader
from controller.operator.metrics import ESTIMATE_SOURCES, OperatorMetrics
from controller.operator.settings import DEFAULTS
from controller.packing.view import ClusterView
from controller.webhook.trainjob import TrainJobHolds
from controller.workload import Remains

log = logging.getLogger("vramgate.scheduler")

#: How many cached estimates are kept, by spec: 1,000 jobs of one spec cost one estimate.
ESTIMATE_CACHE_SIZE = 4096
#: How many traces' outcomes are kept, by digest (an estimate, ~2 KiB, or a failure): far more
#: distinct traced estimates than a cluster waits on at once.
TRACE_CACHE_SIZE = 512
#: A job's Tracing condition expects its trace to take the median of the last this many.
TRACE_SECONDS_KEPT = 5
#: ... and this before any trace has ended here: a Llama-3.1-8B LoRA trace took 8.6 s in a
#: fresh process, imports included (BENCHMARKS.md, "Trace speed and memory"); a distributed
#: one at world size 8, 7.5 s; bigger models and longer sequences take longer.
DEFAULT_TRACE_S = 10.0
#: The metric's `source` of an estimate (`metrics.ESTIMATE_SOURCES`).
COMPUTED, REUSED = ESTIMATE_SOURCES
#: A workload create that failed is retried after about this many seconds, doubling per failure
#: up to CREATE_RETRY_MAX_S (`Backoff`, jittered): a template the API server refuses (422)
#: fails every time, and a retry on every pass would hammer it ten times a second.
CREATE_RETRY_S = 1.0
CREATE_RETRY_MAX_S = 300.0
#: Answers to a workload's create that the same object always gets (its pod template is
#: invalid): the job gives its GPUs back (InvalidTemplate) instead of retrying.
REFUSED_FOR_GOOD = (400, 422)
#: A missing workload's remains are read at most this often per job.
LOOKUP_INTERVAL_S = 5.0
#: A Workload whose check answer the API server refused for good is decided again after
#: this long (a minute: the log says why meanwhile; a change of ours cannot come sooner).
CHECK_REFUSED_S = 60.0
#: A LearnedCorrection this replica wrote is read from its write's answer, not the cache,
#: until the cache catches up or this many seconds pass (then the cache is right: a person
#: deleted it, say).
LEARNED_FRESH_S = 30.0
#: How often each replica looks for the TrainJobs of its holds (`check_holds`), and how
#: many tokens one listing's label selector names (its URL stays short).
HOLD_CHECK_S = 10.0
HOLD_TOKENS_PER_LIST = 100
#: Forgotten LearnedCorrections deleted per pass at most: the first pass after an upgrade
#: may find every old configuration's key, and admission must not wait on thousands.
FORGET_PER_PASS = 50
#: After a delete refused by RBAC, the time until the next try (one warning an hour).
FORGET_DENIED_S = 3600.0


@dataclass(frozen=True)
class SchedulerOptions:
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    #: A pass after this long without events: heartbeats going stale, starvation limits and
    #: ConfigMap retries need time to pass, not an event.
    resync_s: float = DEFAULTS.resync_seconds
    #: After an event, wait this long for more before a pass: 1,000 jobs created at once are
    #: decided in a few passes, not 1,000.
    debounce_s: float = 0.1
    estimate_workers: int = 2
    #: Traced estimates at once, on threads of their own (`OperatorSettings.trace_workers`).
    trace_workers: int = DEFAULTS.trace_workers
    write_workers: int = 16
    #: Workload creates and deletes, beside the status writes: fewer, so decisions come first.
    create_workers: int = 4
    configmap_retry_s: float = DEFAULTS.configmap_retry_seconds
    #: The namespaces the operator watches (none: all); a new leader relists only these.
    namespaces: tuple[str, ...] = ()
    #: How what finished jobs used corrects the next ones (`controller.learning`).
    learning: LearningSettings = field(default_factory=LearningSettings)
    #: Answer Kueue's AdmissionChecks (`controller.admission.kueue`), and how long a Workload
    #: that waits for memory is told to wait before Kueue asks again.
    kueue: bool = DEFAULTS.kueue_admission_check
    kueue_retry_s: int = DEFAULTS.kueue_retry_seconds


class Scheduler:
    def __init__(
        self,
        kube: Kube,
        options: SchedulerOptions,
        leader: Leader | None = None,
        now: Callable[[], datetime] = cond.now_utc,
        metrics: OperatorMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.kube = kube
        self.options = options
        self.leader = leader
        self.now = now
        self.metrics = metrics or OperatorMetrics()
        #: Intervals (retries, backoff, lookups, a pass's length): injected, so a test can
        #: move time instead of waiting for it.
        self.clock = clock or SystemClock()
        self.caches: Caches | None = None
        #: What the TrainJob webhook holds for TrainJobs it sized a moment ago (None: no
        #: TrainJob sizing, or no holds): charged in every pass and view, so a FineTuneJob
        #: does not take memory just promised to a TrainJob (`controller.admission.holds`).
        self.holds: TrainJobHolds | None = None
        self._context = contextvars.copy_context()
        self._wake = asyncio.Event()
        self._estimator = ThreadPoolExecutor(options.estimate_workers, "vramgate-estimate")
        self._tracer = ThreadPoolExecutor(options.trace_workers, "vramgate-trace")
        #: Traces queued or under way, by digest: two jobs of one estimate share one trace;
        #: in the order they were queued (how many are ahead of a new one).
        self._traces: dict[str, asyncio.Future[Estimate]] = {}
        #: digest -> the jobs (key, uid, generation) waiting for that trace: when its turn
        #: comes it runs only if one of them is still current (`_current`).
        self._waiting: dict[str, set[tuple[str, str, int]]] = {}
        #: job key -> (uid, generation) as the last pass saw it: a job deleted or edited since
        #: its trace was queued no longer wants it. Read from the trace workers.
        self._current: dict[str, tuple[str, int]] = {}
        #: What traces found, by digest: an estimate and how status keeps it, or the failure
        #: of a trace that fails for good (a ConfigMap job must not trace it again every
        #: configmap_retry_s). Written from the trace workers: under `_cache_lock`.
        self._by_digest: dict[str, tuple[Estimate, status_rules.Stored] | Failure] = {}
        #: The last traces' seconds: what a job's Tracing condition expects of its own.
        self._trace_seconds: deque[float] = deque(maxlen=TRACE_SECONDS_KEPT)
        #: What estimates depend on besides the spec and the model (`estimate_identity`).
        self._identity = estimate_identity()
        #: Whether this operator can trace (the trace extra is installed); a traced estimate
        #: kept in status is read back either way.
        self._can_trace = trace_extra_installed()
        #: The trace libraries' versions, kept with each traced estimate: an operator that can
        #: trace reads back only what libraries of its versions traced.
        self._libraries = trace_libraries()
        self._writer = ThreadPoolExecutor(options.write_workers, "vramgate-write")
        self._creator = ThreadPoolExecutor(options.create_workers, "vramgate-create")
        # Its own thread: a pass must not queue behind a trace estimate.
        self._decider = ThreadPoolExecutor(1, "vramgate-decide")
        self._estimates: dict[str, admission.Estimated] = {}  # job key -> for uid+generation
        self._estimate_uid: dict[str, str] = {}
        self._estimating: set[tuple[str, str, int]] = set()
        self._retry_at: dict[str, float] = {}
        self._by_spec: dict[str, tuple[JobPlan, Estimate, status_rules.Stored | None]] = {}
        #: `_by_spec` and `_by_digest` are written from worker threads of two pools.
        self._cache_lock = threading.Lock()
        self._fresh: dict[str, tuple[str, dict[str, Any]]] = {}
        #: Kueue Workloads whose check this replica answered, as `_fresh` keeps jobs.
        self._fresh_checks: dict[str, tuple[str, dict[str, Any]]] = {}
        #: Workload key -> (its uid, monotonic time until which it is not decided): its
        #: answer was refused for good (a 400 or 422).
        self._check_refused: dict[str, tuple[str, float]] = {}
        #: Workload uid -> the reason of the last answer said in an Event on its owner.
        self._said: dict[str, str] = {}
        #: Uids of the Workloads whose Job this replica sized and ungated (`_resize`).
        self._resized: set[str] = set()
        self._created: dict[str, str] = {}  # job key -> uid of the job whose workload we made
        self._creating: dict[str, str] = {}  # job key -> uid: its workload's create in flight
        #: job key -> (its failed creates' backoff, monotonic time of the next try)
        self._create_failures: dict[str, tuple[Backoff, float]] = {}
        #: Each job's latest create or delete: the next one for that job starts after it, so
        #: a suspension's delete never overtakes the create it must undo.
        self._workload_tasks: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._undeleted: dict[str, admission.DeleteWorkload] = {}  # to retry: a delete failed
        #: job key -> what its missing workload left behind, for the next pass (read once)
        self._remains: dict[str, Remains] = {}
        self._looking: set[str] = set()  # job keys whose remains are being read
        self._looked_at: dict[str, float] = {}  # job key -> monotonic time of its last read
        #: job key -> (job uid, uid of the batch Job created for it), until status records it
        self._workload_uids: dict[str, tuple[str, str]] = {}
        #: job key -> its workload, refused for good by the API server (a 400 or 422)
        self._refused: dict[str, admission.Refused] = {}
        self._last_written: dict[str, datetime] = {}
        self._peaks: dict[str, observed.Peaks] = {}  # job uid -> its GPUs' observed peaks
        self._families: dict[str, str] = {}  # job uid -> model family, from its estimate
        self._leading = False
        #: The webhooks' view: (the inventory it was built at, monotonic time built, view).
        self._view: tuple[int, float, ClusterView] | None = None
        self._view_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None  # kopf's: the caches are its
        self._inventory = 0
        self._viewer = ThreadPoolExecutor(1, "vramgate-view")
        #: LearnedCorrection name -> (resourceVersion the write started from, None for a
        #: create; the object it wrote; monotonic time of the write): `_learned_objects`.
        self._fresh_learned: dict[str, tuple[str | None, dict[str, Any], float]] = {}
        #: LearnedCorrection name -> the resourceVersion this replica deleted it at (forgotten).
        self._forgetting: dict[str, str] = {}
        self._forget_after = 0.0  # monotonic: no deletes before (denied by RBAC)
        #: Uids of jobs whose samples are counted under every key of their ladder, valid
        #: while the keys (their names and resets) are `_learned_signature` (`_learn`).
        self._counted_uids: set[str] = set()
        self._learned_signature: frozenset[tuple[str, datetime | None]] = frozenset()
        self.passes = 0
        self._decide_s = 0.0  # how long the last pass took to decide

    # -- what handlers call --------------------------------------------------------------

    def attach(self, caches: Caches, context: contextvars.Context) -> None:
        """The caches, and a handler's context: kopf posts Events only from its own."""
        if self.caches is None:
            self._loop = asyncio.get_running_loop()  # first: the webhook's thread reads both
            self.caches, self._context = caches, context
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    def inventory_changed(self) -> None:
        """A GPUNode or Node changed: the webhook's view is out of date."""
        self._inventory += 1
        self.wake()

    async def current_view(self, max_age_s: float | None = None) -> ClusterView | None:
        """The cluster as the caches hold it, for the webhook: rebuilt (in a worker thread,
        once for all the requests waiting on it) after a GPUNode or Node changed, so a job
        applied right after a node joins is judged against that node; with `max_age_s`,
        also once it is older than that, for a judgement on the free memory now (a TrainJob
        sized at create), which moves with every reading and is not rebuilt for.

        Called from the review server's own thread (`controller.webhook.server`) too: the
        current view is read as it is, a new one is built on kopf's loop."""
        loop = self._loop
        if self.caches is None or loop is None:
            return None
        cached = self._view
        if cached is not None and self._view_fresh(cached, max_age_s):
            return cached[2]
        if asyncio.get_running_loop() is not loop:
            built = asyncio.run_coroutine_threadsafe(self._current_view(max_age_s), loop)
            return await asyncio.wrap_future(built)
        return await self._current_view(max_age_s)

    def _view_fresh(self, cached: tuple[int, float, ClusterView], max_age_s: float | None) -> bool:
        seq, built_at, _ = cached
        young = max_age_s is None or self.clock.monotonic() - built_at <= max_age_s
        return seq == self._inventory and young

    async def _current_view(self, max_age_s: float | None = None) -> ClusterView | None:
        assert self.caches is not None
        async with self._view_lock:
            seq = self._inventory
            if self._view is not None and self._view_fresh(self._view, max_age_s):
                return self._view[2]
            built_at = self.clock.monotonic()  # before the caches are read
            objects, _, _ = self.caches.objects()  # on the loop: the caches are its
            objects.holds = () if self.holds is None else self.holds.active()
            now, packing = self.now(), self.options.admission.packing

            def build() -> ClusterView:
                taken, settled = snapshot_and_settled(objects, now)
                if self.holds is not None and settled:  # their pods' memory shows
                    self.holds.end(settled)
                view = ClusterView(taken, packing)
                view.empty  # noqa: B018 - built here, not on the event loop
                return view

            view = await asyncio.get_running_loop().run_in_executor(self._viewer, build)
            self._view = (seq, built_at, view)
            return view

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.options.resync_s)
            # At least as long as the last pass took to decide: with 1,000 jobs a pass costs
            # a few hundred ms of CPU, and every pod starting wakes the loop; deciding at most
            # half the time leaves the other half to the event loop and the API server.
            await asyncio.sleep(max(self.options.debounce_s, self._decide_s))
            self._wake.clear()
            if self.caches is None:
                continue
            leading = self.leader is None or self.leader.is_leader()
            if not leading:
                if self._leading:
                    self.metrics.clear_view()
                self._leading = False
                continue
            relist = not self._leading
            self._leading = True
            started = self.clock.monotonic()
            try:
                await self._pass(relist)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop admission for every other job
                log.exception("an admission pass failed; retrying")
                self._leading = False  # relist before the next decision
                await asyncio.sleep(1)
                self.wake()
            self.passes += 1
            log.debug("pass %d took %.3f s", self.passes, self.clock.monotonic() - started)

    async def close(self) -> None:
        self._estimator.shutdown(wait=False, cancel_futures=True)
        self._tracer.shutdown(wait=False, cancel_futures=True)
        for task in self._background:  # first: they hand work to the pools
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._creator.shutdown(wait=False, cancel_futures=True)
        self._decider.shutdown(wait=False, cancel_futures=True)
        self._viewer.shutdown(wait=False, cancel_futures=True)

    async def _pass(self, relist: bool) -> None:
        assert self.caches is not None
        loop = asyncio.get_running_loop()
        listed: list[dict[str, Any]] | None = None
        if relist:  # a new leader: the ledger as the API server holds it now
            fetched = await loop.run_in_executor(
                self._writer, self.kube.list_jobs, self.options.namespaces
            )
            listed = [slim_job(job) for job in fetched]
            self._fresh.clear()
        objects, workloads, job_pods = self.caches.objects(listed)
        objects.holds = () if self.holds is None else self.holds.active()
        if relist and objects.kueue_checks:  # Ready answers the cache may not have yet
            fetched_workloads = await loop.run_in_executor(
                self._writer, self.kube.list_kueue_workloads, self.options.namespaces
            )
            objects.kueue_workloads = {
                kueue.workload_key(w): slim_kueue_workload(w)
                for w in fetched_workloads
                if not (w.get("metadata") or {}).get("deletionTimestamp")
            }
            self._fresh_checks.clear()
        objects.jobs = {key: self._assumed(key, job) for key, job in objects.jobs.items()}
        for key, uid in list(self._created.items()):
            current = objects.jobs.get(key)
            if key in workloads or current is None or current["metadata"].get("uid") != uid:
                del self._created[key]
        checked, skip = self._checked(objects)
        estimated = {**objects.jobs, **checked}
        self._start_estimates(estimated)
        estimates = {
            key: found
            for key, found in self._estimates.items()
            if key in estimated and self._estimate_uid.get(key) == _uid(estimated[key])
        }
        keys = learned.key_states(self._learned_objects(), self.options.learning)
        # A workload we created (or are creating) but the cache has not seen is not missing.
        known = {**workloads, **{key: {} for key in [*self._created, *self._creating]}}
        inp = admission.PassInput(
            objects=objects,
            workloads=known,
            job_pods=job_pods,
            estimates=estimates,
            settings=self.options.admission,
            now=self.now(),
            last_written=self._last_written,
            peaks=self._peaks,
            remains=dict(self._remains),
            created={
                key: made
                for key, (uid, made) in self._workload_uids.items()
                if _uid(objects.jobs.get(key, {})) == uid
            },
            refused=dict(self._refused),
            learned=learned.records(keys),
            learning=self.options.learning,
            kueue_retry_seconds=self.options.kueue_retry_s,
            kueue_skip=frozenset(skip),
        )
        decided_at = self.clock.monotonic()
        out = await loop.run_in_executor(self._decider, self._decide, inp)
        self._decide_s = self.clock.monotonic() - decided_at
        log.debug(
            "decided %d jobs in %.3f s: %d writes, %d creates, %d deletes",
            len(objects.jobs), self._decide_s,
            len(out.writes), len(out.creates), len(out.deletes),
        )  # fmt: skip
        self._peaks = out.peaks
        for key, remains in inp.remains.items():  # each read is acted on once
            if self._remains.get(key) is remains:
                del self._remains[key]
        for key in [k for k, r in self._refused.items() if _uid(objects.jobs.get(k, {})) != r.uid]:
            del self._refused[key]
        for key in [k for k in self._looked_at if k not in objects.jobs]:
            del self._looked_at[key]
        for key, (uid, made) in list(self._workload_uids.items()):
            ref = (objects.jobs.get(key, {}).get("status") or {}).get("workloadRef") or {}
            if _uid(objects.jobs.get(key, {})) != uid or ref.get("uid") == made:
                del self._workload_uids[key]  # gone, or recorded in status
        self._look_up(out.lookups)
        for key, found in estimates.items():
            if key in objects.jobs and found.plan is not None and found.plan.shape is not None:
                self._families[_uid(objects.jobs[key])] = found.plan.shape.model_type
        landed = await self._carry_out(out, objects.jobs)
        if landed is None:
            return
        await self._answer(out.checks)
        await self._resize(out.resizes)
        left = replace(objects, jobs={**objects.jobs, **landed})
        keys = {**keys, **await self._learn(left.jobs.values(), keys)}
        keys = await self._forget(keys)
        learned_gauges = learned.gauges(keys, self.options.learning)
        uids = {_uid(job) for job in left.jobs.values()}
        for uid in [u for u in self._families if u not in uids]:
            del self._families[uid]
        packing, now, peaks = self.options.admission.packing, self.now(), out.peaks

        # Built by the scrape that reads it (in the server's thread), from this pass's data.
        def build() -> tuple[Gauge, ...]:
            self.metrics.expect_accuracy(accuracy_series(left, self.family))
            return (*metric_view(left, packing, now, peaks, self.family), *learned_gauges)

        self.metrics.set_view(build)

    # -- learning ----------------------------------------------------------------------------

    def _learned_objects(self) -> list[Mapping[str, Any]]:
        """The LearnedCorrections as cached, with this replica's own writes the cache has not
        caught up with laid over them (as `_assumed` does for jobs)."""
        assert self.caches is not None
        now = self.clock.monotonic()
        found: dict[str, Mapping[str, Any]] = {}
        for obj in self.caches.learned_objects():
            found[str(obj["metadata"]["name"])] = obj
        for name, deleted_version in list(self._forgetting.items()):
            if name not in found:
                del self._forgetting[name]  # the cache saw it go
            elif found[name]["metadata"].get("resourceVersion") == deleted_version:
                del found[name]  # deleted (`_forget`); the cache has not caught up
        for name, (before, after, at) in list(self._fresh_learned.items()):
            cached = found.get(name)
            version = None if cached is None else cached["metadata"].get("resourceVersion")
            if now - at > LEARNED_FRESH_S or (cached is not None and version != before):
                del self._fresh_learned[name]  # the cache has it (or something newer)
            else:
                found[name] = after
        return list(found.values())

    async def _learn(
        self, jobs: Iterable[Mapping[str, Any]], keys: Mapping[str, learned.KeyState]
    ) -> dict[str, learned.KeyState]:
        """File every ended job's sample under the keys that have not counted it, and write
        those keys (`controller.admission.learned`): the leader alone, after the pass's own
        writes, so a sample written with a job's end is filed in the same pass. Returns the
        keys it filed into (a write that failed is filed again by the next pass)."""
        settings = self.options.learning
        # Jobs whose samples every key of their ladder counted, while no key was deleted,
        # created or reset: not parsed again on every pass (10,000 finished jobs cost 0.5 s).
        signature = frozenset((name, state.reset_at) for name, state in keys.items())
        if signature != self._learned_signature:
            self._learned_signature, self._counted_uids = signature, set()
        taught = {  # by the sample's id: a job's end may file again in place of its
            # running sample (`learned.sample_id`)
            learned.sample_id(job): job
            for job in jobs
            if (job.get("status") or {}).get("learnedSample") is not None
        }
        self._counted_uids &= taught.keys()
        todo = [job for uid, job in taught.items() if uid not in self._counted_uids]
        if not todo:
            return {}
        loop = asyncio.get_running_loop()
        now = self.now()

        def file() -> dict[str, learned.KeyState]:  # a rebuild files thousands: not on the loop
            return learned.file_samples(keys, learned.samples_of(todo), settings, now)

        changed = await loop.run_in_executor(self._decider, file)
        if not changed:
            self._counted_uids.update(learned.sample_id(job) for job in todo)
            return {}

        async def write(state: learned.KeyState) -> None:
            obj, _ = learned.key_object(state, settings, now)
            name = obj["metadata"]["name"]
            status = learned.key_patch(state, settings, now)
            version = state.resource_version
            try:
                if not state.exists:
                    made = await loop.run_in_executor(self._writer, self.kube.create_learned, obj)
                    version = str(made["metadata"]["resourceVersion"])
                assert version is not None  # an existing key's state carries its own
                after = await loop.run_in_executor(
                    self._writer, self.kube.patch_learned_status, name, status, version
                )
            except (Conflict, Gone) as error:  # filed again on a fresh copy by the next pass
                log.info("learned correction %s not written (%s); again next pass", name, error)
                self.wake()
                return
            except Exception:
                log.exception("cannot write learned correction %s; again next pass", name)
                loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                return
            before = state.resource_version if state.exists else None
            self._fresh_learned[name] = (before, slim_learned(after), self.clock.monotonic())

        await asyncio.gather(*(write(state) for state in changed.values()))
        self.wake()  # a key that learned corrects the jobs still waiting
        return changed

    async def check_holds(self) -> None:
        """Every `HOLD_CHECK_S`, end the TrainJob holds whose TrainJob is not there (the API
        server refused its create after the webhook answered, or it was deleted) and name
        those made with generateName (`controller.admission.holds.looked_up`). Each replica
        checks its own holds, leader or not: they are its memory."""
        while self.holds is not None:
            await asyncio.sleep(HOLD_CHECK_S)
            try:
                await self.look_for_held()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the checks: the holds expire meanwhile
                log.exception("looking for the TrainJobs of the holds failed")

    async def look_for_held(self) -> list[str]:
        """One look of `check_holds`; the jobs of the holds it ended. A named hold whose
        token no TrainJob carries is looked for by its name before it ends: the TrainJob may
        have lost the label (replaced, or applied server-side without it), or be the first
        of two creates of that name, whose hold the second's replaced."""
        if self.holds is None:
            return []
        loop = asyncio.get_running_loop()
        by_namespace: dict[str, list[holds.Hold]] = {}
        for hold in holds.due(self.holds.active(), self.clock.monotonic()):
            by_namespace.setdefault(hold.namespace, []).append(hold)
        gone: list[str] = []
        for namespace, held in by_namespace.items():
            found: dict[str, str] = {}
            try:
                for start in range(0, len(held), HOLD_TOKENS_PER_LIST):
                    tokens = [hold.token for hold in held[start : start + HOLD_TOKENS_PER_LIST]]
                    found |= await loop.run_in_executor(
                        self._writer, self.kube.held_trainjobs, namespace, holds.HOLD_LABEL, tokens
                    )
                missing, named = holds.looked_up(held, found)
                by_job = {hold.job: hold for hold in held}
                ended = []
                for job in missing:
                    name = by_job[job].name
                    if not name or not await loop.run_in_executor(
                        self._writer, self.kube.trainjob_exists, namespace, name
                    ):
                        ended.append(job)
            except Exception as error:  # they expire meanwhile, as before the check
                log.warning("cannot list the TrainJobs held in %s: %s", namespace, error)
                continue
            self.holds.end(ended)
            self.holds.name(named)
            gone.extend(ended)
        if gone:
            log.info("ended %d TrainJob holds: their TrainJobs are not there", len(gone))
            self.inventory_changed()  # no view charges them from now, even one being built
        return gone

    async def _forget(self, keys: Mapping[str, learned.KeyState]) -> dict[str, learned.KeyState]:
        """Delete the configurations' keys no job has taught for long (`learned.forgotten`),
        at most `FORGET_PER_PASS` a pass, each at the resourceVersion it was judged at; the
        keys without those deleted."""
        if self.clock.monotonic() < self._forget_after:
            return dict(keys)
        found = learned.forgotten(keys, self.now())[:FORGET_PER_PASS]
        loop = asyncio.get_running_loop()

        async def delete(state: learned.KeyState) -> str | None:
            name, version = object_name(state.key), str(state.resource_version)
            try:
                await loop.run_in_executor(self._writer, self.kube.delete_learned, name, version)
            except Conflict:  # written since it was read (this pass's own filing, or another
                return None  # replica's): judged again on the next pass
            except ApiError as error:
                if error.status == 403:  # RBAC without delete: say so once an hour
                    self._forget_after = self.clock.monotonic() + FORGET_DENIED_S
                log.warning("cannot delete forgotten learned correction %s: %s", name, error)
                return None
            except Exception:
                log.exception("cannot delete forgotten learned correction %s", name)
                return None
            log.info("forgot learned correction %s (no sample for long)", name)
            self._forgetting[name] = version
            self._fresh_learned.pop(name, None)
            return state.key.name

        deleted = set(await asyncio.gather(*(delete(state) for state in found)))
        return {name: state for name, state in keys.items() if name not in deleted}

    def _decide(self, inp: admission.PassInput) -> admission.PassOutput:
        started = time.perf_counter()
        out = admission.admission_pass(inp)
        self.metrics.observe_pass(time.perf_counter() - started)
        return out

    def family(self, job: Mapping[str, Any]) -> str:
        """The job's model family (config.json's model_type): from its estimate when this
        process made one, else from its spec."""
        found = self._families.get(_uid(job))
        return found if found is not None else observed.spec_family(job.get("spec") or {})

    def _assumed(self, key: str, job: Mapping[str, Any]) -> Mapping[str, Any]:
        fresh = self._fresh.get(key)
        if fresh is None:
            return job
        before, after = fresh
        if job["metadata"].get("resourceVersion") == before and _uid(job) == _uid(after):
            return after  # the cache has not seen our write yet
        del self._fresh[key]
        return job

    # -- Kueue's AdmissionChecks (`controller.admission.kueue`) --------------------------------

    def _checked(self, objects: ClusterObjects) -> tuple[dict[str, dict[str, Any]], set[str]]:
        """Lay this replica's check answers the cache has not seen over the cached Workloads;
        the jobs of those whose check (or size) waits for vramgate, to estimate, and the keys
        of those not to decide this pass (answer refused for good; sized already)."""
        workloads: dict[str, Mapping[str, Any]] = {}
        for key, workload in objects.kueue_workloads.items():
            fresh = self._fresh_checks.get(key)
            if fresh is not None:
                before, after = fresh
                version = workload["metadata"].get("resourceVersion")
                if version == before and _uid(workload) == _uid(after):
                    workload = after  # the cache has not seen our answer yet
                else:
                    del self._fresh_checks[key]
            workloads[key] = workload
        for key in [k for k in self._fresh_checks if k not in workloads]:
            del self._fresh_checks[key]
        uids = {_uid(w) for w in workloads.values()}
        for uid in [u for u in self._said if u not in uids]:
            del self._said[uid]
        objects.kueue_workloads = workloads
        now = self.clock.monotonic()
        for key in [k for k, (_, until) in self._check_refused.items() if until <= now]:
            del self._check_refused[key]
        for uid in [u for u in self._resized if u not in uids]:
            self._resized.discard(uid)
        jobs, skip = {}, set()
        for key, workload in workloads.items():
            uid = _uid(workload)
            # Refused for good: not decided again for a while. Sized already: not again
            # until the cache sees its gate gone (Kueue updates the Workload in place, and
            # copies the Job's gate over at its next reconcile).
            sized = kueue.to_resize(workload) and uid in self._resized
            if self._check_refused.get(key, ("", 0.0))[0] == uid or sized:
                skip.add(key)
            elif kueue.to_resize(workload) or kueue.to_decide(workload, objects.kueue_checks):
                with contextlib.suppress(kueue.CheckProblem):  # answered by the pass
                    jobs[key] = kueue.check_job(workload, objects.kueue_flavors)
        return jobs, skip

    async def _answer(self, writes: Sequence[kueue.CheckWrite]) -> None:
        """Apply each check's answer to its Workload; assumed, once landed, until the cache
        has it. A write refused (the Workload changed: 409) is decided again."""
        loop = asyncio.get_running_loop()

        async def answer(w: kueue.CheckWrite) -> None:
            try:
                after = await loop.run_in_executor(
                    self._writer,
                    self.kube.apply_check,
                    w.namespace,
                    w.name,
                    w.entry,
                    w.resource_version,
                )
            except (Conflict, Gone) as error:
                log.info("[%s] check %s not answered (%s); deciding again", w.key, w.check, error)
                self.wake()
                return
            except ApiError as error:
                if error.status not in REFUSED_FOR_GOOD:
                    log.warning("[%s] check %s not answered: %s", w.key, w.check, error.reason)
                    loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                    return
                # The same answer would be refused on every pass: not decided again for a
                # while (a bug of ours, or a Kueue that validates differently: said in the log).
                log.error("[%s] check %s refused by the API server: %s", w.key, w.check,
                          error.reason)  # fmt: skip
                until = self.clock.monotonic() + CHECK_REFUSED_S
                self._check_refused[w.key] = (w.uid, until)
                loop.call_later(CHECK_REFUSED_S, self.wake)
                return
            except Exception:
                log.exception("[%s] check %s not answered; deciding again", w.key, w.check)
                loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                return
            self._fresh_checks[w.key] = (str(w.resource_version), slim_kueue_workload(after))
            log.info("[%s] check %s: %s (%s)", w.key, w.check, w.entry["state"], w.reason)
            # Counted, and said on the Workload's owner (Kueue resets a Retry or Rejected
            # entry, message too, to Pending at once), once per reason, as a FineTuneJob's
            # decision is: a Workload Kueue asks about every kueueRetrySeconds is one decision.
            if self._said.get(w.uid) == w.reason:
                return
            self._said[w.uid] = w.reason
            decision = kueue.DECISION.get(w.entry["state"])
            if decision is not None:
                self.metrics.decisions.labels(decision, w.reason).inc()
            if w.event is not None and w.owner is not None:
                self._context.run(
                    kopf.event, cast(Any, w.owner),
                    type="Warning" if w.rejected else "Normal", reason=w.reason, message=w.event,
                )  # fmt: skip

        await asyncio.gather(*(answer(w) for w in writes))

    async def _resize(self, writes: Sequence[kueue.ResizeWrite]) -> None:
        """Rewrite each gated Job's GPU count and remove vramgate's gate (`kueue.ResizeWrite`);
        said in an Event on the Job."""
        loop = asyncio.get_running_loop()

        def patch(w: kueue.ResizeWrite) -> None:
            self.kube.resize_job(
                w.namespace, w.name, w.uid, w.gates_before, w.gates, w.container, w.gpus,
                w.parts,
            )  # fmt: skip

        async def resize(w: kueue.ResizeWrite) -> None:
            try:
                await loop.run_in_executor(self._writer, patch, w)
            except (Gone, StaleWrite) as error:  # changed or gone since read: read it again
                log.info("[%s] Job %s not sized (%s); read again", w.key, w.name, error)
                loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                return
            except ApiError as error:
                if error.status not in (400, 403, 422) or w.gpus is None:
                    log.warning("[%s] Job %s not sized: %s", w.key, w.name, error.reason)
                    loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                    return
                # Its resources may not change (a cluster without mutable resources of
                # suspended Jobs, a policy): the gate goes as it is, and the Job says why.
                w = replace(w, container=None, gpus=None, parts=(), reason="NotResized",
                            message=f"not resized: the API server refused the new GPU count "
                            f"({error.reason}); its gate is removed as it is")  # fmt: skip
                try:
                    await loop.run_in_executor(self._writer, patch, w)
                except Exception as again:
                    log.warning("[%s] Job %s not ungated: %s", w.key, w.name, again)
                    loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                    return
            except Exception as error:
                log.warning("[%s] Job %s not sized (%s); again next pass", w.key, w.name, error)
                loop.call_later(LOOKUP_INTERVAL_S, self.wake)
                return
            self._resized.add(w.workload_uid)
            log.info("[%s] Job %s: %s", w.key, w.name, w.message)
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": w.name, "namespace": w.namespace, "uid": w.uid},
            }
            kind = "Warning" if w.gpus is None else "Normal"
            self._context.run(
                kopf.event, cast(Any, job), type=kind, reason=w.reason, message=w.message
            )  # fmt: skip

        await asyncio.gather(*(resize(w) for w in writes))

    async def activate(self, name: str) -> None:
        """Set the AdmissionCheck's Active condition, which Kueue waits for before it uses
        the check (`kueue.active_condition`)."""
        loop = asyncio.get_running_loop()
        condition = kueue.active_condition(self.now())
        try:
            await loop.run_in_executor(
                self._writer, self.kube.apply_check_condition, name, condition
            )
        except Exception:
            log.exception("AdmissionCheck %s: cannot set Active; again on its next event", name)

    # -- estimates -------------------------------------------------------------------------

    def _start_estimates(self, jobs: Mapping[str, Mapping[str, Any]]) -> None:
        now = self.clock.monotonic()
        for key in [k for k in self._estimates if k not in jobs]:
            del self._estimates[key]
        for key in [k for k in self._estimate_uid if k not in jobs]:
            del self._estimate_uid[key]
        for key in [k for k in self._retry_at if k not in jobs]:
            del self._retry_at[key]
        self._current = {
            key: (_uid(job), int((job.get("metadata") or {}).get("generation") or 0))
            for key, job in jobs.items()
        }
        for key, job in jobs.items():
            meta = job.get("metadata") or {}
            uid, generation = str(meta.get("uid")), int(meta.get("generation") or 0)
            found = self._estimates.get(key)
            current = (
                found is not None
                and found.generation == generation
                and self._estimate_uid.get(key) == uid
            )
            # A model in a ConfigMap can change under the same spec: while the job waits (and
            # is not suspended), its ConfigMap is read again every configmap_retry_s (an
            # unchanged one hits the estimate caches, a trace's failure included), so a fixed
            # config ends an InvalidSpec and a changed one is not admitted on its old estimate.
            spec = job.get("spec") or {}
            recheck = config_map_ref(spec) is not None and not spec.get("suspend")
            if (
                current
                and not recheck
                and (found is None or found.failure is None or found.failure.retry_s is None)
            ):
                continue
            if current and now < self._retry_at.get(key, 0):
                continue
            if (key, uid, generation) in self._estimating or _settled(job):
                continue
            self._estimating.add((key, uid, generation))
            asyncio.get_running_loop().create_task(self._estimate(key, uid, generation, job))

    async def _estimate(self, key: str, uid: str, generation: int, job: Mapping[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        self._current.setdefault(key, (uid, generation))
        try:
            found = await loop.run_in_executor(self._estimator, self._estimate_now, job)
            while isinstance(found, _ToTrace):
                # Said on the job while it runs (the pass writes Tracing); decided once traced.
                about, measured = self._trace_expectation()
                tracing = status_rules.Tracing(
                    self.now(), about, measured, self._ahead(found.digest),
                    self.options.trace_workers,
                )  # fmt: skip
                self._estimates[key] = admission.Estimated(
                    generation, plan=found.plan, tracing=tracing
                )
                self._estimate_uid[key] = uid
                self.wake()
                traced = await self._traced(found, (key, uid, generation))
                if config_map_ref(job.get("spec") or {}) is None:
                    found = traced
                    break
                # Its ConfigMap may have changed while it traced: read it again; unchanged, the
                # trace just kept is found by digest, changed, the new config is estimated.
                found = await loop.run_in_executor(self._estimator, self._estimate_now, job)
                if isinstance(found, _ToTrace):
                    log.info("[%s] its ConfigMap changed during the trace; estimating again", key)
        except _Unwanted:  # deleted or edited while its trace was queued: nothing to record
            log.info("[%s] its trace was skipped: the job was deleted or changed", key)
            return
        except Exception as error:  # every failure is recorded on the job
            failure = failure_of(error, temporary_retry_s=self.options.configmap_retry_s)
            if failure.is_bug:
                log.error("[%s] the estimator failed on a valid spec", key, exc_info=error)
            found = admission.Estimated(generation, failure=failure)
        finally:
            self._estimating.discard((key, uid, generation))
        found = replace(found, generation=generation)
        previous = self._estimates.get(key), self._estimate_uid.get(key)
        self._estimates[key] = found
        self._estimate_uid[key] = uid
        if found.failure is not None and found.failure.retry_s is not None:
            self._retry_at[key] = self.clock.monotonic() + found.failure.retry_s
            loop.call_later(found.failure.retry_s, self.wake)
        elif config_map_ref(job.get("spec") or {}) is not None:
            self._retry_at[key] = self.clock.monotonic() + self.options.configmap_retry_s
        if (found, uid) != previous:
            self.wake()  # a ConfigMap read again to the same estimate changes no decision

    def _estimate_now(self, job: Mapping[str, Any]) -> admission.Estimated | _ToTrace:
        """In a worker thread: read the ConfigMap if named, translate, estimate (cached); a
        traced estimate is read back from the job's status where its digest matches, else
        handed back to be traced on the trace workers (`_ToTrace`)."""
        spec = job.get("spec") or {}
        namespace = (job.get("metadata") or {}).get("namespace") or "default"
        config = None
        ref = config_map_ref(spec)
        if ref is not None:
            config = read_model_config(self.kube.core, namespace, ref)
        cache_key = hashlib.sha256(
            json.dumps([spec, config], sort_keys=True, default=str).encode()
        ).hexdigest()
        hit = self._by_spec.get(cache_key)
        if hit is not None:
            return admission.Estimated(0, plan=hit[0], estimate=hit[1], stored=hit[2])
        plan, errors = translate(dict(spec), config)
        if plan is None:
            raise SpecErrors(errors)
        if needs_trace(plan):
            digest = estimate_digest(spec, config, self._identity)
            outcome = self._by_digest.get(digest)
            if isinstance(outcome, Failure):  # it failed for good: the same input fails again
                return admission.Estimated(0, failure=outcome)
            if outcome is not None:  # traced for another job of the same estimate
                self._keep(cache_key, plan, *outcome)
                return admission.Estimated(0, plan=plan, estimate=outcome[0], stored=outcome[1])
            reused = read_back(job, digest, self._libraries if self._can_trace else None)
            if isinstance(reused, NotReadBack):
                if reused.why:
                    say = log.warning if reused.suspect else log.info
                    say("[%s] %s; tracing again", _key(job), reused.why)
                if not self._can_trace:  # ProfileUnavailable now, not a Tracing that ends so
                    estimate_plan(plan)
                return _ToTrace(plan, digest, cache_key)
            est, stored = reused
            self.metrics.count_estimate(est.profile, REUSED)
            log.info("[%s] traced estimate reused from status (digest %s)", _key(job), digest[:12])
        else:
            started = time.perf_counter()
            est, stored = estimate_plan(plan), None
            self.metrics.observe_estimate(est.profile, time.perf_counter() - started)
            self.metrics.count_estimate(est.profile, COMPUTED)
        self._keep(cache_key, plan, est, stored)
        return admission.Estimated(0, plan=plan, estimate=est, stored=stored)

    def _keep(
        self, cache_key: str, plan: JobPlan, est: Estimate, stored: status_rules.Stored | None
    ) -> None:
        with self._cache_lock:  # from the estimate and the trace workers both
            if len(self._by_spec) >= ESTIMATE_CACHE_SIZE:
                self._by_spec.pop(next(iter(self._by_spec)), None)
            self._by_spec[cache_key] = (plan, est, stored)

    def _keep_trace(
        self, digest: str, outcome: tuple[Estimate, status_rules.Stored] | Failure
    ) -> None:
        with self._cache_lock:
            if len(self._by_digest) >= TRACE_CACHE_SIZE:
                self._by_digest.pop(next(iter(self._by_digest)), None)
            self._by_digest[digest] = outcome

    def _ahead(self, digest: str) -> int:
        """How many traces are queued or running before the trace of `digest` (all of those
        under way where it is not queued yet)."""
        order = list(self._traces)
        return order.index(digest) if digest in order else len(order)

    async def _traced(self, todo: _ToTrace, waiter: tuple[str, str, int]) -> admission.Estimated:
        """Trace `todo` on the trace workers (or wait for the trace of its digest already
        queued), for the job `waiter` (key, uid, generation), and keep what it found."""
        self._waiting.setdefault(todo.digest, set()).add(waiter)
        running = self._traces.get(todo.digest)
        # A trace that has finished but whose callback has not run yet (it runs on the loop's
        # next turn) is not joined: a skipped one would raise at once, and asking again
        # before the loop turns would find it again, without end.
        if running is None or running.done():
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(self._tracer, self._trace_now, todo)

            def done(finished: object) -> None:
                if self._traces.get(todo.digest) is finished:  # not a newer trace's
                    del self._traces[todo.digest]
                    self._waiting.pop(todo.digest, None)

            self._traces[todo.digest] = running
            running.add_done_callback(done)
        try:
            est = await asyncio.shield(running)
        except _Unwanted:
            key, uid, generation = waiter
            if self._current.get(key) != (uid, generation):
                raise
            # It joined a trace that was skipped as it did: queue its own.
            return await self._traced(todo, waiter)
        stored = status_rules.Stored(todo.digest, codec.encode(est, self._libraries))
        self._keep(todo.cache_key, todo.plan, est, stored)
        return admission.Estimated(0, plan=todo.plan, estimate=est, stored=stored)

    def _wanted(self, digest: str) -> bool:
        """Whether a job waiting for the trace of `digest` is still at the uid and generation
        it was when it asked (`_current`, as the last pass saw the jobs)."""
        waiting = list(self._waiting.get(digest, ()))
        current = self._current
        return any(current.get(key) == (uid, generation) for key, uid, generation in waiting)

    def _trace_now(self, todo: _ToTrace) -> Estimate:
        """In a trace worker, when the trace's turn comes: the traced estimate, timed (the
        next jobs' Tracing says it), kept by digest with a failure for good; skipped
        (`_Unwanted`) when no job wants it any more."""
        if not self._wanted(todo.digest):
            raise _Unwanted(todo.digest)
        plan = todo.plan
        started = time.perf_counter()
        try:
            est = estimate_plan(plan)
        except Exception as error:
            failure = failure_of(error, temporary_retry_s=self.options.configmap_retry_s)
            if failure.retry_s is None:  # the same input fails the same way
                self._keep_trace(todo.digest, failure)
            raise
        self._keep_trace(
            todo.digest, (est, status_rules.Stored(todo.digest, codec.encode(est, self._libraries)))
        )
        seconds = time.perf_counter() - started
        self._trace_seconds.append(seconds)
        self.metrics.observe_estimate(est.profile, seconds)
        self.metrics.count_estimate(est.profile, COMPUTED)
        log.info("traced %s in %.1f s", plan.model, seconds)
        return est

    def _trace_expectation(self) -> tuple[float, int]:
        """About how long a trace takes here: the median of the last traces' seconds, and
        how many; before any, DEFAULT_TRACE_S and 0."""
        seen = list(self._trace_seconds)
        return (statistics.median(seen), len(seen)) if seen else (DEFAULT_TRACE_S, 0)

    # -- missing workloads -------------------------------------------------------------------

    async def _record_workload_uid(self, c: admission.CreateWorkload, made: str) -> None:
        """The created Job's uid into status.workloadRef at once: if it goes missing from now
        on, it was deleted, and is never created again, even by a restarted operator. Until
        this lands (or if it fails) the pass has it from `_workload_uids`, and records it
        itself once its cache holds the Job."""
        job = next(o for o in c.objects if o["kind"] == "Job")["metadata"]
        owner = c.key.split("/", 1)[1]
        try:
            await asyncio.get_running_loop().run_in_executor(
                self._writer,
                self.kube.record_workload_uid,
                job["namespace"],
                owner,
                job["name"],
                made,
            )
        except Exception as error:  # recorded by a later pass instead
            log.info("[%s] cannot record the uid of Job %s yet: %s", c.key, job["name"], error)

    def _look_up(self, lookups: Sequence[admission.LookUp]) -> None:
        """Read what each missing workload left behind, in the background; the read's arrival
        wakes the pass that acts on it. A job's are read at most every LOOKUP_INTERVAL_S (a
        cache that lags behind a Job that exists would ask on every pass)."""
        now = self.clock.monotonic()
        for lookup in lookups:
            key = lookup.key
            last = self._looked_at.get(key)
            if key in self._looking or (last is not None and now < last + LOOKUP_INTERVAL_S):
                continue
            self._looking.add(key)
            self._looked_at[key] = now
            task = asyncio.get_running_loop().create_task(self._read_remains(lookup))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _read_remains(self, lookup: admission.LookUp) -> None:
        loop = asyncio.get_running_loop()
        try:
            exists, events = await loop.run_in_executor(
                self._creator,
                self.kube.workload_remains,
                lookup.namespace,
                lookup.name,
                lookup.uid,
                lookup.workload_uid,
            )
        except Exception:
            log.exception("[%s] cannot read what workload %s left behind", lookup.key, lookup.name)
            loop.call_later(LOOKUP_INTERVAL_S, self.wake)
            return
        finally:
            self._looking.discard(lookup.key)
        self._remains[lookup.key] = Remains(lookup.uid, lookup.name, exists, tuple(events))
        self.wake()

    # -- carrying out a pass ----------------------------------------------------------------

    def _start(
        self,
        key: str,
        work: Callable[[asyncio.Task[None] | None], Coroutine[Any, Any, None]],
    ) -> None:
        """Run `work` in the background, after the job's previous create or delete."""
        before = self._workload_tasks.get(key)
        task = asyncio.get_running_loop().create_task(work(before))
        self._workload_tasks[key] = task
        self._background.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._background.discard(finished)
            if self._workload_tasks.get(key) is finished:
                del self._workload_tasks[key]

        task.add_done_callback(done)

    async def _carry_out(
        self, out: admission.PassOutput, jobs: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Mapping[str, Any]] | None:
        """Write, then start the creates and deletes (not awaited: see the module's step 5);
        the jobs whose status write landed, as written (None: the pass was dropped)."""
        loop = asyncio.get_running_loop()
        if self.leader is not None and not self.leader.is_leader():
            log.warning("lost the lease during a pass: its decisions are dropped")
            return None
        after_writes: dict[str, Mapping[str, Any]] = {}

        async def write(w: admission.StatusWrite) -> bool:
            job = jobs[w.key]
            meta = job["metadata"]
            try:
                after = await loop.run_in_executor(
                    self._writer,
                    self.kube.patch_job_status,
                    meta["namespace"],
                    meta["name"],
                    w.patch,
                    w.resource_version,
                )
            except (Conflict, Gone) as error:
                log.info("[%s] status write dropped (%s); deciding again", w.key, error)
                self.wake()
                return False
            except Exception:
                log.exception("[%s] status write failed; deciding again", w.key)
                self.wake()
                return False
            slim = slim_job(after)
            self._fresh[w.key] = (str(meta.get("resourceVersion")), slim)
            after_writes[w.key] = slim
            self._last_written[w.key] = self.now()
            if w.recorded is not None:
                self.metrics.landed(
                    w.uid, w.recorded, parse_time(meta.get("creationTimestamp")), self.now(),
                    self.family(job),
                )  # fmt: skip
            for event in w.events:
                self._context.run(
                    kopf.event,
                    cast(Any, after),
                    type=event.type,
                    reason=event.reason,
                    message=event.message,
                )
            return True

        # Releases land before admissions (`admission.StatusWrite.releases`).
        landed: dict[str, bool] = {}
        releases = [w for w in out.writes if w.releases]
        for batch in (releases, [w for w in out.writes if not w.releases]):
            results = await asyncio.gather(*(write(w) for w in batch))
            landed.update(zip([w.key for w in batch], results, strict=True))

        async def create(
            c: admission.CreateWorkload,
            uid: str,
            generation: int,
            before: asyncio.Task[None] | None,
        ) -> None:
            try:
                await _after(before)
                made: str | None = None  # the batch Job's uid, when this create made it
                for obj in c.objects:
                    try:
                        answer = await loop.run_in_executor(self._creator, self.kube.create, obj)
                        if obj["kind"] == "Job":
                            made = (answer.get("metadata") or {}).get("uid")
                    except Conflict:
                        # Made by an earlier pass or replica (names are deterministic), or
                        # the name is someone else's object, which is no workload of this job.
                        try:
                            owners = await loop.run_in_executor(
                                self._creator, self.kube.owners, obj
                            )
                        except Exception as error:
                            self._create_failed(c.key, obj, error, jobs.get(c.key))
                            return
                        if uid not in {str(o.get("uid")) for o in owners}:
                            taken = NameTaken(obj, owners)
                            self._create_failed(c.key, obj, taken, jobs.get(c.key))
                            return
                    except ApiError as error:
                        if error.status in REFUSED_FOR_GOOD:
                            refused = admission.Refused(uid, generation, str(error.reason))
                            self._refused[c.key] = refused
                            log.warning("[%s] %s refused: %s", c.key, obj["kind"], error.reason)
                            self.wake()
                        else:
                            self._create_failed(c.key, obj, error, jobs.get(c.key))
                        return
                    except Exception as error:
                        self._create_failed(c.key, obj, error, jobs.get(c.key))
                        return
                self._created[c.key] = uid
                self._create_failures.pop(c.key, None)
                if made:
                    self._workload_uids[c.key] = (uid, made)
                    await self._record_workload_uid(c, made)
            finally:
                self._creating.pop(c.key, None)

        async def delete(d: admission.DeleteWorkload, before: asyncio.Task[None] | None) -> None:
            await _after(before)
            failed = False
            for obj in d.objects:
                try:
                    await loop.run_in_executor(self._creator, self.kube.delete, obj)
                except Exception:
                    log.exception("[%s] cannot delete %s; retrying", d.key, obj["kind"])
                    failed = True
            self._created.pop(d.key, None)
            if failed:
                self._undeleted[d.key] = d
            else:
                self._undeleted.pop(d.key, None)
            self.wake()  # a workload gone: re-admitted meanwhile, it is created again

        # A delete that failed is retried while its job is still not admitted (admitted again,
        # the names are its new workload's); a job gone takes its workload with it (owner).
        for key in [k for k in self._undeleted if k not in jobs or _admitted(jobs[k])]:
            del self._undeleted[key]
        deleting = {d.key for d in out.deletes}
        retries = [d for key, d in self._undeleted.items() if key not in deleting]
        for d in [*out.deletes, *retries]:
            if landed.get(d.key, True):
                self._start(d.key, functools.partial(delete, d))
        # A job no longer waiting for its workload (suspended, deleted, no longer admitted)
        # starts afresh: once fixed and resumed, its create is not minutes away.
        waiting = {c.key for c in out.creates} | set(self._creating)
        for key in [k for k in self._create_failures if k not in waiting]:
            del self._create_failures[key]
        for c in out.creates:
            job = jobs.get(c.key)
            if job is None or c.key in self._creating or (c.after_write and not landed.get(c.key)):
                continue
            failed = self._create_failures.get(c.key)
            if failed is not None and failed[1] > self.clock.monotonic():
                continue  # backing off: `_create_failed` wakes a pass when it is time
            uid = self._creating[c.key] = _uid(job)
            generation = admitted_generation(after_writes.get(c.key, job))
            self._start(c.key, functools.partial(create, c, uid, generation))
        for key in [k for k in self._last_written if k not in jobs]:
            del self._last_written[key]
        return after_writes

    def _create_failed(
        self, key: str, obj: Mapping[str, Any], error: Exception, job: Mapping[str, Any] | None
    ) -> None:
        """Back off before the next try, and say why on the FineTuneJob: a Warning Event
        (`kubectl describe`) with the API server's message, one per try."""
        failed = self._create_failures.get(key)
        backoff = failed[0] if failed else Backoff(CREATE_RETRY_S, CREATE_RETRY_MAX_S)
        delay = backoff.next_delay()
        self._create_failures[key] = (backoff, self.clock.monotonic() + delay)
        what = f"{obj['kind']} {obj['metadata'].get('name')}"
        reason: str | None = None
        if isinstance(error, ApiError):
            reason = error.reason
        elif isinstance(error, NameTaken):
            reason = str(error)
        if reason:  # the API server refused it: its message says why, no traceback needed
            log.warning("[%s] cannot create %s: %s; retrying in %.0f s", key, what, reason, delay)
        else:
            log.exception("[%s] cannot create %s; retrying in %.0f s", key, what, delay)
        if job is not None:
            self._context.run(
                kopf.event,
                cast(Any, job),
                type="Warning",
                reason=cond.REASON_WORKLOAD_NOT_CREATED,
                message=f"cannot create {what}: {reason or error}; retrying in {delay:.0f} s",
            )
        asyncio.get_running_loop().call_later(delay, self.wake)


class NameTaken(Exception):
    """The workload's name belongs to an object this job does not own: most often the
    workload of an earlier FineTuneJob of the same name, deleted a moment ago and not yet
    collected (delete and apply again is how a finished job is rerun), else someone else's."""

    def __init__(self, obj: Mapping[str, Any], owners: Sequence[Mapping[str, Any]]) -> None:
        meta = obj["metadata"]
        what = f"a {obj['kind']} named {meta['name']}"
        earlier = any(
            o.get("kind") == "FineTuneJob" and o.get("name") == _owner_name(obj) for o in owners
        )
        super().__init__(
            f"{what} of an earlier FineTuneJob of this name is still being deleted"
            if earlier
            else f"{what} already exists in {meta['namespace']} and is not this "
            "FineTuneJob's; delete or rename it (its GPUs stay reserved meanwhile)"
        )


class _Unwanted(Exception):
    """A queued trace whose jobs were all deleted or edited before its turn came."""


@dataclass(frozen=True)
class _ToTrace:
    """A job whose estimate is to be traced: its plan, the digest of what the estimate is
    computed from, and the key of the estimate cache."""

    plan: JobPlan
    digest: str
    cache_key: str


def _key(job: Mapping[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _owner_name(obj: Mapping[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs[0].get("name") if refs else None


async def _after(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        await asyncio.wait({task})


def _admitted(job: Mapping[str, Any]) -> bool:
    return reservation(job, []) is not None


def _uid(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("uid"))


def admitted_generation(job: Mapping[str, Any]) -> int:
    """The generation a job was admitted at (its workload is built from that spec)."""
    status = job.get("status") or {}
    admitted = cond.find_condition(status.get("conditions") or [], cond.ADMITTED) or {}
    at = admitted.get("observedGeneration")
    return int(at if at is not None else (job.get("metadata") or {}).get("generation") or 0)


def _settled(job: Mapping[str, Any]) -> bool:
    """Admitted (its estimate is in status and its spec locked) or finished: no estimate."""
    return finished(job) or _admitted(job)
