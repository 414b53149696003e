"""build_workload: the objects that run an admitted job, pinned to its GPUs in each mode."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from controller.api.base import API_VERSION, GPU_RESOURCE, JOB_LABEL, JOB_UID_LABEL
from controller.api.names import MAX_WORKLOAD_NAME
from controller.base.errors import PermanentError
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import (
    Admission,
    WorkloadError,
    build_workload,
    job_label_value,
    workload_name,
    workload_problem,
)
from controller.workload.build import COMPLETION_INDEX_ANNOTATION

GIB = 2**30
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ALL_MODES = list(GpuMode)


def uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def admission(
    mode: GpuMode = GpuMode.DEVICE_PLUGIN,
    nodes: dict[str, list[int]] | None = None,
    **kwargs: Any,
) -> Admission:
    chosen = nodes if nodes is not None else {"node-a": [5, 2]}
    placement = tuple(
        NodeGpus(node, tuple(indices), tuple(uuid(node, i) for i in indices))
        for node, indices in chosen.items()
    )
    return Admission(nodes=placement, per_gpu_bytes=12 * GIB, mode=mode, **kwargs)


TWO_NODES = {"node-a": [1, 6], "node-b": [4, 3]}


def trainer(**fields: Any) -> dict[str, Any]:
    return {"name": "trainer", "image": "registry.invalid/train:1", **fields}


def finetunejob(name: str = "llama", **pod_spec: Any) -> dict[str, Any]:
    spec = {"containers": [trainer()], **pod_spec}
    return {
        "apiVersion": API_VERSION,
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "research", "uid": "uid-1234"},
        "spec": {"model": {"preset": "llama-3.1-8b"}, "template": {"spec": spec}},
    }


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(objects, "Job")["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value (or valueFrom); every name must appear once."""
    names = [var["name"] for var in container["env"]]
    assert len(names) == len(set(names)), names
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


def gpu_limits(container: dict[str, Any]) -> tuple[Any, Any]:
    resources = container.get("resources") or {}
    return (resources.get("limits") or {}).get(GPU_RESOURCE), (resources.get("requests") or {}).get(
        GPU_RESOURCE
    )


# -- every object ---------------------------------------------------------------------------


# visibleDevices is one node only (refused across nodes, below).
PLACEMENTS = [
    *[(mode, {"node-a": [5, 2]}) for mode in ALL_MODES],
    (GpuMode.DEVICE_PLUGIN, TWO_NODES),
    (GpuMode.DRA, TWO_NODES),
]


@pytest.mark.parametrize(("mode", "nodes"), PLACEMENTS)
def test_every_object_is_in_the_jobs_namespace_labelled_with_its_name_and_uid_and_owned_by_it(
    mode: GpuMode, nodes: dict[str, list[int]]
) -> None:
    objects = build_workload(finetunejob(), admission(mode, nodes))
    assert objects
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "research"
        # The uid too: `kubectl get job -l vramgate.dev/finetunejob-uid=<uid>` finds the Job.
        assert meta["labels"] == {JOB_LABEL: "llama", JOB_UID_LABEL: "uid-1234"}
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "vramgate.dev/v1alpha1",
                "kind": "FineTuneJob",
                "name": "llama",
                "uid": "uid-1234",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    # Created in this order: what the Job's pods reference exists before them.
    assert objects[-1]["kind"] == "Job" and objects[-1]["apiVersion"] == "batch/v1"
    template = objects[-1]["spec"]["template"]
    assert template["metadata"]["labels"][JOB_LABEL] == "llama"


def test_the_template_keeps_its_own_labels_and_annotations() -> None:
    job = finetunejob()
    job["spec"]["template"]["metadata"] = {"labels": {"team": "nlp"}, "annotations": {"a": "b"}}
    template = by_kind(build_workload(job, admission()), "Job")["spec"]["template"]
    assert template["metadata"] == {
        "labels": {"team": "nlp", JOB_LABEL: "llama", JOB_UID_LABEL: job["metadata"]["uid"]},
        "annotations": {"a": "b"},
    }


@pytest.mark.parametrize("mode", ALL_MODES)
def test_the_input_job_is_never_modified_nor_shared(mode: GpuMode) -> None:
    job = finetunejob(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                    ]
                }
            }
        },
        resourceClaims=[{"name": "scratch", "resourceClaimName": "scratch"}],
    )
    job["spec"]["template"]["spec"]["containers"] = [
        trainer(
            env=[{"name": "MASTER_PORT", "value": "1"}],
            resources={
                "limits": {GPU_RESOURCE: "1"},
                "requests": {GPU_RESOURCE: "1"},
                "claims": [{"name": "scratch"}],
            },
        ),
        {"name": "sidecar", "image": "s", "resources": {"limits": {GPU_RESOURCE: "1"}}},
    ]
    before = copy.deepcopy(job)
    nodes = TWO_NODES if mode is not GpuMode.VISIBLE_DEVICES else None
    objects = build_workload(job, admission(mode, nodes))
    assert job == before
    # Nothing in the output aliases the input: changing it leaves the job as it was.
    spec = pod_spec(objects)
    spec["containers"][0]["env"].clear()
    spec["containers"][0]["resources"].clear()
    spec["affinity"]["nodeAffinity"].clear()
    assert job == before


# -- the batch Job on one node --------------------------------------------------------------


def test_one_node_is_one_pod_with_torchruns_rendezvous_on_loopback() -> None:
    objects = build_workload(finetunejob(), admission(GpuMode.DEVICE_PLUGIN))
    assert [o["kind"] for o in objects] == ["Job"]
    job = objects[0]
    assert job["metadata"]["name"] == "llama"
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["completions"], spec["parallelism"]) == (0, 1, 1)
    assert "completionMode" not in spec
    env = env_of(spec["template"]["spec"]["containers"][0])
    assert (env["NNODES"], env["NODE_RANK"], env["MASTER_ADDR"]) == ("1", "0", "127.0.0.1")
    assert "subdomain" not in spec["template"]["spec"]


def test_the_placement_is_in_every_containers_environment() -> None:
    job = finetunejob()
    job["spec"]["template"]["spec"]["containers"].append({"name": "logger", "image": "l"})
    objects = build_workload(job, admission(GpuMode.DEVICE_PLUGIN, TWO_NODES, master_port=23456))
    for container in pod_spec(objects)["containers"]:
        env = env_of(container)
        assert env["VRAMGATE_GPUS"] == "4"
        assert env["VRAMGATE_GPUS_PER_NODE"] == env["NPROC_PER_NODE"] == "2"
        assert env["VRAMGATE_NODES"] == env["NNODES"] == "2"
        assert env["VRAMGATE_PER_GPU_BYTES"] == str(12 * GIB)
        # Node order, then GPU order as placed (not sorted).
        assert env["VRAMGATE_GPU_UUIDS"] == "GPU-node-a-1,GPU-node-a-6,GPU-node-b-4,GPU-node-b-3"
        assert env["MASTER_PORT"] == "23456"


def test_a_users_variable_of_the_same_name_is_replaced_and_the_others_kept() -> None:
    env = [
        {"name": "HF_HOME", "value": "/cache"},
        {"name": "MASTER_PORT", "value": "1"},
        {"name": "NNODES", "value": "9"},
    ]
    job = finetunejob(containers=[trainer(env=env)])
    container = pod_spec(build_workload(job, admission()))["containers"][0]
    values = env_of(container)
    assert (values["HF_HOME"], values["MASTER_PORT"], values["NNODES"]) == ("/cache", "29500", "1")
    assert container["env"][0] == {"name": "HF_HOME", "value": "/cache"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, "Never"), ("Always", "Never"), ("Never", "Never"), ("OnFailure", "OnFailure")],
)
def test_pods_restart_never_unless_the_template_says_on_failure(
    given: str | None, expected: str
) -> None:
    job = finetunejob(**({"restartPolicy": given} if given else {}))
    assert pod_spec(build_workload(job, admission()))["restartPolicy"] == expected


def test_a_crash_log_reaches_the_termination_message_unless_the_template_chose() -> None:
    containers = [trainer(), {"name": "sidecar", "image": "s", "terminationMessagePolicy": "File"}]
    spec = pod_spec(build_workload(finetunejob(containers=containers), admission()))
    policies = [c["terminationMessagePolicy"] for c in spec["containers"]]
    assert policies == ["FallbackToLogsOnError", "File"]


# -- pinned to the chosen nodes -------------------------------------------------------------


def _terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms: list[dict[str, Any]] = required["nodeSelectorTerms"]
    return terms


def _node_of(term: dict[str, Any]) -> str:
    (field,) = [f for f in term["matchFields"] if f["key"] == "metadata.name"]
    assert field["operator"] == "In"
    (node,) = field["values"]  # the API server allows one value for a field selector
    return str(node)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_template_without_affinity_is_pinned_to_the_chosen_node(mode: GpuMode) -> None:
    (term,) = _terms(pod_spec(build_workload(finetunejob(), admission(mode))))
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]
    }


def test_k_nodes_are_k_terms_each_naming_one_node() -> None:
    terms = _terms(pod_spec(build_workload(finetunejob(), admission(nodes=TWO_NODES))))
    assert sorted(_node_of(term) for term in terms) == ["node-a", "node-b"]


def test_the_templates_node_affinity_is_anded_with_the_chosen_nodes() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["z1"]}
    spot = {"key": "spot", "operator": "DoesNotExist"}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [spot]}}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [spot]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAffinity": {"x": 1},
    }
    spec = pod_spec(build_workload(finetunejob(affinity=affinity), admission(nodes=TWO_NODES)))
    terms = _terms(spec)
    # (zone OR spot) AND (node-a OR node-b): every pair, each term keeping its expressions.
    pairs = sorted((term["matchExpressions"][0]["key"], _node_of(term)) for term in terms)
    assert pairs == [("spot", "node-a"), ("spot", "node-b"), ("zone", "node-a"), ("zone", "node-b")]
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == (
        preferred
    )
    assert spec["affinity"]["podAffinity"] == {"x": 1}


def test_null_fields_of_a_yaml_template_count_as_empty() -> None:
    container = trainer(env=None, resources={"limits": None, "requests": None})
    job = finetunejob(containers=[container], affinity=None, initContainers=None)
    job["spec"]["template"]["metadata"] = None
    spec = pod_spec(build_workload(job, admission(GpuMode.DEVICE_PLUGIN, {"n": [0]})))
    assert gpu_limits(spec["containers"][0]) == ("1", "1")
    assert env_of(spec["containers"][0])["NNODES"] == "1"
    assert _node_of(_terms(spec)[0]) == "n"


def test_a_template_that_names_its_node_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"^spec\.template\.spec\.nodeName: must not be set"):
        build_workload(finetunejob(nodeName="node-z"), admission())


# -- devicePlugin ---------------------------------------------------------------------------


def test_device_plugin_asks_for_the_per_node_count_on_the_first_container() -> None:
    containers = [trainer(), {"name": "sidecar", "image": "s"}]
    spec = pod_spec(
        build_workload(
            finetunejob(containers=containers), admission(GpuMode.DEVICE_PLUGIN, TWO_NODES)
        )
    )
    assert gpu_limits(spec["containers"][0]) == ("2", None)
    assert gpu_limits(spec["containers"][1]) == (None, None)


def test_device_plugin_gives_the_gpus_to_the_container_that_asked_for_them() -> None:
    containers = [
        {"name": "prep", "image": "p", "resources": {"limits": {"cpu": "1"}}},
        trainer(
            resources={
                "limits": {GPU_RESOURCE: "1", "memory": "8Gi"},
                "requests": {GPU_RESOURCE: "1", "cpu": "4"},
            }
        ),
        {"name": "also", "image": "a", "resources": {"limits": {GPU_RESOURCE: "4"}}},
    ]
    init = [{"name": "fetch", "image": "f", "resources": {"limits": {GPU_RESOURCE: "8"}}}]
    job = finetunejob(containers=containers, initContainers=init)
    spec = pod_spec(build_workload(job, admission(GpuMode.DEVICE_PLUGIN, {"n": [0, 1, 2]})))
    prep, train, also = spec["containers"]
    assert gpu_limits(train) == ("3", "3")  # requests, when given, equal limits
    assert train["resources"]["limits"]["memory"] == "8Gi"
    assert train["resources"]["requests"]["cpu"] == "4"
    assert gpu_limits(prep) == gpu_limits(also) == (None, None)
    assert prep["resources"]["limits"] == {"cpu": "1"}
    # An init container's GPUs would raise the pod's request above the admitted count.
    assert gpu_limits(spec["initContainers"][0]) == (None, None)


def test_device_plugin_sets_no_visible_devices_and_no_claims() -> None:
    objects = build_workload(finetunejob(), admission(GpuMode.DEVICE_PLUGIN))
    spec = pod_spec(objects)
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(spec["containers"][0])
    assert "resourceClaims" not in spec and "claims" not in spec["containers"][0]["resources"]


# -- visibleDevices -------------------------------------------------------------------------


def test_visible_devices_names_the_chosen_uuids_in_placement_order_and_no_gpu_resource() -> None:
    containers = [
        trainer(
            resources={"limits": {GPU_RESOURCE: "2"}, "requests": {GPU_RESOURCE: "2"}},
            env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
        ),
        {"name": "sidecar", "image": "s", "resources": {"limits": {GPU_RESOURCE: "1"}}},
    ]
    objects = build_workload(
        finetunejob(containers=containers), admission(GpuMode.VISIBLE_DEVICES, {"node-a": [5, 2]})
    )
    assert [o["kind"] for o in objects] == ["Job"]
    spec = pod_spec(objects)
    env = env_of(spec["containers"][0])
    chosen = "GPU-node-a-5,GPU-node-a-2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == chosen
    for container in spec["containers"]:
        assert gpu_limits(container) == (None, None)


def test_visible_devices_across_nodes_is_refused() -> None:
    refused = r"^status\.placement\.nodes: .*visibleDevices pins GPUs on one node only, got 2"
    with pytest.raises(WorkloadError, match=refused):
        build_workload(finetunejob(), admission(GpuMode.VISIBLE_DEVICES, TWO_NODES))


@pytest.mark.parametrize("mode", [GpuMode.VISIBLE_DEVICES, GpuMode.DRA])
def test_modes_that_select_by_uuid_need_every_uuid(mode: GpuMode) -> None:
    placement = Admission((NodeGpus("node-a", (0, 1), ("GPU-0", "")),), GIB, mode)
    with pytest.raises(WorkloadError, match=r"^status\.placement\.nodes\[0\]\.gpuUUIDs: "):
        build_workload(finetunejob(), placement)


def test_device_plugin_does_not_need_uuids() -> None:
    placement = Admission((NodeGpus("node-a", (0, 1), ()),), GIB, GpuMode.DEVICE_PLUGIN)
    spec = pod_spec(build_workload(finetunejob(), placement))
    assert gpu_limits(spec["containers"][0]) == ("2", None)


# -- dra ------------------------------------------------------------------------------------


def _request(claim_spec: dict[str, Any]) -> dict[str, Any]:
    (request,) = claim_spec["devices"]["requests"]
    assert request["name"] == "gpus"
    exactly: dict[str, Any] = request["exactly"]
    return exactly


def test_dra_on_one_node_is_a_claim_for_exactly_the_chosen_gpus() -> None:
    job = finetunejob(containers=[trainer(resources={"limits": {GPU_RESOURCE: "2"}})])
    objects = build_workload(job, admission(GpuMode.DRA, {"node-a": [5, 2]}))
    assert [o["kind"] for o in objects] == ["ResourceClaim", "Job"]
    claim = objects[0]
    assert claim["apiVersion"] == "resource.k8s.io/v1"
    assert claim["metadata"]["name"] == "llama-gpus"
    request = _request(claim["spec"])
    assert request == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [
            {
                "cel": {
                    "expression": 'device.attributes["gpu.nvidia.com"].uuid in '
                    '["GPU-node-a-5", "GPU-node-a-2"]'
                }
            }
        ],
    }
    spec = pod_spec(objects)
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "llama-gpus"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
    assert gpu_limits(spec["containers"][0]) == (None, None)


def test_dra_across_nodes_is_a_claim_template_for_the_per_node_count() -> None:
    objects = build_workload(finetunejob(), admission(GpuMode.DRA, TWO_NODES))
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Service", "Job"]
    template = objects[0]
    assert template["metadata"]["name"] == "llama-gpus"
    assert template["spec"]["metadata"]["labels"] == {JOB_LABEL: "llama", JOB_UID_LABEL: "uid-1234"}
    request = _request(template["spec"]["spec"])
    assert request["count"] == 2
    (selector,) = request["selectors"]
    listed = re.findall(r'"(GPU-[^"]+)"', selector["cel"]["expression"])
    assert listed == ["GPU-node-a-1", "GPU-node-a-6", "GPU-node-b-4", "GPU-node-b-3"]
    assert pod_spec(objects)["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "llama-gpus"}
    ]


def test_dra_uses_the_configured_device_class() -> None:
    objects = build_workload(finetunejob(), admission(GpuMode.DRA, device_class="h100.example"))
    assert _request(objects[0]["spec"])["deviceClassName"] == "h100.example"


def test_dra_replaces_a_claim_of_the_same_name_and_keeps_the_templates_others() -> None:
    claims = [
        {"name": "gpus", "resourceClaimName": "mine"},
        {"name": "nic", "resourceClaimName": "n"},
    ]
    container = trainer(resources={"claims": [{"name": "nic"}, {"name": "gpus"}]})
    job = finetunejob(containers=[container], resourceClaims=claims)
    spec = pod_spec(build_workload(job, admission(GpuMode.DRA)))
    assert spec["resourceClaims"] == [
        {"name": "nic", "resourceClaimName": "n"},
        {"name": "gpus", "resourceClaimName": "llama-gpus"},
    ]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "nic"}, {"name": "gpus"}]


def test_dra_gives_the_claim_to_the_gpu_container_only() -> None:
    containers = [
        {"name": "prep", "image": "p"},
        trainer(resources={"limits": {GPU_RESOURCE: "1"}}),
    ]
    spec = pod_spec(build_workload(finetunejob(containers=containers), admission(GpuMode.DRA)))
    assert "claims" not in (spec["containers"][0].get("resources") or {})
    assert spec["containers"][1]["resources"]["claims"] == [{"name": "gpus"}]


# -- across nodes ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [GpuMode.DEVICE_PLUGIN, GpuMode.DRA])
def test_k_nodes_are_an_indexed_job_with_a_headless_service_for_the_rendezvous(
    mode: GpuMode,
) -> None:
    objects = build_workload(
        finetunejob(hostname="fixed"), admission(mode, TWO_NODES, master_port=23456)
    )
    service = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "llama"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {JOB_LABEL: "llama"}
    assert [p["port"] for p in service["spec"]["ports"]] == [23456]
    assert objects.index(service) < objects.index(by_kind(objects, "Job"))

    job = by_kind(objects, "Job")
    assert job["metadata"]["name"] == "llama"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "llama"
    assert "hostname" not in pod  # the Job controller names pod i's host llama-i
    env = env_of(pod["containers"][0])
    assert env["MASTER_ADDR"] == "llama-0.llama"
    assert env["NNODES"] == "2"
    assert env["NODE_RANK"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
    }


def test_k_nodes_take_one_pod_per_node() -> None:
    own = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    affinity = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [own]}}
    spec = pod_spec(build_workload(finetunejob(affinity=affinity), admission(nodes=TWO_NODES)))
    anti = spec["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"] == [
        own,
        {
            "labelSelector": {"matchLabels": {JOB_LABEL: "llama"}},
            "topologyKey": "kubernetes.io/hostname",
        },
    ]


def test_one_node_has_no_anti_affinity() -> None:
    spec = pod_spec(build_workload(finetunejob(), admission()))
    assert "podAntiAffinity" not in spec["affinity"]


# -- names ----------------------------------------------------------------------------------


def test_a_name_that_qualifies_is_the_workloads_name() -> None:
    assert workload_name("llama-qlora") == "llama-qlora"
    assert workload_name("a" * MAX_WORKLOAD_NAME) == "a" * MAX_WORKLOAD_NAME


@pytest.mark.parametrize(
    "name",
    ["a" * 253, "a" * (MAX_WORKLOAD_NAME + 1), "7b-lora", "llama.3.1-8b", "9", "0.0-x"],
)
def test_other_names_become_short_dns_labels_of_a_prefix_and_a_hash(name: str) -> None:
    result = workload_name(name)
    assert DNS_1035.match(result), result
    assert len(result) <= MAX_WORKLOAD_NAME
    assert result == workload_name(name)
    assert result != name


def test_a_name_starting_with_a_digit_keeps_its_name_readable() -> None:
    result = workload_name("7b-lora")
    assert result.startswith("ftj-7b-lora-")


def test_long_names_with_a_common_prefix_get_different_workloads() -> None:
    first, second = "x" * 200 + "-one", "x" * 200 + "-two"
    assert workload_name(first) != workload_name(second)


def test_the_job_service_and_claim_use_the_workload_name_and_a_valid_label() -> None:
    name = "a" * 253
    objects = build_workload(finetunejob(name), admission(GpuMode.DRA, TWO_NODES))
    short = workload_name(name)
    assert {o["metadata"]["name"] for o in objects} == {short, f"{short}-gpus"}
    label = job_label_value(name)
    assert len(label) <= 63 and label == short
    labels = {JOB_LABEL: label, JOB_UID_LABEL: "uid-1234"}
    assert all(o["metadata"]["labels"] == labels for o in objects)
    assert all(o["metadata"]["ownerReferences"][0]["name"] == name for o in objects)
    assert env_of(pod_spec(objects)["containers"][0])["MASTER_ADDR"] == f"{short}-0.{short}"


def test_a_dotted_name_is_its_own_label_value() -> None:
    assert job_label_value("llama.3.1-8b") == "llama.3.1-8b"


# -- admission and errors -------------------------------------------------------------------


def test_admission_counts_its_gpus() -> None:
    placement = admission(nodes=TWO_NODES)
    assert (placement.gpus, placement.gpus_per_node) == (4, 2)


def test_errors_are_permanent_value_errors() -> None:
    assert issubclass(WorkloadError, PermanentError) and issubclass(WorkloadError, ValueError)


CONTAINERS_ERROR = r"^spec\.template\.spec\.containers: "


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {}},
        {"template": None},
        {"template": {}},
        {"template": {"spec": {}}},
        {"template": {"spec": {"containers": []}}},
    ],
    ids=["no-template", "null-template", "empty-template", "no-containers", "empty-containers"],
)
def test_a_job_without_containers_is_refused_naming_the_field(spec: dict[str, Any]) -> None:
    job = {"metadata": {"name": "j", "namespace": "n", "uid": "u"}, "spec": spec}
    with pytest.raises(WorkloadError, match=CONTAINERS_ERROR):
        build_workload(job, admission())


@pytest.mark.parametrize(
    ("pod_fields", "field"),
    [
        ({"containers": ["trainer"]}, r"spec\.template\.spec\.containers\[0\]: must be an object"),
        (
            {"containers": [trainer(env={"A": "1"})]},
            r"spec\.template\.spec\.containers\[0\]\.env: must be a list",
        ),
        (
            {"containers": [trainer(resources={"limits": [1]})]},
            r"spec\.template\.spec\.containers\[0\]\.resources\.limits: must be an object",
        ),
        ({"affinity": "near"}, r"spec\.template\.spec\.affinity: must be an object"),
    ],
)
def test_a_malformed_template_is_refused_naming_the_field(
    pod_fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(WorkloadError, match=f"^{field}"):
        build_workload(finetunejob(**pod_fields), admission())


def test_a_job_without_a_uid_cannot_own_its_workload() -> None:
    job = finetunejob()
    del job["metadata"]["uid"]
    with pytest.raises(WorkloadError, match=r"^metadata\.uid: must be set"):
        build_workload(job, admission())


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ((), "must list at least one node"),
        ((NodeGpus("a", (0,), ("G0",)), NodeGpus("a", (1,), ("G1",))), "must not repeat a node"),
        (
            (NodeGpus("a", (0, 1), ("G0", "G1")), NodeGpus("b", (2,), ("G2",))),
            "must hold the same number of GPUs.*got a: 2, b: 1",
        ),
        ((NodeGpus("a", (), ()),), "must hold the same number of GPUs \\(at least 1\\)"),
    ],
    ids=["none", "repeated", "uneven", "zero"],
)
def test_a_placement_torchrun_cannot_run_is_refused(
    nodes: tuple[NodeGpus, ...], message: str
) -> None:
    with pytest.raises(WorkloadError, match=rf"^status\.placement\.nodes: {message}"):
        build_workload(finetunejob(), Admission(nodes, GIB, GpuMode.DEVICE_PLUGIN))


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.parametrize(
    "container",
    [
        trainer(resources="x"),
        trainer(resources={"limits": 1}),
        trainer(env="PATH=/bin"),
    ],
    ids=["resources-string", "limits-number", "env-string"],
)
def test_a_template_field_of_the_wrong_type_is_a_workload_error(
    mode: GpuMode, container: dict[str, Any]
) -> None:
    """spec.template is kept as written; a wrong type anywhere must be this job's invalid
    spec (WorkloadError), not a TypeError that stops the operator's pass for every job."""
    job = finetunejob(containers=[container])
    with pytest.raises(WorkloadError, match=r"^spec\.template"):
        build_workload(job, admission(mode))
    assert (workload_problem(job, mode) or "").startswith("spec.template")


def test_an_odd_env_entry_is_left_for_the_api_server_to_judge() -> None:
    """A variable named by a list used to raise TypeError (unhashable) in the builder."""
    odd = {"name": ["a"], "value": "b"}
    job = finetunejob(containers=[trainer(env=[odd])])
    (batch,) = [o for o in build_workload(job, admission()) if o["kind"] == "Job"]
    assert odd in batch["spec"]["template"]["spec"]["containers"][0]["env"]


def test_no_template_or_an_empty_one_is_no_workload_problem() -> None:
    """The operator says NoTemplate (advice only) for both: neither is invalid."""
    job = finetunejob()
    for template in (None, {}):
        assert workload_problem({**job, "spec": {**job["spec"], "template": template}},
                                GpuMode.DEVICE_PLUGIN) is None  # fmt: skip
    assert workload_problem(job, GpuMode.DEVICE_PLUGIN) is None
