"""The learning simulation is seeded, draws its truth from the validation set, and the loop
it simulates cuts the OOMs of the raw estimate."""

from __future__ import annotations

import random

from benchmarks.bench_learning import Job, make_jobs, make_kinds, simulate, validation_set
from controller.learning import LearningSettings, Policy


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
