"""Traced estimates in the scheduler: on workers of their own, shown while they run, kept in
status and read back instead of tracing again.

The trace itself is replaced by a fake (`estimate_plan` patched): what is tested is where
and when it runs and what is kept, not the trace (tests/unit/trace/). The pass that writes
the Tracing condition is tested in tests/unit/admission/test_tracing_status.py; the whole
operator in tests/integration/test_operator_traces.py.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator
from fractions import Fraction
from types import SimpleNamespace
from typing import Any, cast

import pytest

from controller.admission.admission_pass import Estimated
from controller.api import conditions as cond
from controller.base.errors import ProfileUnavailable
from controller.estimator import Estimate, codec
from controller.jobs.spec import estimate_digest, needs_trace, translate
from controller.kube import Kube
from controller.operator import scheduler
from controller.operator.scheduler import (
    DEFAULT_TRACE_S,
    Scheduler,
    SchedulerOptions,
    estimate_identity,
)

TRACE = {
    "model": {"preset": "llama-3.2-1b"},
    "method": "LoRA",
    "lora": {"rank": 8},
    "estimator": {"profile": "Trace"},
}
FORMULA = {"model": {"preset": "llama-3.2-1b"}, "method": "LoRA", "lora": {"rank": 8}}
TRACED = Estimate(
    profile="trace",
    components={"weights": 2_471_000_064, "activations": 900_000_001},
    total_params=1_235_814_400,
    trainable_params=5_636_096,
    sharded_bytes=2_471_000_064,
    replicated_bytes=900_000_001,
    margin=Fraction(11433, 8042),
    moments=((1, 2),),
)


def job(spec: dict[str, Any], name: str = "j", status: dict[str, Any] | None = None) -> dict:
    body: dict[str, Any] = {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "ns", "generation": 1, "uid": f"u-{name}"},
        "spec": copy.deepcopy(spec),
    }
    if status is not None:
        body["status"] = status
    return body


@pytest.fixture
def sched() -> Iterator[Scheduler]:
    kube = SimpleNamespace(core=None)
    made = Scheduler(kube=cast(Kube, kube), options=SchedulerOptions())
    yield made
    asyncio.run(made.close())


class FakeTrace:
    """`estimate_plan` where a trace is asked for: TRACED, on the thread it was called from
    (recorded), after `release` is set; formula profiles are estimated for real."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.real = scheduler.estimate_plan

    def __call__(self, plan: Any) -> Estimate:
        if not needs_trace(plan):
            return self.real(plan)
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(10), "never released"
        return TRACED


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> FakeTrace:
    fake = FakeTrace()
    monkeypatch.setattr(scheduler, "estimate_plan", fake)
    return fake


def estimate(sched: Scheduler, body: dict[str, Any]) -> Estimated:
    async def go() -> Estimated:
        meta = body["metadata"]
        await sched._estimate(f"ns/{meta['name']}", meta["uid"], 1, body)
        return sched._estimates[f"ns/{meta['name']}"]

    return asyncio.run(go())


def counted(sched: Scheduler, profile: str, source: str) -> float:
    return float(sched.metrics.estimates.labels(profile, source)._value.get())


def digest_of(spec: dict[str, Any]) -> str:
    return estimate_digest(spec, None, estimate_identity())


def test_a_trace_runs_on_a_trace_worker_and_is_kept_with_its_digest(
    sched: Scheduler, trace: FakeTrace
) -> None:
    found = estimate(sched, job(TRACE))
    assert found.failure is None and found.estimate == TRACED and found.tracing is None
    assert trace.threads == ["vramgate-trace_0"], "not on the formula estimates' workers"
    assert found.stored is not None
    assert found.stored.digest == digest_of(TRACE)
    assert codec.decode(found.stored.traced) == TRACED
    assert counted(sched, "trace", "computed") == 1 and counted(sched, "trace", "status") == 0


def test_formula_estimates_do_not_wait_for_a_trace_and_the_job_shows_tracing(
    sched: Scheduler, trace: FakeTrace
) -> None:
    trace.release.clear()

    async def go() -> None:
        traced = asyncio.ensure_future(sched._estimate("ns/t", "u-t", 1, job(TRACE, "t")))
        for _ in range(200):  # until the trace is under way
            await asyncio.sleep(0.01)
            if trace.threads:
                break
        pending = sched._estimates["ns/t"]
        assert pending.tracing is not None and pending.estimate is None
        assert pending.plan is not None and pending.plan.model == "llama-3.2-1b"
        assert (pending.tracing.about_s, pending.tracing.measured) == (DEFAULT_TRACE_S, 0)
        for name in ("a", "b", "c"):  # the two formula workers, three estimates
            await asyncio.wait_for(sched._estimate(f"ns/{name}", name, 1, job(FORMULA, name)), 5)
            assert sched._estimates[f"ns/{name}"].estimate is not None
        assert not traced.done(), "the trace is still running"
        trace.release.set()
        await traced
        assert sched._estimates["ns/t"].estimate == TRACED

    asyncio.run(go())


def test_two_jobs_of_one_spec_share_one_trace(sched: Scheduler, trace: FakeTrace) -> None:
    trace.release.clear()

    async def go() -> None:
        both = [
            asyncio.ensure_future(sched._estimate(f"ns/{n}", n, 1, job(TRACE, n))) for n in "xy"
        ]
        await asyncio.sleep(0.2)
        trace.release.set()
        await asyncio.gather(*both)

    asyncio.run(go())
    assert len(trace.threads) == 1
    assert sched._estimates["ns/x"].estimate == sched._estimates["ns/y"].estimate == TRACED


def stored_status(spec: dict[str, Any], traced: str) -> dict[str, Any]:
    return {"estimate": {"profile": "trace", "digest": digest_of(spec), "traced": traced}}


def test_a_traced_estimate_in_status_is_read_back_not_traced_again(
    sched: Scheduler, trace: FakeTrace
) -> None:
    text = codec.encode(TRACED)
    found = estimate(sched, job(TRACE, status=stored_status(TRACE, text)))
    assert trace.threads == [], "not traced"
    assert found.estimate == TRACED
    assert found.stored is not None and found.stored.traced == text
    assert counted(sched, "trace", "status") == 1 and counted(sched, "trace", "computed") == 0


@pytest.mark.parametrize(
    "traced",
    [
        codec.encode(TRACED).replace('"v":1', '"v":0'),  # an older version
        codec.encode(TRACED).replace("1235814400", '"1235814400"'),  # edited by hand
        "{",
        None,
        codec.encode(Estimate("analytic", {"weights": 1}, 1, 0, 1, 0)),  # not a trace
    ],
)
def test_what_does_not_read_back_from_status_is_traced_again(
    sched: Scheduler, trace: FakeTrace, traced: str | None
) -> None:
    found = estimate(sched, job(TRACE, status=stored_status(TRACE, cast(str, traced))))
    assert found.failure is None and found.estimate == TRACED
    assert len(trace.threads) == 1
    assert counted(sched, "trace", "computed") == 1


def test_a_changed_spec_or_model_is_traced_again(sched: Scheduler, trace: FakeTrace) -> None:
    old = stored_status(TRACE, codec.encode(TRACED))
    longer = {**TRACE, "training": {"sequenceLength": 4096}}
    estimate(sched, job(longer, status=old))
    assert len(trace.threads) == 1


def test_the_digest_follows_what_the_estimate_depends_on() -> None:
    identity = estimate_identity()
    base = estimate_digest(TRACE, None, identity)
    assert len(base) == 64 and base == estimate_digest(copy.deepcopy(TRACE), None, identity)
    same = {**TRACE, "suspend": True, "template": {"spec": {}}, "admissionPolicy": "Resize",
            "priority": 5, "resources": {"gpuSelector": {"a": "b"}, "maxGPUs": 4}}  # fmt: skip
    assert estimate_digest(same, None, identity) == base, "who runs it, not what it holds"
    for changed in (
        {**TRACE, "resources": {"gpus": 2}},
        {**TRACE, "lora": {"rank": 16}},
        {**TRACE, "parallelism": "DDP"},
    ):
        assert estimate_digest(changed, None, identity) != base
    assert estimate_digest(TRACE, {"model_type": "llama"}, identity) != base
    assert estimate_digest(TRACE, None, identity + "; transformers 9") != base


def test_a_formula_profile_keeps_nothing_in_status(sched: Scheduler) -> None:
    found = estimate(sched, job(FORMULA))
    assert found.stored is None and found.estimate is not None
    assert counted(sched, "calibrated", "computed") == 1


def test_a_trace_is_expected_to_take_the_median_of_the_last_ones(sched: Scheduler) -> None:
    assert sched._trace_expectation() == (DEFAULT_TRACE_S, 0)
    for seconds in (30.0, 2.0, 4.0):
        sched._trace_seconds.append(seconds)
    assert sched._trace_expectation() == (4.0, 3)
    for _ in range(10):
        sched._trace_seconds.append(1.0)
    assert sched._trace_expectation() == (1.0, scheduler.TRACE_SECONDS_KEPT)


def test_only_the_trace_profile_needs_a_trace() -> None:
    traced, _ = translate(TRACE)
    formula, _ = translate(FORMULA)
    assert traced is not None and formula is not None
    assert needs_trace(traced) and not needs_trace(formula)
    assert cond.REASON_TRACING in cond.BEFORE_ADMISSION


def test_without_the_trace_extra_a_trace_job_is_refused_at_once_but_read_back(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Tracing that ends in ProfileUnavailable on every retry: the estimate worker says
    it at once. A trace kept in status still reads back (no torch needed for that)."""

    def no_trace(plan: Any) -> Any:
        raise ProfileUnavailable("spec.estimator.profile: trace needs the `trace` extra")

    monkeypatch.setattr(scheduler, "estimate_plan", no_trace)
    monkeypatch.setattr(sched, "_can_trace", False)
    with pytest.raises(ProfileUnavailable):
        sched._estimate_now(job(TRACE))
    found = sched._estimate_now(job(TRACE, status=stored_status(TRACE, codec.encode(TRACED))))
    assert isinstance(found, Estimated) and found.estimate == TRACED
