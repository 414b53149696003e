"""The leader deletes the configurations' LearnedCorrections no job taught for long, each at
the resourceVersion it judged, and stops reading one it deleted before its cache sees it go.

Against a Kube that answers `delete_learned` as the API server does: 409 when the object moved
on since it was read, 403 where RBAC grants no delete."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from controller.admission import learned
from controller.api.learnedcorrection import object_name
from controller.kube import ApiError, Conflict
from controller.learning import JobKey
from controller.operator.scheduler import Scheduler, SchedulerOptions
from tests.unit.admission.test_learned import SETTINGS, ended, learn


class DeletingKube:
    def __init__(self, answer: Exception | None = None) -> None:
        self.answer = answer
        self.deleted: list[tuple[str, str]] = []
        self.tries = 0

    def delete_learned(self, name: str, version: str) -> None:
        self.tries += 1
        if self.answer is not None:
            raise self.answer
        self.deleted.append((name, version))


def forget(
    kube: DeletingKube, objects: list[dict[str, Any]], times: int = 1
) -> tuple[Scheduler, dict[str, learned.KeyState]]:
    """`_forget` run `times` over the keys of `objects` (their samples are of 2025: idle);
    the scheduler and the keys the last run left."""
    sched = Scheduler(cast(Any, kube), SchedulerOptions())
    sched.caches = cast(Any, SimpleNamespace(learned_objects=lambda: objects))
    left: dict[str, learned.KeyState] = {}

    async def main() -> None:
        try:
            for _ in range(times):
                keys = learned.key_states(sched._learned_objects(), SETTINGS)
                left.clear()
                left.update(await sched._forget(keys))
        finally:
            await sched.close()

    asyncio.run(main())
    return sched, left


def configuration_key() -> tuple[list[dict[str, Any]], JobKey]:
    job = ended("a", 0.7)
    objects = list(learn([job]).values())
    return objects, JobKey.parse(job["status"]["learnedSample"]["key"])


def test_the_idle_configuration_is_deleted_once_at_its_version_and_read_no_more() -> None:
    objects, key = configuration_key()
    name = object_name(key)
    version = next(o for o in objects if o["metadata"]["name"] == name)["metadata"]
    kube = DeletingKube()
    sched, left = forget(kube, objects, times=2)
    assert kube.deleted == [(name, version["resourceVersion"])], "once, kinds' keys kept"
    assert key.name not in left and len(left) == len(objects) - 1
    # The cache still lists it: not read until the cache sees it go.
    assert name not in {o["metadata"]["name"] for o in sched._learned_objects()}
    sched.caches = cast(Any, SimpleNamespace(learned_objects=lambda: []))
    sched._learned_objects()
    assert sched._forgetting == {}


def test_a_key_written_since_is_kept_and_a_refused_delete_waits_an_hour() -> None:
    objects, key = configuration_key()
    _, left = forget(DeletingKube(Conflict("the object has been modified")), objects)
    assert key.name in left
    kube = DeletingKube(ApiError(403, "forbidden"))
    denied, left = forget(kube, objects, times=2)
    assert key.name in left
    assert kube.tries == 1, "no try for an hour after RBAC refused one"
    assert denied._forget_after > denied.clock.monotonic() + 3000
