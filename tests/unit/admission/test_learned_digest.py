"""The image in a learned key, by digest: a sample is filed under the digest its pods
reported, and a job not yet running is keyed by its template's pin or by the digest last
reported for its tag (`controller.admission.learned`'s docstring)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from controller.admission import learned
from controller.admission.admission_pass import PassInput, admission_pass
from controller.api import conditions as cond
from controller.api.base import JOB_LABEL
from controller.decision import AdmissionSettings
from controller.learning import ANY, JobKey, LearningSettings
from tests.unit.admission.test_learned import learn, own_figure, reserved, workload
from tests.unit.builders.admission import (
    NOW,
    admitted,
    cluster,
    condition,
    estimated,
    ftj,
    run,
    status_after,
    written,
)

SETTINGS = LearningSettings(min_samples=3)
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
TAG = "registry.invalid/train:v1"


def template(image: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", "image": image},
                                    {"name": "sidecar", "image": "proxy:1"}]}}  # fmt: skip


def pod(job: str, phase: str, image_id: str | None, *, sidecar: str | None = None):
    """The job's pod: its trainer container reports `image_id` (as containerd spells it)."""
    statuses = [{"name": "sidecar", "imageID": sidecar or f"proxy@sha256:{'c' * 64}"}]
    if image_id is not None:
        statuses.append({"name": "trainer", "imageID": image_id})
    if phase == "Succeeded":
        for s in statuses:
            s["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    return {
        "metadata": {"name": f"{job}-x1", "namespace": "ns", "uid": f"pod-{job}",
                     "labels": {JOB_LABEL: job}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "containerStatuses": statuses},
    }  # fmt: skip


def ran(
    name: str, used: float, image: str, image_id: str | None, *, at: timedelta = timedelta()
) -> dict[str, Any]:
    """Job `name` of template image `image`, admitted; its pod reports `image_id`, uses
    `used` x its prediction, and succeeds: the job as the API holds it after its end."""
    job, _ = admitted(name, template=template(image))
    predicted = job["status"]["estimate"]["perGpuLevels"]["nvmlBytes"]
    objects = cluster(job)
    objects.gpunodes["n1"]["status"]["gpus"][0]["pods"] = [
        {"uid": f"pod-{name}", "usedBytes": int(used * predicted)}
    ]
    key = f"ns/{name}"
    job = written(job, run(objects, estimates={}, now=NOW + at, workloads={key: workload(name)},
                           job_pods={key: [pod(name, "Running", image_id)]}))  # fmt: skip
    end = workload(name, ("Complete", ""))
    out = run(cluster(job), estimates={}, now=NOW + at, workloads={key: end},
              job_pods={key: [pod(name, "Succeeded", image_id)]})  # fmt: skip
    return written(job, out)


def many(n: int, used: float, image: str, image_id: str | None, prefix: str = "a"):
    jobs = []
    for i in range(n):
        job = ran(f"{prefix}{i}", used, image, image_id)
        job["metadata"]["uid"] = f"uid-{prefix}{i}"
        jobs.append(job)
    return jobs


def decide(nxt: Mapping[str, Any], jobs: list[dict[str, Any]], objects: Mapping[str, Any]):
    """A pass over `nxt` waiting beside the jobs that ran (its image's digests are theirs)."""
    states = learned.key_states(objects.values(), SETTINGS)
    return admission_pass(
        PassInput(
            objects=cluster(nxt, *jobs), workloads={}, job_pods={},
            estimates={"ns/" + nxt["metadata"]["name"]: estimated(nxt)},
            settings=AdmissionSettings(), now=NOW,
            learned=learned.records(states), learning=SETTINGS,
        )
    )  # fmt: skip


def key_of(job: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]] = ()) -> JobKey:
    """The key `job` is corrected by before it runs, beside `jobs`."""
    found = estimated(job)
    assert found.plan is not None and found.estimate is not None
    estimate = {"profile": found.estimate.profile, "parallelism": found.plan.parallelism.api}
    return learned.job_key(job, estimate, learned.image_digests(jobs))


def learned_by(nxt: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]], objects: Any) -> JobKey:
    """The key whose record corrects `nxt` (the first of its ladder with k samples)."""
    found = estimated(nxt)
    assert found.plan is not None and found.estimate is not None
    records = learned.records(learned.key_states(objects.values(), SETTINGS))
    digests = learned.image_digests(jobs)
    got = learned.corrected(nxt, found.plan, found.estimate, 1, records, SETTINGS, now=NOW,
                            digests=digests)  # fmt: skip
    assert got.key is not None
    return JobKey.parse(got.key)


# -- the sample -------------------------------------------------------------------------------


def test_a_sample_is_filed_under_the_digest_the_trainer_container_reported() -> None:
    job = ran("a", 0.7, TAG, f"docker.io/registry.invalid/train@{OLD}")
    observed = job["status"]["observed"]
    assert observed["imageDigest"] == OLD, "the trainer's, not the sidecar's"
    assert observed["imageDigestTime"] == "2025-03-01T12:00:00Z"
    assert JobKey.parse(job["status"]["learnedSample"]["key"]).image == OLD


def test_without_a_reported_digest_the_sample_is_filed_under_the_template_string() -> None:
    for image_id in (None, ""):  # no status for the trainer yet; a runtime that says none
        job = ran("a", 0.7, TAG, image_id)
        assert "imageDigest" not in job["status"]["observed"]
        assert JobKey.parse(job["status"]["learnedSample"]["key"]).image == TAG


def test_the_digest_is_written_once_with_the_running_write_and_kept() -> None:
    job, _ = admitted("a", template=template(TAG))
    key = "ns/a"
    pods = {key: [pod("a", "Running", f"docker-pullable://train@{OLD}")]}
    first = run(cluster(job), estimates={}, workloads={key: workload("a")}, job_pods=pods)
    patch = next(w.patch for w in first.writes if w.key == key)
    assert patch["observed"]["imageDigest"] == OLD, "no peak yet: the digest alone"
    assert patch["observed"]["gpus"] == [] and "peakSince" not in patch["observed"]
    assert condition(patch, cond.RUNNING)["status"] == "True", "in the same write"
    job = written(job, first)
    # A pod replaced by one that pulled the tag after it moved changes nothing: written once.
    pods = {key: [pod("a", "Running", f"docker-pullable://train@{NEW}")]}
    again = run(cluster(job), estimates={}, now=NOW + timedelta(minutes=5),
                workloads={key: workload("a")}, job_pods=pods)  # fmt: skip
    assert all("observed" not in w.patch for w in again.writes if w.key == key)


# -- the key before the job runs ----------------------------------------------------------------


def test_a_template_that_pins_a_digest_is_keyed_by_it() -> None:
    job = ftj("next", template=template(f"{TAG}@{OLD}"))
    assert key_of(job).image == OLD


def test_a_tag_is_keyed_by_the_digest_its_jobs_reported_else_by_itself() -> None:
    job = ftj("next", template=template(TAG))
    assert key_of(job).image == TAG, "a tag never run here"
    assert key_of(job, [ran("a", 0.7, TAG, OLD)]).image == OLD
    other = ran("b", 0.7, "registry.invalid/train:v2", NEW)
    assert key_of(job, [other]).image == TAG, "another tag's digest is not this one's"


def test_a_reported_digest_goes_before_the_pin_it_names_otherwise() -> None:
    pinned = f"{TAG}@{OLD}"
    config_id = f"docker://{NEW}"  # Docker's name for a locally built image
    job = ftj("next", template=template(pinned))
    assert key_of(job, [ran("a", 0.7, pinned, config_id)]).image == NEW


def test_the_next_job_of_a_tag_gets_what_its_digests_jobs_taught() -> None:
    jobs = many(3, 0.7, TAG, OLD)
    objects = learn(jobs)
    nxt = ftj("next", template=template(TAG))
    own = own_figure(nxt)
    figure = reserved(decide(nxt, jobs, objects), "next")
    assert int(0.7 * own) <= figure < own
    message = condition(status_after(decide(nxt, jobs, objects), "ns/next"), cond.ESTIMATED)
    assert "learned from 3 jobs like it" in message["message"]


def test_two_tags_of_one_digest_share_their_samples() -> None:
    jobs = many(3, 0.7, TAG, OLD)
    objects = learn(jobs)
    latest = "registry.invalid/train:latest"
    nxt = ftj("next", template=template(latest))
    fine = [k for k in objects.values() if k["spec"]["image"] != ANY]
    assert {k["spec"]["image"] for k in fine} == {OLD}
    # Before a job of :latest reported, :latest is a key of its own, without samples: the
    # coarser key (image dropped) corrects it.
    assert key_of(nxt, jobs).image == latest
    assert learned_by(nxt, jobs, objects).image == ANY
    # One job of :latest reports the same digest: from then on it shares v1's samples.
    seen = ran("l0", 1.0, latest, OLD)
    assert key_of(nxt, [*jobs, seen]).image == OLD
    assert learned_by(nxt, [*jobs, seen], objects).image == OLD
    assert reserved(decide(nxt, [*jobs, seen], objects), "next") < own_figure(nxt)


def test_a_moved_tag_keys_by_the_old_digest_until_a_pod_of_the_new_one_reports() -> None:
    old_jobs = many(3, 0.7, TAG, OLD)
    objects = learn(old_jobs)
    nxt = ftj("next", template=template(TAG))
    assert key_of(nxt, old_jobs).image == OLD, "the tag moved, no pod of it ran yet"
    assert reserved(decide(nxt, old_jobs, objects), "next") < own_figure(nxt)
    # The first job of the moved tag reports the new digest: its sample starts the new key,
    # and the next job is keyed by it (too few samples: the ladder's coarser keys apply).
    moved = ran("m0", 1.2, TAG, NEW, at=timedelta(minutes=30))
    assert JobKey.parse(moved["status"]["learnedSample"]["key"]).image == NEW
    jobs = [*old_jobs, moved]
    objects = learn([moved], list(objects.values()))
    key = key_of(nxt, jobs)
    assert key.image == NEW
    new_key = next(k for k in objects.values() if k["spec"]["image"] == NEW)
    assert new_key["status"]["samples"] == 1, "the new image's samples are its own"
    old_key = next(k for k in objects.values() if k["spec"]["image"] == OLD)
    assert old_key["status"]["samples"] == 3, "and do not mix into the old one's"
    # The coarser key (image dropped) learned from all four: what the next job gets.
    assert learned_by(nxt, jobs, objects).image == ANY
    assert learned_by(nxt, old_jobs, objects).image == OLD, "before the new digest reported"


def test_the_latest_report_wins_whatever_the_order_of_the_jobs() -> None:
    old = ran("a", 0.7, TAG, OLD)
    new = ran("b", 0.7, TAG, NEW, at=timedelta(minutes=1))
    assert learned.image_digests([old, new]) == {TAG: NEW}
    assert learned.image_digests([new, old]) == {TAG: NEW}
    hand_edited = copy.deepcopy(new)
    hand_edited["status"]["observed"]["imageDigest"] = "latest"  # no digest: ignored
    assert learned.image_digests([old, hand_edited]) == {TAG: OLD}
