"""The scheduler's workload creates and deletes, which run beside the next pass.

A pass no longer waits for the Jobs it creates, so two passes' work on one job can overlap:
these tests hold the orderings that keep the cluster right (a suspension's delete after the
create it undoes, a failed delete retried, a create in flight never made twice), against a
Kube that records every call and answers the way the API server does (409 on a name that
exists, a delete of a missing object is no error). The scheduler's view for the webhook is
built on kopf's loop when asked from the review server's thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any, cast

from controller.admission import admission_pass as admission
from controller.admission.cluster import ClusterObjects
from controller.base.clock import FakeClock
from controller.kube import Conflict
from controller.operator.scheduler import NameTaken, Scheduler, SchedulerOptions

KEY = "ns/j"


class RecordingKube:
    """The cluster's objects by (kind, name), with a delay per call like a busy API server."""

    def __init__(self, create_s: float = 0.05, fail_deletes: int = 0) -> None:
        self.objects: set[tuple[str, str]] = set()
        self.calls: list[tuple[str, str]] = []
        self.create_s = create_s
        self.fail_deletes = fail_deletes
        self.lock = threading.Lock()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        time.sleep(self.create_s)
        name = (obj["kind"], obj["metadata"]["name"])
        with self.lock:
            self.calls.append(("create", obj["kind"]))
            if name in self.objects:
                raise Conflict("already exists")
            self.objects.add(name)
        return obj

    def delete(self, obj: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(("delete", obj["kind"]))
            if self.fail_deletes:
                self.fail_deletes -= 1
                raise RuntimeError("the API server is unavailable")
            self.objects.discard((obj["kind"], obj["metadata"]["name"]))

    def patch_job_status(self, *_: Any) -> dict[str, Any]:
        raise AssertionError("these passes write no status")


def workload() -> tuple[dict[str, Any], ...]:
    meta = {"namespace": "ns", "name": "j-train"}
    return (
        {"apiVersion": "v1", "kind": "Service", "metadata": meta},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta},
    )


def job(admitted: bool) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if admitted:
        status["conditions"] = [{"type": "Admitted", "status": "True", "reason": "Fits"}]
        status["placement"] = {"nodes": [{"node": "n1", "gpuIndices": [0]}], "perGpuBytes": 1}
    meta = {"namespace": "ns", "name": "j", "uid": "u", "resourceVersion": "1"}
    return {"metadata": meta, "status": status}


def creates() -> admission.PassOutput:
    return admission.PassOutput(creates=[admission.CreateWorkload(KEY, workload(), False)])


def deletes() -> admission.PassOutput:
    return admission.PassOutput(deletes=[admission.DeleteWorkload(KEY, workload())])


async def settle(sched: Scheduler) -> None:
    while sched._background:
        await asyncio.gather(*list(sched._background))


def run(scenario: Any, kube: RecordingKube) -> Scheduler:
    sched = Scheduler(cast(Any, kube), SchedulerOptions())

    async def main() -> None:
        try:
            await scenario(sched)
            await settle(sched)
        finally:
            await sched.close()

    asyncio.run(main())
    return sched


def test_a_suspensions_delete_waits_for_the_create_it_undoes() -> None:
    """Admitted, its workload being created, then suspended: the delete must not overtake
    the create, or the Job is made after its delete and runs on GPUs given to others."""
    kube = RecordingKube(create_s=0.05)

    async def scenario(sched: Scheduler) -> None:
        await sched._carry_out(creates(), {KEY: job(admitted=True)})
        await asyncio.sleep(0.06)  # the Service is made, the Job's create is in flight
        await sched._carry_out(deletes(), {KEY: job(admitted=False)})

    sched = run(scenario, kube)
    assert kube.objects == set(), f"left running after the suspension: {kube.objects}"
    assert kube.calls == [
        ("create", "Service"), ("create", "Job"), ("delete", "Service"), ("delete", "Job"),
    ]  # fmt: skip
    assert KEY not in sched._created and KEY not in sched._creating


def test_a_create_in_flight_is_not_started_again_and_counts_as_there() -> None:
    kube = RecordingKube(create_s=0.05)
    seen: list[bool] = []

    async def scenario(sched: Scheduler) -> None:
        await sched._carry_out(creates(), {KEY: job(admitted=True)})
        seen.append(KEY in sched._creating)
        await sched._carry_out(creates(), {KEY: job(admitted=True)})  # the next pass

    sched = run(scenario, kube)
    assert seen == [True], "the next pass sees the workload as there while it is made"
    assert kube.calls == [("create", "Service"), ("create", "Job")], "made once"
    assert sched._created == {KEY: "u"}


def test_a_failed_delete_is_retried_while_the_job_stays_unadmitted() -> None:
    kube = RecordingKube(create_s=0.0, fail_deletes=1)
    kube.objects = {("Service", "j-train"), ("Job", "j-train")}

    async def scenario(sched: Scheduler) -> None:
        await sched._carry_out(deletes(), {KEY: job(admitted=False)})
        await settle(sched)
        assert KEY in sched._undeleted, "remembered for the next pass"
        await sched._carry_out(admission.PassOutput(), {KEY: job(admitted=False)})

    sched = run(scenario, kube)
    assert kube.objects == set(), "the next pass deleted what the first could not"
    assert not sched._undeleted


def test_a_failed_delete_is_dropped_once_the_job_is_admitted_again() -> None:
    """Admitted again, the same names are its new workload's: retrying would end that run."""
    kube = RecordingKube(create_s=0.0, fail_deletes=2)
    kube.objects = {("Service", "j-train"), ("Job", "j-train")}

    async def scenario(sched: Scheduler) -> None:
        await sched._carry_out(deletes(), {KEY: job(admitted=False)})
        await settle(sched)
        await sched._carry_out(admission.PassOutput(), {KEY: job(admitted=True)})

    sched = run(scenario, kube)
    assert ("Job", "j-train") in kube.objects and not sched._undeleted
    assert kube.calls.count(("delete", "Job")) == 1


class FixedCaches:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def objects(self) -> tuple[ClusterObjects, dict[str, Any], dict[str, Any]]:
        self.reads.append(threading.current_thread().name)
        return ClusterObjects(), {}, {}


def test_the_webhooks_thread_gets_a_view_built_on_kopfs_loop() -> None:
    """The caches are kopf's loop's: read there, never from the review server's thread; a
    view already built is read as it is from any thread."""
    sched = Scheduler(cast(Any, RecordingKube()), SchedulerOptions())
    caches = FixedCaches()
    views: list[Any] = []

    async def main() -> None:
        sched.attach(cast(Any, caches), contextvars.copy_context())

        def webhook_thread() -> None:
            views.append(asyncio.run(sched.current_view()))
            views.append(asyncio.run(sched.current_view()))

        thread = threading.Thread(target=webhook_thread, name="vramgate-webhook")
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)  # kopf's loop stays free to build it
        await sched.close()

    asyncio.run(main())
    assert views[0] is not None and views[1] is views[0], "built once, then read as it is"
    assert caches.reads == ["MainThread"]


def test_a_view_asked_no_older_than_an_age_is_rebuilt_once_it_is_older() -> None:
    """The TrainJob webhook sizes on the free memory now (`max_age_s`); the FineTuneJob
    webhooks' view is rebuilt only when the inventory changes."""
    clock = FakeClock()
    sched = Scheduler(cast(Any, RecordingKube()), SchedulerOptions(), clock=clock)
    caches = FixedCaches()

    async def main() -> list[Any]:
        sched.attach(cast(Any, caches), contextvars.copy_context())
        first = await sched.current_view(max_age_s=1.0)
        views = [first, await sched.current_view(max_age_s=1.0)]
        clock.advance(1.5)
        views += [await sched.current_view(), await sched.current_view(max_age_s=1.0)]
        await sched.close()
        return views

    first, again, old_enough, rebuilt = asyncio.run(main())
    assert again is first and old_enough is first
    assert rebuilt is not first and len(caches.reads) == 2


def test_a_taken_name_says_whether_an_earlier_job_of_that_name_holds_it() -> None:
    """Delete and apply again (how a finished job is rerun) meets the old workload for a
    moment: that is no one else's object to delete or rename."""
    job = {
        "kind": "Job",
        "metadata": {
            "name": "llama",
            "namespace": "ml",
            "ownerReferences": [{"kind": "FineTuneJob", "name": "llama", "uid": "new"}],
        },
    }
    earlier = [{"kind": "FineTuneJob", "name": "llama", "uid": "old"}]
    assert str(NameTaken(job, earlier)) == (
        "a Job named llama of an earlier FineTuneJob of this name is still being deleted"
    )
    foreign = str(NameTaken(job, []))
    assert foreign.startswith("a Job named llama already exists in ml and is not this")
