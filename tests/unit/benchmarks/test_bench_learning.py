"""The learning simulation is seeded, draws its truth from the validation set, and the loop
it simulates cuts the OOMs of the raw estimate."""

from __future__ import annotations

import random
from dataclasses import replace

from benchmarks.bench_learning import Job, Kind, make_jobs, make_kinds, simulate, validation_set
from controller.base.units import GIB
from controller.learning import JobKey, LearningSettings, Policy


def run(policy: Policy, seed: int = 3) -> tuple[float, int, int]:
    fits, runs = validation_set()
    rng = random.Random(seed)
    jobs = make_jobs(rng, make_kinds(rng, fits, runs), 600)
    fresh = [Job(j.id, j.kind, j.arrival, j.duration, j.true_peak) for j in jobs]
    result = simulate(fresh, policy, LearningSettings())
    return result.unused_gib_h, result.ooms, len(result.waits)


def test_fits_come_from_the_runs_frameworks() -> None:
    fits, runs = validation_set()
    assert {f.framework for f in fits} == {run[3] for run in runs}
    assert sum(f.runs for f in fits) == len(runs) > 50


def test_seeded_and_learning_cuts_ooms() -> None:
    off, on = run(Policy.OFF), run(Policy.ADJUST)
    assert run(Policy.OFF) == off
    assert on[1] < off[1]
    assert on[0] > 0 and off[2] > 0


def test_admission_charges_what_a_running_job_uses_past_its_reservation() -> None:
    """As the operator's effective free does (`packing.inventory`): a job that uses more than
    it reserved holds its GPU's memory as NVML reports it, so the next job goes elsewhere
    instead of dying there of an OOM its neighbour caused."""
    key = JobKey.of(family="llama", method="LoRA", parallelism="DDP", profile="calibrated")
    over = Kind(key, 1, 40 * GIB, 1.75)  # reserves 40 GiB, uses 70
    fits = Kind(key, 1, 30 * GIB, 1.0)
    whole = Kind(key, 8, 80 * GIB, 1.0)  # after it ends, every GPU of the cluster at once
    jobs = [Job(0, over, 0.0, 10.0, 70 * GIB), Job(1, fits, 1.0, 1.0, 30 * GIB)]
    jobs += [Job(2 + i, whole, 11.0, 1.0, 80 * GIB) for i in range(8)]
    result = simulate(jobs, Policy.OFF, LearningSettings())
    assert result.ooms == 0
    assert result.waits == [0.0] * 10, "what it was charged is given back when it ends"


def test_an_oom_files_what_its_gpu_had_when_it_started_not_when_it_died() -> None:
    """A job dies of an OOM on a GPU its neighbour filled; the neighbour ends before the OOM
    is filed. Its bound is the room it had (10 GiB), not the whole GPU the neighbour left:
    it is raised and runs, not refused as one that needs more than a GPU."""
    key = JobKey.of(family="llama", method="LoRA", parallelism="DDP", profile="calibrated")
    big = Kind(replace(key, config="big"), 1, 70 * GIB, 1.0)
    small = Kind(replace(key, config="small"), 1, 5 * GIB, 4.0)  # reserves 5 GiB, uses 20
    jobs = [Job(0, big, 0.0, 0.05, 70 * GIB), Job(1, small, 0.01, 1.0, 20 * GIB)]
    result = simulate(jobs, Policy.ADJUST, LearningSettings())
    assert result.ooms == 1
    assert (result.rejected, result.gave_up, len(result.waits)) == (0, 0, 2)
