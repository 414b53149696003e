"""A running job teaches once its peak is steady, and its end takes that sample's place if the
peak grew after: on the real local control plane, with `--learning-steady-seconds 3`.

As test_learning.py: each job runs on a simulated node of its own, and the test writes its
GPUNode as the agent would and ends its pod itself. The operator here is its own (another
Lease), started after test_learning.py's has stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.gpunodes import GIB, gpu_status, publish
from tests.integration.test_admission import (  # noqa: F401 - `gpus` is a fixture
    DEADLINE_S,
    Gpus,
    admitted,
    create,
    get,
    gpus,
)
from tests.integration.test_learning import key_object, running_pod, trained
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    OperatorProcess,
    condition,
    crds,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-learning-running-tests.vramgate.dev"
STEADY_S = 3


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
        tmp_path_factory.mktemp("learning-running"),
        extra=("--resync-seconds", "1", "--heartbeat-ttl-seconds", "60",
               "--lease-name", "vramgate-learning-running-tests",
               "--learning-steady-seconds", str(STEADY_S)),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=False)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def predicted(api: client.ApiClient, namespace: str, name: str) -> int:
    return int(
        admitted(api, namespace, name, "True")["status"]["estimate"]["perGpuLevels"]["nvmlBytes"]
    )


def use(api: client.ApiClient, namespace: str, nodes: Gpus, name: str, used: float) -> Any:
    """Job `name`'s pod uses `used` x the prediction on its GPU, as the agent reports it."""
    placed = admitted(api, namespace, name, "True")["status"]["placement"]["nodes"][0]
    node, index = placed["node"], placed["gpuIndices"][0]
    pod = running_pod(api, namespace, name)
    nodes.silent.add(node)
    gib = used * predicted(api, namespace, name) / GIB
    publish(api, node, [gpu_status(node, index, 80, 80 - gib, nodes.product,
                                   {pod.metadata.uid: gib})])  # fmt: skip
    return pod


def sample_where(api: client.ApiClient, namespace: str, name: str, **fields: Any) -> Any:
    def found() -> Any:
        taught = get(api, namespace, name)["status"].get("learnedSample") or {}
        return taught if all(taught.get(k) == v for k, v in fields.items()) else None

    return wait_until(found, timeout=DEADLINE_S, what=f"{name}'s sample with {fields}")


def test_a_running_job_teaches_once_steady_and_its_end_replaces_that_sample(
    operator: OperatorProcess,
    api_client: client.ApiClient,
    namespace: str,
    gpus: Gpus,  # noqa: F811
) -> None:
    # LoRA of a small model: no later module's job shares even the coarsest key (method,
    # profile) it teaches, which are cluster-scoped and rebuilt from the jobs left behind.
    gpus.add([80])
    body = trained("long", gpus, f"trainer-{namespace}:long", method="LoRA",
                   model={"preset": "llama-3.2-1b"})  # fmt: skip
    create(api_client, namespace, body)
    pod = use(api_client, namespace, gpus, "long", 0.7)
    need = predicted(api_client, namespace, "long")
    first = sample_where(api_client, namespace, "long", running=True)
    assert first["kind"] == "Steady" and first["predictedBytes"] == need
    assert abs(first["observedBytes"] - 0.7 * need) <= GIB // 100
    job = get(api_client, namespace, "long")
    assert condition(job, "Running")["status"] == "True", "taught while it runs"
    uid = job["metadata"]["uid"]
    while_running = key_object(api_client, first["key"], 1)
    assert while_running["status"]["countedUIDs"] == [uid]

    # An evaluation pass raises the peak after; the job then ends.
    use(api_client, namespace, gpus, "long", 1.2)
    wait_until(
        lambda: (
            get(api_client, namespace, "long")["status"]["observed"]["peakBytes"]
            >= int(1.2 * need) - GIB // 100
        ),
        timeout=DEADLINE_S,
        what="the higher peak observed",
    )
    client.CoreV1Api(api_client).patch_namespaced_pod_status(pod.metadata.name, namespace, {
        "status": {"phase": "Succeeded", "containerStatuses": [{
            "name": "trainer", "image": "trainer", "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}},
        }]},
    })  # fmt: skip
    end = sample_where(api_client, namespace, "long", revision=1)
    assert end["running"] is False and end["replaces"]["observedBytes"] == first["observedBytes"]
    after = key_object(api_client, first["key"], 1)  # one job, one sample: replaced
    assert after["status"]["countedUIDs"] == [uid, f"{uid}/1"]
    assert float(after["status"]["p95Ratio"]) >= 1.2
    assert "Traceback" not in operator.log_since_start()
