"""The learning loop on the real local control plane: jobs whose pods use 0.7 x and 1.2 x of
their prediction teach the operator, and the next jobs like them are reserved less and more.

`vramgate operator` runs as in test_admission.py with `--learning-min-samples 2`. Each job
runs on a simulated node of its own (kwok); the test writes its GPUNode as the agent would,
with the pod's bytes on its GPU, then ends the pod itself (Succeeded, or Failed with a CUDA
out-of-memory message, as a trainer's termination message says it), so each job's peak and
end are the test's to choose. The jobs of one kind differ from the other kinds by their
trainer image only: the finest key (`controller.learning.keys`) tells them apart. The low
jobs' pods report their image's digest at their end (kwok's report none), so the low kind is
learned by digest and its next job, which names the tag, is keyed by the digest reported.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controller.admission import learned
from controller.api.base import GROUP, JOB_LABEL, VERSION
from controller.api.learnedcorrection import PLURAL as LEARNED
from controller.api.learnedcorrection import object_name
from controller.jobs.spec import config_digest
from controller.learning import JobKey, LearningSettings, record_steady
from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.gpunodes import GIB, gpu_status, publish
from tests.integration.test_admission import (  # noqa: F401 - `gpus` is a fixture
    DEADLINE_S,
    QLORA_BYTES,
    Gpus,
    admitted,
    create,
    get,
    gpus,
    job,
)
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    OperatorProcess,
    condition,
    crds,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-learning-tests.vramgate.dev"
K = 2


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster,
        api_client,
        tmp_path_factory.mktemp("learning"),
        extra=("--resync-seconds", "2", "--heartbeat-ttl-seconds", "60",
               "--lease-name", "vramgate-learning-tests", "--learning-min-samples", str(K)),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=True)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def trained(name: str, nodes: Gpus, image: str, **spec: Any) -> dict[str, Any]:
    body = job(name, nodes, **spec)
    body["spec"]["template"]["spec"]["containers"][0]["image"] = image
    return body


def running_pod(api: client.ApiClient, namespace: str, name: str) -> Any:
    core = client.CoreV1Api(api)
    selector = f"{JOB_LABEL}={name}"
    return wait_until(
        lambda: [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
                 if p.status.phase == "Running"],
        timeout=DEADLINE_S, what=f"{name}'s trainer to run",
    )[0]  # fmt: skip


def run_to_end(
    api: client.ApiClient,
    namespace: str,
    nodes: Gpus,
    name: str,
    used: float,
    oom: bool = False,
    image_id: str = "",
) -> None:
    """Job `name`, admitted: its pod uses `used` x the prediction on its GPU as the agent
    reports it, then ends (Succeeded, or Failed of a CUDA OOM), its trainer container
    reporting `image_id` (kwok's pods report none while they run)."""
    placed = admitted(api, namespace, name, "True")["status"]["placement"]["nodes"][0]
    node, index = placed["node"], placed["gpuIndices"][0]
    pod = running_pod(api, namespace, name)
    nodes.silent.add(node)  # the test writes this GPUNode from now on
    gib = used * QLORA_BYTES / GIB
    status = gpu_status(node, index, 80, 80 - gib, nodes.product, {pod.metadata.uid: gib})
    publish(api, node, [status])
    wait_until(lambda: (get(api, namespace, name)["status"].get("observed") or {}).get("peakBytes"),
               timeout=DEADLINE_S, what=f"{name}'s observed peak")  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if oom:
        message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
        state = {"exitCode": 1, "reason": "Error", "message": message}
        phase = "Failed"
    else:
        state, phase = {"exitCode": 0, "reason": "Completed"}, "Succeeded"
    core = client.CoreV1Api(api)
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {
        "phase": phase,
        "containerStatuses": [{
            "name": "trainer", "image": "trainer", "imageID": image_id, "ready": False,
            "restartCount": 0,
            "state": {"terminated": {**state, "startedAt": now, "finishedAt": now}},
        }],
    }})  # fmt: skip


def learned_sample(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: get(api, namespace, name)["status"].get("learnedSample"),
            timeout=DEADLINE_S,
            what=f"{name}'s sample",
        )
    )


def key_object(api: client.ApiClient, key: str, samples: int) -> dict[str, Any]:
    """The LearnedCorrection of `key`, once it counted `samples`."""
    objects = client.CustomObjectsApi(api)
    name = object_name(JobKey.parse(key))

    def counted() -> dict[str, Any] | None:
        try:
            found = objects.get_cluster_custom_object(GROUP, VERSION, LEARNED, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found if (found.get("status") or {}).get("samples") == samples else None

    return dict(wait_until(counted, timeout=DEADLINE_S, what=f"{key} to count {samples}"))


def reserved(api: client.ApiClient, namespace: str, name: str) -> int:
    return int(admitted(api, namespace, name, "True")["status"]["placement"]["perGpuBytes"])


def test_reservations_follow_what_jobs_like_them_used_across_a_restart_a_failover_and_an_oom(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
    cluster: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    low, high, oom = (f"trainer-{namespace}:{kind}" for kind in ("low", "high", "oom"))
    gpus.add(*[[80]] * (2 * K + 1))
    taught = [(f"low-{i}", low, 0.7) for i in range(K)] + [
        (f"high-{i}", high, 1.2) for i in range(K)
    ]
    for name, image, _ in taught:
        create(api_client, namespace, trained(name, gpus, image))
    create(api_client, namespace, trained("dies", gpus, oom))
    # The low jobs' pods report their image's digest (as containerd spells it); the others none.
    digest = "sha256:" + "1" * 64
    for name, image, used in taught:
        reported = f"docker.io/library/trainer-{namespace}@{digest}" if image == low else ""
        run_to_end(api_client, namespace, gpus, name, used, image_id=reported)
    run_to_end(api_client, namespace, gpus, "dies", 0.9, oom=True)

    samples = {name: learned_sample(api_client, namespace, name) for name, _, _ in taught}
    assert samples["low-0"]["kind"] == "Steady"
    # Filed under the digest the pod reported, not the tag; without a digest, under the tag.
    assert get(api_client, namespace, "low-0")["status"]["observed"]["imageDigest"] == digest
    assert JobKey.parse(samples["low-0"]["key"]).image == digest
    assert JobKey.parse(samples["high-0"]["key"]).image == high
    # The finest key is the configuration the estimate was made of; one spec, one digest.
    configs = {get(api_client, namespace, n)["status"]["estimate"]["config"] for n, _, _ in taught}
    assert len(configs) == 1 and JobKey.parse(samples["low-0"]["key"]).config in configs
    # ... and the manifest as written (what `vramgate plan` reads) names the same one as the
    # object the API server stored with its defaults.
    assert config_digest(trained("x", gpus, low)["spec"]) in configs
    assert samples["low-0"]["predictedBytes"] == QLORA_BYTES
    died = learned_sample(api_client, namespace, "dies")
    assert died["kind"] == "OutOfMemory"
    assert condition(get(api_client, namespace, "dies"), "Failed")["reason"] == "GPUOutOfMemory"
    lows = key_object(api_client, samples["low-0"]["key"], K)
    key_object(api_client, samples["high-0"]["key"], K)
    assert lows["status"]["source"] == "Learned" and lows["status"]["p95Ratio"] < "1.00"

    # The next jobs of each kind: lower, but not below what the 0.7 x jobs used; higher. The
    # next low job names the tag: it is keyed by the digest the low jobs reported (the coarser
    # key, which mixes the low and high jobs, would raise it).
    gpus.add(*[[80]] * 5)
    create(api_client, namespace, trained("next-low", gpus, low))
    create(api_client, namespace, trained("next-high", gpus, high))
    create(api_client, namespace, trained("raise-only", gpus, low, estimateCorrection="RaiseOnly"))
    create(api_client, namespace, trained("dies-again", gpus, oom))
    lower = reserved(api_client, namespace, "next-low")
    assert int(0.7 * QLORA_BYTES) <= lower < QLORA_BYTES
    assert reserved(api_client, namespace, "next-high") >= int(1.2 * QLORA_BYTES)
    assert reserved(api_client, namespace, "raise-only") == QLORA_BYTES, "raiseOnly never lowers"
    assert reserved(api_client, namespace, "dies-again") >= QLORA_BYTES * 120 // 100
    status = get(api_client, namespace, "next-low")["status"]
    assert status["estimate"]["perGpuBytes"] == QLORA_BYTES, "the estimator's own figure stays"
    assert status["estimate"]["correction"]["perGpuBytes"] == lower
    message = condition(get(api_client, namespace, "next-low"), "Estimated")["message"]
    assert f"learned from {K} jobs like it (p95)" in message, message

    # A restart: the learned state is read back from the API, and nothing is counted twice.
    operator.stop()
    operator.start(webhook=True)
    create(api_client, namespace, trained("after-restart", gpus, low))
    assert reserved(api_client, namespace, "after-restart") == lower
    running_pod(api_client, namespace, "after-restart")  # passes of the new process went by
    again = key_object(api_client, samples["low-0"]["key"], K)
    assert again["status"]["countedUIDs"] == lows["status"]["countedUIDs"], "counted once"
    assert "Traceback" not in operator.log_since_start()

    # A failover: the leader dies without handing the Lease back; the standby, which never
    # filed a sample, takes the Lease and decides on what the API holds.
    standby = OperatorProcess(
        cluster, api_client, tmp_path_factory.mktemp("learning-standby"),
        extra=operator.extra, webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    standby.start(webhook=False)
    try:
        gpus.add([80])
        operator.kill()
        create(api_client, namespace, trained("after-failover", gpus, low))
        # The standby waits out the Lease (15 s), lists every job, then decides.
        obj = admitted(api_client, namespace, "after-failover", "True", timeout=60)
        assert int(obj["status"]["placement"]["perGpuBytes"]) == lower
        assert "holding the Lease" in standby.log_since_start()
        kept = key_object(api_client, samples["low-0"]["key"], K)
        assert kept["status"]["countedUIDs"] == lows["status"]["countedUIDs"], "counted once"
        assert "Traceback" not in standby.log_since_start()
    finally:
        standby.stop()
        if operator.proc is None:
            operator.start(webhook=True)


def test_a_configuration_no_job_taught_for_long_is_forgotten_but_a_pinned_one_stays(
    operator: OperatorProcess, api_client: client.ApiClient
) -> None:
    """Two configurations' LearnedCorrections whose only sample is 200 days old (over 8
    half-lives of 14 days), as the leader wrote them then: it deletes the one nobody pinned
    and keeps the one a person pinned."""
    objects = client.CustomObjectsApi(api_client)
    settings = LearningSettings()
    then = datetime.now(UTC) - timedelta(days=200)
    names = []
    for config, pinned in (("0123456789ab", None), ("ba9876543210", 90)):
        key = JobKey.of(family="llama", method="LoRA", parallelism="DDP", profile="calibrated",
                        framework="trl", image="sha256:forgotten", config=config)  # fmt: skip
        record = record_steady({}, key, 7 * GIB, 10 * GIB, then, settings)[key.name]
        obj, status = learned.key_object(learned.KeyState(key, record), settings, then)
        if pinned is not None:
            obj["spec"]["pinnedPercent"] = pinned
        objects.create_cluster_custom_object(GROUP, VERSION, LEARNED, obj)
        name = obj["metadata"]["name"]
        objects.patch_cluster_custom_object_status(
            GROUP, VERSION, LEARNED, name, {"status": status}
        )
        names.append(name)
    forgotten, kept = names

    def gone() -> bool:
        try:
            objects.get_cluster_custom_object(GROUP, VERSION, LEARNED, forgotten)
        except ApiException as error:
            return error.status == 404
        return False

    try:
        wait_until(gone, timeout=DEADLINE_S, what=f"{forgotten} to be forgotten")
        time.sleep(3)  # a pass or more (resync 2 s) after: the pinned one is still there
        pinned = objects.get_cluster_custom_object(GROUP, VERSION, LEARNED, kept)
        assert pinned["spec"]["pinnedPercent"] == 90
        assert "forgot learned correction" in operator.log_since_start()
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                objects.delete_cluster_custom_object(GROUP, VERSION, LEARNED, name)
