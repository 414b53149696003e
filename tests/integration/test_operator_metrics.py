"""The operator's /metrics and status.observed on the real local control plane.

`vramgate operator` runs as in test_admission.py; a job is admitted on a simulated node, its
pod runs (kwok), and the test writes the GPUNode as the agent would with the pod's bytes on
its GPU. Then /metrics is scraped over HTTP and parsed as Prometheus parses it: predicted
bytes per GPU, the reservation, the queue by reason, the decisions, the observed peak and its
ratio to the prediction; status.observed is read from the API; and when the job ends, the
estimator's accuracy is observed once.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from controller.api.base import JOB_LABEL
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

WEBHOOK_CONFIG = "vramgate-metrics-tests.vramgate.dev"


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[OperatorProcess, int]]:
    process = OperatorProcess(
        cluster,
        api_client,
        tmp_path_factory.mktemp("metrics"),
        extra=("--resync-seconds", "2", "--heartbeat-ttl-seconds", "30",
               "--lease-name", "vramgate-metrics-tests"),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=True)
    try:
        yield process, process.metrics_port
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of /metrics: (name, labels, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def sample(port: int, name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` with `labels`, None while there is none."""
    found = [
        v for n, have, v in scrape(port)
        if n == name and all(have.get(k) == want for k, want in labels.items())
    ]  # fmt: skip
    assert len(found) <= 1, f"{name} {labels}: {found}"
    return found[0] if found else None


def eventually(port: int, name: str, **labels: str) -> float:
    return wait_until(
        lambda: sample(port, name, **labels), timeout=DEADLINE_S, what=f"{name} {labels}"
    )


def test_metrics_follow_an_admitted_job_its_observed_peak_and_the_queue(
    operator: tuple[OperatorProcess, int],
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    process, port = operator
    (node,) = gpus.add([80])
    uuid = f"GPU-{node}-0"
    create(api_client, namespace, job("runs", gpus, runs_for="40s"))
    admitted(api_client, namespace, "runs", "True", "Fits")
    create(api_client, namespace, job("waits", gpus))
    admitted(api_client, namespace, "waits", "False", "WaitingForVRAM")

    gpu = {"node": node, "gpu": "0", "UUID": uuid, "modelName": gpus.product}
    predicted = eventually(port, "vramgate_job_predicted_bytes", namespace=namespace,
                           job="runs", profile="calibrated", **gpu)  # fmt: skip
    assert predicted == QLORA_BYTES
    assert eventually(port, "vramgate_gpu_reservation_bytes", **gpu) == QLORA_BYTES
    # The GPU runs' pod will hold is worth nothing to a new job, whatever it has free.
    wait_until(lambda: sample(port, "vramgate_gpu_schedulable_free_bytes", **gpu) == 0,
               timeout=DEADLINE_S, what="the promised GPU's schedulable bytes at 0")  # fmt: skip
    assert eventually(port, "vramgate_pending_jobs", reason="WaitingForVRAM") >= 1
    assert eventually(port, "vramgate_pending_job_created_timestamp_seconds",
                      namespace=namespace, job="waits", reason="WaitingForVRAM") > 0  # fmt: skip
    assert eventually(port, "vramgate_decisions_total", decision="Admit", reason="Fits") >= 1
    assert eventually(port, "vramgate_decisions_total", decision="Queue",
                      reason="WaitingForVRAM") >= 1  # fmt: skip
    assert eventually(port, "vramgate_decision_latency_seconds_count", decision="Admit") >= 1
    assert eventually(port, "vramgate_operator_leader") == 1
    assert eventually(port, "vramgate_webhook_request_duration_seconds_count",
                      webhook="validating", result="allowed") >= 1  # fmt: skip
    assert eventually(port, "vramgate_gpunode_heartbeat_timestamp_seconds", node=node) > 0

    # The trainer runs; the agent sees its pod use 9 GiB of the GPU, then 10.5 GiB.
    core = client.CoreV1Api(api_client)
    pod = wait_until(
        lambda: [p for p in core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}=runs")
                 .items if p.status.phase == "Running"],
        timeout=DEADLINE_S, what="the trainer to run",
    )[0]  # fmt: skip
    gpus.silent.add(node)  # the test writes this GPUNode from now on

    def agent_sees(gib: float) -> None:
        used = {pod.metadata.uid: gib}
        publish(api_client, node, [gpu_status(node, 0, 80, 80 - gib, gpus.product, used)])

    agent_sees(9.0)

    def observed(peak: int) -> dict[str, Any] | None:
        found = get(api_client, namespace, "runs")["status"].get("observed")
        return found if found and found["peakBytes"] == peak else None

    seen = wait_until(lambda: observed(9 * GIB), timeout=DEADLINE_S, what="status.observed")
    assert seen["gpus"] == [{"node": node, "index": 0, "uuid": uuid, "peakBytes": 9 * GIB}]
    assert eventually(port, "vramgate_job_observed_peak_bytes", namespace=namespace,
                      job="runs", **gpu) == 9 * GIB  # fmt: skip
    ratio = eventually(port, "vramgate_job_observed_ratio", namespace=namespace, job="runs",
                       profile="calibrated", family="llama")  # fmt: skip
    assert ratio == pytest.approx(9 * GIB / QLORA_BYTES)

    agent_sees(10.5)
    wait_until(lambda: observed(int(10.5 * GIB)), timeout=DEADLINE_S, what="the peak to grow")
    agent_sees(2.0)  # falls back: the peak stays

    # The job ends (kwok completes the pod after 40 s): its accuracy is observed once.
    wait_until(
        lambda: (c := condition(get(api_client, namespace, "runs"), "Succeeded"))
        and c["status"] == "True",
        timeout=60, what="runs to succeed",
    )  # fmt: skip
    assert get(api_client, namespace, "runs")["status"]["observed"]["peakBytes"] == int(10.5 * GIB)
    labels = {"profile": "calibrated", "family": "llama"}
    assert eventually(port, "vramgate_estimate_accuracy_ratio_count", **labels) == 1
    total = sample(port, "vramgate_estimate_accuracy_ratio_sum", **labels)
    assert total == pytest.approx(10.5 * GIB / QLORA_BYTES)
    assert eventually(port, "vramgate_jobs_finished_total", reason="Succeeded") >= 1
    assert sample(port, "vramgate_job_predicted_bytes", namespace=namespace, job="runs") is None
    assert "Traceback" not in process.log_since_start()
