"""What a pass writes for a job whose estimate is being traced, and for the traced estimate
it then gets (kept in status with its digest, so no replica traces it again)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controller.admission import status as status_rules
from controller.admission.admission_pass import Estimated
from controller.api import conditions as cond
from controller.api.finetunejob import FineTuneJobStatus
from controller.estimator import codec
from controller.jobs.spec import estimate_plan, translate
from tests.unit.builders.admission import (
    NOW,
    cluster,
    condition,
    estimated,
    ftj,
    merge,
    reasons,
    run,
    status_after,
    write_for,
    written,
)

TRACE = {"estimator": {"profile": "Trace"}}
STARTED = NOW - timedelta(seconds=5)
DIGEST = "ab" * 32


def tracing(
    job: dict[str, Any], about_s: float = 41.6, measured: int = 3, ahead: int = 0, workers: int = 1
) -> Estimated:
    plan, errors = translate(dict(job["spec"]))
    assert plan is not None, errors
    trace = status_rules.Tracing(STARTED, about_s, measured, ahead, workers)
    return Estimated(job["metadata"]["generation"], plan=plan, tracing=trace)


def test_a_job_being_traced_shows_tracing_and_other_jobs_are_decided_meanwhile() -> None:
    traced, other = ftj("traced", minute=0, **TRACE), ftj("other", minute=1)
    objects = cluster(traced, other, gpus={"n1": [80]})
    out = run(objects, estimates={"ns/traced": tracing(traced), "ns/other": estimated(other)})

    status = status_after(out, "ns/traced")
    estimated_ = condition(status, cond.ESTIMATED)
    assert (estimated_["status"], estimated_["reason"]) == ("False", cond.REASON_TRACING)
    assert estimated_["message"] == (
        "tracing one training step of llama-3.1-8b on one GPU: about 42 s (the median of "
        "this operator's last 3 traces), started 11:59:55Z"
    )
    admitted = condition(status, cond.ADMITTED)
    assert (admitted["status"], admitted["reason"]) == ("Unknown", cond.REASON_TRACING)
    assert "estimate" not in status and "placement" not in status
    assert reasons(write_for(out, "ns/traced")) == [("Normal", cond.REASON_TRACING)]
    assert [d.job for d in out.decisions] == ["ns/other"], "the other job is not held up"
    assert condition(status_after(out, "ns/other"), cond.ADMITTED)["reason"] == cond.REASON_FITS
    FineTuneJobStatus.model_validate(status)  # what the CRD's schema accepts

    # The next passes, while the trace runs: nothing to write, no second Event.
    again = run(
        cluster(merge(traced, {"status": status}), gpus={"n1": [80]}),
        estimates={"ns/traced": tracing(traced)},
        now=NOW + timedelta(seconds=20),
    )
    assert again.writes == []


def test_before_any_trace_ended_the_expectation_says_it_is_a_default() -> None:
    job = ftj("t", resources={"gpus": 2}, **TRACE)
    out = run(cluster(job, gpus={"n1": [80, 80]}), estimates={"ns/t": tracing(job, 10.0, 0)})
    message = condition(status_after(out, "ns/t"), cond.ESTIMATED)["message"]
    assert message == (
        "tracing one training step of llama-3.1-8b at world size 2 (FSDP): about 10 s "
        "(a default: no trace has ended here yet), started 11:59:55Z"
    )


def test_a_queued_trace_is_expected_after_those_ahead_of_it() -> None:
    job = ftj("t", **TRACE)
    out = run(cluster(job, gpus={"n1": [80]}), estimates={"ns/t": tracing(job, 40.0, 2, 3)})
    message = condition(status_after(out, "ns/t"), cond.ESTIMATED)["message"]
    assert message == (
        "tracing one training step of llama-3.1-8b on one GPU: 3 traces ahead: about 160 s "
        "(4 x 40 s, the median of this operator's last 2 traces), started 11:59:55Z"
    )
    # Two trace workers: three ahead run in two rounds, then this one.
    two = run(cluster(job, gpus={"n1": [80]}), estimates={"ns/t": tracing(job, 40.0, 2, 3, 2)})
    assert (
        "3 traces ahead: about 80 s (2 x 40 s,"
        in condition(status_after(two, "ns/t"), cond.ESTIMATED)["message"]
    )


def test_the_traced_estimate_is_kept_in_status_with_its_digest() -> None:
    job = ftj("t", template=None, **TRACE)
    during = run(cluster(job), estimates={"ns/t": tracing(job)})
    job = merge(job, {"status": status_after(during, "ns/t")})

    plan, _ = translate(dict(ftj("x")["spec"]))  # a formula estimate stands in for the trace
    assert plan is not None
    est = estimate_plan(plan)
    stored = status_rules.Stored(DIGEST, codec.encode(est))
    done = Estimated(1, plan=tracing(job).plan, estimate=est, stored=stored)
    out = run(cluster(job), estimates={"ns/t": done})
    status = status_after(out, "ns/t")
    assert condition(status, cond.ESTIMATED)["reason"] == cond.REASON_ESTIMATED
    assert condition(status, cond.ADMITTED)["reason"] == cond.REASON_NO_TEMPLATE
    assert status["estimate"]["digest"] == DIGEST
    assert codec.decode(status["estimate"]["traced"]) == est
    assert status["estimate"]["totalBytes"] == est.total_bytes
    FineTuneJobStatus.model_validate(status)

    # Read back after a restart (the same Stored): the pass writes nothing.
    assert run(cluster(merge(job, {"status": status})), estimates={"ns/t": done}).writes == []


def test_a_formula_estimate_keeps_no_digest() -> None:
    job = ftj("f")
    status = status_after(run(cluster(job, gpus={"n1": [80]})), "ns/f")
    assert "digest" not in status["estimate"] and "traced" not in status["estimate"]


def traced_job(name: str = "t") -> tuple[dict[str, Any], Estimated]:
    """A Trace job with no template (estimated, never admitted) whose traced estimate is in
    its status, and that estimate (a formula estimate stands in for the trace)."""
    job = ftj(name, template=None, **TRACE)
    plan, _ = translate(dict(job["spec"]))
    assert plan is not None
    est = estimate_plan(plan)
    done = Estimated(
        1, plan=plan, estimate=est, stored=status_rules.Stored(DIGEST, codec.encode(est))
    )
    job = written(job, run(cluster(job), estimates={f"ns/{name}": done}))
    assert job["status"]["estimate"]["digest"] == DIGEST
    return job, done


def test_a_traced_job_edited_to_a_formula_profile_drops_its_digest_in_one_write() -> None:
    """Status is a merge patch: without an explicit null the digest and the trace stayed, and
    every pass wrote the same status (and posted an Event) again."""
    job, _ = traced_job()
    edited = ftj("t", template=None, generation=2)
    edited["status"] = job["status"]
    first = run(cluster(edited), estimates={"ns/t": estimated(edited)})
    patch = write_for(first, "ns/t").patch
    assert patch["estimate"]["digest"] is None and patch["estimate"]["traced"] is None
    edited = written(edited, first)
    assert "digest" not in edited["status"]["estimate"]
    assert "traced" not in edited["status"]["estimate"]
    for seconds in (10, 20):
        later = run(
            cluster(edited),
            estimates={"ns/t": estimated(edited)},
            now=NOW + timedelta(seconds=seconds),
        )
        assert later.writes == [], "written again"


def test_a_status_whose_stored_trace_the_api_server_pruned_is_not_written_again() -> None:
    """An older CRD without `digest` and `traced` prunes them from every write: comparing the
    estimate with them would write on every pass."""
    job, done = traced_job()
    estimate = job["status"]["estimate"]
    pruned = {k: v for k, v in estimate.items() if k not in ("digest", "traced")}
    job["status"] = {**job["status"], "estimate": pruned}
    for seconds in (0, 10):
        out = run(cluster(job), estimates={"ns/t": done}, now=NOW + timedelta(seconds=seconds))
        assert out.writes == []
