"""Admission that learns from observed peaks, simulated: 10,000 jobs with the loop off and on.

    python -m benchmarks.bench_learning [--jobs 10000] [--seed 7]

Pure core, no API server: `controller.learning` decides each job's per-GPU reservation; a small
event simulator stands in for the cluster. Everything is seeded and deterministic.

**Where the truth comes from.** Each run of the accuracy set (`benchmarks/accuracy/runs.yaml`,
published measured runs) gives measured / predicted, the prediction being the calibrated
profile's per-GPU figure at the run's own statistic (`benchmarks.accuracy.report.predict`, as
the accuracy report computes it). Per trainer framework (the runs' `framework`), a lognormal
is fitted to those ratios (mu, sigma = mean, standard deviation of ln ratio). The ratios of
the set are between *configurations* (other models, lengths, methods), so they are drawn once
per configuration: a kind of job is one run of the set (its model family, method,
parallelism, GPU count and calibrated per-GPU prediction) with a trainer image (one of
`IMAGES_PER_FRAMEWORK`), keyed by that run as its `config` (the operator's `config_digest`
of the job's spec tells apart what decides memory but not the GPU count; the set's runs
differ in more than their count) and a bias drawn from its framework's lognormal; kinds that
picked the same run and image are one configuration and share it. Each job of a kind peaks at
prediction x bias x a jitter (lognormal, sigma `JITTER`, 2 %: repeated runs of one
configuration differ by the data's lengths, not by the allocator, which is deterministic for
the same shapes; an assumption, not a measurement).

**The cluster and the stream.** 8 nodes x 8 GPUs x 80 GiB, shared GPUs (visibleDevices: only
there does a reservation smaller than a GPU matter). Jobs arrive as a Poisson process at the
rate that offers `LOAD` of the cluster's memory in true peaks; kinds are picked with Zipf
popularity (s = 1: a few kinds run often, most rarely); durations are lognormal, median 2 h,
sigma 1 (mean 3.3 h). Admission is first-fit in arrival order with backfill: the first node
with the job's GPU count of GPUs whose free memory holds its per-GPU reservation, GPUs taken
in index order. Free is the operator's effective free (`controller.packing.inventory`): a GPU
less, per job on it, what it reserved or what it uses, whichever is more (NVML counts a
running job's memory; one that uses more than it reserved holds that much). A figure above
a GPU (a margin or an OOM's bump on a large job) takes the whole GPU instead; only a job that
died of OOM with its GPUs to itself, which showed it needs more than a GPU, is rejected.

**OOM rule.** A job's pods hold their true peak from their first steps to the end (PyTorch's
caching allocator keeps what it reached). A job OOMs when, on one of its GPUs, its true peak is
more than the GPU's memory less what the jobs already running there hold: the physical rule,
so a job that under-reserved survives where its neighbours left room. It dies
`OOM_AFTER_SECONDS` after it started, its reservation held until then, having reached the room
its GPU had at its start (what its OOM files: neighbours that ended since freed memory it
never reached), and is queued again (creation-time order) with its figure recomputed, at most
`MAX_OOMS` times.

**Learning.** A job past its first steps (`STEADY_AFTER_SECONDS`, the operator's
`learningSteadySeconds`) files observed / predicted;
an OOM files VPA's bumped need (`controller.learning.record`). A job's figure is computed when
it is queued and again, while it waits, after every sample filed since (as admission would
read the learned state at each pass). Loop off: the calibrated figure. Loop on:
`controller.learning.correct` with the defaults (k = 5, p95, 5 % margin, clamp 0.6 to 1.5,
half-life 14 days; `--percentile` and `--margin` change the first two).

Rows: the loop off (the calibrated figure as it is); off with one margin for every job, the
loop's own rule (p95 x 1.05) read from the whole validation set at once, which is what a
cluster-wide headroom tuned on the same data would be; the loop on, `adjust` and `raiseOnly`.

Reported: GiB-hours reserved but unused (reservation - true peak, over each GPU of each
completed run, for its duration; also as GPU-hours of 80 GiB), OOMs, jobs that never ran
(rejected, or given up after `MAX_OOMS`), and queue wait from arrival to the start of the run
that completed.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from benchmarks.accuracy.report import predict
from benchmarks.accuracy.runs import load_document, load_runs, model_shape
from controller.base.units import GIB
from controller.estimator import Profile
from controller.learning import (
    JobKey,
    KeyRecord,
    LearningSettings,
    Policy,
    correct,
    record_oom,
    record_steady,
)

NODES = 8
GPUS_PER_NODE = 8
GPU_BYTES = 80 * GIB
KINDS = 200
IMAGES_PER_FRAMEWORK = 2
ZIPF_S = 1.0
JITTER = 0.02
LOAD = 0.7
DURATION_MEDIAN_H = 2.0
DURATION_SIGMA = 1.0
#: The operator's default (`learningSteadySeconds`): a running job teaches once its peak has
#: held that long.
STEADY_AFTER_SECONDS = LearningSettings().steady_seconds
OOM_AFTER_SECONDS = 600
MAX_OOMS = 3
START = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Fit:
    framework: str
    runs: int
    mu: float
    sigma: float
    ratios: tuple[float, ...]


@dataclass(frozen=True)
class Kind:
    key: JobKey
    gpus: int
    predicted: int  # per-GPU bytes
    bias: float


@dataclass
class Job:
    id: int
    kind: Kind
    arrival: float  # hours
    duration: float  # hours
    true_peak: int  # per-GPU bytes
    reservation: int = 0
    ooms: int = 0
    died_alone: bool = False  # an OOM with nothing else on its GPUs
    room: int = 0  # the least a GPU of its run had left when it started: all it could reach
    learned_at: int = 0  # how many samples were filed when its figure was computed
    started: float = 0.0
    gpus: list[tuple[int, int]] = field(default_factory=list)


#: A run of the set as a kind of job is made of it: family, method, parallelism, framework,
#: GPUs, predicted per-GPU bytes, measured / predicted.
RunKind = tuple[str, str, str, str, int, int, float]


def validation_set() -> tuple[list[Fit], list[RunKind]]:
    """Per framework, the lognormal of measured / calibrated-predicted; and every run."""
    models = load_document().get("models") or {}
    ratios: dict[str, list[float]] = defaultdict(list)
    runs = []
    for run in load_runs():
        prediction = predict(run, Profile.CALIBRATED, models)
        if prediction.predicted is None:
            continue
        framework = str(run.fields["framework"])
        ratios[framework].append(run.measured_bytes / prediction.predicted)
        family = model_shape(run, models).model_type
        method = str(run.fields["method"])
        parallelism = str(run.parallelism.value)
        ratio = run.measured_bytes / prediction.predicted
        runs.append((family, method, parallelism, framework, run.gpus, prediction.predicted, ratio))
    fits = [
        Fit(
            f,
            len(r),
            statistics.fmean(map(math.log, r)),
            statistics.stdev(map(math.log, r)),
            tuple(r),
        )
        for f, r in sorted(ratios.items())
    ]
    return fits, runs


def make_kinds(
    rng: random.Random, fits: list[Fit], runs: list[RunKind], truth: str = "lognormal"
) -> list[Kind]:
    """`KINDS` kinds of job, each a run of the set with one of its framework's images; its
    bias drawn from its framework's lognormal (`truth` "lognormal") or the run's own
    measured / predicted ("runs"). Two kinds that picked the same run and image are one
    configuration (the key's `config`): they share their bias, as the same job run again
    would."""
    by_framework = {f.framework: f for f in fits}
    kinds = []
    drawn: dict[tuple[int, str], float] = {}
    for _ in range(KINDS):
        index = rng.randrange(len(runs))
        family, method, parallelism, framework, gpus, predicted, ratio = runs[index]
        fit = by_framework[framework]
        image = f"sha256:{framework}-{rng.randrange(IMAGES_PER_FRAMEWORK)}"
        key = JobKey.of(
            family=family,
            method=method,
            parallelism=parallelism,
            profile="calibrated",
            framework=framework,
            image=image,
            config=f"run{index}",
        )
        bias = rng.lognormvariate(fit.mu, fit.sigma)  # drawn either way: one random stream
        bias = drawn.setdefault((index, image), bias if truth == "lognormal" else ratio)
        kinds.append(Kind(key, gpus, predicted, bias))
    return kinds


def make_jobs(rng: random.Random, kinds: list[Kind], count: int) -> list[Job]:
    weights = [1 / (rank + 1) ** ZIPF_S for rank in range(len(kinds))]
    chosen = rng.choices(kinds, weights=weights, k=count)
    mu = math.log(DURATION_MEDIAN_H)
    jobs = []
    for i, kind in enumerate(chosen):
        duration = rng.lognormvariate(mu, DURATION_SIGMA)
        peak = round(kind.predicted * kind.bias * rng.lognormvariate(0.0, JITTER))
        jobs.append(Job(i, kind, 0.0, duration, peak))
    # The arrival rate that offers LOAD of the cluster's memory in true peaks.
    demand = statistics.fmean(j.true_peak * j.kind.gpus * j.duration for j in jobs)
    rate = LOAD * NODES * GPUS_PER_NODE * GPU_BYTES / demand  # jobs per hour
    now = 0.0
    for job in jobs:
        now += rng.expovariate(rate)
        job.arrival = now
    return jobs


@dataclass
class Result:
    unused_gib_h: float = 0.0
    reserved_gib_h: float = 0.0
    ooms: int = 0
    ooms_past_gpu: int = 0  # of which the job's true peak exceeds a whole GPU
    gave_up: int = 0
    rejected: int = 0
    waits: list[float] = field(default_factory=list)


def simulate(
    jobs: list[Job], policy: Policy, settings: LearningSettings, static_percent: int | None = None
) -> Result:
    """One run of the stream. `policy` OFF reserves the calibrated figure; `static_percent`
    reserves it x a fixed percent for every job (a cluster-wide margin, no learning)."""
    held = [[0] * GPUS_PER_NODE for _ in range(NODES)]
    # What admission charges a GPU (the operator's effective free, `packing.inventory`): a
    # running job's memory as NVML reports it or what it reserved, whichever is more.
    charged = [[0] * GPUS_PER_NODE for _ in range(NODES)]
    records: dict[str, KeyRecord] = {}
    filed = 0  # samples filed so far: a queued job's figure from fewer is stale
    result = Result()
    events: list[tuple[float, int, str, Job]] = []
    seq = 0
    queue: list[tuple[float, int, Job]] = []

    def push(at: float, what: str, job: Job) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, what, job))

    def when(hours: float) -> datetime:
        return START + timedelta(hours=hours)

    def refigure(job: Job) -> bool:
        """The job's reservation from what is learned now; False when it is rejected."""
        job.learned_at = filed
        if static_percent is not None:
            job.reservation = -(-job.kind.predicted * static_percent // 100)
        else:
            figure = correct(job.kind.predicted, job.kind.key, records, settings, policy=policy)
            job.reservation = figure.per_gpu_bytes
        if job.reservation > GPU_BYTES and not job.died_alone:
            # A margin or an OOM's bump never makes a job whose estimate fits a GPU
            # unplaceable: it takes the whole GPU. Only a job that died with whole GPUs to
            # itself has shown it needs more than a GPU, and is rejected.
            job.reservation = max(GPU_BYTES, job.kind.predicted)
        if job.reservation > GPU_BYTES:
            result.rejected += 1
            return False
        return True

    def enqueue(job: Job) -> None:
        if refigure(job):
            bisect.insort(queue, (job.arrival, job.id, job))

    def place(job: Job) -> list[tuple[int, int]] | None:
        for n in range(NODES):
            free = [g for g in range(GPUS_PER_NODE) if GPU_BYTES - charged[n][g] >= job.reservation]
            if len(free) >= job.kind.gpus:
                return [(n, g) for g in free[: job.kind.gpus]]
        return None

    def schedule(now: float) -> None:
        failed: dict[int, int] = {}  # GPU count -> least reservation that did not fit
        kept = []
        for entry in queue:
            job = entry[2]
            if job.learned_at != filed and not refigure(job):
                continue  # rejected: what was learned since says it needs more than a GPU
            if any(g <= job.kind.gpus and r <= job.reservation for g, r in failed.items()):
                kept.append(entry)
                continue
            where = place(job)
            if where is None:
                failed[job.kind.gpus] = min(
                    failed.get(job.kind.gpus, job.reservation), job.reservation
                )
                kept.append(entry)
                continue
            start(job, where, now)
        queue[:] = kept

    def start(job: Job, where: list[tuple[int, int]], now: float) -> None:
        job.gpus, job.started = where, now
        for n, g in where:
            charged[n][g] += job.reservation
        job.room = room = min(GPU_BYTES - held[n][g] for n, g in where)
        if job.true_peak > room:
            push(now + OOM_AFTER_SECONDS / 3600, "oom", job)
            return
        for n, g in where:
            held[n][g] += job.true_peak
            charged[n][g] += max(0, job.true_peak - job.reservation)
        push(now + STEADY_AFTER_SECONDS / 3600, "steady", job)
        push(now + job.duration, "finish", job)

    def release(job: Job, holding: bool) -> None:
        for n, g in job.gpus:
            charged[n][g] -= job.reservation
            if holding:
                held[n][g] -= job.true_peak
                charged[n][g] -= max(0, job.true_peak - job.reservation)

    for job in jobs:
        push(job.arrival, "arrive", job)
    while events:
        now, _, what, job = heapq.heappop(events)
        if what == "arrive":
            enqueue(job)
        elif what == "steady":
            at = when(now)
            key, predicted = job.kind.key, job.kind.predicted
            records |= record_steady(records, key, job.true_peak, predicted, at, settings)
            filed += 1
            continue  # frees nothing
        elif what == "finish":
            release(job, holding=True)
            spare = max(0, job.reservation - job.true_peak) * job.kind.gpus
            result.unused_gib_h += spare / GIB * job.duration
            result.reserved_gib_h += job.reservation * job.kind.gpus / GIB * job.duration
            result.waits.append(job.started - job.arrival)
        elif what == "oom":
            release(job, holding=False)
            result.ooms += 1
            result.ooms_past_gpu += job.true_peak > GPU_BYTES
            job.ooms += 1
            # What it had when it died: the room at its start (neighbours that ended in the
            # minutes since freed memory it never reached).
            room = job.room
            job.died_alone = job.died_alone or room == GPU_BYTES
            records |= record_oom(
                records,
                job.kind.key,
                job.reservation,
                room,
                0,
                job.kind.predicted,
                when(now),
                settings,
            )
            filed += 1
            if job.ooms >= MAX_OOMS:
                result.gave_up += 1
            else:
                enqueue(job)
        schedule(now)
    return result


def row(name: str, r: Result) -> list[str]:
    waits = sorted(r.waits)
    p95 = waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)] if waits else 0.0
    share = r.unused_gib_h / r.reserved_gib_h if r.reserved_gib_h else 0.0
    return [
        name,
        f"{r.unused_gib_h:,.0f}",
        f"{r.unused_gib_h * GIB / GPU_BYTES:,.0f}",
        f"{share * 100:.1f} %",
        f"{r.ooms} ({r.ooms_past_gpu})",
        str(r.rejected + r.gave_up),
        f"{statistics.fmean(waits) if waits else 0.0:.2f}",
        f"{p95:.2f}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--percentile", type=int, default=95, help="the loop's percentile")
    parser.add_argument("--margin", type=int, default=5, help="the loop's margin, percent")
    parser.add_argument(
        "--truth",
        choices=("lognormal", "runs"),
        default="lognormal",
        help="a kind's measured / predicted: drawn from its framework's lognormal, or its "
        "run's own (jobs of one key then differ as the set's runs of that key do)",
    )
    args = parser.parse_args(argv)
    began = time.perf_counter()
    fits, runs = validation_set()
    rng = random.Random(args.seed)
    kinds = make_kinds(rng, fits, runs, args.truth)
    jobs = make_jobs(rng, kinds, args.jobs)

    print("Measured / calibrated-predicted per framework (runs.yaml), lognormal fit:\n")
    print("| framework | runs | median | sigma of ln | p95 |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for f in fits:
        p95 = math.exp(f.mu + 1.645 * f.sigma)
        print(f"| {f.framework} | {f.runs} | {math.exp(f.mu):.3f} | {f.sigma:.3f} | {p95:.3f} |")

    settings = LearningSettings(percentile=args.percentile, margin_percent=args.margin)
    header = [
        "loop",
        "reserved but unused (GiB-h)",
        "(80 GiB GPU-h)",
        "of reserved",
        "OOMs (of which > a GPU)",
        "never ran",
        "mean wait (h)",
        "p95 wait (h)",
    ]
    # Without learning, one margin for every job: the same rule the loop applies per key
    # (percentile of measured / predicted x (1 + margin)), read from the whole set at once.
    everyone = sorted(r for f in fits for r in f.ratios)
    whole_set = everyone[math.ceil(settings.percentile / 100 * len(everyone)) - 1]
    static = math.ceil(whole_set * (100 + settings.margin_percent) - 1e-9)
    rule = f"p{settings.percentile} + {settings.margin_percent} %"
    rows = []
    for name, policy, fixed in (
        ("off", Policy.OFF, None),
        (f"off, every job x {static / 100:.2f} (the set's {rule})", Policy.OFF, static),
        ("on (adjust)", Policy.ADJUST, None),
        ("on (raiseOnly)", Policy.RAISE_ONLY, None),
    ):
        fresh = [Job(j.id, j.kind, j.arrival, j.duration, j.true_peak) for j in jobs]
        rows.append(row(name, simulate(fresh, policy, settings, fixed)))
    span = max(j.arrival for j in jobs)
    keys = len({k.key for k in kinds})
    print(
        f"\n{args.jobs:,} jobs over {span / 24:.0f} days, {KINDS} kinds ({keys} keys), "
        f"truth: {args.truth}, "
        f"{NODES} nodes x {GPUS_PER_NODE} GPUs x {GPU_BYTES // GIB} GiB, seed {args.seed}:\n"
    )
    print("| " + " | ".join(header) + " |")
    print("| --- |" + " ---: |" * (len(header) - 1))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(f"\nwall time {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
