"""The operator's Prometheus metrics: the admission state, decisions, latencies, accuracy.

Why a custom collector for the state gauges: they are rendered from the latest admission
pass's view (`metric_view.py`), so a job or GPU that is gone leaves no series behind, as
labelled gauges set one by one would. Only the leader exports them (a standby's caches may
lag, and sums across replicas must not double count); every replica exports
`vramgate_operator_leader` and `vramgate_build_info`. Counters and histograms are updated as
things happen, on the replica where they happen (the webhook's on every replica).

A registry of its own, never the global one: tests build as many operators as they like.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller import __version__
from controller.admission.admission_pass import Recorded
from controller.admission.metric_view import Gauge
from controller.api import conditions as cond
from controller.decision import ADVISE
from controller.estimator import Profile

#: Observed peak / predicted: dense around 1, where the estimator should be.
ACCURACY_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0)
#: Creation to first decision: a pass after a debounce, or an estimate's seconds (Trace).
DECISION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: One pure pass: milliseconds for a small cluster, a second for thousands of jobs.
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: One estimate: microseconds (Calibrated, cached shape) to tens of seconds (Trace).
ESTIMATE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip
#: Where an estimate came from: computed by this process, or read back from the job's
#: status (`controller.operator.scheduler`).
ESTIMATE_SOURCES = ("computed", "status")
#: One admission request, as kopf's handler runs it; the API server waits up to the webhook's
#: timeoutSeconds (5 s in the chart; 30 s with `--webhook managed`).
WEBHOOK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)  # fmt: skip


#: How a job ends (the Succeeded or Failed condition's reason).
FINISHED_REASONS = (
    cond.REASON_SUCCEEDED,
    cond.REASON_OOM_KILLED,
    cond.REASON_GPU_OUT_OF_MEMORY,
    cond.REASON_WORKLOAD_FAILED,
)


#: Every (decision, Admitted reason) the operator writes, so each series exists from the start.
KNOWN_DECISIONS = (
    ("Admit", cond.REASON_FITS),
    ("Resize", cond.REASON_RESIZED),
    (ADVISE, cond.REASON_ADVISED),
    (ADVISE, cond.REASON_NO_TEMPLATE),
    ("Queue", cond.REASON_WAITING_FOR_VRAM),
    ("Queue", cond.REASON_WAITING_FOR_NODES),
    ("Queue", cond.REASON_WAITING_FOR_GPUS),
    ("Queue", cond.REASON_WAITING_IN_QUEUE),
    ("Queue", cond.REASON_PRIORITY_CLASS_UNAVAILABLE),
    ("Reject", cond.REASON_INSUFFICIENT_VRAM),
    ("Reject", cond.REASON_NO_MATCHING_GPU),
    ("Reject", cond.REASON_INSUFFICIENT_GPUS),
)
#: Decisions that admit a job (and so will, at its end, observe its accuracy).
ADMITTING = frozenset({"Admit", "Resize", ADVISE})


class _State(Collector):
    """The leader's state gauges and every replica's leader and build gauges."""

    def __init__(self, owner: OperatorMetrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        owner = self.owner
        leading = owner.leading()
        leader = GaugeMetricFamily(
            "vramgate_operator_leader",
            "1 on the replica that holds the Lease and decides admissions, else 0.",
            labels=["identity"],
        )
        leader.add_metric([owner.identity], 1.0 if leading else 0.0)
        yield leader
        build = GaugeMetricFamily(
            "vramgate_build_info", "The running vramgate's version; always 1.", labels=["version"]
        )
        build.add_metric([__version__], 1.0)
        yield build
        if not leading:
            return
        for gauge in owner.view():
            family = GaugeMetricFamily(gauge.name, gauge.doc, labels=list(gauge.labels))
            for values, value in gauge.samples:
                family.add_metric(list(values), value)
            yield family


class OperatorMetrics:
    """The operator's metrics in a registry of its own (`registry`), scraped at /metrics."""

    def __init__(self, identity: str = "", leading: Callable[[], bool] = lambda: True) -> None:
        self.identity = identity
        self.leading = leading
        self._lock = threading.Lock()
        self._view: tuple[Gauge, ...] = ()
        self._build: Callable[[], tuple[Gauge, ...]] | None = None
        self._ended: set[str] = set()
        self._expected: set[tuple[str, str]] = set()  # accuracy series made at 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_State(self))
        r = self.registry
        self.decisions = Counter(
            "vramgate_decisions", "Admission decisions written, by decision (Admit, Resize, "
            "Queue, Reject, Advise) and Admitted reason.", ["decision", "reason"], registry=r,
        )  # fmt: skip
        self.decision_latency = Histogram(
            "vramgate_decision_latency_seconds",
            "From a job's creation to its first decision written, in seconds.",
            ["decision"], buckets=DECISION_BUCKETS, registry=r,
        )  # fmt: skip
        self.pass_duration = Histogram(
            "vramgate_admission_pass_duration_seconds",
            "One admission pass (pure: deciding every job, no API calls), in seconds.",
            buckets=PASS_BUCKETS, registry=r,
        )  # fmt: skip
        self.estimate_duration = Histogram(
            "vramgate_estimate_duration_seconds",
            "One VRAM estimate (not served from the cache), in seconds, by profile.",
            ["profile"], buckets=ESTIMATE_BUCKETS, registry=r,
        )  # fmt: skip
        self.estimates = Counter(
            "vramgate_estimates", "VRAM estimates made for jobs (not served from this "
            "process's cache), by profile and source: computed here, or read back from the "
            "job's status (a traced estimate whose digest matches: no trace again after a "
            "restart or a failover).", ["profile", "source"], registry=r,
        )  # fmt: skip
        self.webhook_duration = Histogram(
            "vramgate_webhook_request_duration_seconds",
            "One admission request as the handler ran it, in seconds, by webhook "
            "(validating, mutating) and result (allowed, denied, error).",
            ["webhook", "result"], buckets=WEBHOOK_BUCKETS, registry=r,
        )  # fmt: skip
        self.finished = Counter(
            "vramgate_jobs_finished", "Jobs that ended, by reason (Succeeded, OOMKilled, "
            "GPUOutOfMemory, WorkloadFailed).", ["reason"], registry=r,
        )  # fmt: skip
        self.accuracy = Histogram(
            "vramgate_estimate_accuracy_ratio",
            "Observed peak over predicted bytes per GPU, once per job when it ends with a "
            "non-zero observed peak, by profile and model family: above 1 the estimator "
            "under-predicted.",
            ["profile", "family"], buckets=ACCURACY_BUCKETS, registry=r,
        )  # fmt: skip

        # Known label values start at 0 (Prometheus' advice): an alert on increase() or a
        # rate panel then sees the first event instead of a series appearing from nowhere.
        for reason in FINISHED_REASONS:
            self.finished.labels(reason)
        for decision, reason in KNOWN_DECISIONS:
            self.decisions.labels(decision, reason)
        for decision in dict(KNOWN_DECISIONS):
            self.decision_latency.labels(decision)
        for profile in Profile:
            self.estimate_duration.labels(profile.value)
            for source in ESTIMATE_SOURCES:
                self.estimates.labels(profile.value, source)
        for webhook in ("validating", "mutating"):
            for result in ("allowed", "denied", "error"):
                self.webhook_duration.labels(webhook, result)

    # -- what the scheduler and the webhook call ---------------------------------------------

    def set_view(self, view: tuple[Gauge, ...] | Callable[[], tuple[Gauge, ...]]) -> None:
        """The latest pass's state gauges (rendered while this replica leads), or how to
        build them: built on the next scrape, once, so a pass every 100 ms does not pay for
        a view scraped every 30 s."""
        with self._lock:
            if callable(view):
                self._view, self._build = (), view
            else:
                self._view, self._build = view, None

    def clear_view(self) -> None:
        self.set_view(())

    def view(self) -> tuple[Gauge, ...]:
        """The state gauges, built now if the latest pass left only how to.

        Built outside the lock: the event loop takes it at the end of every pass, and a
        view of 5,000 GPU nodes takes seconds to build."""
        with self._lock:
            build, view = self._build, self._view
        if build is None:
            return view
        built = build()
        with self._lock:
            if self._build is build:  # no newer pass meanwhile: keep it for the next scrape
                self._view, self._build = built, None
        return built

    def expect_accuracy(self, series: set[tuple[str, str]]) -> None:
        """Make each (profile, family) accuracy series exist at 0 before its first job ends."""
        with self._lock:
            new = series - self._expected
            self._expected |= new
        for profile, family in new:
            self.accuracy.labels(profile, family)

    def observe_pass(self, seconds: float) -> None:
        self.pass_duration.observe(seconds)

    def observe_estimate(self, profile: str, seconds: float) -> None:
        self.estimate_duration.labels(profile).observe(seconds)

    def count_estimate(self, profile: str, source: str) -> None:
        """An estimate of `profile` made from `source` (one of ESTIMATE_SOURCES)."""
        self.estimates.labels(profile, source).inc()

    def observe_webhook(self, webhook: str, result: str, seconds: float) -> None:
        self.webhook_duration.labels(webhook, result).observe(seconds)

    def landed(
        self, uid: str, recorded: Recorded, created: datetime | None, now: datetime, family: str
    ) -> None:
        """A status write of job `uid` that records `recorded` landed."""
        if recorded.decision is not None:
            self.decisions.labels(recorded.decision, recorded.reason or "").inc()
            if recorded.decision in ADMITTING and recorded.profile:
                # The job's accuracy series exists at 0 before its end is observed, so
                # increase() over the histogram counts that first observation.
                self.accuracy.labels(recorded.profile, family)
            if recorded.first and created is not None:
                latency = max(0.0, (now - created).total_seconds())
                self.decision_latency.labels(recorded.decision).observe(latency)
        if recorded.finished is not None and self._once(uid):
            self.finished.labels(recorded.finished).inc()
            if recorded.peak_bytes > 0 and recorded.predicted_bytes > 0:
                ratio = recorded.peak_bytes / recorded.predicted_bytes
                self.accuracy.labels(recorded.profile, family).observe(ratio)

    def _once(self, uid: str) -> bool:
        """Whether job `uid`'s end is counted for the first time by this process (an end
        written again, after a write whose answer was lost, must not count twice; a restart
        never sees the end again)."""
        with self._lock:
            if uid in self._ended:
                return False
            if len(self._ended) >= 100_000:
                self._ended.clear()
            self._ended.add(uid)
            return True


def start_metrics_server(metrics: OperatorMetrics, address: str, port: int) -> Any:
    """Serve `metrics` at http://address:port/metrics in a daemon thread; the server."""
    server, _thread = start_http_server(port, address, registry=metrics.registry)
    return server
