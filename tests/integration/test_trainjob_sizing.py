"""TrainJobs sized at create (`trainJobSizing`) on the local control plane: Trainer's CRDs
from the pinned module (e2e/trainer.py), the operator with its managed webhooks, and a
TrainJob applied with kubectl, which prints the webhook's warnings.

Only Trainer's CRDs are installed, not its controller or webhooks: the runtime a TrainJob
names need not exist, and nothing runs it. The TrainJobs select the test's nodes through
their runtimePatches' nodeSelector for the trainer's replicated job (`node`), so GPUs of
other tests in the session do not count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from controller.admission.kueue import SPEC_ANNOTATION
from controller.admission.trainjob import POLICY_ANNOTATION
from controller.api.base import REQUESTED_GPUS_ANNOTATION
from e2e import trainer
from e2e.cluster import Cluster
from e2e.wait import wait_until
from tests.integration.test_admission import DEADLINE_S, Gpus, gpus  # noqa: F401 - fixture
from tests.integration.test_operator import (  # noqa: F401 - `crds` is a fixture
    OperatorProcess,
    crds,
    forget_webhook_configs,
)

pytestmark = pytest.mark.integration

WEBHOOK_CONFIG = "vramgate-trainjob.vramgate.dev"
FULL = "model: {preset: llama-3.1-8b}\nmethod: Full\n"  # 45.49 GiB per GPU on 2, 23.76 on 4
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def trainer_crds(cluster: Cluster) -> None:
    """Trainer's CRDs (and JobSet's), left installed: a Kueue running in the session starts
    its TrainJob integration once they appear (e2e/trainer.py)."""
    trainer.install_crds(cluster)
    # kubectl resolves `trainjob` through discovery, which lags a moment behind Established.
    wait_until(lambda: cluster.kubectl("get", "trainjobs", "-A").returncode == 0,
               timeout=30, what="TrainJobs in discovery")  # fmt: skip


@pytest.fixture(scope="module")
def sizing(
    cluster: Cluster,
    api_client: client.ApiClient,
    crds: None,  # noqa: F811
    trainer_crds: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        cluster,
        api_client,
        tmp_path_factory.mktemp("trainjob-sizing"),
        extra=("--train-job-sizing", "--resync-seconds", "2", "--heartbeat-ttl-seconds", "30",
               "--lease-name", "vramgate-trainjob-tests"),
        webhook_config=WEBHOOK_CONFIG,
    )  # fmt: skip
    process.start(webhook=True)
    try:
        yield process
    finally:
        process.stop()
        forget_webhook_configs(api_client, WEBHOOK_CONFIG)


def trainjob(name: str, nodes: Gpus, per_node: int, spec: str | None = FULL) -> dict[str, Any]:
    annotations = {POLICY_ANNOTATION: "Resize"}
    if spec is not None:
        annotations[SPEC_ANNOTATION] = spec
    on_the_tests_nodes = {"nodeSelector": nodes.selector}
    return {
        "apiVersion": trainer.API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 1, "resourcesPerNode": {"limits": {GPU: per_node}}},
            "runtimePatches": [{
                "manager": "vramgate.dev/tests",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node",
                    "template": {"spec": {"template": {"spec": on_the_tests_nodes}}},
                }]}}},
            }],
        },
    }  # fmt: skip


def stored(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(
        client.CustomObjectsApi(api).get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", name
        )
    )


def test_a_trainjob_asking_4_gpus_where_2_fit_now_is_created_asking_2(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    gpus.add([80, 80, 5, 5], held={0: [2, 3]})  # two GPUs held by pods outside vramgate
    body = json.dumps(trainjob("llama-full", gpus, per_node=4))
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=body)
    assert done.returncode == 0, done.stderr
    assert "Warning: vramgate: resized 4 -> 2 GPUs (policy Resize): 4 GPUs do not fit now; " \
        "needs 45.49 GiB per GPU on 2 GPUs with FSDP" in done.stderr  # fmt: skip
    assert f"spec.trainer.resourcesPerNode[{GPU}] 4 -> 2" in done.stderr
    obj = stored(api_client, namespace, "llama-full")
    assert obj["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 2}}
    assert obj["spec"]["trainer"]["numNodes"] == 1
    assert obj["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "4"
    # The manifest applied again (GitOps) asks for 4 again: spec.trainer is immutable, and
    # the count it was sized to is kept instead of the update being refused.
    again = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=body)
    assert again.returncode == 0, again.stderr
    assert "keeps the 2 it was sized to at create" in again.stderr
    kept = stored(api_client, namespace, "llama-full")
    assert kept["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 2}}


def test_a_trainjob_without_the_annotation_is_untouched_and_an_invalid_one_refused(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    gpus.add([80, 80])
    plain = json.dumps(trainjob("plain", gpus, per_node=4, spec=None))
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=plain)
    assert done.returncode == 0 and "vramgate" not in done.stderr, done.stderr
    obj = stored(api_client, namespace, "plain")
    assert obj["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 4}}
    assert REQUESTED_GPUS_ANNOTATION not in obj["metadata"]["annotations"]

    lora = "model: {preset: llama-3.1-8b}\nmethod: LoRA\nlora: {rank: 0}\n"
    invalid = json.dumps(trainjob("invalid", gpus, per_node=2, spec=lora))
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=invalid)
    assert done.returncode != 0
    assert f'admission webhook "mutate-trainjob.{WEBHOOK_CONFIG}" denied the request' in done.stderr
    assert f"metadata.annotations[{SPEC_ANNOTATION}].lora.rank: must be greater than" in (
        done.stderr
    )
