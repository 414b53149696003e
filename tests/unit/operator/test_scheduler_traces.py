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
from controller.operator.identity import trace_libraries
from controller.operator.scheduler import (
    DEFAULT_TRACE_S,
    Scheduler,
    SchedulerOptions,
    estimate_identity,
)
from tests.unit.trace_support import require_trace_extra

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
    text = codec.encode(TRACED, trace_libraries())
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


# -- one trace per digest, failures included ---------------------------------------------------


def test_jobs_that_differ_only_outside_the_digest_share_one_finished_trace(
    sched: Scheduler, trace: FakeTrace
) -> None:
    """The second job comes after the first's trace ended: its pod template, priority and
    suspension are no part of the estimate, so the trace kept by digest answers it."""
    first = {**TRACE, "template": {"metadata": {"labels": {"run": "a"}}}}
    second = {**TRACE, "template": {"metadata": {"labels": {"run": "b"}}}, "priority": 3}
    assert digest_of(first) == digest_of(second)
    estimate(sched, job(first, "a"))
    found = estimate(sched, job(second, "b"))
    assert len(trace.threads) == 1, "traced again for the same digest"
    assert found.estimate == TRACED and found.stored is not None
    assert found.stored.digest == digest_of(second)


CONFIG_MAP_SPEC = {
    "model": {"configMapRef": {"name": "m", "key": "config.json"}},
    "method": "LoRA",
    "lora": {"rank": 8},
    "estimator": {"profile": "Trace"},
}


def config_map_job() -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": copy.deepcopy(CONFIG_MAP_SPEC),
    }


def llama_config() -> dict[str, Any]:
    from controller.estimator.presets import load_preset

    return dict(load_preset("llama-3.2-1b").config)


async def settle(sched: Scheduler) -> None:
    for _ in range(500):
        await asyncio.sleep(0.01)
        if not sched._estimating:
            return
    raise AssertionError("the estimate never ended")


def test_a_trace_that_fails_for_good_is_not_traced_again_on_each_config_map_recheck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It flipped Tracing <-> InvalidSpec (an Event each) every configmap_retry_s; now the
    failure is kept by digest, and only a changed config is traced again."""
    from controller.base.clock import FakeClock
    from controller.trace.build import TraceUnsupported

    config = llama_config()
    monkeypatch.setattr(scheduler, "read_model_config", lambda core, ns, ref: dict(config))
    traces: list[int] = []

    def failing(plan: Any) -> Estimate:
        assert needs_trace(plan)
        traces.append(len(plan.shape.layers) if plan.shape else 0)
        raise TraceUnsupported("spec.lora: refused")

    monkeypatch.setattr(scheduler, "estimate_plan", failing)
    clock = FakeClock()
    sched = Scheduler(cast(Kube, SimpleNamespace(core=None)), SchedulerOptions(), clock=clock)
    body = config_map_job()
    seen: list[str | None] = []

    async def go() -> None:
        for _ in range(4):
            sched._start_estimates({"ns/j": body})
            await asyncio.sleep(0.02)
            now = sched._estimates.get("ns/j")
            seen.append("Tracing" if now and now.tracing else None)
            await settle(sched)
            failure = sched._estimates["ns/j"].failure
            assert failure is not None and failure.reason == cond.REASON_INVALID_SPEC
            clock.advance(sched.options.configmap_retry_s + 1)
        config["num_hidden_layers"] = 8  # the ConfigMap changed: its trace is another one
        sched._start_estimates({"ns/j": body})
        await settle(sched)

    try:
        asyncio.run(go())
    finally:
        asyncio.run(sched.close())
    assert len(traces) == 2, traces
    assert seen[1:] == [None] * 3, "Tracing again on a recheck"


def test_a_trace_whose_config_map_changed_meanwhile_is_not_published(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is estimated again from the new config, not admitted on the old one's trace."""
    config = llama_config()
    monkeypatch.setattr(scheduler, "read_model_config", lambda core, ns, ref: dict(config))
    layers: list[int] = []
    other = Estimate("trace", {"weights": 1_000}, 1, 0, 1_000, 0)

    def traced(plan: Any) -> Estimate:
        layers.append(len(plan.shape.layers))
        if len(layers) == 1:
            config["num_hidden_layers"] = 8  # edited while the first trace runs
            return TRACED
        return other

    monkeypatch.setattr(scheduler, "estimate_plan", traced)
    found = estimate(sched, config_map_job())
    assert layers == [16, 8]
    assert found.estimate == other, "the stale trace was published"
    assert found.stored is not None
    assert found.stored.digest == estimate_digest(CONFIG_MAP_SPEC, config, estimate_identity())


# -- the queue ----------------------------------------------------------------------------------


def test_queued_traces_of_deleted_or_edited_jobs_are_skipped_and_the_queue_is_expected(
    sched: Scheduler, trace: FakeTrace
) -> None:
    trace.release.clear()
    sched._trace_seconds.append(30.0)
    specs = {f"j{rank}": {**TRACE, "lora": {"rank": rank}} for rank in (8, 16, 32, 64)}
    bodies = {name: job(spec, name) for name, spec in specs.items()}

    async def go() -> None:
        sched._start_estimates({f"ns/{n}": b for n, b in bodies.items()})
        for _ in range(300):
            await asyncio.sleep(0.01)
            if all(sched._estimates.get(f"ns/{n}") for n in bodies) and trace.threads:
                break
        last = sched._estimates["ns/j64"].tracing
        assert last is not None and last.ahead == 3 and last.rounds == 4
        # j16 deleted, j32 edited (generation 2), while queued behind j8's trace.
        edited = copy.deepcopy(bodies["j32"])
        edited["metadata"]["generation"] = 2
        sched._start_estimates({"ns/j8": bodies["j8"], "ns/j32": edited, "ns/j64": bodies["j64"]})
        trace.release.set()
        await settle(sched)

    asyncio.run(go())
    # j8, j64 and j32's new generation (its own trace, of the same digest as its old one).
    assert len(trace.threads) == 3, trace.threads
    assert sched._estimates["ns/j64"].estimate == TRACED
    assert sched._estimates["ns/j32"].generation == 2
    assert "ns/j16" not in sched._estimates


def test_a_trace_world_size_beyond_the_cap_is_an_invalid_spec() -> None:
    from controller.estimator import MAX_TRACE_GPUS

    big = {**TRACE, "method": "Full", "parallelism": "FSDP"}
    big["resources"] = {"gpus": MAX_TRACE_GPUS + 1}
    plan, errors = translate(big)
    assert plan is None
    assert [e.field for e in errors] == ["spec.resources.gpus"]
    assert str(MAX_TRACE_GPUS) in str(errors[0]) and "Trace" in str(errors[0])
    at_cap = {**big, "resources": {"gpus": MAX_TRACE_GPUS}}
    assert translate(at_cap)[0] is not None
    formula = {k: v for k, v in big.items() if k != "estimator"}
    assert translate(formula)[0] is not None, "the formula profiles keep MAX_GPUS"


# -- what identifies the estimator --------------------------------------------------------------


def test_an_operator_without_the_trace_extra_reads_back_a_stored_trace(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The digest holds no library version; the libraries the trace ran with travel in the
    payload and are compared only by an operator that can trace."""
    text = codec.encode(TRACED, "torch 9.9; transformers 99.0; peft 9.9")

    def no_trace(plan: Any) -> Any:
        raise ProfileUnavailable("trace needs the `trace` extra")

    monkeypatch.setattr(scheduler, "estimate_plan", no_trace)
    monkeypatch.setattr(sched, "_can_trace", False)
    monkeypatch.setattr(sched, "_libraries", "torch none; transformers none; peft none")
    found = sched._estimate_now(job(TRACE, status=stored_status(TRACE, text)))
    assert isinstance(found, Estimated) and found.estimate == TRACED


def test_an_operator_with_other_trace_libraries_traces_again(
    sched: Scheduler, trace: FakeTrace
) -> None:
    text = codec.encode(TRACED, "torch 1.0; transformers 1.0; peft 0.1")
    found = estimate(sched, job(TRACE, status=stored_status(TRACE, text)))
    assert len(trace.threads) == 1 and found.estimate == TRACED
    assert found.stored is not None
    assert codec.made_by(found.stored.traced) == trace_libraries()


def test_the_estimator_identity_changes_with_its_code_and_data(tmp_path: Any) -> None:
    from controller.operator import identity

    for folder in identity.CODE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("X = 1\n")
    (tmp_path / "estimator" / "table.json").write_text("{}")
    base = identity.code_digest(tmp_path)
    assert base == identity.code_digest(tmp_path)
    (tmp_path / "estimator" / "table.json").write_text('{"a": 1}')
    assert identity.code_digest(tmp_path) != base, "a data file"
    changed = identity.code_digest(tmp_path)
    (tmp_path / "trace" / "a.py").write_text("X = 2\n")
    assert identity.code_digest(tmp_path) != changed, "the trace's code"
    assert identity.CODE_DIGEST in estimate_identity()


# -- the estimate cache --------------------------------------------------------------------------


def test_the_estimate_cache_is_bounded_and_safe_from_several_threads(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduler, "ESTIMATE_CACHE_SIZE", 2)
    plan, _ = translate(FORMULA)
    assert plan is not None
    errors: list[BaseException] = []

    def keep(thread: int) -> None:
        try:
            for i in range(3000):
                sched._keep(f"{thread}-{i}", plan, TRACED, None)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=keep, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(sched._by_spec) <= 2


def test_a_calibrated_job_handed_to_the_trace_reads_its_kept_trace_back(
    sched: Scheduler, trace: FakeTrace
) -> None:
    """Calibrated hands a family whose layers are no attention it prices to the trace: the
    estimate kept is the trace's (profile trace) though the job names calibrated, and a
    restarted operator reads it back instead of tracing again."""
    require_trace_extra()
    from tests.unit.jobs.test_calibrated_handoff import LFM2, _small

    spec = {"model": {"config": _small("lfm2", **LFM2)}, "method": "LoRA", "lora": {"rank": 8}}
    first = estimate(sched, job(spec))
    assert len(trace.threads) == 1 and first.stored is not None
    kept = {"estimate": {"digest": first.stored.digest, "traced": first.stored.traced}}
    restarted = Scheduler(kube=cast(Kube, SimpleNamespace(core=None)), options=SchedulerOptions())
    try:
        again = estimate(restarted, job(spec, status=kept))
    finally:
        asyncio.run(restarted.close())
    assert len(trace.threads) == 1, "read back, not traced again"
    assert again.estimate == TRACED and counted(restarted, "trace", "status") == 1


def test_a_finished_trace_whose_callback_has_not_run_is_not_joined_again(
    sched: Scheduler, trace: FakeTrace
) -> None:
    """A skipped trace (`_Unwanted`) finished, its done callback not run yet (it runs on the
    loop's next turn), when a job still wanting it asks: it gets a trace of its own, where it
    once asked again and again without the loop turning (a RecursionError)."""
    body = job(TRACE, "j")
    todo = sched._estimate_now(body)
    assert isinstance(todo, scheduler._ToTrace)

    async def go() -> Estimated:
        stale = asyncio.get_running_loop().create_future()
        stale.set_exception(scheduler._Unwanted(todo.digest))
        sched._traces[todo.digest] = stale
        sched._current["ns/j"] = ("u-j", 1)
        return await sched._traced(todo, ("ns/j", "u-j", 1))

    found = asyncio.run(go())
    assert found.estimate == TRACED and trace.threads == ["vramgate-trace_0"]
    assert todo.digest not in sched._traces, "the new trace's callback cleaned up after it"
