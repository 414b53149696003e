"""The admission pass as plain data: FineTuneJobs, Nodes and GPUNodes in; status writes,
workloads to create and workloads to delete out.

Jobs are dicts as the API holds them; their estimates are made the way the scheduler makes
them (`translate` + `estimate_plan`). A second pass is fed the status the first one wrote,
merged as the API server merges a status patch, so "an unchanged cluster writes nothing" is
tested the way it happens.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from controller.admission import observed
from controller.admission import status as status_rules
from controller.admission.admission_pass import (
    MESSAGE_REFRESH,
    CreateWorkload,
    DeleteWorkload,
    Estimated,
    LookUp,
    PassOutput,
    Recorded,
    Refused,
    StatusWrite,
)
from controller.admission.cluster import ClusterObjects
from controller.admission.failures import failure_of
from controller.admission.holds import Hold
from controller.admission.observed import GROWTH_BYTES
from controller.api import conditions as cond
from controller.api.base import JOB_LABEL
from controller.base.errors import ConfigMapUnavailable
from controller.base.units import format_gib
from controller.decision import AdmissionSettings, Outcome, QueueingStrategy
from controller.estimator import SpecError, SpecErrors
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import Admission, Remains, build_workload
from tests.unit.builders.admission import (
    GIB,
    NOW,
    admitted,
    cluster,
    condition,
    estimated,
    ftj,
    merge,
    node,
    placed_on,
    reasons,
    run,
    status_after,
    write_for,
    written,
)

# -- the API's objects ----------------------------------------------------------------------


def per_gpu(job: Mapping[str, Any]) -> int:
    found = estimated(job)
    assert found.plan is not None and found.estimate is not None
    return found.estimate.per_gpu_bytes(1, found.plan.parallelism)


# -- reading the output -----------------------------------------------------------------------


def workload(name: str, *conditions: str) -> dict[str, Any]:
    """The batch Job of job `name` as the operator's cache holds it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "labels": {JOB_LABEL: name}},
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 0},
        "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]},
    }


def pod(job: str, phase: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{job}-x1", "namespace": "ns", "uid": f"pod-{job}",
                     "labels": {JOB_LABEL: job}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, **status},
    }  # fmt: skip


# -- admission ------------------------------------------------------------------------------


def test_a_pending_job_that_fits_is_admitted_onto_the_tightest_gpu() -> None:
    job = ftj("a")
    out = run(cluster(job, gpus={"n1": [80, 24, 40], "n2": [30]}))

    (write,) = out.writes
    assert write.key == "ns/a" and write.uid == "uid-a"
    assert write.resource_version == "101", "an admission fails if the job changed since"
    status = status_after(out, "ns/a")
    need = per_gpu(job)
    assert status["placement"] == {
        "nodes": [{"node": "n1", "gpuIndices": [1], "gpuUUIDs": ["GPU-n1-1"]}],
        "requestedGPUs": 1,
        "admittedGPUs": 1,
        "perGpuBytes": need,
    }, "24 GiB is the least free memory that holds ~11.6 GiB (n2's 30 and n1's 40 are looser)"
    assert status["workloadRef"] == {"apiVersion": "batch/v1", "kind": "Job", "name": "a"}
    admitted_ = condition(status, cond.ADMITTED)
    assert (admitted_["status"], admitted_["reason"], admitted_["observedGeneration"]) == (
        "True", cond.REASON_FITS, 1,
    )  # fmt: skip
    assert "n1 GPU 1" in admitted_["message"]
    assert condition(status, cond.ESTIMATED)["status"] == "True"
    assert condition(status, cond.RUNNING)["reason"] == cond.REASON_STARTING
    assert ("Normal", cond.REASON_FITS) in reasons(write)

    (create,) = out.creates
    expected = build_workload(
        job, Admission((NodeGpus("n1", (1,), ("GPU-n1-1",)),), need, GpuMode.DEVICE_PLUGIN)
    )
    assert create == CreateWorkload("ns/a", tuple(expected), after_write=True)
    assert out.deletes == []
    (decision,) = out.decisions
    assert decision.outcome is Outcome.ADMIT


def test_two_jobs_in_one_pass_never_share_an_exclusive_gpu() -> None:
    a, b = ftj("a", minute=0), ftj("b", minute=1)
    out = run(cluster(a, b, gpus={"n1": [80, 80]}))
    assert placed_on(status_after(out, "ns/a")) == [("n1", [0])]
    assert placed_on(status_after(out, "ns/b")) == [("n1", [1])]

    out = run(cluster(a, b, gpus={"n1": [80]}))
    assert placed_on(status_after(out, "ns/a")) == [("n1", [0])]
    queued = status_after(out, "ns/b")
    assert "placement" not in queued
    assert condition(queued, cond.ADMITTED)["reason"] == cond.REASON_WAITING_FOR_VRAM
    assert [c.key for c in out.creates] == ["ns/a"]


def test_an_admitted_job_holds_its_gpus_against_a_new_one() -> None:
    a, _ = admitted("a", gpus={"n1": [80, 24, 40]})
    assert placed_on(a["status"]) == [("n1", [1])]
    b = ftj("b", minute=5)
    # The agent still reports GPU 1 free (a's pod has not started): only the ledger holds it.
    out = run(cluster(a, b, gpus={"n1": [80, 24, 40]}))
    assert placed_on(status_after(out, "ns/b")) == [("n1", [2])]
    assert [w.key for w in out.writes] == ["ns/b"], "a's status is unchanged"

    unplaced = copy.deepcopy(a)
    del unplaced["status"]["placement"]  # no placement, no hold: the ledger is the status
    out = run(cluster(unplaced, b, gpus={"n1": [80, 24, 40]}), estimates={"ns/b": estimated(b)})
    assert placed_on(status_after(out, "ns/b")) == [("n1", [1])]


def test_a_trainjob_hold_keeps_a_finetunejob_off_the_gpu_it_holds() -> None:
    """A TrainJob sized a moment ago holds n1's GPU 1 (`ClusterObjects.holds`, as the
    scheduler's pass sets them); its pods have not started, so the agent still reads it
    free. The pass charges the hold: the FineTuneJob takes GPU 2, as if GPU 1 were taken."""
    b = ftj("b", minute=5)
    objects = cluster(b, gpus={"n1": [80, 24, 40]})
    objects.holds = (
        Hold("ml", "llama", (NodeGpus("n1", (1,), ("GPU-n1-1",)),), 20 * GIB, 1, 1e9, 1),
    )
    assert placed_on(status_after(run(objects), "ns/b")) == [("n1", [2])]
    objects.holds = ()  # no hold: the tightest GPU that holds it, GPU 1
    assert placed_on(status_after(run(objects), "ns/b")) == [("n1", [1])]


@pytest.mark.parametrize("generation", [None, 1], ids=["absent", "older generation"])
def test_a_job_not_estimated_at_its_generation_is_not_decided(generation: int | None) -> None:
    job = ftj("a", generation=2)
    estimates = {} if generation is None else {"ns/a": estimated(job, generation)}
    out = run(cluster(job), estimates=estimates)
    assert out == PassOutput()


# -- queue and reject -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_gib", "free_gib", "spec", "reason", "event"),
    [
        (80, 5, {}, cond.REASON_WAITING_FOR_VRAM, "Normal"),
        (8, 8, {}, cond.REASON_INSUFFICIENT_VRAM, "Warning"),
        (80, 80, {"resources": {"gpuSelector": {"gpu": "a100"}}},
         cond.REASON_NO_MATCHING_GPU, "Warning"),
    ],
    ids=["queue", "reject: never fits", "reject: no matching GPU"],
)  # fmt: skip
def test_a_job_that_does_not_fit_is_told_why_and_not_rewritten(
    total_gib: float, free_gib: float, spec: dict[str, Any], reason: str, event: str
) -> None:
    job = ftj("a", **spec)
    objects = cluster(job, gpus={"n1": [free_gib]}, total_gib=total_gib, labels={"gpu": "h100"})
    out = run(objects)
    write = write_for(out, "ns/a")
    assert write.resource_version is None
    status = status_after(out, "ns/a")
    admitted_ = condition(status, cond.ADMITTED)
    assert (admitted_["status"], admitted_["reason"]) == ("False", reason)
    assert "placement" not in status and "workloadRef" not in status
    assert (event, reason) in reasons(write)
    assert out.creates == [] and out.deletes == []

    again = run(cluster(written(job, out), gpus={"n1": [free_gib]}, total_gib=total_gib,
                        labels={"gpu": "h100"}), now=NOW + timedelta(seconds=20))  # fmt: skip
    assert again.writes == [], "an unchanged job writes nothing"
    assert [d.reason for d in again.decisions] == [reason]


def test_a_job_waiting_for_a_cordoned_node_is_queued_quietly_naming_it() -> None:
    """Too big for n1's free memory, the job fits the cordoned n2: it waits for n2 (a Normal
    event, as any queued job), and a pass while nothing changed writes nothing."""
    job = ftj("a")

    def objects(of: Mapping[str, Any]) -> ClusterObjects:
        made = cluster(of, gpus={"n1": [5], "n2": [80]})
        made.nodes["n2"]["spec"]["unschedulable"] = True
        return made

    out = run(objects(job))
    write = write_for(out, "ns/a")
    admitted_ = condition(status_after(out, "ns/a"), cond.ADMITTED)
    assert (admitted_["status"], admitted_["reason"]) == ("False", cond.REASON_WAITING_FOR_NODES)
    assert "it would fit now on n2, which takes no work now (node cordoned)" in admitted_["message"]
    assert ("Normal", cond.REASON_WAITING_FOR_NODES) in reasons(write)
    assert run(objects(written(job, out)), now=NOW + timedelta(seconds=20)).writes == []


def test_a_job_waiting_for_a_node_whose_gpunode_is_gone_is_queued_quietly_naming_it() -> None:
    """n2's GPUNode was deleted; its agent makes it again in a moment. The job, too big for
    n1's free memory, fits n2's GPUs as its Node's labels give them: it waits for n2, as for
    a cordoned node."""
    job = ftj("a")
    labels = {"nvidia.com/gpu.memory": "81920"}
    objects = cluster(job, gpus={"n1": [5]})
    objects.nodes["n2"] = node("n2", 8, labels)
    out = run(objects)
    write = write_for(out, "ns/a")
    admitted_ = condition(status_after(out, "ns/a"), cond.ADMITTED)
    assert (admitted_["status"], admitted_["reason"]) == ("False", cond.REASON_WAITING_FOR_NODES)
    assert "it would fit now on n2, which takes no work now (GPUs not yet reported by its " \
        "vramgate agent)" in admitted_["message"]  # fmt: skip
    assert ("Normal", cond.REASON_WAITING_FOR_NODES) in reasons(write)


def test_a_queued_message_is_refreshed_at_most_every_message_refresh() -> None:
    job = ftj("a")
    first = run(cluster(job, gpus={"n1": [5]}))
    queued = written(job, first)
    message = condition(queued["status"], cond.ADMITTED)["message"]
    assert "5.00 GiB" in message, message

    moved = cluster(queued, gpus={"n1": [6]})  # only the numbers in the message change
    soon = NOW + MESSAGE_REFRESH - timedelta(seconds=1)
    assert run(moved, now=soon, last_written={"ns/a": NOW}).writes == []

    later = NOW + MESSAGE_REFRESH
    (write,) = run(moved, now=later, last_written={"ns/a": NOW}).writes
    assert set(write.patch) == {"conditions"}
    refreshed = condition(merge(queued["status"], write.patch), cond.ADMITTED)
    assert "6.00 GiB" in refreshed["message"]
    assert (
        refreshed["lastTransitionTime"]
        == condition(queued["status"], cond.ADMITTED)["lastTransitionTime"]
    ), "still the same state"
    assert write.events == (), "a refreshed number is no Event"

    # Never written by this operator (a restart): written at once.
    assert len(run(moved, now=soon).writes) == 1


# -- jobs that cannot run -------------------------------------------------------------------


def test_a_job_without_a_template_is_told_what_admission_would_do_and_gets_nothing() -> None:
    job = ftj("a", template=None)
    out = run(cluster(job))
    write = write_for(out, "ns/a")
    assert write.resource_version is None
    status = status_after(out, "ns/a")
    admitted_ = condition(status, cond.ADMITTED)
    assert (admitted_["status"], admitted_["reason"]) == ("False", cond.REASON_NO_TEMPLATE)
    assert "spec.template is empty" in admitted_["message"]
    assert "would be admitted (Fits: " in admitted_["message"]
    assert "placement" not in status
    assert out.creates == []
    assert ("Normal", cond.REASON_NO_TEMPLATE) in reasons(write)


def test_a_job_without_a_template_holds_no_gpu() -> None:
    idle = ftj("idle", minute=0, template=None)  # first in the queue
    job = ftj("b", minute=1)
    out = run(cluster(idle, job, gpus={"n1": [80]}))
    assert placed_on(status_after(out, "ns/b")) == [("n1", [0])]
    assert [c.key for c in out.creates] == ["ns/b"]
    told = condition(status_after(out, "ns/idle"), cond.ADMITTED)
    assert told["reason"] == cond.REASON_NO_TEMPLATE
    assert "would wait" in told["message"], "the GPU went to a job that can run"


def test_under_strict_fifo_a_job_without_a_template_is_told_it_would_wait_its_turn() -> None:
    waits = ftj("waits", minute=0)  # 11.6 GiB: fits the 80 GiB GPU, not its 10 free
    small = {"model": {"preset": "qwen2.5-0.5b"}}  # fits the 10 GiB free
    bare = ftj("bare", minute=1, template=None, **small)
    objects = cluster(waits, bare, gpus={"n1": [10]})
    strict = AdmissionSettings(queueing=QueueingStrategy.STRICT_FIFO)
    told = condition(status_after(run(objects, settings=strict), "ns/bare"), cond.ADMITTED)
    assert told["reason"] == cond.REASON_NO_TEMPLATE
    assert "would wait (WaitingInQueue: fits now, but waits behind ns/waits" in told["message"]


def test_a_suspended_job_without_a_template_is_told_it_is_suspended() -> None:
    job = ftj("a", template=None)
    job["spec"]["suspend"] = True
    told = condition(status_after(run(cluster(job)), "ns/a"), cond.ADMITTED)
    assert (told["status"], told["reason"]) == ("False", cond.REASON_SUSPENDED)


def test_an_invalid_template_is_an_invalid_spec_before_any_gpu_is_promised() -> None:
    bad = ftj("bad", minute=0, template={"spec": {"containers": []}})
    good = ftj("good", minute=1)
    out = run(cluster(bad, good, gpus={"n1": [80]}))

    write = write_for(out, "ns/bad")
    assert write.resource_version is None
    status = status_after(out, "ns/bad")
    for type_ in (cond.ESTIMATED, cond.ADMITTED):
        found = condition(status, type_)
        assert (found["status"], found["reason"]) == ("False", cond.REASON_INVALID_SPEC)
        assert found["message"].startswith("spec.template.spec.containers: must list")
    assert "placement" not in status
    assert reasons(write) == [("Warning", cond.REASON_INVALID_SPEC)], (
        "not announced as estimated first"
    )
    assert [d.job for d in out.decisions] == ["ns/good"], "no decision for the invalid one"
    assert placed_on(status_after(out, "ns/good")) == [("n1", [0])]
    assert [c.key for c in out.creates] == ["ns/good"]


def test_an_unchanged_invalid_template_writes_nothing() -> None:
    bad = ftj("bad", template={"spec": {"containers": []}})
    first = run(cluster(bad))
    again = run(cluster(written(bad, first)), now=NOW + timedelta(seconds=10))
    assert again.writes == [], "no write (and no Events) on every resync"


@pytest.mark.parametrize(
    "error",
    [
        SpecErrors([SpecError("spec.model.preset", "unknown preset 'nope'")]),
        ConfigMapUnavailable("spec.model.configMapRef.name: ConfigMap ns/cfg not found"),
    ],
    ids=["InvalidSpec", "ConfigMapUnavailable"],
)
def test_an_estimate_failure_is_recorded_as_the_status_rules_say(error: Exception) -> None:
    job = ftj("a")
    failure = failure_of(error, temporary_retry_s=30)
    out = run(cluster(job), estimates={"ns/a": Estimated(1, failure=failure)})

    if failure.reason == cond.REASON_INVALID_SPEC:
        expected = status_rules.invalid(failure.message, 1, {}, NOW)
    else:
        assert failure.reason == cond.REASON_CONFIGMAP_UNAVAILABLE and failure.retry_s == 30
        expected = status_rules.not_estimated(failure.reason, failure.message, 1, {}, NOW)
    assert expected.event is not None
    assert out.writes == [StatusWrite("ns/a", "uid-a", expected.patch, (expected.event,))]
    assert out.decisions == [] and out.creates == []
    status = status_after(out, "ns/a")
    assert condition(status, cond.ESTIMATED)["reason"] == failure.reason
    assert condition(status, cond.ESTIMATED)["message"] == str(error)


# -- admitted jobs --------------------------------------------------------------------------


def event(reason: str, *, uid: str = "job-uid-a") -> dict[str, Any]:
    """A core v1 Event of the Job controller about the batch Job `a` of uid `uid`."""
    return {
        "involvedObject": {"kind": "Job", "name": "a", "namespace": "ns", "uid": uid},
        "reason": reason,
        "message": "Job has reached the specified backoff limit" if "Backoff" in reason else reason,
        "lastTimestamp": "2025-03-01T12:00:00Z",
    }


def seen_running(job: dict[str, Any]) -> dict[str, Any]:
    """`job` after a pass that saw its workload (uid job-uid-a) running."""
    meta = {**workload("a")["metadata"], "uid": "job-uid-a"}
    seen = {**workload("a"), "metadata": meta}
    pods = {"ns/a": [pod("a", "Running")]}
    return written(job, run(cluster(job), workloads={"ns/a": seen}, job_pods=pods))


def test_an_admitted_job_whose_workload_was_never_created_gets_it_created_again() -> None:
    a, objects = admitted("a")
    out = run(cluster(a))
    assert out.creates == [CreateWorkload("ns/a", objects, after_write=False)]
    assert out.writes == [] and out.deletes == [] and out.lookups == []


def test_the_workloads_uid_is_recorded_once_seen() -> None:
    a, _ = admitted("a")
    a = seen_running(a)
    assert a["status"]["workloadRef"] == {
        "apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": "job-uid-a",
    }  # fmt: skip


def test_a_created_workload_gone_missing_is_looked_into_and_never_created_again() -> None:
    a, _ = admitted("a")
    out = run(cluster(seen_running(a)))
    assert out.lookups == [LookUp("ns/a", "uid-a", "ns", "a", "job-uid-a")]
    assert out.creates == [] and out.writes == [] and out.deletes == []

    # Created by this operator a moment ago, its uid not in status yet: the same.
    out = run(cluster(a), created={"ns/a": "job-uid-a"})
    assert out.lookups == [LookUp("ns/a", "uid-a", "ns", "a", "job-uid-a")]
    assert out.creates == []

    # There after all (the cache lags): nothing to do.
    remains = {"ns/a": Remains("uid-a", "a", exists=True)}
    out = run(cluster(seen_running(a)), remains=remains)
    assert out.creates == [] and out.writes == [] and out.lookups == []


def test_a_finished_workload_deleted_unseen_ends_the_job_as_it_ended() -> None:
    a = seen_running(admitted("a")[0])
    b = ftj("b", minute=5)
    ran = (event("SuccessfulCreate"), event("Completed"))
    out = run(
        cluster(a, b),
        estimates={"ns/b": estimated(b)},
        remains={"ns/a": Remains("uid-a", "a", events=ran)},
    )
    assert [c.key for c in out.creates] == ["ns/b"], "a is not run again; b gets its GPU"
    write = write_for(out, "ns/a")
    assert write.releases and out.writes[0] is write, "the release is written first"
    done = merge(a["status"], write.patch)
    succeeded = condition(done, cond.SUCCEEDED)
    assert (succeeded["status"], succeeded["reason"]) == ("True", cond.REASON_SUCCEEDED)
    assert "Events" in succeeded["message"]
    assert condition(done, cond.RUNNING)["status"] == "False"

    failed = (event("SuccessfulCreate"), event("BackoffLimitExceeded"))
    out = run(cluster(a), remains={"ns/a": Remains("uid-a", "a", events=failed)})
    assert out.creates == []
    ended = condition(merge(a["status"], write_for(out, "ns/a").patch), cond.FAILED)
    assert (ended["status"], ended["reason"]) == ("True", "BackoffLimitExceeded")
    assert "backoff limit" in ended["message"]

    # An earlier Job of the same name (another uid) completed: that says nothing of this one.
    other = (event("Completed", uid="job-uid-earlier"),)
    out = run(cluster(a), remains={"ns/a": Remains("uid-a", "a", events=other)})
    gone = condition(merge(a["status"], write_for(out, "ns/a").patch), cond.FAILED)
    assert gone["reason"] == cond.REASON_WORKLOAD_DELETED


def test_a_workload_deleted_while_it_ran_stops_the_job_and_releases_its_gpus() -> None:
    a = seen_running(admitted("a")[0])
    # `kubectl delete job a`: the Job controller made a pod, and nothing says it ended.
    remains = {"ns/a": Remains("uid-a", "a", events=(event("SuccessfulCreate"),))}
    out = run(cluster(a), remains=remains)
    assert out.creates == [] and out.lookups == []
    write = write_for(out, "ns/a")
    assert write.releases
    stopped = merge(a["status"], write.patch)
    failed = condition(stopped, cond.FAILED)
    assert (failed["status"], failed["reason"]) == ("True", cond.REASON_WORKLOAD_DELETED)
    assert "delete this FineTuneJob and apply it again" in failed["message"]
    assert ("Warning", cond.REASON_WORKLOAD_DELETED) in reasons(write)
    assert run(cluster({**a, "status": stopped}), estimates={}).writes == [], "it stays ended"

    # Its pods, not collected yet, say how it failed when they failed.
    killed = pod("a", "Failed", containerStatuses=[
        {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    ])  # fmt: skip
    out = run(cluster(a), remains={"ns/a": Remains("uid-a", "a")}, job_pods={"ns/a": [killed]})
    oom = condition(merge(a["status"], write_for(out, "ns/a").patch), cond.FAILED)
    assert oom["reason"] == cond.REASON_OOM_KILLED


def test_a_missing_workload_is_never_built_from_a_spec_changed_after_admission() -> None:
    a, _ = admitted("a")
    a["metadata"]["generation"] = 2
    a["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.invalid/other:2"
    out = run(cluster(a), estimates={})
    assert out.creates == [], "the admitted spec is gone; generation 2 is not admitted"
    write = write_for(out, "ns/a")
    assert write.releases and write.patch["placement"] is None
    after = merge(a["status"], write.patch)
    again = condition(after, cond.ADMITTED)
    assert (again["status"], again["reason"]) == ("Unknown", cond.REASON_PENDING)
    assert "decided again" in again["message"]

    # The next pass decides generation 2 afresh, its estimate and workload of that spec.
    out = run(cluster({**a, "status": after}))
    assert placed_on(status_after(out, "ns/a")) == [("n1", [0])]
    (create,) = out.creates
    image = create.objects[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.invalid/other:2"


def test_a_workload_the_api_server_refuses_for_good_releases_the_gpus_until_the_spec_changes() -> (
    None
):
    a, objects = admitted("a")
    b = ftj("b", minute=5)
    refused = Refused("uid-a", 1, 'Job.batch "a" is invalid: spec.template.spec.containers[0].name')
    out = run(cluster(a, b), estimates={"ns/b": estimated(b)}, refused={"ns/a": refused})
    write = write_for(out, "ns/a")
    assert write.releases and write.patch["placement"] is None
    assert out.deletes == [DeleteWorkload("ns/a", objects)], "whatever was made of it"
    after = merge(a["status"], write.patch)
    invalid = condition(after, cond.ADMITTED)
    assert (invalid["status"], invalid["reason"]) == ("False", cond.REASON_INVALID_TEMPLATE)
    assert "spec.template.spec.containers[0].name" in invalid["message"]
    assert ("Warning", cond.REASON_INVALID_TEMPLATE) in reasons(write)
    assert placed_on(status_after(out, "ns/b")) == [("n1", [0])], "its GPU goes to b"

    a = {**a, "status": after}
    assert run(cluster(a)).writes == [], "not decided again at the same spec"
    a["metadata"]["generation"] = 2
    assert placed_on(status_after(run(cluster(a)), "ns/a")) == [("n1", [0])], "a new spec is"


def test_a_running_workload_sets_running() -> None:
    a, _ = admitted("a")
    out = run(
        cluster(a), workloads={"ns/a": workload("a")}, job_pods={"ns/a": [pod("a", "Running")]}
    )
    assert out.creates == []
    write = write_for(out, "ns/a")
    running = condition(merge(a["status"], write.patch), cond.RUNNING)
    assert (running["status"], running["reason"]) == ("True", cond.REASON_RUNNING)
    assert "1 of 1 pods running on n1" in running["message"]
    assert ("Normal", cond.REASON_RUNNING) in reasons(write)
    assert "placement" not in write.patch


def test_a_complete_workload_succeeds_and_frees_its_gpu_in_the_same_pass() -> None:
    a, _ = admitted("a")  # on the one GPU of n1
    b = ftj("b", minute=5)
    estimates = {"ns/b": estimated(b)}

    still = run(cluster(a, b), estimates=estimates, workloads={"ns/a": workload("a")})
    assert condition(status_after(still, "ns/b"), cond.ADMITTED)["reason"] == (
        cond.REASON_WAITING_FOR_VRAM
    ), "while a runs, b waits"

    out = run(cluster(a, b), estimates=estimates, workloads={"ns/a": workload("a", "Complete")})
    done = merge(a["status"], write_for(out, "ns/a").patch)
    succeeded = condition(done, cond.SUCCEEDED)
    assert (succeeded["status"], succeeded["reason"]) == ("True", cond.REASON_SUCCEEDED)
    assert condition(done, cond.RUNNING)["status"] == "False"
    assert ("Normal", cond.REASON_SUCCEEDED) in reasons(write_for(out, "ns/a"))
    assert placed_on(status_after(out, "ns/b")) == [("n1", [0])]
    assert [c.key for c in out.creates] == ["ns/b"]

    finished = {**a, "status": done}
    assert run(cluster(finished), estimates={}).writes == [], "a finished job is left alone"


def test_a_pod_killed_for_host_memory_fails_the_job_as_oomkilled() -> None:
    a, _ = admitted("a")
    killed = pod(
        "a",
        "Failed",
        containerStatuses=[
            {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
        ],
    )
    out = run(cluster(a), workloads={"ns/a": workload("a")}, job_pods={"ns/a": [killed]})
    write = write_for(out, "ns/a")
    failed = condition(merge(a["status"], write.patch), cond.FAILED)
    assert (failed["status"], failed["reason"]) == ("True", cond.REASON_OOM_KILLED)
    assert "host RAM, not GPU memory" in failed["message"]
    assert ("Warning", cond.REASON_OOM_KILLED) in reasons(write)


def test_suspending_an_admitted_job_deletes_its_workload_and_frees_its_gpu() -> None:
    a, objects = admitted("a")  # on the one GPU of n1
    a["metadata"]["generation"] = 2
    a["spec"]["suspend"] = True
    b = ftj("b", minute=5)
    out = run(
        cluster(a, b),
        estimates={"ns/b": estimated(b)},
        workloads={"ns/a": workload("a")},
        job_pods={"ns/a": [pod("a", "Running")]},
    )

    assert out.deletes == [DeleteWorkload("ns/a", objects)]
    patch = write_for(out, "ns/a").patch
    assert patch["placement"] is None and patch["workloadRef"] is None
    released = merge(a["status"], patch)
    suspended = condition(released, cond.ADMITTED)
    assert (suspended["status"], suspended["reason"]) == ("False", cond.REASON_SUSPENDED)
    assert cond.RUNNING not in {c["type"] for c in released["conditions"]}
    assert ("Normal", cond.REASON_SUSPENDED) in reasons(write_for(out, "ns/a"))
    assert placed_on(status_after(out, "ns/b")) == [("n1", [0])], "a's GPU, in the same pass"
    assert [c.key for c in out.creates] == ["ns/b"]


def test_a_spec_change_after_admission_is_locked_out_and_said_so() -> None:
    a, _ = admitted("a")
    a["metadata"]["generation"] = 2
    a["spec"]["lora"] = {"rank": 64}
    workloads, pods = {"ns/a": workload("a")}, {"ns/a": [pod("a", "Running")]}
    out = run(cluster(a), estimates={}, workloads=workloads, job_pods=pods)

    write = write_for(out, "ns/a")
    locked_status = merge(a["status"], write.patch)
    locked = condition(locked_status, cond.ADMITTED)
    assert (locked["status"], locked["reason"]) == ("True", cond.REASON_SPEC_LOCKED)
    assert locked["observedGeneration"] == 1, "what is admitted is generation 1"
    assert "only spec.suspend may change" in locked["message"]
    assert ("Warning", cond.REASON_SPEC_LOCKED) in reasons(write)
    assert "placement" not in write.patch and locked_status["placement"] == a["status"]["placement"]
    assert out.deletes == [] and out.creates == []

    again = run(
        cluster({**a, "status": locked_status}), estimates={}, workloads=workloads, job_pods=pods
    )
    assert again.writes == [], "said once"


def test_a_spec_change_after_the_job_finished_is_ignored_and_said_so() -> None:
    a, _ = admitted("a")
    done = run(cluster(a), estimates={}, workloads={"ns/a": workload("a", "Complete")})
    a = {**a, "status": merge(a["status"], write_for(done, "ns/a").patch)}
    a["metadata"]["generation"] = 2
    a["spec"]["lora"] = {"rank": 64}

    out = run(cluster(a), estimates={"ns/a": estimated(a)})
    write = write_for(out, "ns/a")
    locked_status = merge(a["status"], write.patch)
    locked = condition(locked_status, cond.ADMITTED)
    assert (locked["status"], locked["reason"]) == ("True", cond.REASON_SPEC_LOCKED)
    assert locked["observedGeneration"] == 1
    assert "finished" in locked["message"] and "delete it and apply it again" in locked["message"]
    assert ("Warning", cond.REASON_SPEC_LOCKED) in reasons(write)
    assert condition(locked_status, cond.SUCCEEDED)["status"] == "True", "still succeeded"
    assert out.creates == [] and out.decisions == [], "not decided again"

    again = run(cluster({**a, "status": locked_status}), estimates={"ns/a": estimated(a)})
    assert again.writes == [], "said once"

    # A foreground deletion bumps the generation too: no change of the spec to speak of.
    a["metadata"]["deletionTimestamp"] = "2026-12-01T12:00:00Z"
    assert run(cluster(a), estimates={"ns/a": estimated(a)}).writes == []


def test_admissions_are_written_before_the_other_writes() -> None:
    rejected = ftj("a-first", minute=0, resources={"gpuSelector": {"gpu": "a100"}})
    fits = ftj("z-last", minute=1)
    out = run(cluster(rejected, fits))
    assert [(w.key, w.resource_version) for w in out.writes] == [
        ("ns/z-last", "101"),
        ("ns/a-first", None),
    ]


# -- decisions recorded for the metrics -------------------------------------------------------


def test_a_write_records_a_new_decision_and_whether_it_is_the_jobs_first() -> None:
    a = ftj("a")
    out = run(cluster(a))
    assert write_for(out, "ns/a").recorded == Recorded(
        decision="Admit", reason="Fits", first=True, profile="calibrated"
    ), "the estimate's profile, so the accuracy series can exist before the job ends"

    waits = ftj("waits", resources={"gpus": 1})
    busy = cluster(waits, gpus={"n1": [5]})
    queued = run(busy)
    assert write_for(queued, "ns/waits").recorded == Recorded(
        decision="Queue", reason=cond.REASON_WAITING_FOR_VRAM, first=True, profile="calibrated"
    )
    later = written(waits, queued)
    freed = run(cluster(later), estimates={"ns/waits": estimated(waits)})
    assert write_for(freed, "ns/waits").recorded == Recorded(
        decision="Admit", reason="Fits", first=False, profile="calibrated"
    ), "admitted after waiting: a decision, not the first"


def test_a_resized_job_shows_its_estimate_at_the_admitted_count() -> None:
    # Full llama-3.1-8b needs ~130 GiB on one GPU: four 80 GiB GPUs hold it with FSDP.
    job = ftj("full", method="Full", lora=None, admissionPolicy="Resize",
              resources={"gpus": 1, "minGPUs": 1, "maxGPUs": 8})  # fmt: skip
    out = run(cluster(job, gpus={"n1": [80] * 8}))
    status = written(job, out)["status"]
    admitted = status["placement"]["admittedGPUs"]
    assert admitted > 1, status["conditions"]
    assert status["estimate"]["gpus"] == admitted
    assert status["estimate"]["perGpuBytes"] == status["placement"]["perGpuBytes"]
    assert status["estimate"]["perGpu"] == format_gib(status["placement"]["perGpuBytes"])
    # `kubectl describe ftj` shows the Estimated condition beside status.estimate: one figure.
    assert condition(status, "Estimated")["message"].startswith(
        f"{status['estimate']['perGpu']} per GPU on {admitted} GPUs with FSDP ("
    )
    assert condition(status, "Estimated")["message"].endswith(
        "; resized from the 1 GPU asked for (policy Resize)"
    )


def test_a_queued_jobs_message_refresh_records_no_new_decision() -> None:
    waits = ftj("waits")
    first = run(cluster(waits, gpus={"n1": [5]}))
    later = written(waits, first)
    refreshed = run(
        cluster(later, gpus={"n1": [6]}), now=NOW + MESSAGE_REFRESH * 2,
        last_written={"ns/waits": NOW},
    )  # fmt: skip
    assert write_for(refreshed, "ns/waits").recorded is None


def test_a_job_without_a_template_is_recorded_as_advice() -> None:
    out = run(cluster(ftj("bare", template=None)))
    assert write_for(out, "ns/bare").recorded == Recorded(
        decision="Advise", reason=cond.REASON_NO_TEMPLATE, first=True, profile="calibrated"
    )


# -- status.observed ---------------------------------------------------------------------------


def using(objects: ClusterObjects, gib: float, pod_uid: str = "pod-a") -> ClusterObjects:
    """`objects` with the pod `pod_uid` using `gib` GiB on n1's GPU 0, as the agent says."""
    gpu = objects.gpunodes["n1"]["status"]["gpus"][0]
    gpu["pods"] = [{"uid": pod_uid, "usedBytes": int(gib * GIB)}]
    return objects


def running(a: Mapping[str, Any]) -> dict[str, Any]:
    return {"workloads": {"ns/a": workload("a")}, "job_pods": {"ns/a": [pod("a", "Running")]}}


def test_the_first_observation_of_a_running_job_is_written_with_node_index_and_uuid() -> None:
    a, _ = admitted("a")
    out = run(using(cluster(a), 10.0), estimates={}, **running(a))
    status = merge(a["status"], write_for(out, "ns/a").patch)
    assert status["observed"] == {
        "peakBytes": 10 * GIB,
        "peak": "10.00 GiB",
        "peakSince": "2025-03-01T12:00:00Z",  # the pass's now: first seen
        "gpus": [{"node": "n1", "index": 0, "uuid": "GPU-n1-0", "peakBytes": 10 * GIB}],
    }
    assert out.peaks["uid-a"]["GPU-n1-0"].peak_bytes == 10 * GIB


def test_a_peak_is_rewritten_only_once_it_grew_by_more_than_the_threshold() -> None:
    a, _ = admitted("a")
    first = run(using(cluster(a), 10.0), estimates={}, **running(a))
    a = written(a, first)
    base = 10 * GIB
    step = base * 5 // 100  # 512 MiB: 5 % of 10 GiB is larger than 256 MiB
    assert step > GROWTH_BYTES

    at = run(using(cluster(a), (base + step) / GIB), estimates={}, peaks=first.peaks, **running(a))
    assert at.writes == [], "exactly at the threshold: not yet"
    assert at.peaks["uid-a"]["GPU-n1-0"].peak_bytes == base + step, "but remembered"

    over = run(
        using(cluster(a), (base + step + 1) / GIB), estimates={}, peaks=at.peaks, **running(a)
    )
    assert merge(a["status"], write_for(over, "ns/a").patch)["observed"]["peakBytes"] == (
        base + step + 1
    )


def test_a_small_peak_grows_by_256_mib_before_it_is_rewritten() -> None:
    a, _ = admitted("a")
    first = run(using(cluster(a), 1.0), estimates={}, **running(a))
    a = written(a, first)
    inside = run(using(cluster(a), 1.25), estimates={}, peaks=first.peaks, **running(a))
    assert inside.writes == [], "256 MiB more is 25 % of 1 GiB, but not more than 256 MiB"
    beyond = run(using(cluster(a), 1.26), estimates={}, peaks=first.peaks, **running(a))
    assert [w.key for w in beyond.writes] == ["ns/a"]


def test_a_peak_never_falls_and_one_between_writes_is_not_lost() -> None:
    a, _ = admitted("a")
    first = run(using(cluster(a), 10.0), estimates={}, **running(a))
    a = written(a, first)
    up = run(using(cluster(a), 10.3), estimates={}, peaks=first.peaks, **running(a))
    assert up.writes == []
    down = run(using(cluster(a), 4.0), estimates={}, peaks=up.peaks, **running(a))
    assert down.writes == [] and down.peaks["uid-a"]["GPU-n1-0"].peak_bytes == int(10.3 * GIB)

    done = run(
        cluster(a), estimates={}, peaks=down.peaks,
        workloads={"ns/a": workload("a", "Complete")}, job_pods={"ns/a": [pod("a", "Succeeded")]},
    )  # fmt: skip
    write = write_for(done, "ns/a")
    assert merge(a["status"], write.patch)["observed"]["peakBytes"] == int(10.3 * GIB), (
        "the end's write carries the exact peak"
    )
    assert write.recorded == Recorded(
        finished=cond.REASON_SUCCEEDED,
        peak_bytes=int(10.3 * GIB),
        predicted_bytes=a["status"]["placement"]["perGpuBytes"],
        profile="calibrated",
    )
    assert "uid-a" in done.peaks, "kept while the end's write may still fail"
    after = run(cluster(written(a, done)), estimates={}, peaks=done.peaks)
    assert after.writes == [] and after.peaks == {}, "a finished job is not tracked"


def test_a_job_that_ends_unobserved_is_recorded_with_no_peak() -> None:
    a, _ = admitted("a")
    done = run(cluster(a), estimates={}, workloads={"ns/a": workload("a", "Complete")})
    write = write_for(done, "ns/a")
    assert "observed" not in write.patch
    assert write.recorded is not None and write.recorded.peak_bytes == 0


def test_another_pods_memory_is_not_the_jobs() -> None:
    a, _ = admitted("a")
    out = run(using(cluster(a), 10.0, pod_uid="someone-else"), estimates={}, **running(a))
    assert "observed" not in merge(a["status"], write_for(out, "ns/a").patch)
    assert out.peaks == {}


def test_suspending_a_job_removes_what_was_observed_with_its_placement() -> None:
    a, _ = admitted("a")
    a = written(a, run(using(cluster(a), 10.0), estimates={}, **running(a)))
    assert a["status"]["observed"]["peakBytes"] == 10 * GIB
    a["metadata"]["generation"] = 2
    a["spec"]["suspend"] = True
    out = run(cluster(a), estimates={}, workloads={"ns/a": workload("a")})
    assert write_for(out, "ns/a").patch["observed"] is None


def test_pod_usage_is_read_once_and_a_jobs_pods_are_summed_per_gpu() -> None:
    nodes = {
        "n1": {"status": {"gpus": [
            {"index": 0, "uuid": "GPU-a", "pods": [{"uid": "p1", "usedBytes": 3 * GIB},
                                                    {"uid": "p2", "usedBytes": 2 * GIB},
                                                    {"uid": "other", "usedBytes": 9 * GIB}]},
            {"index": 1, "uuid": "GPU-b", "pods": [{"uid": "p1", "usedBytes": None}]},
        ]}},
        "n2": {"status": {"gpus": [
            {"index": 3, "uuid": "GPU-c", "pods": [{"uid": "p2", "usedBytes": GIB}]},
        ]}},
    }  # fmt: skip
    usage = observed.pod_usage(nodes)
    assert usage["p1"] == (("n1", 0, "GPU-a", 3 * GIB),), "unknown usage is not zero usage"
    seen = observed.seen_now({"p1", "p2"}, usage)
    assert seen == {
        "GPU-a": observed.GpuPeak("n1", 0, "GPU-a", 5 * GIB),
        "GPU-c": observed.GpuPeak("n2", 3, "GPU-c", GIB),
    }
    assert observed.seen_now(set(), usage) == {}
