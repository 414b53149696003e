"""The operator's metrics: the state view as plain data, what /metrics renders from it (leader
and standby), the counters a landed write moves, the accuracy histogram observed once, and
the webhook's latency by result.

The cluster is built the way tests/unit/admission/test_admission_pass.py builds it, and
admitted jobs come from a real pass, so the figures are the pass's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import kopf
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controller.admission import kueue
from controller.admission.admission_pass import Recorded
from controller.admission.metric_view import Gauge, accuracy_series, metric_view
from controller.admission.observed import GpuPeak, spec_family
from controller.api import conditions as cond
from controller.operator.metrics import ACCURACY_BUCKETS, OperatorMetrics
from controller.packing.inventory import GpuMode, PackingSettings
from controller.packing.view import ClusterView
from controller.webhook.admission import AdmissionWebhook
from tests.unit.admission.test_kueue import admission_check, ready
from tests.unit.builders.admission import (
    GIB,
    NOW,
    admitted,
    cluster,
    ftj,
    run,
    written,
)

PRODUCT = "NVIDIA-H100-80GB-HBM3"


def families(gauges: Iterable[Gauge]) -> dict[str, Gauge]:
    return {g.name: g for g in gauges}


def samples(gauge: Gauge) -> dict[tuple[str, ...], float]:
    return dict(gauge.samples)


def scrape(metrics: OperatorMetrics) -> dict[str, list[Sample]]:
    """/metrics as Prometheus parses it: family name -> its samples."""
    text = generate_latest(metrics.registry).decode()
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def value(found: dict[str, list[Sample]], name: str, **labels: str) -> float:
    (hit,) = [
        s.value
        for samples in found.values()
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return hit


def one_admitted_one_waiting() -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Job a admitted on n1's GPU 0 (80 GiB free, 2 GPUs), job w waiting for a GPU it can
    never share (both GPUs taken: w asks for 2)."""
    a, _ = admitted("a", gpus={"n1": [80, 80]})
    w = ftj("w", minute=3, resources={"gpus": 2}, parallelism="DDP")
    out = run(cluster(a, w, gpus={"n1": [80, 80]}), estimates=None)
    w = written(w, out)
    return cluster(a, w, gpus={"n1": [80, 80]}), a, w


def view_of(
    objects: Any,
    peaks: Mapping[str, Mapping[str, GpuPeak]] | None = None,
    packing: PackingSettings | None = None,
) -> Any:
    settings = packing or PackingSettings()
    return families(metric_view(objects, settings, NOW, peaks or {}, lambda job: "llama"))


# -- the view ----------------------------------------------------------------------------------


def test_an_admitted_job_is_predicted_and_reserved_on_each_gpu_of_its_placement() -> None:
    objects, a, _ = one_admitted_one_waiting()
    per_gpu = a["status"]["placement"]["perGpuBytes"]
    view = view_of(objects)
    assert samples(view["vramgate_job_predicted_bytes"]) == {
        ("ns", "a", "n1", "0", "GPU-n1-0", PRODUCT, "calibrated"): float(per_gpu)
    }
    assert samples(view["vramgate_gpu_reservation_bytes"]) == {
        ("n1", "0", "GPU-n1-0", PRODUCT): float(per_gpu),
        ("n1", "1", "GPU-n1-1", PRODUCT): 0.0,
    }, "every GPU with known memory, 0 where nothing is reserved"


def test_a_kueue_workload_vramgate_admitted_is_predicted_and_reserved_like_a_job() -> None:
    objects = cluster(gpus={"n1": [80, 80]})
    objects.kueue_checks = kueue.our_checks([admission_check()])
    held = ready("w", "n1", 20 * GIB)
    objects.kueue_workloads = {kueue.workload_key(held): held}
    view = view_of(objects)
    assert samples(view["vramgate_job_predicted_bytes"]) == {
        ("ns", "w", "n1", "0", "GPU-n1-0", PRODUCT, "Kueue"): float(20 * GIB)
    }
    assert samples(view["vramgate_gpu_reservation_bytes"])[("n1", "0", "GPU-n1-0", PRODUCT)] == (
        20 * GIB
    )
    held["status"]["conditions"].append({"type": "Finished", "status": "True"})
    assert samples(view_of(objects)["vramgate_job_predicted_bytes"]) == {}


def test_schedulable_free_is_free_less_what_admitted_jobs_will_still_allocate() -> None:
    objects, a, _ = one_admitted_one_waiting()
    per_gpu = a["status"]["placement"]["perGpuBytes"]
    shared = PackingSettings(gpu_mode=GpuMode.VISIBLE_DEVICES)
    free = samples(view_of(objects, packing=shared)["vramgate_gpu_schedulable_free_bytes"])
    assert free == {
        ("n1", "0", "GPU-n1-0", PRODUCT): float(80 * GIB - per_gpu),
        ("n1", "1", "GPU-n1-1", PRODUCT): float(80 * GIB),
    }
    # Whole GPUs: the one a's job holds takes no other job, whatever memory it has left.
    for mode in (GpuMode.DEVICE_PLUGIN, GpuMode.DRA):
        found = view_of(objects, packing=PackingSettings(gpu_mode=mode))
        assert samples(found["vramgate_gpu_schedulable_free_bytes"]) == {
            ("n1", "0", "GPU-n1-0", PRODUCT): 0.0,
            ("n1", "1", "GPU-n1-1", PRODUCT): float(80 * GIB),
        }, mode
    objects.nodes["n1"]["spec"]["unschedulable"] = True
    assert samples(view_of(objects)["vramgate_gpu_schedulable_free_bytes"]) == {}, (
        "a cordoned node's GPUs are not placeable"
    )


def test_schedulable_free_with_the_device_plugin_is_what_the_node_may_hand_a_pod() -> None:
    """GPU 0 runs a pod's process: 0. GPUs 1 and 2 are free of pods, and the device plugin
    may hand a new pod either: each is worth what the less free of them has, 30 GiB."""
    objects = cluster(gpus={"n1": [50, 30, 80]})
    objects.gpunodes["n1"]["status"]["gpus"][0]["pods"] = [{"uid": "other", "usedBytes": 30 * GIB}]
    objects.nodes["n1"]["status"]["allocatable"] = {"nvidia.com/gpu": "3"}
    free = samples(view_of(objects)["vramgate_gpu_schedulable_free_bytes"])
    assert free == {
        ("n1", "0", "GPU-n1-0", PRODUCT): 0.0,
        ("n1", "1", "GPU-n1-1", PRODUCT): float(30 * GIB),
        ("n1", "2", "GPU-n1-2", PRODUCT): float(30 * GIB),
    }
    found = view_of(objects, packing=PackingSettings(gpu_mode=GpuMode.DRA))
    assert samples(found["vramgate_gpu_schedulable_free_bytes"]) == {
        ("n1", "0", "GPU-n1-0", PRODUCT): 0.0,
        ("n1", "1", "GPU-n1-1", PRODUCT): float(30 * GIB),
        ("n1", "2", "GPU-n1-2", PRODUCT): float(80 * GIB),
    }


def test_pending_jobs_are_counted_by_reason_with_their_creation_time() -> None:
    objects, _, w = one_admitted_one_waiting()
    reason = next(c for c in w["status"]["conditions"] if c["type"] == "Admitted")["reason"]
    fresh = ftj("fresh", minute=7)  # not estimated yet: no Admitted condition
    objects.jobs["ns/fresh"] = fresh
    view = view_of(objects)
    assert samples(view["vramgate_pending_jobs"]) == {(reason,): 1.0, ("Pending",): 1.0}
    created = samples(view["vramgate_pending_job_created_timestamp_seconds"])
    assert created == {
        ("ns", "w", reason): (NOW - timedelta(minutes=57)).timestamp(),
        ("ns", "fresh", "Pending"): (NOW - timedelta(minutes=53)).timestamp(),
    }


def test_a_finished_job_leaves_no_series() -> None:
    objects, a, _ = one_admitted_one_waiting()
    done = dict(a["status"])
    done["conditions"] = [*done["conditions"], {"type": "Succeeded", "status": "True",
                                                "reason": "Succeeded"}]  # fmt: skip
    objects.jobs["ns/a"] = {**a, "status": done}
    view = view_of(objects)
    assert samples(view["vramgate_job_predicted_bytes"]) == {}
    assert set(samples(view["vramgate_gpu_reservation_bytes"]).values()) == {0.0}
    assert samples(view["vramgate_pending_jobs"]).get(("Succeeded",)) is None


def test_observed_peaks_and_their_ratio_to_the_prediction() -> None:
    objects, a, _ = one_admitted_one_waiting()
    per_gpu = a["status"]["placement"]["perGpuBytes"]
    peak = GpuPeak("n1", 0, "GPU-n1-0", per_gpu * 11 // 10)
    view = view_of(objects, {"uid-a": {"GPU-n1-0": peak}})
    assert samples(view["vramgate_job_observed_peak_bytes"]) == {
        ("ns", "a", "n1", "0", "GPU-n1-0", PRODUCT): float(peak.peak_bytes)
    }
    ((labels, ratio),) = view["vramgate_job_observed_ratio"].samples
    assert labels == ("ns", "a", "calibrated", "llama")
    assert ratio == pytest.approx(1.1, abs=1e-9)


def test_a_job_seen_on_another_gpu_of_its_node_is_predicted_and_reserved_there() -> None:
    # devicePlugin: the kubelet gave the pod GPU 1, not the placement's GPU 0.
    objects, a, _ = one_admitted_one_waiting()
    per_gpu = a["status"]["placement"]["perGpuBytes"]
    peak = GpuPeak("n1", 1, "GPU-n1-1", per_gpu // 2)
    view = view_of(objects, {"uid-a": {"GPU-n1-1": peak}})
    assert samples(view["vramgate_gpu_reservation_bytes"]) == {
        ("n1", "0", "GPU-n1-0", PRODUCT): 0.0,
        ("n1", "1", "GPU-n1-1", PRODUCT): float(per_gpu),
    }
    assert list(samples(view["vramgate_job_predicted_bytes"])) == [
        ("ns", "a", "n1", "1", "GPU-n1-1", PRODUCT, "calibrated")
    ]
    # Seen where it was placed, or not seen yet: the placement's GPU.
    for peaks in ({"uid-a": {"GPU-n1-0": GpuPeak("n1", 0, "GPU-n1-0", 1)}}, {}):
        view = view_of(objects, peaks)
        assert list(samples(view["vramgate_job_predicted_bytes"])) == [
            ("ns", "a", "n1", "0", "GPU-n1-0", PRODUCT, "calibrated")
        ]


def test_observed_peaks_come_from_status_after_a_restart() -> None:
    objects, a, _ = one_admitted_one_waiting()
    a["status"]["observed"] = {"peakBytes": 5 * GIB, "peak": "5.00 GiB", "gpus": [
        {"node": "n1", "index": 0, "uuid": "GPU-n1-0", "peakBytes": 5 * GIB}]}  # fmt: skip
    view = view_of(objects)
    assert list(samples(view["vramgate_job_observed_peak_bytes"]).values()) == [5.0 * GIB]


def test_heartbeats_are_exported_per_gpunode() -> None:
    objects, _, _ = one_admitted_one_waiting()
    beats = samples(view_of(objects)["vramgate_gpunode_heartbeat_timestamp_seconds"])
    assert beats == {("n1",): (NOW - timedelta(seconds=10)).timestamp()}


def test_the_family_of_a_preset_and_of_an_inline_config() -> None:
    assert spec_family({"model": {"preset": "llama-3.1-8b"}}) == "llama"
    assert spec_family({"model": {"config": {"model_type": "qwen2"}}}) == "qwen2"
    assert spec_family({"model": {"configMapRef": {"name": "m"}}}) == "unknown"


# -- the collector -----------------------------------------------------------------------------


def test_the_leader_exports_the_view_and_a_standby_only_its_leader_and_build_gauges() -> None:
    objects, a, _ = one_admitted_one_waiting()
    leading = [True]
    metrics = OperatorMetrics("replica-0", leading=lambda: leading[0])
    metrics.set_view(metric_view(objects, PackingSettings(), NOW, {}, lambda job: "llama"))

    found = scrape(metrics)
    per_gpu = a["status"]["placement"]["perGpuBytes"]
    assert value(found, "vramgate_job_predicted_bytes", job="a", UUID="GPU-n1-0") == per_gpu
    assert value(found, "vramgate_operator_leader", identity="replica-0") == 1
    assert value(found, "vramgate_build_info", version="0.1.0") == 1
    assert value(found, "vramgate_gpu_reservation_bytes", gpu="1") == 0

    leading[0] = False
    standby = scrape(metrics)
    assert value(standby, "vramgate_operator_leader", identity="replica-0") == 0
    state = {g.name for g in metric_view(objects, PackingSettings(), NOW, {}, lambda j: "")}
    assert not state & set(standby), "no state gauge from a standby"


def test_a_new_view_leaves_no_series_of_what_is_gone() -> None:
    objects, _, _ = one_admitted_one_waiting()
    metrics = OperatorMetrics("r")
    metrics.set_view(metric_view(objects, PackingSettings(), NOW, {}, lambda job: "llama"))
    del objects.gpunodes["n1"]
    metrics.set_view(metric_view(objects, PackingSettings(), NOW, {}, lambda job: "llama"))
    found = scrape(metrics)
    assert found["vramgate_gpu_reservation_bytes"] == []
    assert found["vramgate_gpunode_heartbeat_timestamp_seconds"] == []


def test_a_view_left_to_build_is_built_by_the_first_scrape_only() -> None:
    objects, _, _ = one_admitted_one_waiting()
    built: list[int] = []

    def build() -> tuple[Gauge, ...]:
        built.append(1)
        return metric_view(objects, PackingSettings(), NOW, {}, lambda job: "llama")

    metrics = OperatorMetrics("r")
    metrics.set_view(build)
    assert built == [], "a pass does not build it"
    first, second = scrape(metrics), scrape(metrics)
    assert built == [1]
    assert first["vramgate_job_predicted_bytes"] == second["vramgate_job_predicted_bytes"] != []


def test_a_pass_that_ends_while_a_scrape_builds_the_view_is_not_blocked_and_wins() -> None:
    # The event loop sets the view at the end of every pass: it must never wait for a
    # scrape's build (seconds on 5,000 nodes), and the newer pass's view must not be lost.
    metrics = OperatorMetrics("r")
    newer = (Gauge("vramgate_newer", "the newer pass", (), (((), 1.0),)),)

    def slow_build() -> tuple[Gauge, ...]:
        metrics.set_view(newer)  # would deadlock if the build held the lock
        return (Gauge("vramgate_older", "the older pass", (), (((), 1.0),)),)

    metrics.set_view(slow_build)
    assert [g.name for g in metrics.view()] == ["vramgate_older"]
    assert [g.name for g in metrics.view()] == ["vramgate_newer"], "the newer view kept"


def test_a_landed_decision_is_counted_and_a_first_one_timed_from_creation() -> None:
    metrics = OperatorMetrics("r")
    created = NOW - timedelta(seconds=3)
    metrics.landed("u1", Recorded("Admit", "Fits", first=True), created, NOW, "llama")
    metrics.landed("u2", Recorded("Queue", "WaitingForVRAM", first=True), created, NOW, "llama")
    metrics.landed("u2", Recorded("Admit", "Fits", first=False), created, NOW, "llama")
    found = scrape(metrics)
    assert value(found, "vramgate_decisions_total", decision="Admit", reason="Fits") == 2
    assert value(found, "vramgate_decision_latency_seconds_count", decision="Admit") == 1
    assert value(found, "vramgate_decision_latency_seconds_sum", decision="Admit") == 3.0
    assert value(found, "vramgate_decision_latency_seconds_count", decision="Queue") == 1


def test_every_known_decision_and_profile_has_its_series_at_zero_before_any_event() -> None:
    # rate() and increase() cannot count an event that happens before a series' first scrape.
    found = scrape(OperatorMetrics("r"))
    known = (("Admit", "Fits"), ("Resize", "Resized"), ("Queue", "WaitingForVRAM"),
             ("Queue", "WaitingForNodes"), ("Reject", "InsufficientVRAM"))  # fmt: skip
    for decision, reason in known:
        assert value(found, "vramgate_decisions_total", decision=decision, reason=reason) == 0
        assert value(found, "vramgate_decision_latency_seconds_count", decision=decision) == 0
    for profile in ("calibrated", "analytic", "unsloth", "trace"):
        assert value(found, "vramgate_estimate_duration_seconds_count", profile=profile) == 0


def test_an_admission_creates_its_accuracy_series_at_zero_before_the_job_ends() -> None:
    metrics = OperatorMetrics("r")
    metrics.landed("u1", Recorded("Queue", "WaitingForVRAM", first=True, profile="calibrated"),
                   None, NOW, "llama")  # fmt: skip
    assert [s for s in scrape(metrics)["vramgate_estimate_accuracy_ratio"]] == []
    metrics.landed("u1", Recorded("Resize", "Resized", profile="calibrated"), None, NOW, "llama")
    found = scrape(metrics)
    labels = {"profile": "calibrated", "family": "llama"}
    assert value(found, "vramgate_estimate_accuracy_ratio_count", **labels) == 0


def test_the_accuracy_of_a_finished_job_is_observed_once() -> None:
    metrics = OperatorMetrics("r")
    end = Recorded(finished="Succeeded", peak_bytes=11 * GIB, predicted_bytes=10 * GIB,
                   profile="calibrated")  # fmt: skip
    metrics.landed("u1", end, None, NOW, "llama")
    metrics.landed("u1", end, None, NOW, "llama")  # a retried write of the same end
    found = scrape(metrics)
    labels = {"profile": "calibrated", "family": "llama"}
    assert value(found, "vramgate_estimate_accuracy_ratio_count", **labels) == 1
    assert value(found, "vramgate_estimate_accuracy_ratio_sum", **labels) == pytest.approx(1.1)
    assert value(found, "vramgate_estimate_accuracy_ratio_bucket", le="1.05", **labels) == 0
    assert value(found, "vramgate_estimate_accuracy_ratio_bucket", le="1.1", **labels) == 1
    buckets = {s.labels["le"] for s in found["vramgate_estimate_accuracy_ratio"]
               if s.name.endswith("_bucket")}  # fmt: skip
    assert buckets == {str(b) for b in ACCURACY_BUCKETS} | {"+Inf"}
    assert value(found, "vramgate_jobs_finished_total", reason="Succeeded") == 1, "once too"


def test_a_job_that_ends_with_no_observed_peak_adds_no_accuracy() -> None:
    metrics = OperatorMetrics("r")
    metrics.landed("u1", Recorded(finished=cond.REASON_OOM_KILLED, predicted_bytes=GIB,
                                  profile="calibrated"), None, NOW, "llama")  # fmt: skip
    found = scrape(metrics)
    assert value(found, "vramgate_jobs_finished_total", reason="OOMKilled") == 1
    assert [s for s in found["vramgate_estimate_accuracy_ratio"] if s.name.endswith("_count")] == []


# -- the webhook's latency ---------------------------------------------------------------------


def webhook(metrics: OperatorMetrics, view: ClusterView | None) -> AdmissionWebhook:
    async def current() -> ClusterView | None:
        return view

    return AdmissionWebhook(current, metrics.observe_webhook)


def test_webhook_requests_are_timed_by_webhook_and_result() -> None:
    metrics = OperatorMetrics("r")
    hook = webhook(metrics, None)
    good = {"metadata": {"name": "j"}, "spec": dict(ftj("j")["spec"])}
    asyncio.run(hook.validate(body=good, spec=good["spec"], old=None, operation="CREATE"))
    bad = {"metadata": {"name": "j"}, "spec": {**good["spec"], "method": "Sideways"}}
    with pytest.raises(kopf.AdmissionError):
        asyncio.run(hook.validate(body=bad, spec=bad["spec"], old=None, operation="CREATE"))
    asyncio.run(hook.mutate(body=good, spec=good["spec"], patch=kopf.Patch(), warnings=[]))

    async def broken() -> ClusterView | None:
        raise RuntimeError("the view failed")

    failing = AdmissionWebhook(broken, metrics.observe_webhook)
    with pytest.raises(RuntimeError):
        asyncio.run(failing.mutate(body=good, spec=good["spec"], patch=kopf.Patch(), warnings=[]))

    found = scrape(metrics)
    name = "vramgate_webhook_request_duration_seconds_count"
    assert value(found, name, webhook="validating", result="allowed") == 1
    assert value(found, name, webhook="validating", result="denied") == 1
    assert value(found, name, webhook="mutating", result="allowed") == 1
    assert value(found, name, webhook="mutating", result="error") == 1


def test_end_reasons_and_webhook_results_start_at_zero() -> None:
    found = scrape(OperatorMetrics("r"))
    for reason in ("Succeeded", "OOMKilled", "GPUOutOfMemory", "WorkloadFailed"):
        assert value(found, "vramgate_jobs_finished_total", reason=reason) == 0
    name = "vramgate_webhook_request_duration_seconds_count"
    assert value(found, name, webhook="mutating", result="error") == 0


def test_a_pass_and_an_estimate_are_timed() -> None:
    metrics = OperatorMetrics("r")
    metrics.observe_pass(0.002)
    metrics.observe_estimate("calibrated", 0.0003)
    found = scrape(metrics)
    assert value(found, "vramgate_admission_pass_duration_seconds_count") == 1
    assert value(found, "vramgate_estimate_duration_seconds_count", profile="calibrated") == 1


def test_a_new_leader_makes_the_accuracy_series_of_every_admitted_job_at_zero() -> None:
    objects, _, _ = one_admitted_one_waiting()
    series = accuracy_series(objects, lambda job: "llama")
    assert series == {("calibrated", "llama")}, "the admitted job only, not the waiting one"
    metrics = OperatorMetrics("r")
    metrics.expect_accuracy(series)
    found = scrape(metrics)
    assert value(found, "vramgate_estimate_accuracy_ratio_count",
                 profile="calibrated", family="llama") == 0  # fmt: skip
