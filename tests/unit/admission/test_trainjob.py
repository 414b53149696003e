"""TrainJobs sized at create (`controller.admission.trainjob`): the annotation read as the
Kueue check reads it, numNodes x GPUs per node, and the patch, warning or refusal.

Reference (calibrated): llama-3.1-8b Full needs 86.09 GiB on one GPU, 45.49 GiB per GPU on 2
with FSDP, 23.76 GiB on 4: on 80 GiB GPUs it needs at least 2.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from controller.admission.kueue import SPEC_ANNOTATION, read_spec
from controller.admission.trainer_runtime import slim
from controller.admission.trainjob import (
    POLICY_ANNOTATION,
    Counted,
    Sizing,
    pod_constraints,
    restore,
    size,
)
from controller.api.base import REQUESTED_GPUS_ANNOTATION
from controller.estimator import Parallelism
from controller.jobs.spec import estimate_plan
from controller.packing.inventory import NodeGpus, PackingSettings
from controller.packing.placement import shapes
from controller.packing.view import ClusterView
from tests.unit.builders.packing import node, view

FULL = {"model": {"preset": "llama-3.1-8b"}, "method": "Full"}
QLORA = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}
GPU = "nvidia.com/gpu"
DEVICE_PLUGIN = PackingSettings()  # a TrainJob's GPUs are its pods' nvidia.com/gpu


def trainjob(
    nodes: int | None = 1,
    per_node: Any = 4,
    policy: str | None = "Resize",
    spec: Any = None,
    parts: tuple[str, ...] = ("limits",),
    **trainer: Any,
) -> dict[str, Any]:
    raw = spec if isinstance(spec, str) else yaml.safe_dump(FULL if spec is None else spec)
    annotations = {SPEC_ANNOTATION: raw}
    if policy is not None:
        annotations[POLICY_ANNOTATION] = policy
    shape: dict[str, Any] = {"resourcesPerNode": {part: {GPU: per_node} for part in parts}}
    if nodes is not None:
        shape["numNodes"] = nodes
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "llama", "namespace": "ml", "annotations": annotations},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {**shape, **trainer}},
    }


def cluster(*frees: list[float], allocated: int = 0, **labels: str) -> ClusterView:
    """One node per list of free GiB (80 GiB GPUs); `allocated` GPUs of the first given to
    other pods (the device plugin hands them to no one else)."""
    return view(
        *(
            node(f"n{i}", free, labels=labels, gpu_allocatable=len(free),
                 gpu_allocated=allocated if i == 0 else 0)
            for i, free in enumerate(frees)
        ),
        settings=DEVICE_PLUGIN,
    )  # fmt: skip


def open_gpus(*counts: int) -> ClusterView:
    """One node of four 80 GiB GPUs per count, that many of them not given to other pods."""
    return view(
        *(node(f"n{i}", [80] * 4, gpu_allocatable=4, gpu_allocated=4 - c)
          for i, c in enumerate(counts)),
        settings=DEVICE_PLUGIN,
    )  # fmt: skip


def applied(obj: dict[str, Any], sizing: Sizing) -> dict[str, Any]:
    """The TrainJob as the API server stores it after the patch."""
    return jsonpatch.apply_patch(obj, list(sizing.patch))


def uncounted(sizing: Sizing) -> Sizing:
    """The answer without where it counted (`Sizing.counted`, what the webhook holds)."""
    return replace(sizing, counted=None)


def asked(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["trainer"]["resourcesPerNode"]


def test_the_annotation_is_read_by_the_kueue_checks_reader_into_a_copy_of_the_callers() -> None:
    """One reader (cached per text) for a podSet's annotation and a TrainJob's: what one
    caller changes in its copy, the next read does not see."""
    text = "model: {preset: llama-3.1-8b}\nmethod: Full\n"
    first, problem = read_spec(text)
    assert problem is None
    first["model"]["preset"] = "changed"
    assert read_spec(text) == (FULL, None)


def test_a_4_gpu_trainjob_is_sized_to_2_when_only_2_fit_now() -> None:
    """Two of the node's four GPUs are another pod's: 4 do not fit now, 2 do (45.49 GiB each)."""
    obj = trainjob()
    sizing = size(obj, cluster([80, 80, 80, 80], allocated=2))
    assert sizing.refusal is None and sizing.gpus == 2
    stored = applied(obj, sizing)
    assert asked(stored) == {"limits": {GPU: 2}}
    assert stored["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "4"
    assert stored["spec"]["trainer"]["numNodes"] == 1
    (warning,) = sizing.warnings
    assert warning.startswith(
        "vramgate: resized 4 -> 2 GPUs (policy Resize): 4 GPUs do not fit now;"
    )
    assert "needs 45.49 GiB per GPU on 2 GPUs with FSDP; placed on n0" in warning
    assert warning.endswith(f"spec.trainer.resourcesPerNode[{GPU}] 4 -> 2")


def test_a_count_no_node_has_is_sized_to_one_that_does() -> None:
    """One pod takes all its GPUs on one node: 4 on a cluster of 2-GPU nodes never fit."""
    obj = trainjob(per_node="4", parts=("limits", "requests"))
    sizing = size(obj, cluster([80, 80], [80, 80]))
    assert asked(applied(obj, sizing)) == {"limits": {GPU: "2"}, "requests": {GPU: "2"}}
    assert "4 GPUs can never fit this cluster" in sizing.warnings[0]


def test_a_trainjob_without_either_annotation_passes_untouched() -> None:
    """Opt in: vramgate.dev/finetune, or vramgate.dev/admission-policy alone (its runtime
    then says its training); a TrainJob with neither is none of vramgate's business."""
    obj = trainjob()
    del obj["metadata"]["annotations"][SPEC_ANNOTATION]
    only_policy = size(obj, cluster([80, 80], allocated=2))
    assert only_policy.warnings[0].startswith("vramgate: not sized: no model")
    del obj["metadata"]["annotations"][POLICY_ANNOTATION]
    assert size(obj, cluster([80, 80], allocated=2)) == Sizing()
    obj["metadata"].pop("annotations")
    assert size(obj, None) == Sizing()


def test_a_count_that_fits_now_is_left_as_it_is_and_says_where_it_counted() -> None:
    sizing = size(trainjob(per_node=2), cluster([80, 80, 80, 80]))
    assert uncounted(sizing) == Sizing(gpus=2)
    # What the webhook holds for it: the GPUs it fits on now, at its per-GPU figure.
    assert sizing.counted == Counted((NodeGpus("n0", (0, 1), ("n0-0", "n0-1")),), 48841659274)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        (trainjob(spec="model: [unclosed"),
         f"metadata.annotations[{SPEC_ANNOTATION}]: must be YAML"),
        (trainjob(spec={**FULL, "resources": {"gpus": 2}}),
         "resources may set only minGPUs and maxGPUs here"),
        (trainjob(spec={**FULL, "template": {}}), "the TrainJob's spec.trainer's"),
        (trainjob(spec={**FULL, "method": "Partial"}),
         f"metadata.annotations[{SPEC_ANNOTATION}].method: unsupported value 'Partial'"),
        (trainjob(spec={**QLORA, "lora": {"rank": 0}}),
         f"metadata.annotations[{SPEC_ANNOTATION}].lora.rank: must be greater than or equal"),
        (trainjob(spec={**FULL, "resources": {"maxGPUs": 2}}),
         f"spec.trainer (numNodes x spec.trainer.resourcesPerNode[{GPU}]): must be between "
         "minGPUs (1) and maxGPUs (2), got 4"),
        (trainjob(policy="resize"),
         f"metadata.annotations[{POLICY_ANNOTATION}]: unsupported value 'resize'; allowed: "
         "Enforce, Resize"),
    ],
    ids=["not-yaml", "gpus-in-annotation", "template-in-annotation", "method", "lora-rank",
         "outside-its-bounds", "policy"],
)  # fmt: skip
def test_an_invalid_annotation_is_refused_naming_the_field(obj: dict[str, Any], field: str) -> None:
    """As the FineTuneJob validating webhook refuses an invalid spec, and the Kueue check
    rejects the annotation: the trainer cannot change once the TrainJob exists."""
    sizing = size(obj, cluster([80, 80, 80, 80]))
    assert sizing.refusal is not None and sizing.refusal.startswith("vramgate: ")
    assert field in sizing.refusal
    assert not sizing.patch and sizing.gpus is None


def test_a_trainjob_that_never_fits_is_refused_with_the_numbers() -> None:
    """Full needs at least 2 GPUs of 80 GiB, and each node has 1."""
    sizing = size(trainjob(per_node=1), cluster([80], [80]))
    assert sizing.refusal is not None and not sizing.patch
    assert sizing.refusal.startswith(
        "vramgate: InsufficientVRAM: no count in [1, 2] fits even when the cluster is empty: it "
        "needs 86.09 GiB per GPU on 1 GPU"
    )
    assert sizing.refusal.endswith(
        "a TrainJob of one node runs one pod, and the matching nodes have at most 1 GPU each"
    )
    enforced = size(trainjob(per_node=4, policy=None), cluster([80, 80]))
    assert enforced.refusal is not None and "InsufficientGPUs" in enforced.refusal


def test_enforce_changes_nothing_and_warns_when_it_does_not_fit_now() -> None:
    sizing = size(trainjob(policy="Enforce"), cluster([80, 80, 80, 80], allocated=2))
    assert sizing.patch == () and sizing.refusal is None
    (warning,) = sizing.warnings
    assert warning.startswith("vramgate: does not fit now (policy Enforce): needs 23.76 GiB")
    assert uncounted(size(trainjob(policy=None), cluster([80, 80, 80, 80]))) == Sizing(gpus=4)


def test_resize_keeps_a_count_that_fits_the_empty_cluster_when_none_fits_now() -> None:
    """Every GPU is another pod's now: no count fits, and 4 can once they are free."""
    sizing = size(trainjob(), cluster([80, 80, 80, 80], allocated=4))
    assert sizing.patch == () and sizing.gpus == 4
    assert sizing.warnings[0].startswith("vramgate: does not fit now (policy Resize)")


def test_a_count_that_never_fits_goes_to_the_nearest_that_can_even_if_none_fits_now() -> None:
    obj = trainjob(per_node=8)
    sizing = size(obj, cluster([80, 80, 80, 80], allocated=4))
    assert asked(applied(obj, sizing)) == {"limits": {GPU: 4}}
    assert sizing.warnings[0] == (
        "vramgate: 8 GPUs can never fit this cluster; the nearest count that can is 4 "
        f"(23.76 GiB each with FSDP), and none fits now: spec.trainer.resourcesPerNode[{GPU}] "
        "8 -> 4"
    )


def test_the_bounds_of_the_annotation_limit_the_resize() -> None:
    """minGPUs 4: 2 would fit now, but the job may not run on fewer than 4."""
    obj = trainjob(spec={**FULL, "resources": {"minGPUs": 4}})
    sizing = size(obj, cluster([80, 80, 80, 80], allocated=2))
    assert sizing.patch == () and "does not fit now" in sizing.warnings[0]


def test_a_trainjob_of_several_nodes_is_resized_keeping_its_nodes_and_whole_pods() -> None:
    """3 nodes x 4 GPUs (QLoRA, small) on three 4-GPU nodes whose GPUs 2 and 3 are other
    pods': 12 does not fit now, nor do 11 to 7 (no whole pods of 11 / 3, 10 / 3 ..., and
    9 = 3 x 3 has no node with 3 open GPUs), 6 = 3 pods of 2 does, one on each node."""
    obj = trainjob(nodes=3, per_node=4, spec=QLORA, numProcPerNode=4)
    sizing = size(obj, open_gpus(2, 2, 2))
    assert sizing.refusal is None and sizing.gpus == 6
    stored = applied(obj, sizing)
    assert stored["spec"]["trainer"]["numNodes"] == 3
    assert asked(stored) == {"limits": {GPU: 2}}
    assert stored["spec"]["trainer"]["numProcPerNode"] == 2
    assert stored["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "12"
    (warning,) = sizing.warnings
    assert warning.startswith("vramgate: resized 12 -> 6 GPUs (policy Resize): 12 GPUs do not")
    assert warning.endswith(f"spec.trainer.resourcesPerNode[{GPU}] 4 -> 2 on each of 3 nodes, "
                            "numProcPerNode 4 -> 2")  # fmt: skip
    assert sizing.counted is not None
    assert [len(part.indices) for part in sizing.counted.placement] == [2, 2, 2]


def test_the_packers_fewest_nodes_layout_that_splits_a_pod_is_not_the_only_one_tried() -> None:
    """3 nodes x 2 GPUs on nodes with 3, 3 and 2 open GPUs: the packer's fewest-nodes
    layout of 6 GPUs is 2 nodes x 3, which splits a pod; asked for whole pods it finds 3 x 2
    (before, the TrainJob was told it does not fit now)."""
    obj = trainjob(nodes=3, per_node=2, spec=QLORA, policy="Enforce")
    sizing = size(obj, open_gpus(3, 3, 2))
    assert uncounted(sizing) == Sizing(gpus=6)
    assert sizing.counted is not None
    placed = {part.node: len(part.indices) for part in sizing.counted.placement}
    assert placed == {"n0": 2, "n1": 2, "n2": 2}


def test_shapes_of_whole_pods() -> None:
    """The packer's shapes for n GPUs as `pods` equal pods: whole pods on every node."""
    assert list(shapes(12, 8, Parallelism.FSDP, pods=3)) == [(3, 4)]
    assert list(shapes(12, 12, Parallelism.FSDP, pods=3)) == [(1, 12), (3, 4)]
    assert list(shapes(8, 8, Parallelism.DDP, pods=2)) == [(1, 8), (2, 4)]
    assert list(shapes(6, 8, Parallelism.FSDP, pods=4)) == []  # 4 does not divide 6
    assert list(shapes(6, 8, Parallelism.FSDP)) == [(1, 6), (2, 3), (3, 2), (6, 1)]


def test_a_device_map_over_several_nodes_is_not_sized() -> None:
    obj = trainjob(nodes=2, per_node=1, spec={**FULL, "parallelism": "DeviceMap"})
    sizing = size(obj, cluster([80], [80]))
    assert sizing.patch == () and sizing.refusal is None
    assert sizing.warnings[0].startswith("vramgate: not sized: parallelism DeviceMap")


def test_a_refusal_speaks_of_the_trainjobs_fields() -> None:
    sizing = size(trainjob(per_node=1, policy="Enforce"), cluster([80, 80]))
    assert sizing.refusal is not None
    assert "spec.resources.gpus" not in sizing.refusal
    assert "admissionPolicy" not in sizing.refusal
    assert f"{POLICY_ANNOTATION}: Resize" in sizing.refusal


def test_a_trainjob_whose_pods_no_node_can_hold_is_refused() -> None:
    """2 nodes x 2 GPUs asked on 4 one-GPU nodes: 4 GPUs fit by memory, but no node ever
    holds a pod's 2 (nor one of any count that 2 divides): refused, saying so."""
    obj = trainjob(nodes=2, per_node=2, spec=QLORA, policy="Enforce")
    sizing = size(obj, cluster([80], [80], [80], [80]))
    assert sizing.patch == ()
    assert sizing.refusal == (
        "vramgate: InsufficientGPUs: needs 2 pods of 2 GPUs, each pod on one node "
        f"(spec.trainer.numNodes x spec.trainer.resourcesPerNode[{GPU}]); the matching nodes "
        "have at most 1 GPU each, so no such placement exists"
    )


def test_a_trainjob_whose_pods_fit_only_unevenly_is_refused_saying_so() -> None:
    """3 nodes x 2 GPUs on two 4-GPU nodes: 2 pods on one node and 1 on the other would
    fit, but vramgate places the same number of pods on every node: refused, and the message
    does not say that no node holds a pod (each holds two)."""
    obj = trainjob(nodes=3, per_node=2, spec=QLORA, policy="Enforce")
    sizing = size(obj, cluster([80] * 4, [80] * 4))
    assert sizing.refusal == (
        "vramgate: InsufficientGPUs: no layout of whole pods with the same number of pods on "
        "every node exists: needs 3 pods of 2 GPUs, each pod on one node "
        f"(spec.trainer.numNodes x spec.trainer.resourcesPerNode[{GPU}]), and the 8 matching "
        "GPUs are on nodes of at most 4 GPUs each; vramgate does not place a TrainJob's pods "
        "unevenly (more on one node than on another)"
    )


def test_a_trainjob_asking_more_gpus_than_the_cluster_has_is_told_the_count() -> None:
    """4 nodes x 2 GPUs on three 2-GPU nodes: each node holds a pod, but the cluster has 6
    GPUs, not 8: the decision's own numbers."""
    obj = trainjob(nodes=4, per_node=2, spec=QLORA, policy="Enforce")
    sizing = size(obj, cluster([80, 80], [80, 80], [80, 80]))
    assert sizing.refusal is not None
    assert sizing.refusal.startswith(
        "vramgate: InsufficientGPUs: requests 8 GPUs; the cluster has 6 matching GPUs"
    )
    assert "no such placement" not in sizing.refusal


def test_numprocpernode_other_than_the_gpus_is_left_alone() -> None:
    obj = trainjob(per_node=4, numProcPerNode=1)
    sizing = size(obj, cluster([80, 80, 80, 80], allocated=2))
    assert applied(obj, sizing)["spec"]["trainer"]["numProcPerNode"] == 1


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (trainjob(nodes=None), "spec.trainer.numNodes is not set"),
        (trainjob(parts=()), f"spec.trainer.resourcesPerNode[{GPU}] is not set"),
        (trainjob(per_node="500m"), "must be one whole number of at least 1, got limits 500m"),
        (trainjob(spec={"model": {"configMapRef": {"name": "cfg"}}, "method": "Full"}),
         "a model in a ConfigMap is read by the operator only"),
        (trainjob(spec={**FULL, "estimator": {"profile": "Trace"}}), "profile Trace"),
    ],
    ids=["numnodes-from-the-runtime", "gpus-from-the-runtime", "fraction", "configmap", "trace"],
)  # fmt: skip
def test_what_cannot_be_sized_here_is_allowed_with_a_warning(obj: dict[str, Any], why: str) -> None:
    sizing = size(obj, cluster([80, 80, 80, 80], allocated=2))
    assert sizing.refusal is None and sizing.patch == ()
    (warning,) = sizing.warnings
    assert warning.startswith("vramgate: not sized: ") and why in warning


def test_before_the_operator_has_seen_a_gpu_nothing_is_sized() -> None:
    for seen in (None, cluster()):
        sizing = size(trainjob(), seen)
        assert sizing.patch == () and sizing.refusal is None
        assert sizing.warnings[0].startswith("vramgate: not sized: the operator has")


def test_its_runtime_patches_choose_the_nodes_of_its_trainer_pods() -> None:
    """The nodeSelector and tolerations the TrainJob's runtimePatches give the trainer's
    replicated job (`node`): the 4 free GPUs elsewhere do not count."""
    obj = trainjob()
    pod = {"nodeSelector": {"pool": "a"}, "tolerations": [{"key": "x", "operator": "Exists"}]}
    other = {"nodeSelector": {"pool": "b"}}
    obj["spec"]["runtimePatches"] = [{"manager": "me", "trainingRuntimeSpec": {"template": {
        "spec": {"replicatedJobs": [
            {"name": "dataset-initializer", "template": {"spec": {"template": {"spec": other}}}},
            {"name": "node", "template": {"spec": {"template": {"spec": pod}}}},
        ]}}}}]  # fmt: skip
    constraints = pod_constraints(obj)
    assert constraints.node_selector == (("pool", "a"),) and len(constraints.tolerations) == 1
    nodes = view(
        node("a0", [80, 80], labels={"pool": "a"}),
        node("b0", [80, 80, 80, 80], labels={"pool": "b"}),
        settings=DEVICE_PLUGIN,
    )
    assert size(obj, nodes).gpus == 2
    assert pod_constraints(trainjob()).node_selector == ()


def test_its_manifest_applied_again_keeps_the_count_it_was_sized_to() -> None:
    obj = trainjob(per_node=4, numProcPerNode=4)
    stored = applied(obj, size(obj, cluster([80, 80, 80, 80], allocated=2)))
    assert stored["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 2}}
    found = restore(stored, obj)  # the manifest, asking for 4 again
    kept = applied(obj, found)
    assert kept["spec"]["trainer"] == stored["spec"]["trainer"]
    assert kept["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "4"
    assert "keeps the 2 it was sized to at create" in found.warnings[0]


def test_an_update_that_changes_more_than_the_count_is_left_to_the_api_server() -> None:
    obj = trainjob(per_node=4)
    stored = applied(obj, size(obj, cluster([80, 80, 80, 80], allocated=2)))
    other = trainjob(nodes=2, per_node=2)  # 4 GPUs again, in another shape
    assert restore(stored, other) == Sizing()
    assert restore(stored, trainjob(per_node=3)) == Sizing()  # not the count asked
    assert restore(obj, obj) == Sizing()  # never resized: nothing to keep


# -- the runtime: what a TrainJob leaves to it (controller.admission.trainer_runtime) --------

RUNTIME = yaml.safe_load(
    (Path(__file__).parent / "data" / "torchtune_llama3_2_1b.yaml").read_text()
)  # 1 node x 2 GPUs, hf://meta-llama/Llama-3.2-1B-Instruct, torchtune llama3_2/1B_full


def named(policy: str = "Resize", spec: Any = None, **fields: Any) -> dict[str, Any]:
    """A TrainJob that names the built-in runtime and leaves it the rest."""
    annotations = {POLICY_ANNOTATION: policy}
    if spec is not None:
        annotations[SPEC_ANNOTATION] = yaml.safe_dump(spec)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tune", "namespace": "ml", "annotations": annotations},
        "spec": {"runtimeRef": {"name": "torchtune-llama3.2-1b"}, **fields},
    }


def test_a_trainjob_naming_only_its_runtime_is_sized_from_it_and_the_patch_says_its_trainer() -> (
    None
):
    """Llama 3.2 1B Full needs 14.49 GiB on 1 GPU: the runtime's 2 do not fit where one of the
    node's two GPUs is another pod's; the patch writes numNodes and resourcesPerNode, which
    the TrainJob left to its runtime."""
    obj = named()
    sizing = size(obj, cluster([80, 80], allocated=1), runtime=RUNTIME)
    assert sizing.refusal is None and sizing.gpus == 1
    stored = applied(obj, sizing)
    assert stored["spec"]["trainer"] == {"numNodes": 1, "resourcesPerNode": {"limits": {GPU: 1}}}
    assert stored["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "2"
    told, resized = sizing.warnings
    assert told.startswith(
        "vramgate: read from the TrainJob and its runtime (ClusterTrainingRuntime "
        "torchtune-llama3.2-1b): model llama-3.2-1b from hf://meta-llama/Llama-3.2-1B-Instruct"
    )
    assert "method Full (torchtune config llama3_2/1B_full)" in told
    assert "1 node(s) x 2 GPUs (the runtime's trainer)" in told
    assert told.endswith(f"{SPEC_ANNOTATION} overrides any of them")
    assert "needs 14.49 GiB per GPU on 1 GPU with FSDP" in resized
    assert resized.endswith("(set from its runtime's trainer resources), numNodes 1 (set from "
                            "its runtime's)")  # fmt: skip
    assert uncounted(size(obj, cluster([80, 80]), runtime=RUNTIME)) == Sizing(gpus=2)  # silent


def test_the_runtimes_other_resources_are_kept_in_the_resources_per_node_written() -> None:
    """A TrainJob's resourcesPerNode replaces its runtime container's whole (Trainer's
    trainingruntime.go): the CPU and memory the runtime asks for go with the GPUs."""
    runtime = copy.deepcopy(RUNTIME)
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][2]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {GPU: "2", "memory": "64Gi"}, "requests": {"cpu": "8", GPU: "2"}
    }  # fmt: skip
    obj = named(trainer={"numNodes": 1, "args": ["batch_size=2"]})
    sizing = size(obj, cluster([80, 80], allocated=1), runtime=runtime)
    trainer = applied(obj, sizing)["spec"]["trainer"]
    assert trainer == {
        "numNodes": 1,
        "args": ["batch_size=2"],
        "resourcesPerNode": {"limits": {GPU: "1", "memory": "64Gi"},
                             "requests": {"cpu": "8", GPU: "1"}},
    }  # fmt: skip
    assert sizing.patch[0]["path"] == "/spec/trainer/resourcesPerNode"


def test_the_annotation_wins_over_the_runtime_field_by_field() -> None:
    """The annotation's model (8B: 45.49 GiB per GPU on 2, 86.09 on 1) is estimated on the
    runtime's 2 GPUs; its training fields merge over the torchtune overrides read."""
    obj = named(spec={"model": {"preset": "llama-3.1-8b"}, "training": {"sequenceLength": 512}},
                trainer={"command": ["tune", "run"], "args": ["batch_size=4"]})  # fmt: skip
    seen: list[Any] = []

    def estimator(plan: Any) -> Any:
        seen.append(plan)
        return estimate_plan(plan)

    sizing = size(obj, cluster([80, 80], allocated=1), estimator, runtime=RUNTIME)
    (plan,) = seen
    assert (plan.settings.batch, plan.settings.seq_len, plan.model) == (4, 512, "llama-3.1-8b")
    assert sizing.patch == () and sizing.gpus == 2  # 1 GPU can never hold it: kept, warned
    assert "needs 45.49 GiB per GPU on 2 GPUs" in sizing.warnings[-1]
    assert "model llama-3.2-1b" not in sizing.warnings[0]
    assert "method Full (torchtune config chosen by Trainer" in sizing.warnings[0]


@pytest.mark.parametrize(
    ("obj", "runtime", "why"),
    [
        (named(), None, "its runtime ClusterTrainingRuntime torchtune-llama3.2-1b is not in the "
                        "operator's cache"),
        (named(trainer={"command": ["tune", "run"], "args": ["model.lora_attn_modules=[q_proj]"]}),
         RUNTIME, "method LoRA read from its torchtune config, but no LoRA rank: add "
                  "model.lora_rank=<r>"),
        (named(trainer={"args": ["tokenizer.max_seq_len=99999999"]}), RUNTIME,
         "training.sequenceLength (read from the TrainJob and its runtime): must be"),
        (named(initializer={"model": {"storageUri": "hf://someone/Private-7B"}}), RUNTIME,
         "is no bundled preset"),
    ],
    ids=["runtime-not-cached", "lora-without-rank", "read-setting-out-of-range", "unknown-model"],
)  # fmt: skip
def test_what_the_runtime_cannot_tell_is_allowed_with_a_warning_never_refused(
    obj: dict[str, Any], runtime: Any, why: str
) -> None:
    sizing = size(obj, cluster([80, 80], allocated=1), runtime=runtime)
    assert sizing.refusal is None and sizing.patch == ()
    (warning,) = sizing.warnings
    assert warning.startswith("vramgate: not sized: ") and why in warning, warning


def test_a_trainjob_that_never_fits_on_what_its_runtime_says_is_refused_saying_so() -> None:
    obj = named(
        policy="Enforce", initializer={"model": {"storageUri": "hf://meta-llama/Llama-3.1-405B"}}
    )
    sizing = size(obj, cluster([80, 80]), runtime=RUNTIME)
    assert sizing.refusal is not None and sizing.refusal.startswith("vramgate: InsufficientVRAM")
    assert "(read from the TrainJob and its runtime (ClusterTrainingRuntime " in sizing.refusal
    assert "model llama-3.1-405b from hf://meta-llama/Llama-3.1-405B" in sizing.refusal


def _hostile_runtime(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """The built-in runtime with the value at `path` (keys and list indexes) replaced."""
    runtime = copy.deepcopy(RUNTIME)
    into: Any = runtime
    for key in path[:-1]:
        into = into[key]
    into[path[-1]] = value
    return runtime


_JOBS = ("spec", "template", "spec", "replicatedJobs")
_NODE_POD = (*_JOBS, 2, "template", "spec", "template", "spec")
_NODE = (*_NODE_POD, "containers", 0)


@pytest.mark.parametrize(
    ("obj", "runtime"),
    [
        (named(trainer={"command": ["tune", "run"],
                        "args": ["model.lora_attn_modules=[q_proj]", "model.lora_rank=8",
                                 "model.quantize_base=yes"]}), RUNTIME),
        (named(trainer={"command": 5}), RUNTIME),
        (named(trainer={"command": ["tune", "run"], "args": True}), RUNTIME),
        (named(trainer={"command": ["tune", 7]}), RUNTIME),
        (named(spec={"method": "LoRA", "lora": 5}), RUNTIME),
        (named(spec={"method": "LoRA", "lora": [1]}, trainer={"numNodes": 1}), None),
        (named(spec={"training": 3, "estimator": "x"}), RUNTIME),
        (named(trainer={"numNodes": "2"}), RUNTIME),
        (named(trainer={"numNodes": -1, "resourcesPerNode": {"limits": {GPU: -2}}}), RUNTIME),
        (named(trainer=[1, 2]), RUNTIME),
        (named(trainer={"resourcesPerNode": "lots"}), RUNTIME),
        (named(initializer={"model": {"storageUri": 5, "env": "STORAGE_URI"}}), RUNTIME),
        (named(initializer={"model": {"env": [{"name": "STORAGE_URI", "valueFrom": {}}]}}),
         RUNTIME),
        (named(runtimePatches=[{"trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
                "tolerations": "all", "affinity": [1], "nodeSelector": 5}}}}}]}}}}, 3, "x"]),
         RUNTIME),
        (named(), _hostile_runtime(("spec", "template"), [])),
        (named(), _hostile_runtime(("spec", "template", "spec"), "jobs")),
        (named(), _hostile_runtime(_JOBS, {"node": {}})),
        (named(), _hostile_runtime((*_JOBS, 2, "template"), 7)),
        (named(), _hostile_runtime((*_NODE_POD, "containers"), {"name": "node"})),
        (named(), _hostile_runtime((*_NODE_POD, "tolerations"), "all")),
        (named(), _hostile_runtime((*_NODE_POD, "affinity"), {"nodeAffinity": [1]})),
        (named(), _hostile_runtime((*_JOBS, 1, "template", "spec", "template", "spec",
                                    "containers", 0, "env"), {"STORAGE_URI": "x"})),
        (named(), _hostile_runtime((*_NODE, "resources"), ["limits"])),
        (named(), _hostile_runtime((*_NODE, "resources", "limits", GPU), "-2")),
        (named(), _hostile_runtime((*_NODE, "command"), "tune run")),
        (named(), _hostile_runtime(("spec", "mlPolicy"), {"numNodes": "two"})),
        (named(), _hostile_runtime(("spec", "mlPolicy"), {"numNodes": -3})),
        (named(), _hostile_runtime(("spec", "mlPolicy"), 5)),
        (named(), _hostile_runtime(("spec",), None)),
    ],
)  # fmt: skip
def test_hostile_shapes_get_an_answer_never_an_exception(obj: Any, runtime: Any) -> None:
    """A mutating webhook sees the object before its schema is checked, and a runtime is
    whatever was applied: every field may have any type. The answer is always one: allowed
    (with a warning where it could not be sized), or a one-line refusal of the annotation's
    own fields."""
    for cached in (runtime, None if runtime is None else slim(runtime)):
        sizing = size(obj, cluster([80, 80], allocated=1), runtime=cached)
        if sizing.refusal is not None:
            assert "\n" not in sizing.refusal
            assert sizing.refusal.startswith(f"vramgate: metadata.annotations[{SPEC_ANNOTATION}]")
        else:
            assert sizing.warnings or sizing.patch or sizing.gpus, sizing


@pytest.mark.parametrize(
    "trainer",
    [None, {}, {"args": ["batch_size=2"]}, {"numNodes": 1}],
    ids=["no-trainer", "empty-trainer", "trainer-without-them", "trainer-without-resources"],
)
def test_a_manifest_applied_again_keeps_the_trainer_written_from_its_runtime(
    trainer: dict[str, Any] | None,
) -> None:
    """The webhook wrote numNodes and resourcesPerNode from the runtime at create; the
    manifest, which never said them, applied again (a server-side apply drops them) gets
    them back rather than a refusal of the immutable spec.trainer."""
    obj = named() if trainer is None else named(trainer=trainer)
    stored = applied(obj, size(obj, cluster([80, 80], allocated=1), runtime=RUNTIME))
    assert stored["spec"]["trainer"]["resourcesPerNode"] == {"limits": {GPU: 1}}
    found = restore(stored, obj)
    kept = applied(obj, found)
    assert kept["spec"]["trainer"] == stored["spec"]["trainer"]
    assert kept["metadata"]["annotations"][REQUESTED_GPUS_ANNOTATION] == "2"
    assert "keeps the 1 it was sized to at create" in found.warnings[0]
    assert restore(stored, stored) == Sizing()  # nothing lacks, nothing changed
    other = copy.deepcopy(obj)
    other["spec"]["trainer"] = {**(trainer or {}), "args": ["batch_size=64"]}
    assert restore(stored, other) == Sizing()  # more than what was written: the API server's


def test_a_runtime_numnodes_that_cannot_be_read_is_named_as_the_runtimes() -> None:
    runtime = copy.deepcopy(RUNTIME)
    runtime["spec"]["mlPolicy"]["numNodes"] = 0
    (warning,) = size(named(), cluster([80, 80]), runtime=runtime).warnings
    assert warning == (
        "vramgate: not sized: its runtime's spec.mlPolicy.numNodes must be a whole number of "
        "at least 1, got 0"
    )
