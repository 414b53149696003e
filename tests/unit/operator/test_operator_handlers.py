"""The operator's shell without a cluster: the scheduler's estimate of one job and how its
failures are classified, the ConfigMap read, kopf's registration, and `vramgate operator`'s
start-up errors.

The estimate runs here as the scheduler runs it (`Scheduler._estimate_now` in a worker
thread, its failure through `failure_of`), with a fake ConfigMap reader. The pass that
records the result is tested in test_admission_pass.py; the whole operator against a real
API server in tests/integration/test_operator.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import kopf
import pytest
from kubernetes.client.rest import ApiException

from controller.admission.admission_pass import Estimated
from controller.admission.failures import PROFILE_RETRY_S, failure_of
from controller.api import conditions as cond
from controller.base.errors import ConfigMapUnavailable, ProfileUnavailable
from controller.cli import main
from controller.decision import QueueingStrategy
from controller.estimator import SpecErrors
from controller.jobs.profiles import trace_extra_installed
from controller.jobs.spec import ConfigMapKey
from controller.kube import Kube, read_model_config
from controller.operator import caches, handlers, scheduler
from controller.operator.run import NoDiffBase, build_registry, operator_settings
from controller.operator.scheduler import Scheduler, SchedulerOptions
from controller.operator.settings import OperatorOptions, WebhookMode
from controller.packing.inventory import GpuMode
from controller.webhook.server import ReviewServer
from tests.unit.conftest import NOT_A_FAMILY, PYTHIA_69B, QWEN25_05B

GIB = 2**30
RETRY_S = 7.0
PRESET = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}


class FakeConfigMaps:
    """`CoreV1Api.read_namespaced_config_map` over a dict of name -> data."""

    def __init__(self, maps: dict[str, dict[str, str]]) -> None:
        self.maps = maps
        self.reads = 0

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        self.reads += 1
        if name not in self.maps:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=self.maps[name])


def new_scheduler(maps: FakeConfigMaps | None = None) -> Scheduler:
    """A Scheduler whose Kube is only the ConfigMap reader `_estimate_now` uses, and a dry
    run that passes (the webhook's)."""
    kube = SimpleNamespace(core=maps or FakeConfigMaps({}), create_dry_run=lambda obj: None)
    return Scheduler(kube=cast(Kube, kube), options=SchedulerOptions(configmap_retry_s=RETRY_S))


@pytest.fixture
def sched() -> Iterator[Scheduler]:
    made = new_scheduler()
    yield made
    asyncio.run(made.close())


def job(spec: dict[str, Any], generation: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "j", "namespace": "ns", "generation": generation, "uid": "u"},
        "spec": spec,
    }


def estimate_as_the_loop_does(sched: Scheduler, body: dict[str, Any]) -> Estimated:
    """`Scheduler._estimate` (worker thread, failure classified) and what it stored."""

    async def go() -> Estimated:
        meta = body["metadata"]
        await sched._estimate("ns/j", meta["uid"], meta["generation"], body)
        return sched._estimates["ns/j"]

    return asyncio.run(go())


@pytest.fixture
def estimator_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every plan the scheduler hands the estimator."""
    calls: list[Any] = []
    real = scheduler.estimate_plan

    def counting(plan: Any) -> Any:
        calls.append(plan)
        return real(plan)

    monkeypatch.setattr(scheduler, "estimate_plan", counting)
    return calls


# -- Scheduler._estimate_now --------------------------------------------------------------


def test_a_preset_spec_is_planned_and_estimated(
    sched: Scheduler, estimator_calls: list[Any]
) -> None:
    found = sched._estimate_now(job(PRESET))
    assert found.failure is None and found.plan is not None and found.estimate is not None
    assert found.plan.model == "llama-3.1-8b" and found.plan.gpus == 1
    assert found.estimate.total_bytes > 8 * GIB
    assert len(estimator_calls) == 1


def test_the_same_spec_is_estimated_once(sched: Scheduler, estimator_calls: list[Any]) -> None:
    first = sched._estimate_now(job(PRESET))
    again = sched._estimate_now(job(dict(PRESET), generation=9))  # another job, same spec
    assert len(estimator_calls) == 1, "the second is the cache's"
    assert again.plan is first.plan and again.estimate is first.estimate

    other = sched._estimate_now(job({**PRESET, "lora": {"rank": 64}}))
    assert len(estimator_calls) == 2, "another spec is another estimate"
    assert other.estimate is not None and first.estimate is not None
    assert other.estimate.trainable_params > first.estimate.trainable_params


def test_the_loop_stores_an_estimate_at_the_jobs_generation(sched: Scheduler) -> None:
    found = estimate_as_the_loop_does(sched, job(PRESET, generation=4))
    assert found.generation == 4 and found.failure is None
    assert sched._estimate_uid["ns/j"] == "u"
    assert sched._estimating == set()


def test_a_configmap_model_is_read_and_estimated_and_reread_each_time() -> None:
    maps = FakeConfigMaps({"cfg": {"model.json": json.dumps(QWEN25_05B)}})
    spec = {
        "model": {"configMapRef": {"name": "cfg", "key": "model.json"}},
        "method": "LoRA",
        "lora": {"rank": 8},
    }
    made = new_scheduler(maps)
    found = made._estimate_now(job(spec))
    assert found.plan is not None and found.plan.model == "configmaps/cfg[model.json]"
    assert maps.reads == 1
    again = made._estimate_now(job(spec))
    assert maps.reads == 2, "the ConfigMap may have changed: it is part of the cache key"
    assert again.estimate is found.estimate


# -- failure classification -----------------------------------------------------------------


def test_an_invalid_spec_is_invalid_spec_and_never_retried(sched: Scheduler) -> None:
    body = job({"model": {"preset": "nope"}, "method": "QLoRA", "lora": {"rank": 0}})
    with pytest.raises(SpecErrors) as caught:
        sched._estimate_now(body)
    message = str(caught.value)
    assert "spec.model.preset" in message and "spec.lora.rank" in message, "every error"

    failure = failure_of(caught.value, temporary_retry_s=RETRY_S)
    assert (failure.reason, failure.retry_s, failure.message) == (
        cond.REASON_INVALID_SPEC, None, message,
    )  # fmt: skip
    stored = estimate_as_the_loop_does(sched, body)
    assert stored.failure == failure and stored.generation == 3
    assert "ns/j" not in sched._retry_at


def test_a_model_family_without_a_hand_reading_is_estimated_in_the_worker(
    sched: Scheduler,
) -> None:
    """Read from the model transformers builds, in the estimate worker (never on the event
    loop), where the trace extra is installed: 6.86B parameters, as published. Without the
    extra, InvalidSpec saying what would read it, not retried."""
    spec = {"model": {"config": PYTHIA_69B}, "method": "Full"}
    stored = estimate_as_the_loop_does(sched, job(spec))
    if trace_extra_installed():
        assert stored.failure is None and stored.estimate is not None
        assert stored.estimate.total_params == 6_857_302_016
        return
    assert stored.failure is not None and stored.estimate is None
    assert (stored.failure.reason, stored.failure.retry_s) == (cond.REASON_INVALID_SPEC, None)
    assert stored.failure.message.startswith(f"spec.model.config.{NOT_A_FAMILY} (its layers")
    assert "trace extra" in stored.failure.message
    assert "\n" not in stored.failure.message and "ns/j" not in sched._retry_at


def test_a_missing_configmap_is_retried(sched: Scheduler) -> None:
    body = job({"model": {"configMapRef": {"name": "cfg"}}, "method": "LoRA"})
    with pytest.raises(ConfigMapUnavailable) as caught:
        sched._estimate_now(body)
    failure = failure_of(caught.value, temporary_retry_s=RETRY_S)
    assert failure.reason == cond.REASON_CONFIGMAP_UNAVAILABLE
    assert failure.message == "spec.model.configMapRef.name: ConfigMap ns/cfg not found"
    assert failure.retry_s == RETRY_S and not failure.is_bug

    stored = estimate_as_the_loop_does(sched, body)
    assert stored.failure == failure, "the scheduler's configmap_retry_s is the delay"
    assert "ns/j" in sched._retry_at


def test_a_profile_the_operator_lacks_is_retried_later(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_trace(plan: Any) -> Any:
        raise ProfileUnavailable("spec.estimator.profile: trace needs the `trace` extra")

    monkeypatch.setattr(scheduler, "estimate_plan", no_trace)
    with pytest.raises(ProfileUnavailable) as caught:
        sched._estimate_now(job(PRESET))
    failure = failure_of(caught.value, temporary_retry_s=RETRY_S)
    assert (failure.reason, failure.retry_s) == (cond.REASON_PROFILE_UNAVAILABLE, PROFILE_RETRY_S)
    assert failure.message == "spec.estimator.profile: trace needs the `trace` extra"
    assert estimate_as_the_loop_does(sched, job(PRESET)).failure == failure


def test_an_estimator_bug_is_estimation_failed_and_not_retried(
    sched: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(plan: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(scheduler, "estimate_plan", broken)
    with pytest.raises(ZeroDivisionError) as caught:
        sched._estimate_now(job(PRESET))
    failure = failure_of(caught.value, temporary_retry_s=RETRY_S)
    assert failure.reason == cond.REASON_ESTIMATION_FAILED and failure.is_bug
    assert failure.message == "the estimator failed: ZeroDivisionError: division by zero"
    assert failure.retry_s is None
    assert estimate_as_the_loop_does(sched, job(PRESET)).failure == failure


# -- the ConfigMap read ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("maps", "ref", "message"),
    [
        ({}, ConfigMapKey("cfg"), "spec.model.configMapRef.name: ConfigMap ns/cfg not found"),
        (
            {"cfg": {"other": "{}"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg has no key 'config.json' (keys: other)",
        ),
        (
            {"cfg": {"config.json": "{not json"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg key 'config.json' is not valid JSON",
        ),
        (
            {"cfg": {"config.json": "[1, 2]"}},
            ConfigMapKey("cfg"),
            "spec.model.configMapRef.key: ConfigMap ns/cfg key 'config.json' must hold a JSON "
            "object",
        ),
    ],
)
def test_configmap_problems_name_the_field(
    maps: dict[str, dict[str, str]], ref: ConfigMapKey, message: str
) -> None:
    with pytest.raises(ConfigMapUnavailable) as caught:
        read_model_config(FakeConfigMaps(maps), "ns", ref)
    assert str(caught.value).startswith(message)


def test_a_forbidden_read_says_so() -> None:
    class Forbidden(FakeConfigMaps):
        def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
            raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ConfigMapUnavailable, match="cannot read ConfigMap ns/cfg: 403 Forbidden"):
        read_model_config(Forbidden({}), "ns", ConfigMapKey("cfg"))


# -- kopf registration ----------------------------------------------------------------------


def test_registration_covers_indexes_wake_ups_lifecycle_and_both_webhooks(
    sched: Scheduler,
) -> None:
    registry: Any = kopf.OperatorRegistry()  # its handler lists are kopf's internals
    handlers.register(registry, sched, webhooks=True)

    indexes = registry._indexing.get_all_handlers()
    assert [h.id for h in indexes] == list(caches.INDEXES)
    wake = {h.selector.any_name for h in registry._watching.get_all_handlers()}
    assert wake == {
        "finetunejobs", "gpunodes", "nodes", "pods", "jobs", "priorityclasses", "learnedcorrections"
    }  # fmt: skip
    activities = {str(h.activity.value) for h in registry._activities.get_all_handlers()}
    assert activities == {"startup", "cleanup"}
    assert registry._changing.get_all_handlers() == [], "no create/update handler writes"
    # Coroutines: kopf runs plain functions in its thread pool, two thread hops per event.
    watching = list(registry._watching.get_all_handlers())
    assert all(inspect.iscoroutinefunction(h.fn) for h in [*indexes, *watching])
    # So kopf needs no diff base (run.NoDiffBase): only these two kinds of handler read one.
    assert registry._spawning.get_all_handlers() == [], "no daemons or timers"

    hooks = {h.id: h for h in registry._webhooks.get_all_handlers()}
    assert set(hooks) == {handlers.VALIDATE_HANDLER, handlers.MUTATE_HANDLER}
    validate, mutate = hooks[handlers.VALIDATE_HANDLER], hooks[handlers.MUTATE_HANDLER]
    assert str(validate.reason.value) == "validating" and str(mutate.reason.value) == "mutating"
    assert validate.operations == ["CREATE", "UPDATE"] and mutate.operations == ["CREATE", "UPDATE"]
    assert validate.ignore_failures and mutate.ignore_failures, "a down webhook blocks nothing"

    bare: Any = kopf.OperatorRegistry()
    handlers.register(bare, sched, webhooks=False)
    assert bare._webhooks.get_all_handlers() == []
    assert len(bare._indexing.get_all_handlers()) == len(caches.INDEXES)


def test_a_gpunode_heartbeat_alone_does_not_wake_the_loop(sched: Scheduler) -> None:
    registry: Any = kopf.OperatorRegistry()
    handlers.register(registry, sched, webhooks=False)
    (on_gpunode,) = [
        h for h in registry._watching.get_all_handlers() if h.selector.any_name == "gpunodes"
    ]
    indexes: dict[str, Any] = {name: {} for name in caches.INDEXES}

    def event(beat: str, free: int, total: int = 80 * GIB) -> tuple[bool, int]:
        sched._wake.clear()
        inventory = sched._inventory
        gpu = {"index": 0, "totalBytes": total, "freeBytes": free, "usedBytes": total - free}
        body = {"metadata": {"name": "n1", "uid": "g1"},
                "status": {"heartbeatTime": beat, "gpus": [gpu]}}  # fmt: skip
        asyncio.run(on_gpunode.fn(body=kopf.Body(cast(Any, body)), type="MODIFIED", **indexes))
        return sched._wake.is_set(), sched._inventory - inventory

    assert event("2025-03-01T12:00:00Z", 80 * GIB) == (True, 1), "the first sight of it"
    assert event("2025-03-01T12:00:30Z", 80 * GIB) == (False, 0), "a heartbeat only"
    # The webhook judges against the empty cluster: its view is not rebuilt for usage.
    assert event("2025-03-01T12:01:00Z", 70 * GIB) == (True, 0), "memory in use changed"
    assert event("2025-03-01T12:01:30Z", 70 * GIB, 40 * GIB) == (True, 1), "capacity changed"
    assert sched.caches is not None, "the handler handed the scheduler its caches"


def test_every_finetunejob_event_wakes_the_loop(sched: Scheduler) -> None:
    """No digest of a FineTuneJob's body (its resourceVersion differs on every real event):
    each event wakes the loop, a relist's too, and the debounce folds them into one pass."""
    registry: Any = kopf.OperatorRegistry()
    handlers.register(registry, sched, webhooks=False)
    (on_job,) = [
        h for h in registry._watching.get_all_handlers() if h.selector.any_name == "finetunejobs"
    ]
    indexes: dict[str, Any] = {name: {} for name in caches.INDEXES}
    body = {"metadata": {"name": "j", "namespace": "ns", "uid": "u1"}, "spec": {}}
    for kind in ("ADDED", "MODIFIED", "MODIFIED", "DELETED"):
        sched._wake.clear()
        asyncio.run(on_job.fn(body=kopf.Body(cast(Any, body)), type=kind, **indexes))
        assert sched._wake.is_set(), kind


def test_a_priority_class_created_or_given_another_value_wakes_the_loop(sched: Scheduler) -> None:
    """A job waiting for its class is decided, and the queue reordered, at once."""
    registry: Any = kopf.OperatorRegistry()
    handlers.register(registry, sched, webhooks=False)
    (on_class,) = [
        h for h in registry._watching.get_all_handlers() if h.selector.any_name == "priorityclasses"
    ]
    indexes: dict[str, Any] = {name: {} for name in caches.INDEXES}

    def event(value: int, kind: str = "MODIFIED", **more: Any) -> bool:
        sched._wake.clear()
        body = {"metadata": {"name": "high", "uid": "pc1", "labels": more}, "value": value}
        asyncio.run(on_class.fn(body=kopf.Body(cast(Any, body)), type=kind, **indexes))
        return sched._wake.is_set()

    assert event(1000, "ADDED")
    assert not event(1000, team="a"), "a label changes no rank"
    assert event(2000)
    assert event(2000, "DELETED")


# -- `vramgate operator` start-up -----------------------------------------------------------


def test_no_credentials_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["operator", "--webhook", "off"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("vramgate operator: no Kubernetes credentials: ")


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--webhook-port=70000", "--webhook-port: must be less than or equal to 65535, got 70000"),
        ("--configmap-retry-seconds=0", "--configmap-retry-seconds: must be greater than 0"),
        ("--webhook=sometimes", "argument --webhook: invalid choice: 'sometimes'"),
        ("--resync-seconds=0", "--resync-seconds: must be greater than 0, got 0.0"),
        ("--gpu-mode=shared", "argument --gpu-mode: invalid choice: 'shared'"),
        ("--queueing=LIFO", "argument --queueing: invalid choice: 'LIFO'"),
        ("--headroom=2", "--headroom: "),
        ("--headroom-percent=51", "--headroom-percent: must be between 0 and 50, got 51"),
    ],
)
def test_bad_flags_exit_2(flag: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", flag]) == 2
    assert message in capsys.readouterr().err


def test_operator_flags_reach_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[OperatorOptions] = []

    def fake_run(options: OperatorOptions) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr("controller.operator.run.run", fake_run)
    argv = [
        "operator", "--webhook=off", "--gpu-mode=visibleDevices", "--queueing=StrictFIFO",
        "--headroom=2GiB", "--headroom-percent=5", "--resync-seconds=3",
        "--no-leader-election", "--lease-namespace=vg", "--lease-name=lease",
        "--identity=replica-1", "--configmap-retry-seconds=4",
    ]  # fmt: skip
    assert main(argv) == 0
    (options,) = seen
    packing = options.admission.packing
    assert packing.gpu_mode is GpuMode.VISIBLE_DEVICES
    assert (packing.headroom_bytes, packing.headroom_percent) == (2 * GIB, 5)
    assert options.admission.queueing is QueueingStrategy.STRICT_FIFO
    assert (options.resync_s, options.configmap_retry_s) == (3.0, 4.0)
    assert options.leader_election is False
    assert (options.lease_namespace, options.lease_name, options.identity) == (
        "vg", "lease", "replica-1",
    )  # fmt: skip

    assert main(["operator", "--webhook=off"]) == 0
    assert seen[-1].leader_election is True, "leader election is on by default"


def test_the_review_server_answers_with_the_registered_webhooks(sched: Scheduler) -> None:
    """End to end over HTTP: build_registry hands the server its webhooks, and the server
    answers with them, never with kopf's handler machinery (`fn`)."""
    server = ReviewServer(addr="127.0.0.1", insecure=True)
    build_registry(OperatorOptions(), sched, None, server)
    assert server.hook is not None

    async def kopf_fn(*_: Any, **__: Any) -> Any:
        raise AssertionError("kopf's handlers were called")

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-7", "operation": "CREATE",
            "resource": {"group": "vramgate.dev", "version": "v1alpha1",
                         "resource": "finetunejobs"},
            "object": {"metadata": {"name": "j"}, "spec": {"model": {"preset": "llama-3.1-8b"},
                                                          "method": "Partial"}},
        },
    }  # fmt: skip

    async def post() -> tuple[int, Any]:
        iterator = server(kopf_fn).__aiter__()
        config = await iterator.__anext__()
        try:
            async with aiohttp.ClientSession() as session:
                url = f"{config['url'].rstrip('/')}/{handlers.VALIDATE_HANDLER}"
                async with session.post(url, json=review) as response:
                    return response.status, await response.json()
        finally:
            await iterator.aclose()

    status, answered = asyncio.run(post())
    assert status == 200
    assert answered["response"]["uid"] == "u-7" and answered["response"]["allowed"] is False
    assert "spec.method" in answered["response"]["status"]["message"]


def test_trainjob_sizing_registers_its_webhook_and_hands_it_to_the_server(
    sched: Scheduler,
) -> None:
    """Only with trainJobSizing: a mutating webhook on TrainJobs, CREATE only (their trainer is
    immutable), failing open; the review server answers with it. No watch: a TrainJob is
    sized once, at its create; what it was sized onto is held a short while in a ledger
    the scheduler shares (below)."""
    server = ReviewServer(addr="127.0.0.1", insecure=True)
    registry: Any = build_registry(OperatorOptions(train_job_sizing=True), sched, None, server)
    hooks = {h.id: h for h in registry._webhooks.get_all_handlers()}
    trainjobs = hooks[handlers.MUTATE_TRAINJOB_HANDLER]
    assert (trainjobs.selector.group, trainjobs.selector.any_name) == (
        "trainer.kubeflow.org", "trainjobs"
    )  # fmt: skip
    assert str(trainjobs.reason.value) == "mutating" and trainjobs.operations == ["CREATE"]
    assert trainjobs.ignore_failures
    assert server.trainjobs is not None and server.hook is not None
    watched = {h.selector.any_name for h in registry._watching.get_all_handlers()}
    assert "trainjobs" not in watched

    plain = ReviewServer(addr="127.0.0.1", insecure=True)
    registry = build_registry(OperatorOptions(), sched, None, plain)
    assert handlers.MUTATE_TRAINJOB_HANDLER not in {
        h.id for h in registry._webhooks.get_all_handlers()
    }
    assert plain.trainjobs is None


def test_trainjob_holds_are_one_ledger_of_the_webhook_and_the_scheduler(
    sched: Scheduler,
) -> None:
    """trainJobHoldSeconds reaches the ledger the review server's webhook adds to and the
    scheduler's passes and views charge: the same object, on the scheduler's clock; 0: none."""
    server = ReviewServer(addr="127.0.0.1", insecure=True)
    options = OperatorOptions(train_job_sizing=True, train_job_hold_s=45)
    build_registry(options, sched, None, server)
    assert server.trainjobs is not None and server.trainjobs.holds is not None
    assert server.trainjobs.holds is sched.holds and sched.holds.hold_s == 45
    assert sched.holds.clock == sched.clock.monotonic

    server = ReviewServer(addr="127.0.0.1", insecure=True)
    build_registry(replace(options, train_job_hold_s=0), sched, None, server)
    assert server.trainjobs is not None and server.trainjobs.holds is None
    assert sched.holds is None


def test_kopf_builds_no_diff_base_for_the_handlers_that_do_not_read_one(sched: Scheduler) -> None:
    """kopf's default deep-copies every watched body on every event to build a diff base; the
    operator's handlers never read one (no change or spawn handlers, asserted above)."""
    settings = operator_settings(OperatorOptions(webhook=WebhookMode.OFF))
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, NoDiffBase)
    body = kopf.Body({"metadata": {"name": "j"}, "spec": {"gpus": 1}})
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None
    registry: Any = build_registry(OperatorOptions(), sched, None)
    assert registry._changing.get_all_handlers() == []
    assert registry._spawning.get_all_handlers() == []


def test_the_kopf_floor_benchmark_watches_what_the_operator_watches(sched: Scheduler) -> None:
    """`benchmarks.kopf_floor` prices kopf's share of the operator's CPU only while its
    watches are the operator's: the same resources, label filters and `when` filters, one
    index and one event handler each."""
    from benchmarks import kopf_floor

    def watches(handlers_: list[Any]) -> list[tuple[Any, ...]]:
        return sorted(
            ((h.selector.group or "", h.selector.version, h.selector.any_name,
              tuple(sorted((h.labels or {}).items(), key=str)), h.when)
             for h in handlers_),
            key=lambda w: (w[2], str(w[3]), id(w[4])),
        )  # fmt: skip

    for with_kueue in (False, True):
        sched.options = replace(sched.options, kueue=with_kueue)
        operator: Any = kopf.OperatorRegistry()
        handlers.register(operator, sched, webhooks=False)
        floor: Any = kopf_floor.registry(with_kueue)
        assert watches(floor._indexing.get_all_handlers()) == watches(
            operator._indexing.get_all_handlers()
        ), with_kueue
        assert watches(floor._watching.get_all_handlers()) == watches(
            operator._watching.get_all_handlers()
        ), with_kueue
