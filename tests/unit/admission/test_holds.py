"""Holds on what a sized TrainJob counted on (`controller.admission.holds`): expiry, the
reservation the packer charges, and the end once its pods' memory shows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controller.admission import holds
from controller.admission.cluster import ClusterObjects, snapshot, snapshot_and_settled
from controller.admission.holds import JOBSET_LABEL, Hold
from controller.admission.pods import pod_gpus
from controller.base.units import GIB
from controller.packing.inventory import GpuDevice, NodeGpus, NodeState, PackingSettings
from tests.unit.builders.packing import frees, node, view

DEVICE_PLUGIN = PackingSettings()


def hold(expires_s: float = 100.0, pods: int = 1, name: str = "llama", serial: int = 1) -> Hold:
    placement = (NodeGpus("n0", (0, 1), ("n0-0", "n0-1")),)
    return Hold("ml", name, placement, 30 * GIB, pods, expires_s, serial)


def pod(uid: str, node: str | None = "n0", gpus: int = 2, phase: str = "Running",
        jobset: str = "llama", namespace: str = "ml") -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"uid": uid, "namespace": namespace, "labels": {JOBSET_LABEL: jobset}},
        "spec": {"nodeName": node, "containers": [
            {"name": "node", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase},
    }  # fmt: skip


def test_a_hold_expires_at_its_time_exactly() -> None:
    early, late = hold(10.0, serial=1), hold(20.0, serial=2)
    assert holds.live([early, late], 9.999) == (early, late)
    assert holds.live([early, late], 10.0) == (late,)
    assert holds.live([early, late], 20.0) == ()


def test_a_hold_is_charged_as_a_reservation_on_the_gpus_it_counted_on() -> None:
    """Two of n0's four 80 GiB GPUs at 30 GiB each; with the device plugin they are taken
    whole, and the node's open slots drop by two."""
    base = view(node("n0", [80, 80, 80, 80], gpu_allocatable=4), settings=DEVICE_PLUGIN)
    charged = base.with_reservations([holds.reservation(hold())])
    assert frees(charged) == {"n0-0": 50.0, "n0-1": 50.0, "n0-2": 80.0, "n0-3": 80.0}
    assert charged.now.nodes[0].slots == 2 and base.now.nodes[0].slots == 4
    # A reservation the view charges already is not charged twice, and the view is kept.
    assert charged.with_reservations([holds.reservation(hold())]) is charged


def test_a_scheduled_pod_of_the_hold_has_its_gpus_counted_once() -> None:
    """Its pod on n0 asks for 2 GPUs, which the node counts as allocated: the hold does not
    take two slots more."""
    scheduled = [pod("p1")]
    reservation = holds.reservation(hold(), scheduled)
    assert reservation.pod_uids == frozenset({"p1"})
    assert reservation.allocated_gpus == {"n0": 2}
    # Another TrainJob's pod, or one of another namespace or finished, is not its.
    others = [pod("x", jobset="other"), pod("y", namespace="other"), pod("z", phase="Failed")]
    assert holds.reservation(hold(), others).pod_uids == frozenset()


def test_a_hold_ends_once_every_pod_has_its_memory_in_the_readings() -> None:
    two = hold(pods=2)
    pods = [pod("p1"), pod("p2", node="n1")]
    read = frozenset({"p1"})
    assert not holds.settled(two, pods, read)  # p2 has no memory yet
    assert not holds.settled(two, pods[:1], frozenset({"p1"}))  # only one of its two pods
    assert holds.settled(two, pods, frozenset({"p1", "p2"}))
    # A hold whose name is not known (generateName) never finds pods: it expires.
    assert not holds.settled(hold(name=""), [pod("p1", jobset="")], frozenset({"p1"}))


def test_the_snapshot_charges_the_holds_until_their_pods_memory_shows() -> None:
    gpus = tuple(
        GpuDevice(f"n0-{i}", i, "H100", 80 * GIB, 80 * GIB - (20 * GIB if i == 0 else 0),
                  pod_used_bytes={"p1": 20 * GIB} if i == 0 else {})
        for i in range(4)
    )  # fmt: skip
    objects = ClusterObjects()
    objects.compact.append(NodeState("n0", gpus))
    objects.holds = (hold(),)
    objects.pods = [pod("p1")]
    taken = snapshot(objects, None)
    assert taken.reservations == ()  # its one pod's memory shows: the readings count it
    objects.pods = [pod("p9")]  # its pod not read yet: charged, less nothing seen
    (charged,) = snapshot(objects, None).reservations
    assert charged.job == hold().job and charged.pod_uids == frozenset({"p9"})
    kept, ended = holds.charged([hold()], [pod("p1")], taken.nodes)
    assert kept == [] and ended == frozenset({hold().job})
    # The operator ends the settled holds from the same pass that builds its snapshot.
    objects.pods = [pod("p1")]
    assert snapshot_and_settled(objects, None) == (taken, frozenset({hold().job}))
    objects.pods = [pod("p9")]
    waiting, settled = snapshot_and_settled(objects, None)
    assert settled == frozenset() and [r.job for r in waiting.reservations] == [hold().job]


def test_a_holds_job_is_never_a_finetunejobs_key() -> None:
    """FineTuneJobs' reservations are `namespace/name`; a hold's is prefixed and numbered,
    so a TrainJob created again under its name holds apart from its first."""
    assert hold().job == "trainjob-hold:ml/llama#1"
    assert hold(serial=2).job != hold().job


def test_a_terminating_pod_of_a_former_trainjob_of_that_name_is_not_the_holds() -> None:
    """A TrainJob deleted and created again under its name: the first one's pods terminate a
    while (deletionTimestamp set), with their memory still read. They neither settle the new
    hold nor are counted as its scheduled pods."""
    old = pod("old")
    old["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert holds.pods_of(hold(), [old]) == []
    assert not holds.settled(hold(), [old], frozenset({"old"}))
    assert holds.reservation(hold(), [old]).allocated_gpus == {}
    assert holds.settled(hold(), [old, pod("new")], frozenset({"old", "new"}))


def test_a_holds_pod_counts_its_gpus_as_the_snapshot_counts_a_pods() -> None:
    """One rule for a pod's nvidia.com/gpu (`pods.pod_gpus`: the most of its init containers,
    or the sum of the rest), so the hold's scheduled pod takes off what its node counts."""
    bigger_init = pod("p1", gpus=2)
    bigger_init["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"nvidia.com/gpu": "4"}}}
    ]
    assert pod_gpus(bigger_init) == 4
    assert holds.reservation(hold(), [bigger_init]).allocated_gpus == {"n0": 4}


def test_a_view_with_holds_shares_the_empty_index_already_built() -> None:
    """Reservations do not change the empty cluster: charging holds rebuilds `now` only."""
    base = view(node("n0", [80, 80, 80, 80], gpu_allocatable=4), settings=DEVICE_PLUGIN)
    empty = base.empty
    charged = base.with_reservations([holds.reservation(hold())])
    assert charged.empty is empty
    assert charged.now is not base.now


def test_a_hold_is_looked_for_once_its_create_had_time_to_be_stored() -> None:
    made = replace(hold(), token="ab12-1", made_s=100.0)
    assert holds.due([made, hold()], 100.0 + holds.CHECK_AFTER_S - 1) == []
    assert holds.due([made, hold()], 100.0 + holds.CHECK_AFTER_S) == [made], "unlabelled: not"


def test_a_hold_whose_trainjob_is_not_there_ends_and_a_generated_name_is_learned() -> None:
    there = replace(hold(name="llama", serial=1), token="t-1")
    refused = replace(hold(name="other", serial=2), token="t-2")
    generated = replace(hold(name="", serial=3), token="t-3")
    found = {"t-1": "llama", "t-3": "sweep-x7k2p"}
    gone, named = holds.looked_up([there, refused, generated], found)
    assert gone == [refused.job]
    assert named == {generated.job: "sweep-x7k2p"}
