"""Each replica looks for the TrainJobs of its holds by their label: one not there (refused
after the webhook answered, or deleted) ends its hold; a generateName one names it. Against
a Kube that lists by label as the API server does, or cannot be reached."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, cast

from controller.admission import holds
from controller.admission.cluster import ClusterObjects
from controller.admission.trainjob import Counted, Sizing
from controller.base.clock import FakeClock
from controller.operator.scheduler import Scheduler, SchedulerOptions
from controller.packing.inventory import GpuDevice, NodeGpus, NodeState
from controller.webhook.trainjob import TrainJobHolds
from tests.unit.builders.packing import frees


class ListingKube:
    def __init__(
        self,
        stored: dict[str, dict[str, str]],
        fail: bool = False,
        unlabelled: tuple[str, ...] = (),
    ) -> None:
        self.stored = stored  # namespace -> token -> name
        self.fail = fail
        self.unlabelled = unlabelled  # names there without the label
        self.asked: list[tuple[str, str, tuple[str, ...]]] = []
        self.got: list[str] = []

    def held_trainjobs(self, namespace: str, label: str, tokens: list[str]) -> dict[str, str]:
        self.asked.append((namespace, label, tuple(tokens)))
        if self.fail:
            raise OSError("connection refused")
        return {t: n for t, n in self.stored.get(namespace, {}).items() if t in tokens}

    def trainjob_exists(self, namespace: str, name: str) -> bool:
        self.got.append(name)
        return name in self.unlabelled


def sized(name: str) -> dict[str, Any]:
    meta = {"namespace": "ml", "name": name} if name else {"namespace": "ml", "generateName": "s-"}
    return {"metadata": meta}


def look(
    kube: ListingKube, made: list[str], after_s: float, seen: list[Scheduler] | None = None
) -> tuple[list[str], TrainJobHolds]:
    """Holds made for TrainJobs named `made` ("" for a generateName), looked for `after_s`
    later: the holds' jobs it ended, and the ledger (the scheduler into `seen`)."""
    clock = FakeClock()
    clock.advance(1000)  # holds made well after the clock's start
    sched = Scheduler(cast(Any, kube), SchedulerOptions(), clock=clock)
    ledger = TrainJobHolds(600, clock.monotonic)
    counted = Counted((NodeGpus("n0", (0,), ("n0-0",)),), 1 << 30, 1)
    for name in made:
        ledger.add(sized(name), Sizing(counted=counted))
    sched.holds = ledger
    clock.advance(after_s)
    if seen is not None:
        seen.append(sched)

    async def main() -> list[str]:
        try:
            return await sched.look_for_held()
        finally:
            await sched.close()

    return asyncio.run(main()), ledger


def test_trainjobs_not_there_end_their_holds_in_one_listing_per_namespace() -> None:
    kube = ListingKube({"ml": {}})
    seen: list[Scheduler] = []
    ended, ledger = look(kube, ["refused", "deleted", ""], holds.CHECK_AFTER_S, seen)
    (asked,) = kube.asked
    assert asked[0] == "ml" and asked[1] == holds.HOLD_LABEL and len(set(asked[2])) == 3
    assert len(ended) == 3 and ledger.active() == (), "none of them is there"
    (sched,) = seen
    assert sched._inventory == 1, "no view, cached or being built, charges them any more"
    assert sched._wake.is_set(), "the pass decides on the memory they held"
    assert kube.got == ["refused", "deleted"], "a named one is looked for by name first"


def test_a_named_trainjob_that_lost_its_label_keeps_its_hold() -> None:
    """Replaced (PUT) or applied server-side without the label, or the first of two creates
    of its name (the second's hold, another token, replaced the first's): still there."""
    kube = ListingKube({"ml": {}}, unlabelled=("relabelled",))
    ended, ledger = look(kube, ["relabelled", ""], holds.CHECK_AFTER_S)
    assert [h.name for h in ledger.active()] == ["relabelled"]
    assert len(ended) == 1 and "?" in ended[0], "a generateName one without its label: gone"


def test_two_ledgers_never_give_the_same_token() -> None:
    """Two replicas, or a restarted process, each with their own serials from 1: the label
    must still tell their holds apart."""
    counted = Counted((NodeGpus("n0", (0,), ("n0-0",)),), 1 << 30, 1)
    one, two = (TrainJobHolds(600).add(sized("a"), Sizing(counted=counted)) for _ in range(2))
    assert one.serial == two.serial and one.token != two.token


def test_the_listing_keeps_those_there_and_names_a_generated_one() -> None:
    class Answer(ListingKube):
        def held_trainjobs(self, namespace: str, label: str, tokens: list[str]) -> dict[str, str]:
            super().held_trainjobs(namespace, label, tokens)
            return {tokens[0]: "there", tokens[2]: "s-x7k2p"}  # "refused" is not there

    ended, ledger = look(Answer({}), ["there", "refused", ""], holds.CHECK_AFTER_S)
    assert [h.name for h in ledger.active()] == ["there", "s-x7k2p"]
    assert len(ended) == 1 and "refused" in ended[0]


def test_nothing_is_looked_for_too_soon_and_an_unreachable_api_ends_nothing() -> None:
    early = ListingKube({})
    ended, ledger = look(early, ["young"], holds.CHECK_AFTER_S - 1)
    assert (early.asked, ended, len(ledger.active())) == ([], [], 1)
    down = ListingKube({}, fail=True)
    ended, ledger = look(down, ["kept"], holds.CHECK_AFTER_S)
    assert len(down.asked) == 1 and ended == [] and len(ledger.active()) == 1


class OneNodeCaches:
    """A node whose GPU 0 reads the memory of pod `read` (if any) and the pods given."""

    def __init__(self, pods: list[dict[str, Any]], read: str | None) -> None:
        self.pods, self.read = pods, read

    def objects(self) -> tuple[ClusterObjects, dict[str, Any], dict[str, Any]]:
        used = {self.read: 20 << 30} if self.read else {}
        gpu = GpuDevice("n0-0", 0, "H100", 80 << 30, (60 if used else 80) << 30, used)
        objects = ClusterObjects()
        objects.compact.append(NodeState("n0", (gpu,)))
        objects.pods = list(self.pods)
        return objects, {}, {}


def trainjob_pod(uid: str, name: str) -> dict[str, Any]:
    labels = {holds.JOBSET_LABEL: name}
    return {"metadata": {"uid": uid, "namespace": "ml", "labels": labels},
            "spec": {"nodeName": "n0"}, "status": {"phase": "Running"}}  # fmt: skip


def test_building_a_view_ends_the_holds_whose_pods_memory_shows_and_charges_the_rest() -> None:
    """One pass over the holds and the readings: the view charges the hold whose pod is not
    read yet, and the ledger drops the one whose pod's memory the node reports."""
    counted = Counted((NodeGpus("n0", (0,), ("n0-0",)),), 1 << 30, 1)
    ledger = TrainJobHolds(600)
    read, waiting = (ledger.add(sized(n), Sizing(counted=counted)) for n in ("read", "waiting"))
    caches = OneNodeCaches([trainjob_pod("p1", "read"), trainjob_pod("p2", "waiting")], "p1")
    sched = Scheduler(cast(Any, ListingKube({})), SchedulerOptions())
    sched.holds = ledger

    async def main() -> Any:
        sched.attach(cast(Any, caches), contextvars.copy_context())
        try:
            return await sched.current_view()
        finally:
            await sched.close()

    view = asyncio.run(main())
    assert [h.job for h in ledger.active()] == [waiting.job], "the read one's hold ended"
    # 60 GiB free as read (the read pod's 20 in it), less the waiting hold's 1 GiB only.
    assert frees(view) == {"n0-0": 59.0} and read.job != waiting.job
