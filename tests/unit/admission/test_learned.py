"""The learning loop's wiring, as plain data: a job's end writes its sample, the leader files
samples under the keys that have not counted them, and the pass corrects waiting jobs."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from controller.admission import learned
from controller.admission.admission_pass import PassInput, admission_pass
from controller.api import conditions as cond
from controller.api.base import JOB_LABEL
from controller.api.finetunejob import FineTuneJobSpec
from controller.api.learnedcorrection import MAX_COUNTED_UIDS, object_name
from controller.decision import AdmissionSettings
from controller.jobs.spec import translate
from controller.learning import JobKey, LearningSettings, Policy
from controller.learning.histogram import format_time
from tests.unit.builders.admission import (
    GIB,
    NOW,
    admitted,
    cluster,
    condition,
    estimated,
    ftj,
    merge,
    run,
    status_after,
    written,
)

SETTINGS = LearningSettings(min_samples=3)


def workload(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ns", "labels": {JOB_LABEL: name}},
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 0},
        "status": {
            "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]
        },
    }


def trainer_pod(job: str, phase: str, message: str = "") -> dict[str, Any]:
    containers = []
    if phase == "Failed":
        state = {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
        containers = [{"name": "trainer", "state": state}]
    return {
        "metadata": {"name": f"{job}-x1", "namespace": "ns", "uid": f"pod-{job}",
                     "labels": {JOB_LABEL: job}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "containerStatuses": containers},
    }  # fmt: skip


def ended(name: str, used: float, *, failed: bool = False, **spec: Any) -> dict[str, Any]:
    """Job `name`, admitted, whose pod used `used` x its prediction on n1's GPU 0 and then
    succeeded (or died of a CUDA OOM), as the API holds it after the pass that saw its end."""
    job, _ = admitted(name, **spec)
    predicted = job["status"]["estimate"]["perGpuLevels"]["nvmlBytes"]
    objects = cluster(job)
    objects.gpunodes["n1"]["status"]["gpus"][0]["pods"] = [
        {"uid": f"pod-{name}", "usedBytes": int(used * predicted)}
    ]
    running = {"workloads": {f"ns/{name}": workload(name)},
               "job_pods": {f"ns/{name}": [trainer_pod(name, "Running")]}}  # fmt: skip
    job = written(job, run(objects, estimates={}, **running))
    if failed:
        oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
        end = workload(name, ("Failed", "BackoffLimitExceeded"))
        pods = [trainer_pod(name, "Failed", oom)]
    else:
        end = workload(name, ("Complete", ""))
        pods = [trainer_pod(name, "Succeeded")]
    out = run(cluster(job), estimates={}, workloads={f"ns/{name}": end},
              job_pods={f"ns/{name}": pods})  # fmt: skip
    return written(job, out)


def with_uid(job: Mapping[str, Any], uid: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(job))
    out["metadata"]["uid"] = uid
    return out


def learn(
    jobs: Sequence[Mapping[str, Any]],
    objects: Sequence[Mapping[str, Any]] = (),
    settings: LearningSettings = SETTINGS,
) -> dict[str, dict[str, Any]]:
    """What the leader writes, applied: every key object after filing `jobs`' samples."""
    states = learned.key_states(objects, settings)
    changed = learned.file_samples(states, learned.samples_of(jobs), settings)
    out = {str(o["metadata"]["name"]): dict(o) for o in objects}
    for state in changed.values():
        obj, _ = learned.key_object(state, settings, NOW)
        name = obj["metadata"]["name"]
        status = learned.key_patch(state, settings, NOW)
        before = out.get(name, obj)
        version = int(before["metadata"].get("resourceVersion") or 0) + 1
        out[name] = {**before, "metadata": {**obj["metadata"], "resourceVersion": str(version)},
                     "status": merge(before.get("status") or {}, status)}  # fmt: skip
    return out


def decide(job: Mapping[str, Any], objects: Mapping[str, Mapping[str, Any]], **kw: Any):
    settings = kw.pop("learning", SETTINGS)
    states = learned.key_states(objects.values(), settings)
    return admission_pass(
        PassInput(
            objects=cluster(job),
            workloads={},
            job_pods={},
            estimates={"ns/" + job["metadata"]["name"]: estimated(job)},
            settings=AdmissionSettings(),
            now=NOW,
            learned=learned.records(states),
            learning=settings,
            **kw,
        )
    )


def reserved(out: Any, name: str) -> int:
    return int(status_after(out, f"ns/{name}")["placement"]["perGpuBytes"])


def own_figure(job: Mapping[str, Any]) -> int:
    found = estimated(job)
    assert found.plan is not None and found.estimate is not None
    return found.estimate.per_gpu_bytes(found.plan.gpus, found.plan.parallelism)


# -- a job's end -> its sample ----------------------------------------------------------------


def test_a_job_that_succeeded_writes_its_ratio_to_its_own_prediction_with_its_end() -> None:
    job = ended("a", 0.7)
    sample = job["status"]["learnedSample"]
    predicted = job["status"]["estimate"]["perGpuLevels"]["nvmlBytes"]
    assert sample["kind"] == "Steady"
    assert sample["predictedBytes"] == predicted
    assert sample["observedBytes"] == int(0.7 * predicted)
    assert condition(job["status"], cond.SUCCEEDED)["status"] == "True", "in the end's write"
    key = JobKey.parse(sample["key"])
    assert (key.family, key.method, key.profile) == ("llama", "QLoRA", "calibrated")


def test_a_job_that_died_of_gpu_oom_writes_an_out_of_memory_sample() -> None:
    job = ended("a", 0.9, failed=True)
    assert condition(job["status"], cond.FAILED)["reason"] == cond.REASON_GPU_OUT_OF_MEMORY
    assert job["status"]["learnedSample"]["kind"] == "OutOfMemory"


def test_a_sample_is_written_once_and_never_rewritten() -> None:
    job = ended("a", 0.7)
    again = run(cluster(job), estimates={}, workloads={"ns/a": workload("a", ("Complete", ""))})
    assert all("learnedSample" not in w.patch for w in again.writes)


class Running:
    """Job `name`, admitted and running, its pod seen on n1's GPU 0 at each pass's `now`."""

    def __init__(self, name: str, **spec: Any) -> None:
        self.name = name
        self.job, _ = admitted(name, **spec)
        self.predicted = self.job["status"]["estimate"]["perGpuLevels"]["nvmlBytes"]
        self.peaks: Mapping[str, Any] = {}

    def step(self, minutes: float, used: float, end: str = "", oom: bool = False) -> dict[str, Any]:
        """One pass `minutes` after NOW, the pod using `used` x the prediction (and the
        workload Complete or Failed with a CUDA OOM where `end` says so); what it wrote."""
        objects = cluster(self.job)
        objects.gpunodes["n1"]["status"]["gpus"][0]["pods"] = [
            {"uid": f"pod-{self.name}", "usedBytes": int(used * self.predicted)}
        ]
        key = f"ns/{self.name}"
        if end == "Complete":
            load, pods = workload(self.name, ("Complete", "")), [trainer_pod(self.name, "Running")]
        elif end == "Failed":
            oom_text = "torch.OutOfMemoryError: CUDA out of memory." if oom else "bad"
            load = workload(self.name, ("Failed", "BackoffLimitExceeded"))
            pods = [trainer_pod(self.name, "Failed", oom_text)]
        else:
            load, pods = workload(self.name), [trainer_pod(self.name, "Running")]
        out = run(objects, estimates={}, workloads={key: load}, job_pods={key: pods},
                  now=NOW + timedelta(minutes=minutes), peaks=self.peaks)  # fmt: skip
        self.peaks = out.peaks
        patch = next((w.patch for w in out.writes if w.key == key), {})
        self.job = written(self.job, out)
        return patch

    @property
    def sample(self) -> dict[str, Any] | None:
        found = self.job["status"].get("learnedSample")
        return None if found is None else dict(found)


def test_a_running_job_whose_peak_is_steady_teaches_before_it_ends() -> None:
    job = Running("a")
    assert "learnedSample" not in job.step(0, 0.7), "first seen: too soon"
    assert job.job["status"]["observed"]["peakSince"] == "2025-03-01T12:00:00Z"
    assert job.step(14, 0.7) == {}, "14 minutes steady: not yet (15 by default)"
    patch = job.step(15, 0.7)
    sample = patch["learnedSample"]
    assert sample["kind"] == "Steady" and sample["running"] is True
    assert sample["observedBytes"] == int(0.7 * job.predicted)
    assert sample["predictedBytes"] == job.predicted
    assert sample["time"] == "2025-03-01T12:15:00Z"
    assert job.step(30, 0.7) == {}, "written once"
    assert learned.sample_id(job.job) == "uid-a"


def test_a_peak_that_grows_while_the_job_runs_starts_the_wait_again() -> None:
    job = Running("a")
    job.step(0, 0.5)
    assert job.step(10, 0.8)["observed"]["peakSince"] == "2025-03-01T12:10:00Z"
    assert job.step(20, 0.8) == {}, "10 minutes since it grew"
    job.step(21, 0.82)  # 2.5 % more: below the write threshold, the same peak read again
    assert job.step(25, 0.82)["learnedSample"]["observedBytes"] == int(0.82 * job.predicted)


def test_the_end_files_in_place_of_the_running_sample() -> None:
    grew = Running("b")
    grew.step(0, 0.7)
    grew.step(15, 0.7)
    before = grew.sample
    assert before is not None
    grew.step(40, 1.1, end="Complete")
    after = grew.sample
    assert after is not None and after["revision"] == 1 and after["running"] is False
    assert after["observedBytes"] == int(1.1 * grew.predicted)
    assert after["replaces"] == {
        "observedBytes": before["observedBytes"],
        "predictedBytes": before["predictedBytes"],
        "time": before["time"],
    }
    assert learned.sample_id(grew.job) == "uid-b/1"
    grew.step(50, 1.1, end="Complete")
    assert grew.sample == after, "revised once"

    died = Running("c")
    died.step(0, 0.7)
    died.step(15, 0.7)
    died.step(40, 0.7, end="Failed", oom=True)
    assert died.sample is not None and died.sample["kind"] == "OutOfMemory"
    assert died.sample["revision"] == 1


def test_an_ended_jobs_sample_replaces_its_running_one_in_every_key_that_counted_it() -> None:
    """A job counted once: its end's sample takes the running one's place (same samples, the
    ratio moved), filed once across restarts; a key rebuilt after the end counts it once."""
    job = Running("a")
    job.step(0, 0.6)
    job.step(15, 0.6)
    running_job = copy.deepcopy(job.job)
    objects = learn([running_job])
    job.step(40, 1.2, end="Complete")
    revised = learn([job.job], list(objects.values()))
    rebuilt = learn([job.job])
    for name, obj in revised.items():
        status = obj["status"]
        assert status["samples"] == 1, name
        assert status["countedUIDs"] == ["uid-a", "uid-a/1"]
        assert float(status["p95Ratio"]) >= 1.2 > float(objects[name]["status"]["p95Ratio"])
        assert (
            status["histogram"]["bucketWeights"]
            == (rebuilt[name]["status"]["histogram"]["bucketWeights"])
        ), "the running sample's weight taken out exactly"
    again = learned.file_samples(
        learned.key_states(revised.values(), SETTINGS),
        learned.samples_of([job.job]),
        SETTINGS,
    )
    assert again == {}, "filed once"


def revised_pair(name: str, end_used: float, oom: bool = False) -> tuple[Any, Any]:
    """Job `name` as the API holds it after its running sample (0.6 x), and after its end."""
    job = Running(name)
    job.step(0, 0.6)
    job.step(15, 0.6)
    before = copy.deepcopy(job.job)
    job.step(40, end_used, end="Failed" if oom else "Complete", oom=oom)
    return before, job.job


def test_an_oom_after_a_running_sample_is_taken_out_once_and_only_from_its_own_key() -> None:
    """The OOM files under the job's own key alone: the running sample leaves that key once,
    however often the leader files again (beside other jobs' samples), and stays in the
    coarser keys, which the OOM's bound does not reach."""
    before, died = revised_pair("a", 0.6, oom=True)
    objects = learn([before])
    other = with_uid(ended("b", 0.8), "uid-b")
    once = learn([died], list(objects.values()))
    twice = learn([died, other], list(once.values()))
    finest = object_name(JobKey.parse(died["status"]["learnedSample"]["key"]))
    assert once[finest]["status"]["samples"] == 1, "the OOM's sample in the running one's place"
    for name, obj in twice.items():
        if name == finest:
            continue
        assert obj["status"]["samples"] == 2, "the running sample and b's: nothing drained"


def test_a_reset_between_the_running_sample_and_the_end_takes_nothing_out() -> None:
    before, after = revised_pair("a", 1.2)
    objects = learn([before])
    finest = object_name(JobKey.parse(before["status"]["learnedSample"]["key"]))
    objects[finest]["spec"]["resetAt"] = "2025-03-01T12:20:00Z"  # after the running sample
    other = with_uid(ended("b", 0.8), "uid-b")
    other["status"]["learnedSample"]["time"] = "2025-03-01T12:30:00Z"
    status = learn([other, after], list(objects.values()))[finest]["status"]
    assert status["samples"] == 2, "b's and a's end: the running one was already forgotten"
    assert len(status["histogram"]["bucketWeights"]) == 2, "the reset's bucket is gone"


def test_a_running_sample_does_not_clear_its_keys_oom_raise() -> None:
    objects = learn([ended("dead", 0.9, failed=True)])
    job = Running("a")
    job.step(0, 0.6)
    job.step(15, 0.6)
    assert job.sample is not None and job.sample["running"] is True
    finest = object_name(JobKey.parse(job.sample["key"]))
    raised = objects[finest]["status"]["oomFactorPercent"]
    assert (
        raised
        and learn([job.job], list(objects.values()))[finest]["status"]["oomFactorPercent"] == raised
    ), "it may still die"
    job.step(40, 0.6, end="Complete")
    ended_status = learn([job.job], list(objects.values()))[finest]["status"]
    assert ended_status.get("oomFactorPercent") is None, "its success clears it"


def run_then_end(
    objects: Mapping[str, Mapping[str, Any]], running: float, end: float, **spec: Any
) -> tuple[dict[str, dict[str, Any]], Running, str]:
    """Job "b" of `spec` runs at `running` x its prediction long enough to file a running
    sample, then ends at `end` x: the key objects after each pass's filing, the job, and
    its finest key's object name."""
    job = Running("b", **spec)
    job.step(0, running)
    job.step(15, running)
    assert job.sample is not None
    finest = object_name(JobKey.parse(job.sample["key"]))
    filed = learn([job.job], list(objects.values()))  # the running sample
    job.step(40, end, end="Complete")
    return learn([job.job], list(filed.values())), job, finest  # its end, in its place


def test_a_success_its_kind_would_not_cover_keeps_the_raise_through_its_running_sample():
    """Rank 32 needs 1.3 x; its kind (rank 16 jobs) uses 1.0 x. After its OOM, a job of it
    runs at 1.3 x and succeeds: its running sample, filed first, must not count towards
    covering its own end, so the raise stays; nor, in a rebuild of its deleted key, its own
    sample the coarser keys counted already."""
    kind = [with_uid(ended("k", 1.0), f"k{i}") for i in range(3)]
    dead = ended("dead", 0.9, failed=True, lora={"rank": 32})
    objects = learn([*kind, dead])
    objects, _, finest = run_then_end(objects, 1.3, 1.3, lora={"rank": 32})
    assert (objects[finest]["status"].get("oomFactorPercent") or 0) >= 129, "kept, at what it used"

    # A job of it that ended without a running sample, filed, then its key deleted and
    # rebuilt: the coarser keys have counted it already, and it must not cover itself there.
    other = with_uid(ended("z", 1.3, lora={"rank": 32}), "uid-z")  # filed after uid-dead
    objects = learn([*kind, dead])
    objects = learn([other], list(objects.values()))
    kept = objects[finest]["status"].get("oomFactorPercent") or 0
    assert kept >= 129
    rebuilt = {n: o for n, o in objects.items() if n != finest}
    again = learn([*kind, dead, other], list(rebuilt.values()))
    assert again[finest]["status"].get("oomFactorPercent") == kept, "a rebuild reads the same"


def test_a_rebuild_judges_a_raise_as_filing_did_when_the_job_had_a_running_sample() -> None:
    """The kind: 19 jobs at 1.0 x and one at 1.3 x. After its OOM, a rank 32 job runs at 1.0 x
    (a running sample) and ends at 1.3 x. Filed pass by pass its raise stays; a rebuild of its
    deleted key must judge on the same records (its running sample, replaced in the coarser
    keys long ago, is not taken out of them a second time)."""
    kind = [with_uid(ended("k", 1.0), f"k{i:02}") for i in range(19)]
    kind.append(with_uid(ended("h", 1.3), "k19"))
    dead = ended("dead", 0.9, failed=True, lora={"rank": 32})
    objects = learn([*kind, dead])
    objects, job, finest = run_then_end(objects, 1.0, 1.3, lora={"rank": 32})
    kept = objects[finest]["status"].get("oomFactorPercent")
    assert kept is not None
    rebuilt = {n: o for n, o in objects.items() if n != finest}
    again = learn([*kind, dead, job.job], list(rebuilt.values()))
    assert again[finest]["status"].get("oomFactorPercent") == kept


def test_peaks_written_before_peak_since_existed_get_it_once() -> None:
    job = Running("a")
    job.step(0, 0.6)
    del job.job["status"]["observed"]["peakSince"]  # as an older operator wrote it
    assert job.step(5, 0.6)["observed"]["peakSince"] == "2025-03-01T12:05:00Z"
    assert job.step(6, 0.6) == {}


def test_steady_seconds_zero_teaches_only_at_the_end() -> None:
    settings = LearningSettings(steady_seconds=0)
    job = Running("a")
    job.step(0, 0.7)
    assert (
        learned.running_sample(
            job.job["status"],
            _key(job.job),
            int(0.7 * job.predicted),
            NOW + timedelta(days=1),
            settings,
        )
        is None
    )


def _key(job: Mapping[str, Any]) -> JobKey:
    return learned.job_key(job, job["status"].get("estimate") or {})


# -- filing samples ---------------------------------------------------------------------------


def test_samples_are_filed_under_every_key_of_the_ladder_and_counted_once() -> None:
    job = ended("a", 0.7)
    key = JobKey.parse(job["status"]["learnedSample"]["key"])
    objects = learn([job])
    assert set(objects) == {object_name(k) for k in key.ladder()}
    for obj in objects.values():
        assert obj["status"]["samples"] == 1 and obj["status"]["countedUIDs"] == ["uid-a"]
    again = learned.file_samples(
        learned.key_states(objects.values(), SETTINGS), learned.samples_of([job]), SETTINGS
    )
    assert again == {}, "a restart or a new leader files nothing twice"


def test_a_deleted_key_is_rebuilt_from_the_jobs_that_carry_their_sample() -> None:
    jobs = [with_uid(ended("a", 0.7), f"uid-{i}") for i in range(3)]
    objects = learn(jobs)
    finest = object_name(JobKey.parse(jobs[0]["status"]["learnedSample"]["key"]))
    lost = {k: v for k, v in objects.items() if k != finest}
    rebuilt = learn(jobs, list(lost.values()))
    assert rebuilt[finest]["status"]["histogram"] == objects[finest]["status"]["histogram"]
    assert all(rebuilt[k] == lost[k] for k in lost), "the other keys counted them already"


def test_a_configuration_no_job_taught_for_8_half_lives_is_forgotten_and_not_made_again():
    jobs = [with_uid(ended("a", 0.7), f"uid-{i}") for i in range(3)]
    objects = learn(jobs)
    key = JobKey.parse(jobs[0]["status"]["learnedSample"]["key"])
    assert key.config != "*"
    states = learned.key_states(objects.values(), SETTINGS)
    half_life = timedelta(seconds=SETTINGS.half_life_seconds)
    # Its latest sample is at NOW; its histogram's reference a whole half-life at or before.
    assert learned.forgotten(states, NOW + 8 * half_life) == []
    later = NOW + (learned.FORGET_AFTER_HALF_LIVES + 1) * half_life
    assert [s.key for s in learned.forgotten(states, later)] == [key], "its kind's keys stay"
    # The jobs still in the API do not make it again; a job of it taught now does.
    left = {n: st for n, st in states.items() if n != key.name}
    again = learned.file_samples(left, learned.samples_of(jobs), SETTINGS, later)
    assert again == {}
    fresh = with_uid(ended("a", 0.7), "uid-new")
    fresh["status"]["learnedSample"]["time"] = format_time(later)
    made = learned.file_samples(left, learned.samples_of([*jobs, fresh]), SETTINGS, later)
    assert key.name in made and made[key.name].record.histogram.samples == 4


def test_a_forgotten_configuration_is_not_made_again_of_an_old_oom() -> None:
    """Its OOM's raise was cleared by a success; the success's job left the API, the OOM's
    did not: the rebuild must not bring the raise back (it would never be forgotten)."""
    died = ended("b", 0.9, failed=True)
    key = JobKey.parse(died["status"]["learnedSample"]["key"])
    objects = learn([died])
    left = {n: st for n, st in learned.key_states(objects.values(), SETTINGS).items()
            if n != key.name}  # fmt: skip
    half_life = timedelta(seconds=SETTINGS.half_life_seconds)
    later = NOW + (learned.FORGET_AFTER_HALF_LIVES + 1) * half_life
    assert key.name in learned.file_samples(left, learned.samples_of([died]), SETTINGS, NOW)
    assert learned.file_samples(left, learned.samples_of([died]), SETTINGS, later) == {}


def test_a_pinned_or_raised_configuration_is_never_forgotten() -> None:
    half_life = timedelta(seconds=SETTINGS.half_life_seconds)
    later = NOW + 20 * half_life
    oom = learn([ended("b", 0.9, failed=True)])
    raised = learned.key_states(oom.values(), SETTINGS)
    assert any(st.record.oom_factor_percent for st in raised.values())
    assert learned.forgotten(raised, later) == []
    objects = learn([ended("a", 0.7)])
    finest = object_name(JobKey.parse(ended("a", 0.7)["status"]["learnedSample"]["key"]))
    objects[finest]["spec"]["pinnedPercent"] = 90
    assert learned.forgotten(learned.key_states(objects.values(), SETTINGS), later) == []


def test_the_histogram_reads_back_exactly_from_its_status() -> None:
    objects = learn([with_uid(ended("a", 0.7), f"u{i}") for i in range(2)])
    for obj in objects.values():
        state = learned.key_state(obj, SETTINGS)
        assert state is not None
        status = learned.histogram_to_status(state.record.histogram)
        assert status == obj["status"]["histogram"]
        assert all(isinstance(v, str) for v in status["bucketWeights"].values()), "no floats"


def test_a_reset_forgets_the_samples_taken_before_it() -> None:
    old = with_uid(ended("a", 0.7), "old")
    objects = learn([old])
    finest = object_name(JobKey.parse(old["status"]["learnedSample"]["key"]))
    objects[finest]["spec"]["resetAt"] = "2025-03-01T12:00:00Z"  # NOW: the sample's time
    new = with_uid(ended("b", 1.2), "new")
    new["status"]["learnedSample"]["time"] = "2025-03-01T12:05:00Z"
    after = learn([old, new], list(objects.values()))
    status = after[finest]["status"]
    assert status["samples"] == 1 and status["countedUIDs"] == ["new"]
    assert status["resetAt"] == "2025-03-01T12:00:00Z"


def test_counted_uids_are_bounded_and_older_samples_stay_counted() -> None:
    base = ended("a", 0.7)
    jobs = []
    for i in range(MAX_COUNTED_UIDS + 3):
        job = with_uid(base, f"u{i:04d}")
        at = NOW + timedelta(minutes=i)
        job["status"]["learnedSample"]["time"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        jobs.append(job)
    objects = learn(jobs)
    status = next(iter(objects.values()))["status"]
    assert len(status["countedUIDs"]) == MAX_COUNTED_UIDS
    assert "u0000" not in status["countedUIDs"] and status["samples"] == MAX_COUNTED_UIDS + 3
    assert status["countedThrough"] == (NOW + timedelta(minutes=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    again = learned.file_samples(
        learned.key_states(objects.values(), SETTINGS), learned.samples_of(jobs), SETTINGS
    )
    assert again == {}


# -- correcting the next job ------------------------------------------------------------------


def test_after_k_jobs_that_used_less_the_next_is_reserved_less_but_not_below_what_they_used():
    jobs = [with_uid(ended("a", 0.7), f"u{i}") for i in range(3)]
    objects = learn(jobs)
    nxt = ftj("next")
    own = own_figure(nxt)
    out = decide(nxt, objects)
    figure = reserved(out, "next")
    assert int(0.7 * own) <= figure < own
    status = status_after(out, "ns/next")
    assert status["estimate"]["perGpuBytes"] == own, "status keeps the estimator's own figure"
    correction = status["estimate"]["correction"]
    assert correction["perGpuBytes"] == figure and correction["source"] == "Learned"
    message = condition(status, cond.ESTIMATED)["message"]
    assert "learned from 3 jobs like it (p95)" in message and "per GPU" in message


def test_after_k_jobs_that_used_more_the_next_is_reserved_more() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(3)])
    nxt = ftj("next")
    assert reserved(decide(nxt, objects), "next") >= int(1.2 * own_figure(nxt))


def test_each_configuration_learns_its_own_ratio_and_a_new_one_falls_back_to_its_kind() -> None:
    """Rank 16 used 0.7 x, rank 32 used 1.2 x: one kind (llama QLoRA), two configurations.
    Each configuration's next job follows its own; a third, unseen, the kind's p95."""
    lower = [with_uid(ended("a", 0.7), f"a{i}") for i in range(3)]
    higher = [with_uid(ended("b", 1.2, lora={"rank": 32}), f"b{i}") for i in range(3)]
    objects = learn(lower + higher)
    nxt = ftj("next")
    own = own_figure(nxt)
    assert int(0.7 * own) <= reserved(decide(nxt, objects), "next") < int(0.8 * own)
    more = ftj("more", lora={"rank": 32})
    assert reserved(decide(more, objects), "more") >= int(1.2 * own_figure(more))
    new = ftj("new", lora={"rank": 64})
    out = decide(new, objects)
    assert reserved(out, "new") >= int(1.2 * own_figure(new)), "the kind's p95 covers both"
    message = condition(status_after(out, "ns/new"), cond.ESTIMATED)["message"]
    assert "learned from 6 jobs like it" in message


def test_a_configuration_is_what_in_the_spec_decides_memory() -> None:
    spec = ftj("a")["spec"]
    digest = learned.config_digest(spec)
    assert len(digest) == 12 and int(digest, 16) >= 0
    same = {**spec, "resources": {"gpus": 4}, "template": {}, "admissionPolicy": "Resize"}
    assert learned.config_digest(same) == digest, "placement and GPU count are not memory"
    reordered = dict(reversed(list(spec.items())))
    assert learned.config_digest(reordered) == digest
    # As the API server stores it, every default filled: a job file as written (`vramgate
    # plan`) and the stored object are one configuration.
    stored = FineTuneJobSpec.model_validate(spec).model_dump(mode="json", by_alias=True)
    assert stored["training"] and stored["parallelism"] == "FSDP"
    assert learned.config_digest(stored) == digest
    # An inline config.json read from YAML keeps 500000.0; the API server stores 500000.
    inline = {**spec, "model": {"config": {"model_type": "llama", "rope_theta": 500000.0}}}
    as_stored = {**spec, "model": {"config": {"model_type": "llama", "rope_theta": 500000}}}
    assert learned.config_digest(inline) == learned.config_digest(as_stored)
    assert learned.config_digest(inline) != learned.config_digest(
        {**spec, "model": {"config": {"model_type": "llama", "rope_theta": 500000.5}}}
    )
    for change in ({"lora": {"rank": 32}}, {"training": {"batchSize": 2}}, {"method": "LoRA"},
                   {"model": {"preset": "qwen2.5-7b"}}, {"parallelism": "DDP"}):  # fmt: skip
        assert learned.config_digest({**spec, **change}) != digest, change
    key = learned.job_key(ftj("a"), {"profile": "calibrated", "parallelism": "FSDP"})
    assert key.config == digest and key.ladder()[1].config == "*"


def test_a_model_is_one_configuration_however_it_is_named() -> None:
    """The plan's digest (what the estimate and its samples carry) reads the ConfigMap's
    content: as the same config.json inline, and another once the ConfigMap is edited."""
    config = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
              "vocab_size": 32000}  # fmt: skip
    spec = ftj("a")["spec"]
    by_ref = {**spec, "model": {"configMapRef": {"name": "tiny", "key": "config.json"}}}
    inline, _ = translate({**spec, "model": {"config": config}})
    read, _ = translate(by_ref, config_map_config=config)
    edited, _ = translate(by_ref, config_map_config={**config, "num_hidden_layers": 24})
    assert inline is not None and read is not None and edited is not None
    assert read.config == inline.config
    assert edited.config != read.config
    # A preset by its name, its repo id or another case of either: one configuration.
    named = [translate({**spec, "model": {"preset": p}})[0]
             for p in ("llama-3.1-8b", "meta-llama/Llama-3.1-8B", "LLAMA-3.1-8B")]  # fmt: skip
    assert len({p.config for p in named if p is not None}) == 1 and None not in named


def test_raise_only_never_lowers_and_off_keeps_the_estimate() -> None:
    objects = learn([with_uid(ended("a", 0.7), f"u{i}") for i in range(3)])
    for spelled in ("RaiseOnly", "Off"):
        nxt = ftj("next", estimateCorrection=spelled)
        assert reserved(decide(nxt, objects), "next") == own_figure(nxt), spelled
    cluster_wide = replace(SETTINGS, policy=Policy.RAISE_ONLY)
    nxt = ftj("next")
    assert reserved(decide(nxt, objects, learning=cluster_wide), "next") == own_figure(nxt)


def test_a_job_that_died_of_oom_raises_its_rerun_at_once() -> None:
    objects = learn([ended("a", 0.9, failed=True)])
    rerun = ftj("a-again")
    figure = reserved(decide(rerun, objects), "a-again")
    own = own_figure(rerun)
    assert figure >= own * 120 // 100, "at least the OOM's need: 1.2 x what it had"
    status = status_after(decide(rerun, objects), "ns/a-again")
    assert status["estimate"]["correction"]["source"] == "OutOfMemory"


def test_too_few_samples_change_nothing_and_say_nothing() -> None:
    objects = learn([with_uid(ended("a", 0.7), "u0")])
    nxt = ftj("next")
    out = decide(nxt, objects)
    assert reserved(out, "next") == own_figure(nxt)
    assert "correction" not in status_after(out, "ns/next")["estimate"]


def test_a_pin_wins_over_what_was_learned() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(3)])
    for obj in objects.values():
        obj["spec"]["pinnedPercent"] = 90
    nxt = ftj("next")
    assert reserved(decide(nxt, objects), "next") == -(-own_figure(nxt) * 90 // 100)


def test_a_key_objects_status_says_what_it_yields() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(3)])
    status = next(iter(objects.values()))["status"]
    assert status["p95Ratio"] >= "1.20" and status["source"] == "Learned"
    assert status["correctionPercent"] >= 126 and status["message"].startswith("x 1.")


def test_a_learned_raise_past_the_largest_gpu_is_capped_there_but_an_ooms_is_not() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(3)])
    nxt = ftj("next")
    own = own_figure(nxt)
    room = own * 110 // 100 / GIB  # the estimate fits the GPU, 1.2 x it does not
    settings = LearningSettings(min_samples=3)
    out = admission_pass(
        PassInput(
            objects=cluster(nxt, gpus={"n1": [room]}, total_gib=room),
            workloads={},
            job_pods={},
            estimates={"ns/next": estimated(nxt)},
            settings=AdmissionSettings(),
            now=NOW,
            learned=learned.records(learned.key_states(objects.values(), settings)),
            learning=settings,
        )
    )
    figure = reserved(out, "next")
    assert own < figure <= room * GIB, "admitted: capped, not refused"
    correction = status_after(out, "ns/next")["estimate"]["correction"]
    assert (
        correction["perGpuBytes"] == figure
        and "capped to fit the largest GPU" in (correction["message"])
    )

    died = ended("b", 0.9, failed=True)
    key = JobKey.parse(died["status"]["learnedSample"]["key"])
    oomed = learned.records(learned.key_states(learn([died]).values(), settings))
    raised = learned.correction(own, key, oomed, settings, {})
    assert raised.source.value == "OutOfMemory" and raised.per_gpu_bytes > own
    assert learned.capped(raised, own) is raised, "an OOM's need is never capped"


def test_each_key_is_a_series_of_its_samples_its_p95_ratio_and_its_correction() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(3)])
    states = learned.key_states(objects.values(), SETTINGS)
    samples, p95, factor = learned.gauges(states, SETTINGS)
    assert samples.labels == p95.labels == ("family", "method", "parallelism", "profile",
                                            "framework", "image", "config")  # fmt: skip
    assert len(samples.samples) == len(states) and {v for _, v in samples.samples} == {3.0}
    assert all(1.2 <= v < 1.3 for _, v in p95.samples), "the upper end of 1.2's bucket"
    assert all(v == pytest.approx(1.2 * 1.05, abs=0.07) for _, v in factor.samples)


def test_a_configuration_has_series_only_once_it_answers_for_its_jobs() -> None:
    objects = learn([with_uid(ended("a", 1.2), f"u{i}") for i in range(2)])
    states = learned.key_states(objects.values(), SETTINGS)
    config = learned.job_key(ftj("a"), {"profile": "calibrated", "parallelism": "FSDP"}).config
    samples, _, _ = learned.gauges(states, SETTINGS)
    series = {labels[-1] for labels, _ in samples.samples}  # config, the last label
    assert series == {"*"} and len(samples.samples) == len(states) - 1, "2 of k = 3 samples"
    objects = learn([with_uid(ended("a", 1.2), "u2")], list(objects.values()))
    samples, _, _ = learned.gauges(learned.key_states(objects.values(), SETTINGS), SETTINGS)
    assert {labels[-1] for labels, _ in samples.samples} == {"*", config}
