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

from controller.admission import holds
from controller.admission.holds import HOLD_LABEL
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


def trainjob(
    name: str, nodes: Gpus, per_node: int, spec: str | None = FULL, policy: str | None = "Resize"
) -> dict[str, Any]:
    annotations = {} if policy is None else {POLICY_ANNOTATION: policy}
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


def test_trainjobs_created_back_to_back_are_not_sized_onto_the_same_gpus(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    """One node of four free 80 GiB GPUs: the first TrainJob asks 2 (45.49 GiB each), which
    fit, and are held; the second, created right after, asks 4, which the same free memory
    would fit too (23.76 GiB each), but 2 are the first's: it is resized to the other 2.
    Nothing runs either (no Trainer controller): only the hold tells the second."""
    gpus.add([80, 80, 80, 80])
    first = json.dumps(trainjob("first", gpus, per_node=2))
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=first)
    assert done.returncode == 0 and "vramgate" not in done.stderr, done.stderr
    second = json.dumps(trainjob("second", gpus, per_node=4))
    done = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=second)
    assert done.returncode == 0, done.stderr
    assert "Warning: vramgate: resized 4 -> 2 GPUs (policy Resize): 4 GPUs do not fit now" in (
        done.stderr
    )
    obj = stored(api_client, namespace, "second")
    assert obj["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 2}}
    assert obj["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "4"
    assert stored(api_client, namespace, "first")["spec"]["trainer"]["resourcesPerNode"] == {
        "limits": {GPU: 2}
    }  # fmt: skip


def test_a_trainjob_without_the_annotation_is_untouched_and_an_invalid_one_refused(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    gpus.add([80, 80])
    plain = json.dumps(trainjob("plain", gpus, per_node=4, spec=None, policy=None))
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=plain)
    assert done.returncode == 0 and "vramgate" not in done.stderr, done.stderr
    obj = stored(api_client, namespace, "plain")
    assert obj["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 4}}
    assert REQUESTED_GPUS_ANNOTATION not in (obj["metadata"].get("annotations") or {})

    lora = "model: {preset: llama-3.1-8b}\nmethod: LoRA\nlora: {rank: 0}\n"
    invalid = json.dumps(trainjob("invalid", gpus, per_node=2, spec=lora))
    done = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=invalid)
    assert done.returncode != 0
    assert f'admission webhook "mutate-trainjob.{WEBHOOK_CONFIG}" denied the request' in done.stderr
    assert f"metadata.annotations[{SPEC_ANNOTATION}].lora.rank: must be greater than" in (
        done.stderr
    )


def test_a_trainjob_naming_only_its_runtime_is_sized_from_it(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    """A ClusterTrainingRuntime in the shape of Trainer's built-in torchtune-llama3.2-1b (its
    model initializer's STORAGE_URI, `tune run ... --config llama3_2/1B_full`, 2 GPUs on 1
    node), placed on the test's nodes; a TrainJob naming it with only the Resize annotation
    is sized from it once the operator has cached it: one of the node's two GPUs is held,
    so it is created asking 1, written into the spec.trainer it left to its runtime."""
    gpus.add([80, 80], held={0: [1]})
    name = f"vramgate-tests-{namespace}"  # cluster-scoped: one per test namespace
    node = {"name": "node", "image": "trainer", "resources": {"limits": {GPU: 2}},
            "command": ["tune", "run", "full_finetune_distributed", "--config",
                        "llama3_2/1B_full", "output_dir=/workspace/output"]}  # fmt: skip
    model = {
        "name": "model-initializer",
        "image": "initializer",
        "env": [{"name": "STORAGE_URI", "value": "hf://meta-llama/Llama-3.2-1B-Instruct"}],
    }
    ancestor = "trainer.kubeflow.org/trainjob-ancestor-step"

    def job(job_name: str, step: str, container: dict[str, Any], **pod: Any) -> dict[str, Any]:
        return {"name": job_name, "template": {
            "metadata": {"labels": {ancestor: step}},
            "spec": {"template": {"spec": {"containers": [container], **pod}}}}}  # fmt: skip

    runtime = {
        "apiVersion": trainer.API_VERSION, "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {
            "replicatedJobs": [job("model-initializer", "model-initializer", model),
                               job("node", "trainer", node, nodeSelector=gpus.selector)]}}},
    }  # fmt: skip
    done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(runtime))
    assert done.returncode == 0, done.stderr
    try:
        body = {"apiVersion": trainer.API_VERSION, "kind": "TrainJob",
                "metadata": {"name": "tune", "annotations": {POLICY_ANNOTATION: "Resize"}},
                "spec": {"runtimeRef": {"name": name}}}  # fmt: skip
        created: list[str] = []

        def sized() -> bool:  # the operator's cache sees the runtime a moment after its create
            done = cluster.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(body))
            assert done.returncode == 0, done.stderr
            if "is not in the operator's cache" not in done.stderr:
                created.append(done.stderr)
                return True
            cluster.kubectl("delete", "trainjob", "tune", "-n", namespace, "--wait=true")
            return False

        wait_until(sized, timeout=DEADLINE_S, what="the runtime in the operator's cache")
        (said,) = created
        assert f"read from the TrainJob and its runtime (ClusterTrainingRuntime {name})" in said
        assert "model llama-3.2-1b from hf://meta-llama/Llama-3.2-1B-Instruct" in said
        assert "method Full (torchtune config llama3_2/1B_full)" in said
        assert "resized 2 -> 1 GPUs (policy Resize): 2 GPUs do not fit now" in said, said
        obj = stored(api_client, namespace, "tune")
        assert obj["spec"]["trainer"] == {"numNodes": 1, "resourcesPerNode": {"limits": {GPU: 1}}}
        assert obj["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "2"
    finally:
        cluster.kubectl("delete", "clustertrainingruntime", name, "--ignore-not-found")


def test_the_holds_of_deleted_trainjobs_end_and_a_generated_name_is_found(
    sizing: OperatorProcess, cluster: Cluster, namespace: str, gpus: Gpus,  # noqa: F811
    api_client: client.ApiClient,
) -> None:  # fmt: skip
    """Two TrainJobs take the node's four GPUs, one named, one with generateName; each is
    labelled with its hold's token. Deleted before any pod runs (no Trainer controller
    here), their holds end once the operator's listing by that label finds nothing (about
    `holds.CHECK_AFTER_S` after the create), long before their 600 s: four fit again."""
    gpus.add([80, 80, 80, 80])
    named_job = trainjob("named", gpus, per_node=2)
    generated = trainjob("", gpus, per_node=2)
    generated["metadata"] = {"generateName": "sweep-",
                             "annotations": generated["metadata"]["annotations"]}  # fmt: skip
    made = []
    for body in (named_job, generated):
        done = cluster.kubectl("create", "-n", namespace, "-o", "name", "-f", "-",
                               stdin=json.dumps(body))  # fmt: skip
        assert done.returncode == 0 and "vramgate" not in done.stderr, done.stderr
        made.append(done.stdout.strip().split("/")[-1])
    assert made[0] == "named" and made[1].startswith("sweep-")
    tokens = {stored(api_client, namespace, n)["metadata"]["labels"][HOLD_LABEL] for n in made}
    assert len(tokens) == 2

    def asking_four() -> str:
        body = json.dumps(trainjob("probe", gpus, per_node=4))
        done = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                               stdin=body)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert "does not fit now" in asking_four(), "the two holds take all four GPUs"
    done = cluster.kubectl("delete", "trainjob", *made, "-n", namespace, "--wait=true")
    assert done.returncode == 0, done.stderr
    wait_until(lambda: "vramgate" not in asking_four(),
               timeout=holds.CHECK_AFTER_S + DEADLINE_S, what="the holds to end")  # fmt: skip
    assert "TrainJob holds: their TrainJobs are not there" in sizing.log_since_start()
