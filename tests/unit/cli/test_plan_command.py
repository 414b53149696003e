"""`vramgate plan`: the built-in example, both cluster forms, and one-line errors."""

from __future__ import annotations

import copy
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.base.units import GIB
from controller.cli import main
from controller.cli import plan as plan_command
from controller.cli.plan import DRAFT_WITHOUT_TEMPLATE
from controller.estimator import Estimate, Parallelism, codec
from controller.estimator.presets import load_preset
from controller.jobs.spec import estimate_digest, needs_trace
from controller.operator.identity import estimate_identity, trace_libraries
from tests.unit.conftest import PYTHIA_69B

LLAMA_QLORA = {
    "apiVersion": "vramgate.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "qlora", "namespace": "team"},
    "spec": {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}},
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, *documents: Any) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def decisions(out: str) -> list[dict[str, Any]]:
    return list(json.loads(out)["decisions"])


def test_the_built_in_example_shows_all_four_decisions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--json")
    assert code == 0
    got = [(d["job"], d["decision"], d["reason"]) for d in decisions(out)]
    assert got == [
        ("research/llama-qlora", "Admit", "Fits"),
        ("research/llama-full", "Resize", "Resized"),
        ("research/qwen-72b-lora", "Queue", "WaitingForVRAM"),
        ("research/llama-405b-full", "Reject", "InsufficientVRAM"),
    ]
    admitted = decisions(out)[0]
    assert admitted["placement"] == [{"node": "l4-a", "gpus": [0], "uuids": ["l4-a-gpu0"]}]
    resized = decisions(out)[1]
    assert resized["requested_gpus"] == 1 and resized["admitted_gpus"] == 2
    assert decisions(out)[3]["placement"] == []
    assert [d["warnings"] for d in decisions(out)] == [[]] * 4, "each has its trainer's template"


def test_the_human_table_names_each_decision_and_its_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys)
    assert code == 0
    for word in ("Admit", "Resize", "Queue", "Reject", "so it waits for memory"):
        assert word in out


def test_a_compact_cluster_and_a_job_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(
        tmp_path,
        "cluster.yaml",
        {"nodes": [{"name": "a", "gpus": [{"memory": "24GiB", "free": "6GiB"}]}]},
    )
    jobs = write(tmp_path, "jobs.yaml", LLAMA_QLORA)
    code, out, _ = run(capsys, "--cluster", cluster, jobs, "--json")
    assert code == 0
    (decision,) = decisions(out)
    assert decision["decision"] == "Queue" and decision["reason"] == "WaitingForVRAM"
    assert "the best node's least free one has 6.00 GiB (a GPU 0)" in decision["message"]


@pytest.mark.parametrize("zero", ["0B", "0GiB", 0], ids=["0B", "0GiB", "bare-0"])
def test_a_full_gpu_has_zero_free(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, zero: str | int
) -> None:
    """Zero bytes in any unit, or none: unambiguous, unlike a bare 80."""
    node = {"name": "a", "gpus": [{"memory": "80GiB", "free": zero}, {"memory": "80GiB"}]}
    cluster = write(tmp_path, "c.yaml", {"nodes": [node]})
    jobs = write(tmp_path, "j.yaml", LLAMA_QLORA)
    code, out, _ = run(capsys, "--cluster", cluster, jobs, "--json", "--gpu-mode", "dra")
    assert code == 0 and decisions(out)[0]["placement"][0]["gpus"] == [1]


def test_a_compact_gpu_a_pod_holds_is_one_the_device_plugin_never_hands_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A full GPU free of pods may be the one the device plugin hands the job's pod; once
    `allocated: true` says a pod holds it, it is not."""
    full = {"memory": "80GiB", "free": "2GiB"}
    jobs = write(tmp_path, "j.yaml", LLAMA_QLORA)
    for allocated, decided in ((False, "Queue"), (True, "Admit")):
        gpu = dict(full, allocated=True) if allocated else full
        node = {"name": "a", "gpus": [gpu, {"memory": "80GiB"}]}
        cluster = write(tmp_path, "c.yaml", {"nodes": [node]})
        code, out, _ = run(capsys, "--cluster", cluster, jobs, "--json")
        (decision,) = decisions(out)
        assert code == 0 and decision["decision"] == decided, decision["message"]
    assert decision["placement"] == [{"node": "a", "gpus": [1], "uuids": ["a-gpu1"]}]
    node = {"name": "a", "gpus": [dict(full, allocated="yes")]}
    code, _, err = run(capsys, "--cluster", write(tmp_path, "c.yaml", {"nodes": [node]}))
    assert code == 2 and "nodes[0].gpus[0].allocated: Input should be a valid boolean" in err


def test_the_profile_flag_overrides_the_spec(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    jobs = write(tmp_path, "j.yaml", LLAMA_QLORA)
    _, out, _ = run(capsys, "--cluster", cluster, jobs, "--json", "--profile", "analytic")
    assert decisions(out)[0]["per_gpu_bytes"] == 7_780_056_064  # seed 2's 7.25 GiB


def _kubectl_dump(used_by_job: int) -> dict[str, Any]:
    """What `kubectl get nodes,gpunodes,finetunejobs,pods,configmaps -A -o yaml` prints, in part."""
    heartbeat = "2026-12-01T10:00:00Z"
    node = {
        "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "H100"}},
        "status": {
            "allocatable": {"nvidia.com/gpu": "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    gpunode = {
        "kind": "GPUNode",
        "metadata": {"name": "gpu-1"},
        "status": {
            "heartbeatTime": heartbeat,
            "conditions": [{"type": "Ready", "status": "True"}],
            "gpus": [
                {
                    "uuid": "GPU-1",
                    "index": 0,
                    "product": "H100",
                    "totalBytes": 80 * GIB,
                    "freeBytes": 80 * GIB - used_by_job,
                    "usedBytes": used_by_job,
                    "pods": [{"uid": "pod-uid", "usedBytes": used_by_job}] if used_by_job else [],
                }
            ],
        },
    }
    admitted = {
        "kind": "FineTuneJob",
        "metadata": {"name": "running", "namespace": "team"},
        "spec": LLAMA_QLORA["spec"],
        "status": {
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Fits"}],
            "placement": {
                "nodes": [{"node": "gpu-1", "gpuIndices": [0], "gpuUUIDs": ["GPU-1"]}],
                "requestedGPUs": 1,
                "admittedGPUs": 1,
                "perGpuBytes": 60 * GIB,
            },
        },
    }
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "running-0",
            "namespace": "team",
            "uid": "pod-uid",
            "labels": {"vramgate.dev/finetunejob": "running"},
        },
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    return {"kind": "List", "items": [node, gpunode, admitted, pod]}


def _broken(item: int, path: str, value: Any) -> dict[str, Any]:
    """The dump with one field (dotted path, [i] for list items) of one item set to value."""
    dump = copy.deepcopy(_kubectl_dump(40 * GIB))
    parent: Any = dump["items"][item]
    *parts, last = re.findall(r"[^.\[\]]+", path)
    for part in parts:
        parent = parent[int(part)] if part.isdigit() else parent[part]
    if last.isdigit():
        parent[int(last)] = value
    else:
        parent[last] = value
    return dump


@pytest.mark.parametrize(
    ("item", "path", "value", "expected"),
    [
        (1, "status.heartbeatTime", "yesterday",
         "GPUNode gpu-1: status.heartbeatTime: Input should be a valid datetime"),
        (1, "status.gpus[0].index", "zero",
         "GPUNode gpu-1: status.gpus[0].index: Input should be a valid integer, got 'zero'"),
        (1, "status.gpus[0].totalBytes", "80Gi",
         "GPUNode gpu-1: status.gpus[0].totalBytes: Input should be a valid integer, got '80Gi'"),
        (1, "status.gpus[0].freeBytes", -1,
         "status.gpus[0].freeBytes: Input should be greater than or equal to 0, got -1"),
        (1, "status.gpus", "x", "GPUNode gpu-1: status.gpus: Input should be a valid list"),
        (1, "status.gpus[0].pods[0].usedBytes", "lots", "pods[0].usedBytes: Input should be"),
        (1, "status", [1], "GPUNode gpu-1: status: Input should be a valid dictionary"),
        (2, "status.placement.nodes[0]", {"gpuIndices": [0]},
         "FineTuneJob running: status.placement.nodes[0].node: Field required"),
        (2, "status.placement.perGpuBytes", "big", "status.placement.perGpuBytes: Input"),
        (2, "status.conditions", ["x"], "status.conditions[0]: Input should be a valid dict"),
        (2, "metadata.creationTimestamp", "now", "metadata.creationTimestamp: Input should be"),
        (2, "status.observed", {"imageDigestTime": "now"},
         "status.observed.imageDigestTime: Input should be"),
        (3, "metadata.labels", ["a"], "Pod running-0: metadata.labels: Input should be a valid"),
        (3, "spec.containers[0].resources.limits", "one",
         "Pod running-0: spec.containers[0].resources.limits: must be a map of resource names"),
        (3, "spec.containers[0].resources.limits", {"nvidia.com/gpu": 1.5},
         "resources.limits: nvidia.com/gpu: must be a whole number of GPUs, got 1.5"),
        (0, "spec", {"unschedulable": "yes"}, "Node gpu-1: spec.unschedulable: Input should be"),
    ],
)  # fmt: skip
def test_a_hand_broken_dump_is_refused_naming_the_object_and_field(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    item: int,
    path: str,
    value: Any,
    expected: str,
) -> None:
    """What the API server would never have stored: one line, exit 2, not a traceback from
    deep inside the snapshot."""
    cluster = write(tmp_path, "dump.yaml", _broken(item, path, value))
    code, out, err = run(capsys, "--cluster", cluster)
    assert (code, out) == (2, "")
    assert err.startswith(f"vramgate: dump.yaml: document 1 item {item}: ") and expected in err
    assert err.count("\n") == 1


def test_what_admission_does_not_read_is_not_checked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A half CPU as a number, free memory above the total (the static agent backend writes
    what it is given): the API server stores both, so plan reads them."""
    dump = _broken(3, "spec.containers[0].resources.limits", {"nvidia.com/gpu": "1", "cpu": 0.5})
    dump["items"][1]["status"]["gpus"][0]["freeBytes"] = 81 * GIB
    code, _, err = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump))
    assert code == 0, err


def test_a_compact_node_has_the_labels_every_kubelet_sets(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A template selecting kubernetes.io/os or a hostname plans as on a real cluster."""
    cluster = write(tmp_path, "c.yaml", {"nodes": [
        {"name": "a", "gpus": {"memory": "80GiB"}},
        {"name": "b", "labels": {"kubernetes.io/arch": "arm64"}, "gpus": {"memory": "80GiB"}},
    ]})  # fmt: skip
    selector = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}
    template = {"spec": {"nodeSelector": selector, "containers": [{"name": "t", "image": "t"}]}}
    job = dict(LLAMA_QLORA, spec=dict(LLAMA_QLORA["spec"], template=template))
    code, out, err = run(capsys, "--cluster", cluster, write(tmp_path, "j.yaml", job), "--json")
    assert code == 0, err
    assert decisions(out)[0]["placement"][0]["node"] == "b"


def test_a_misspelled_vramgate_kind_is_refused_not_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    typo = dict(LLAMA_QLORA, kind="FinetuneJob", metadata={"name": "j2"})
    jobs = write(tmp_path, "jobs.yaml", LLAMA_QLORA, typo)
    code, _, err = run(capsys, jobs)
    assert code == 2
    assert err == (
        "vramgate: jobs.yaml: document 2: kind: 'FinetuneJob' is not one of vramgate.dev's: "
        "FineTuneJob, GPUNode, LearnedCorrection\n"
    )


@pytest.mark.parametrize("used_by_job", [0, 40 * GIB, 60 * GIB])
def test_a_kubectl_dump_keeps_admitted_jobs_reservations_and_counts_them_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, used_by_job: int
) -> None:
    """The admitted job reserves 60 GiB; whatever of it NVML already shows as used is not
    charged again, so the effective free memory is 20 GiB at every stage of its start."""
    cluster = write(tmp_path, "dump.yaml", _kubectl_dump(used_by_job))
    small = dict(LLAMA_QLORA, metadata={"name": "small", "namespace": "team"})
    jobs = write(tmp_path, "jobs.yaml", small)
    argv = ["--cluster", cluster, jobs, "--json", "--profile", "analytic"]
    code, out, _ = run(capsys, *argv, "--gpu-mode", "visibleDevices")
    assert code == 0
    (decision,) = decisions(out)  # the admitted job keeps its place; only `small` is decided
    assert decision["job"] == "team/small" and decision["decision"] == "Admit"
    assert "12.75 GiB left on the tightest" in decision["message"]  # 20 - 7.25 GiB


def test_with_the_device_plugin_a_gpu_in_use_takes_no_other_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "dump.yaml", _kubectl_dump(40 * GIB))
    jobs = write(tmp_path, "jobs.yaml", dict(LLAMA_QLORA, metadata={"name": "small"}))
    code, out, _ = run(capsys, "--cluster", cluster, jobs, "--json")
    assert code == 0
    (decision,) = decisions(out)
    assert decision["decision"] == "Queue"
    assert "no matching GPU takes work now" in decision["message"]


def test_jobs_in_the_cluster_dump_are_decided_without_job_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = _kubectl_dump(0)
    dump["items"].append(dict(LLAMA_QLORA, metadata={"name": "pending", "namespace": "team"}))
    code, out, _ = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), "--json")
    assert code == 0
    assert [d["job"] for d in decisions(out)] == ["team/pending"]


def _queue_dump(*priority_classes: dict[str, Any]) -> dict[str, Any]:
    """One free 80 GiB GPU and three pending jobs of one shape: `older` in team-a, then in
    tenant `jumper` with spec.priority 1,000,000,000 and `classy` naming the class `high`."""
    node, gpunode = _kubectl_dump(0)["items"][:2]

    def pending(name: str, namespace: str, minute: int, **spec: Any) -> dict[str, Any]:
        meta = {"name": name, "namespace": namespace,
                "creationTimestamp": f"2026-12-01T09:0{minute}:00Z"}  # fmt: skip
        template = {"spec": {"containers": [{"name": "t", "image": "t"}]}}
        return dict(LLAMA_QLORA, metadata=meta, spec={**LLAMA_QLORA["spec"], **spec,
                                                       "template": template})  # fmt: skip

    jobs = [
        pending("older", "team-a", 0),
        pending("jumper", "tenant", 1, priority=1_000_000_000),
        pending("classy", "tenant", 2, priorityClassName="high"),
    ]
    return {"kind": "List", "items": [node, gpunode, *jobs, *priority_classes]}


HIGH_CLASS = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
              "metadata": {"name": "high"}, "value": 1000}  # fmt: skip


def test_a_dump_ranks_its_jobs_by_their_priority_classes_not_their_raw_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def planned(dump: dict[str, Any], *flags: str) -> list[tuple[str, str, str]]:
        code, out, err = run(capsys, "--cluster", write(tmp_path, "d.json", dump), "--json",
                             *flags)  # fmt: skip
        assert code == 0, err
        return [(d["job"], d["decision"], d["reason"]) for d in decisions(out)]

    # No class `high` in the dump: classy waits for it; the raw number ranks nothing.
    assert planned(_queue_dump()) == [
        ("team-a/older", "Admit", "Fits"),
        ("tenant/jumper", "Queue", "WaitingForVRAM"),
        ("tenant/classy", "Queue", "PriorityClassUnavailable"),
    ]
    _, out, _ = run(capsys, "--cluster", write(tmp_path, "d.json", _queue_dump()))
    assert "tenant/jumper: needs 11.64 GiB" in out
    assert "warning: spec.priority 1000000000 is ignored" in " ".join(out.split())
    # `kubectl get ...,priorityclasses` holds it: the higher class goes first.
    assert planned(_queue_dump(HIGH_CLASS))[0] == ("tenant/classy", "Admit", "Fits")
    # A file of the classes completes a dump taken without them.
    classes = write(tmp_path, "classes.yaml", HIGH_CLASS)
    assert planned(_queue_dump(), classes)[0] == ("tenant/classy", "Admit", "Fits")
    # As the operator so configured: an administrator's namespace may set a raw number.
    flags = ("--raw-priority-namespace", "tenant")
    assert planned(_queue_dump(HIGH_CLASS), *flags)[0] == ("tenant/jumper", "Admit", "Fits")


def test_a_hand_broken_priority_class_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = _queue_dump({**HIGH_CLASS, "value": "high"})
    code, _, err = run(capsys, "--cluster", write(tmp_path, "d.yaml", dump))
    assert code == 2
    assert "item 5: PriorityClass high: value: Input should be a valid integer, got 'high'" in err


def test_a_dumped_gpu_node_without_a_gpunode_is_waited_for_not_taken_for_absent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """gpu-2's GPUNode is missing from the dump (deleted, its agent about to make it again):
    a 2-GPU job fits gpu-2's eight H100s, which its Node's labels describe, so it waits for
    gpu-2 instead of being refused for the one GPU gpu-1 reports."""
    dump = _kubectl_dump(0)
    dump["items"].append(
        {
            "kind": "Node",
            "metadata": {
                "name": "gpu-2",
                "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.memory": "81559"},
            },
            "status": {
                "capacity": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    two = dict(LLAMA_QLORA, spec={**LLAMA_QLORA["spec"], "resources": {"gpus": 2}})
    argv = ["--cluster", write(tmp_path, "dump.yaml", dump), write(tmp_path, "j.yaml", two)]
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    (decision,) = decisions(out)
    assert (decision["decision"], decision["reason"]) == ("Queue", "WaitingForNodes")
    assert "it would fit now on gpu-2, which takes no work now (GPUs not yet reported by its " \
        "vramgate agent)" in decision["message"]  # fmt: skip


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"nodes": [{"name": "a", "gpus": {"memory": 80}}]},
            "c.yaml: document 1: nodes[0].gpus[0].memory: must have a unit",
        ),
        (
            {"nodes": [{"name": "a", "gpus": {"memory": "80GiB", "colour": "red"}}]},
            "c.yaml: document 1: nodes[0].gpus[0].colour: unknown key; allowed: memory, free, "
            "uuid, product, count",
        ),
        (
            {"nodes": [{"name": "a", "taints": [], "gpus": {"memory": "80GiB"}}]},
            "nodes[0].taints: unknown key; allowed: name, labels, gpus, ready, cordoned",
        ),
        (
            {"nodes": [{"name": "a", "gpus": {"memory": "1GiB"}}], "cluster": "x"},
            "cluster: unknown key; allowed: nodes",
        ),
        ({"nodes": [{"name": "a", "gpus": {"free": "8GiB"}}]}, "nodes[0].gpus[0].memory: required"),
        (
            {"nodes": [{"name": "A_B c", "gpus": {"memory": "80GiB"}}]},
            "nodes[0].name: must be a DNS-1123 subdomain",
        ),
        (
            {"nodes": [{"name": "a", "gpus": {"memory": "80GiB", "count": 2, "uuid": "GPU-1"}}]},
            "nodes[0].gpus[0]: uuid names one GPU, but count is 2: give each GPU its own entry",
        ),
        (
            {"nodes": [{"name": "a", "gpus": [{"memory": "8GiB", "free": "9GiB"}]}]},
            "free must be at most memory",
        ),
        ({"nodes": []}, "c.yaml: document 1: nodes: List should have at least 1 item"),
        (
            {"nodes": [{"name": "a", "gpus": {"memory": "0GiB"}}]},
            "nodes[0].gpus[0].memory: must be greater than 0",
        ),
        (
            {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}] * 2},
            "c.yaml: document 1: nodes: node 'a' is described twice",
        ),
        (["a list"], "c.yaml: document 1: must be a mapping"),
        ({"kind": "Node", "metadata": {}}, "c.yaml: document 1: metadata.name is required"),
    ],
)
def test_a_bad_cluster_file_exits_2_with_one_line_naming_document_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, document: Any, expected: str
) -> None:
    code, out, err = run(capsys, "--cluster", write(tmp_path, "c.yaml", document))
    assert code == 2 and out == ""
    assert expected in err and err.count("\n") == 1


def test_a_bad_job_names_its_file_document_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    bad = dict(LLAMA_QLORA, spec=dict(LLAMA_QLORA["spec"], lora={"rank": 0}))
    jobs = write(tmp_path, "jobs.yaml", LLAMA_QLORA | {"metadata": {"name": "ok"}}, bad)
    code, _, err = run(capsys, "--cluster", cluster, jobs)
    assert code == 2
    assert "jobs.yaml: document 2 (team/qlora): spec.lora.rank: must be greater than" in err


def _config_job(name: str, config_map: str) -> dict[str, Any]:
    spec = dict(LLAMA_QLORA["spec"], model={"configMapRef": {"name": config_map}})
    return dict(LLAMA_QLORA, metadata={"name": name, "namespace": "team"}, spec=spec)


def _config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "team"}, "data": data}


def test_a_dumped_job_the_operator_cannot_decide_is_listed_and_the_others_decided(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A broken job in the cluster is the cluster's state, not the user's input: the operator
    leaves it undecided, so the plan does too, and decides the rest."""
    config = json.dumps(load_preset("llama-3.1-8b").config_dict())
    dump = _kubectl_dump(0)
    dump["items"] += [
        _config_job("missing", "nowhere"),
        _config_job("no-key", "other-key"),
        _config_job("not-json", "garbled"),
        _config_job("fine", "llama"),
        _config_map("other-key", {"model.json": config}),
        _config_map("garbled", {"config.json": "{not json"}),
        _config_map("llama", {"config.json": config}),
    ]
    cluster = write(tmp_path, "dump.yaml", dump)
    code, out, _ = run(capsys, "--cluster", cluster, "--json")
    assert code == 0
    assert [d["job"] for d in decisions(out)] == ["team/fine"]
    undecided = {u["job"]: u["error"] for u in json.loads(out)["undecided"]}
    assert undecided == {
        "team/missing": "spec.model.configMapRef.name: ConfigMap team/nowhere not found",
        "team/no-key": "spec.model.configMapRef.key: ConfigMap team/other-key has no key "
        "'config.json' (keys: model.json)",
        "team/not-json": undecided["team/not-json"],
    }
    assert undecided["team/not-json"].startswith(
        "spec.model.configMapRef.key: ConfigMap team/garbled key 'config.json' is not valid JSON"
    )
    code, out, _ = run(capsys, "--cluster", cluster)
    assert code == 0
    assert "team/missing: not decided: spec.model.configMapRef.name: ConfigMap" in out


def test_brackets_in_a_message_print_as_they_are(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Messages carry the user's text: a ConfigMap key in brackets, or a refused value with
    brackets in it, prints as written, and a `[/]` in it is not rich's closing tag."""
    config = json.loads(json.dumps(load_preset("llama-3.1-8b").config_dict()))
    config["hidden_size"] = "big"
    dump = _kubectl_dump(0)
    odd = _config_job("odd", "llama")
    odd["spec"]["training"] = {"optimizer": "[/][bold]x"}
    dump["items"] += [
        _config_job("broken", "llama"),
        odd,
        _config_map("llama", {"config.json": json.dumps(config)}),
    ]
    code, out, _ = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump))
    assert code == 0
    assert "team/broken: not decided: configmaps/llama[config.json].hidden_size: must be" in out
    assert "spec.training.optimizer: unsupported value '[/][bold]x'; allowed:" in out


def test_a_dumped_job_without_a_template_is_advised_after_the_rest_and_holds_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The operator tells such a job what admission would do (NoTemplate) and reserves
    nothing for it: the one free GPU goes to the job file's job, though the dumped one is
    older. A job file's own template-less job is planned as a draft, as before."""
    node, gpunode, *_ = _kubectl_dump(0)["items"]
    early = {"name": "advice", "namespace": "team", "creationTimestamp": "2026-12-01T09:00:00Z"}
    dump = {"kind": "List", "items": [node, gpunode, dict(LLAMA_QLORA, metadata=early)]}
    template = {"spec": {"containers": [{"name": "t", "image": "t:v1"}]}}
    mine = dict(LLAMA_QLORA, metadata={"name": "mine", "namespace": "team",
                                       "creationTimestamp": "2026-12-01T11:00:00Z"},
                spec={**LLAMA_QLORA["spec"], "template": template})  # fmt: skip
    argv = ["--cluster", write(tmp_path, "dump.yaml", dump), write(tmp_path, "j.yaml", mine)]
    code, out, _ = run(capsys, *argv, "--json")
    assert code == 0
    found = {d["job"]: d for d in decisions(out)}
    assert [found["team/mine"]["decision"], found["team/mine"]["placement"][0]["node"]] == [
        "Admit", "gpu-1"
    ]  # fmt: skip
    advice = found["team/advice"]
    assert (advice["decision"], advice["reason"]) == ("Advise", "NoTemplate")
    assert (advice["admitted_gpus"], advice["placement"]) == (None, [])
    assert advice["message"].startswith("spec.template is empty, so there is nothing to run")
    assert "the job would wait" in advice["message"]
    assert (advice["warnings"], found["team/mine"]["warnings"]) == ([], [])

    # The job file's own template-less job: planned as if it had one, with a warning.
    draft = dict(mine, spec=LLAMA_QLORA["spec"])
    argv[2] = write(tmp_path, "j.yaml", draft)
    code, out, _ = run(capsys, *argv, "--json")
    found = {d["job"]: d for d in decisions(out)}
    assert found["team/mine"]["decision"] == "Admit"
    assert found["team/mine"]["warnings"] == [DRAFT_WITHOUT_TEMPLATE]
    code, out, _ = run(capsys, *argv)
    assert f"team/mine: warning: {DRAFT_WITHOUT_TEMPLATE}" in " ".join(out.split())

    # Suspended, it is told so, as any suspended job.
    dump["items"][2] = dict(LLAMA_QLORA, metadata=early, spec={**LLAMA_QLORA["spec"],
                                                               "suspend": True})  # fmt: skip
    argv[1:] = [write(tmp_path, "dump.yaml", dump), write(tmp_path, "j.yaml", mine)]
    code, out, _ = run(capsys, *argv, "--json")
    found = {d["job"]: d for d in decisions(out)}
    assert (found["team/advice"]["decision"], found["team/advice"]["reason"]) == (
        "Queue", "Suspended"
    )  # fmt: skip


def test_a_dumped_job_whose_workload_cannot_be_built_is_undecided(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The operator records it InvalidSpec before promising it a GPU: plan does not admit it."""
    dump = _kubectl_dump(0)
    template = {"spec": {"nodeName": "gpu-1", "containers": [{"name": "t", "image": "t:v1"}]}}
    pinned = dict(LLAMA_QLORA, metadata={"name": "pinned", "namespace": "team"},
                  spec={**LLAMA_QLORA["spec"], "template": template})  # fmt: skip
    dump["items"].append(pinned)
    code, out, _ = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), "--json")
    assert code == 0
    assert "team/pinned" not in [d["job"] for d in decisions(out)]
    assert json.loads(out)["undecided"] == [{
        "job": "team/pinned",
        "error": "spec.template.spec.nodeName: must not be set; admission chooses the node",
    }]  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"spec": {**LLAMA_QLORA["spec"], "method": "qlora"}},
            "spec.method: unsupported value 'qlora'; allowed: Full, LoRA, QLoRA",
        ),
        (
            {"metadata": {"name": "My_Job", "namespace": "team"}},
            "metadata.name: 'My_Job' must be a DNS-1123 subdomain",
        ),
        (
            {"metadata": {"name": "ok", "namespace": "Team A"}},
            "metadata.namespace: 'Team A' must be a DNS-1123 label",
        ),
        (
            {"apiVersion": "vramgate.dev/v1"},
            "apiVersion: 'vramgate.dev/v1' must be vramgate.dev/v1alpha1",
        ),
        (
            {"metadata": {"name": "ok", "annotations": {"a": 1}}},
            "metadata.annotations.a: must be a string, got 1 (quote it)",
        ),
        (
            {"metadata": {"name": "ok", "labels": {"bad key!": "x"}}},
            "metadata.labels: key 'bad key!' must be a name of at most 63",
        ),
        (
            {"metadata": {"name": "ok", "labels": {"team": "a b"}}},
            "metadata.labels.team: 'a b' must be at most 63 letters",
        ),
        # kubectl's strict field validation: an unknown field is refused, not dropped.
        (
            {"specs": {}},
            "specs: unknown field; allowed: apiVersion, kind, metadata, spec, status",
        ),
        (
            {"metadata": {"name": "ok", "label": {"team": "a"}}},
            "metadata.label: unknown field; allowed: name, generateName, namespace",
        ),
        # What the webhook refuses because the workload could not be built from it.
        (
            {
                "spec": {
                    **LLAMA_QLORA["spec"],
                    "template": {
                        "spec": {"nodeName": "a", "containers": [{"name": "t", "image": "t:v1"}]}
                    },
                }
            },
            "spec.template.spec.nodeName: must not be set; admission chooses the node",
        ),
        (
            {"spec": {**LLAMA_QLORA["spec"], "template": {"spec": {"containers": []}}}},
            "spec.template.spec.containers: must list at least one container, got none",
        ),
        # A model type no reading reads (remote code): refused, not estimated as another.
        (
            {
                "spec": {
                    **LLAMA_QLORA["spec"],
                    "model": {"config": PYTHIA_69B | {"model_type": "my_remote_llm"}},
                }
            },
            "spec.model.config.model_type: ",
        ),
    ],
)
def test_a_job_kubectl_apply_would_refuse_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    """`translate` is lenient where the CLI wants it (`qlora`); a plan is for jobs that apply."""
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    jobs = write(tmp_path, "jobs.yaml", LLAMA_QLORA | changes)
    code, out, err = run(capsys, "--cluster", cluster, jobs)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "jobs.yaml: document 1 (" in err and expected in err


def test_a_date_in_a_job_file_is_read_as_kubectl_sends_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """YAML reads `released: 2024-01-01` as a date; kubectl sends the string."""
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    template = {
        "metadata": {"annotations": {"released": "DATE"}},
        "spec": {"containers": [{"name": "t"}]},
    }
    job = dict(LLAMA_QLORA, spec=dict(LLAMA_QLORA["spec"], template=template))
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(job).replace("DATE", "2024-01-01"))
    code, out, err = run(capsys, "--cluster", cluster, str(path), "--json")
    assert (code, err) == (0, "")
    assert [d["decision"] for d in decisions(out)] == ["Admit"]


def test_job_files_without_a_finetunejob_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    other = write(tmp_path, "other.yaml", {"kind": "Secret", "metadata": {"name": "x"}})
    code, out, err = run(capsys, "--cluster", cluster, other)
    assert code == 2 and out == ""
    assert err.strip().endswith("other.yaml: no FineTuneJob, ConfigMap or PriorityClass in it")


def test_a_config_map_file_replaces_a_broken_one_of_the_dump(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """ "Would it be admitted once I fix its ConfigMap?"""
    dump = _kubectl_dump(0)
    dump["items"] += [_config_job("from-map", "llama"), _config_map("llama", {"config.json": "{"})]
    config = json.dumps(load_preset("llama-3.1-8b").config_dict())
    fixed = write(tmp_path, "fixed.yaml", _config_map("llama", {"config.json": config}))
    code, out, _ = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), fixed, "--json")
    assert code == 0
    assert [d["job"] for d in decisions(out)] == ["team/from-map"]


def test_the_first_bad_job_of_a_file_is_the_one_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    bad = [dict(LLAMA_QLORA, metadata={"name": f"bad-{i}-"}) for i in range(50)]
    jobs = write(tmp_path, "jobs.yaml", *bad)
    for _ in range(3):
        code, _, err = run(capsys, "--cluster", cluster, jobs)
        assert code == 2 and "jobs.yaml: document 1 (default/bad-0-)" in err


def test_a_config_map_file_completes_a_dump_taken_without_config_maps(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = _kubectl_dump(0)
    dump["items"].append(_config_job("from-map", "llama"))
    config = json.dumps(load_preset("llama-3.1-8b").config_dict())
    maps = write(tmp_path, "maps.yaml", _config_map("llama", {"config.json": config}))
    code, out, _ = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), maps, "--json")
    assert code == 0
    assert [d["job"] for d in decisions(out)] == ["team/from-map"]
    assert json.loads(out)["undecided"] == []


def test_a_long_job_name_folds_and_leaves_the_other_columns_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    long = dict(LLAMA_QLORA, metadata={"name": "x" * 200, "namespace": "team"})
    code, out, _ = run(capsys, "--cluster", cluster, write(tmp_path, "jobs.yaml", long))
    assert code == 0
    row = next(line for line in out.splitlines() if "team/xxx" in line)
    assert all(cell in row for cell in ("Admit", "Fits", "a:0", "11.64"))


def test_a_job_file_naming_a_missing_config_map_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "80GiB"}}]})
    jobs = write(tmp_path, "jobs.yaml", _config_job("mine", "nowhere"))
    code, out, err = run(capsys, "--cluster", cluster, jobs)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert (
        "jobs.yaml: document 1 (team/mine): spec.model.configMapRef.name: "
        "ConfigMap team/nowhere not found" in err
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe not utf-8", "not UTF-8 text"),
        (b"nodes: [\n", "not valid YAML"),
        (b"[" * 100_000 + b"]" * 100_000, "too deep"),
        (b"a: " + b"[" * 100_000, "nested more than 100 brackets deep"),
        (b"a: " + b"[" * 100_000 + b"]" * 100_000, "nested more than 100 brackets deep"),
        (b"a: " + b"[{" * 60 + b"}]" * 60, "nested more than 100 brackets deep"),
        (b"a:\n" + b"".join(b" " * i + b"- \n" for i in range(2000)), "at most 100"),
        # "Billion laughs": 1 KB that expands to 10^8 collections, and an alias into itself.
        (
            b"a0: &a0 [lol, lol]\n"
            + b"".join(
                b"a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]\n"
                for i in range(1, 9)
            ),
            "times over; at most 10 (write the repeated part out)",
        ),
        # One long string, anchored once and aliased thousands of times: 300 MB as JSON.
        (
            b"big: &s " + b"x" * 100_000 + b"\nrefs: [" + b", ".join([b"*s"] * 3000) + b"]\n",
            "its aliases expand it 2,993 times over; at most 10",
        ),
        (b"nodes: &n [{name: a, gpus: *n}]\n", "an alias refers to a node that holds it"),
    ],
)
def test_unreadable_files_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    code, _, err = run(capsys, "--cluster", str(path))
    assert code == 2 and expected in err and err.count("\n") == 1


@pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])
def test_deep_block_nesting_is_refused_at_plans_limit_whichever_parser_reads_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    libyaml: bool,
) -> None:
    """1,500 levels: past the limit libyaml has of its own since PyYAML 6.0.4 (1,000), and
    deep enough to run PyYAML's recursive pure-Python composer out of stack. The user reads
    plan's limit, the document and the line, whichever parser and version read the file."""
    if not libyaml:
        monkeypatch.setattr(plan_command, "_C_LOADER", None)
    elif plan_command._C_LOADER is None:
        pytest.skip("this PyYAML has no libyaml")
    deep = b"".join(b" " * i + b"- x\n" if i == 1499 else b" " * i + b"-\n" for i in range(1500))
    path = tmp_path / "c.yaml"
    path.write_bytes(b"nodes: []\n---\na:\n" + deep)
    code, out, err = run(capsys, "--cluster", str(path))
    assert (code, out) == (2, "")
    assert err.endswith(f"{path}: document 2, line 103: nested 101 deep; at most 100\n")
    assert err.count("\n") == 1


def test_a_few_aliases_read_as_kubectl_reads_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    labels = {"team": "research"}
    job = dict(LLAMA_QLORA, metadata={"name": "shared", "labels": labels,
                                      "annotations": labels})  # fmt: skip
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.dump(job))  # PyYAML writes the shared map once, then an alias
    assert "*id" in path.read_text()
    code, out, _ = run(capsys, str(path), "--json")
    assert code == 0 and decisions(out)[0]["job"] == "default/shared"


def test_a_json_dump_is_read_as_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps(_kubectl_dump(0)))
    jobs = write(tmp_path, "jobs.yaml", dict(LLAMA_QLORA, metadata={"name": "small"}))
    code, out, _ = run(capsys, "--cluster", str(path), jobs, "--json", "--gpu-mode", "dra")
    assert code == 0 and decisions(out)[0]["decision"] == "Queue"


def test_headroom_is_kept_free_on_every_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster = write(tmp_path, "c.yaml", {"nodes": [{"name": "a", "gpus": {"memory": "10GiB"}}]})
    jobs = write(tmp_path, "j.yaml", LLAMA_QLORA)
    argv = ["--cluster", cluster, jobs, "--json", "--profile", "analytic"]
    _, out, _ = run(capsys, *argv)
    assert decisions(out)[0]["decision"] == "Admit"  # 7.25 GiB on 10 GiB
    _, out, _ = run(capsys, *argv, "--headroom", "3GiB")
    assert decisions(out)[0]["decision"] == "Reject"  # 7.25 GiB on 7 GiB usable
    assert "the largest GPU holds 7.00 GiB usable" in decisions(out)[0]["message"]
    _, out, _ = run(capsys, *argv, "--headroom-percent", "20")
    assert decisions(out)[0]["decision"] == "Admit"  # 8 GiB usable
    code, _, err = run(capsys, *argv, "--headroom-percent", "90")
    assert code == 2 and "--headroom-percent: must be between 0 and 50" in err
    code, _, err = run(capsys, *argv, "--headroom", "3")
    assert code == 2 and "--headroom:" in err
    # Past a year overflowed the date arithmetic: a traceback, not this line.
    code, _, err = run(capsys, *argv, "--heartbeat-ttl-seconds", "99999999999999999999")
    assert code == 2
    assert err == (
        "vramgate: --heartbeat-ttl-seconds: must be less than or equal to 31536000, "
        "got 99999999999999999999\n"
    )


def test_a_headroom_larger_than_the_gpus_says_0_usable_not_a_negative_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--headroom", "100GiB", "--json")
    assert code == 0
    messages = [d["message"] for d in decisions(out)]
    assert all(d["decision"] == "Reject" for d in decisions(out))
    assert all("holds 0.00 GiB usable" in m and "-" not in m.split("holds")[1] for m in messages)


def test_strict_fifo_lets_no_job_go_ahead(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    full = {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "first", "creationTimestamp": "2026-12-01T08:00:00Z"},
        "spec": {"model": {"preset": "qwen2.5-1.5b"}, "method": "Full"},
    }
    later = dict(
        LLAMA_QLORA, metadata={"name": "later", "creationTimestamp": "2026-12-01T09:00:00Z"}
    )
    busy = {"nodes": [{"name": "a", "gpus": {"memory": "24GiB", "free": "13GiB"}}]}
    cluster = write(tmp_path, "c.yaml", busy)
    jobs = write(tmp_path, "j.yaml", later, full)
    argv = ["--cluster", cluster, jobs, "--json"]
    _, out, _ = run(capsys, *argv)
    assert [(d["job"], d["decision"]) for d in decisions(out)] == [
        ("default/first", "Queue"),
        ("default/later", "Admit"),
    ]
    _, out, _ = run(capsys, *argv, "--queueing", "StrictFIFO")
    assert [(d["job"], d["reason"]) for d in decisions(out)] == [
        ("default/first", "WaitingForVRAM"),
        ("default/later", "WaitingInQueue"),
    ]


def test_a_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--cluster", str(tmp_path / "nope.yaml"))
    assert code == 2 and "nope.yaml: cannot read" in err


def test_plan_and_the_operator_share_the_admission_settings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One model (`AdmissionConfig`): the same fields, flags, defaults and checks; plan reads
    them from its command line only, never the operator's environment or config file."""
    from controller.admission.config import AdmissionConfig
    from controller.cli import plan as plan_command
    from controller.cli.main import build_parser
    from controller.operator import settings as operator

    assert issubclass(operator.OperatorSettings, AdmissionConfig)
    names = set(AdmissionConfig.model_fields)
    assert names == {"gpu_mode", "queueing", "headroom", "headroom_percent",
                     "heartbeat_ttl_seconds", "raw_priority_namespaces", "learning_policy",
                     "learning_min_samples", "learning_percentile", "learning_margin_percent",
                     "learning_half_life_seconds", "learning_steady_seconds"}  # fmt: skip
    assert names <= set(operator.OperatorSettings.model_fields)
    assert [plan_command.ADMISSION.flag(n) for n in names] == [
        operator.LOADER.flag(n) for n in names
    ]

    def both(*flags: str) -> tuple[Any, Any]:
        plan_args = build_parser().parse_args(["plan", *flags])
        operator_args = build_parser().parse_args(["operator", *flags])
        return (
            plan_command.admission_settings(plan_args),
            operator.load_settings(operator_args, environ={}).admission(),
        )

    planned, operated = both()
    assert planned == operated  # the same defaults
    planned, operated = both(
        "--gpu-mode",
        "visibleDevices",
        "--queueing",
        "StrictFIFO",
        "--headroom",
        "2GiB",
        "--headroom-percent",
        "5",
        "--heartbeat-ttl-seconds",
        "120",
        "--raw-priority-namespace",
        "platform",
    )
    assert planned == operated and planned.packing.headroom_bytes == 2 * GIB
    assert planned.raw_priority_namespaces == {"platform"}

    monkeypatch.setenv("VRAMGATE_OPERATOR_GPU_MODE", "dra")
    monkeypatch.setenv("GPU_MODE", "dra")
    planned, _ = both()
    assert planned.packing.gpu_mode.value == "devicePlugin"

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--config" not in text and "env " not in text and "VRAMGATE" not in text
    assert "--headroom SIZE memory kept free on every GPU" in text and "(default 0GiB)" in text


def test_plan_reads_learned_corrections_from_a_dump_and_decides_on_the_operators_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from controller.admission import learned
    from controller.admission.admission_pass import Estimated, PassInput, admission_pass
    from controller.admission.cluster import ClusterObjects
    from controller.decision import AdmissionSettings
    from controller.jobs.spec import estimate_plan, translate
    from controller.learning import LearningSettings

    node, gpunode = _kubectl_dump(0)["items"][:2]
    template = {"spec": {"containers": [{"name": "trainer", "image": "trainer:low"}]}}
    meta = {"name": "next", "namespace": "team", "uid": "uid-next", "generation": 1,
            "resourceVersion": "7", "creationTimestamp": "2026-12-01T09:00:00Z"}  # fmt: skip
    job = dict(LLAMA_QLORA, metadata=meta, spec={**LLAMA_QLORA["spec"], "template": template})
    plan, _ = translate(dict(job["spec"]), None)
    assert plan is not None
    est = estimate_plan(plan)
    key = learned.job_key(job, {"profile": est.profile, "parallelism": plan.parallelism.api})
    predicted = est.per_gpu_bytes(plan.gpus, plan.parallelism)
    at = datetime(2026, 12, 1, 8, tzinfo=UTC)
    settings = LearningSettings(min_samples=3)
    taught = [learned.Sample(f"u{i}", key, "Steady", int(0.7 * predicted), predicted, predicted, at)
              for i in range(3)]  # fmt: skip
    keys = []
    for state in learned.file_samples({}, taught, settings).values():
        obj, status = learned.key_object(state, settings, at)
        keys.append({**obj, "status": status})
    dump = {"kind": "List", "items": [node, gpunode, job, *keys]}

    code, out, err = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), "--json",
                         "--learning-min-samples", "3")  # fmt: skip
    assert code == 0, err
    (decided,) = decisions(out)
    objects = ClusterObjects()
    for item in dump["items"]:
        objects.add(item, "dump")
    operator = admission_pass(
        PassInput(
            objects=objects, workloads={}, job_pods={},
            estimates={"team/next": Estimated(1, plan=plan, estimate=est)},
            settings=AdmissionSettings(), now=datetime(2026, 12, 1, 10, tzinfo=UTC),
            learned=learned.records(learned.key_states(keys, settings)), learning=settings,
        )
    )  # fmt: skip
    (write_,) = operator.writes
    reserved = write_.patch["placement"]["perGpuBytes"]
    assert decided["per_gpu_bytes"] == reserved < predicted, "plan decides as the operator"
    _, unlearned, _ = run(capsys, "--cluster", write(tmp_path, "d.yaml", dump), "--json",
                          "--learning-policy", "off")  # fmt: skip
    assert decisions(unlearned)[0]["per_gpu_bytes"] == predicted


def test_plan_keys_a_tag_by_the_digest_the_dumps_jobs_reported_as_the_operator_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime

    from controller.admission import learned
    from controller.admission.admission_pass import Estimated, PassInput, admission_pass
    from controller.admission.cluster import ClusterObjects
    from controller.decision import AdmissionSettings
    from controller.jobs.spec import estimate_plan, translate
    from controller.learning import LearningSettings

    digest = "sha256:" + "d" * 64
    node, gpunode = _kubectl_dump(0)["items"][:2]
    template = {"spec": {"containers": [{"name": "trainer", "image": "trainer:low"}]}}
    meta = {"name": "next", "namespace": "team", "uid": "uid-next", "generation": 1,
            "resourceVersion": "7", "creationTimestamp": "2026-12-01T09:00:00Z"}  # fmt: skip
    job = dict(LLAMA_QLORA, metadata=meta, spec={**LLAMA_QLORA["spec"], "template": template})
    # A job of the same tag that ran and ended: its status says which image its pods ran.
    ran = dict(job, metadata={**meta, "name": "ran", "uid": "uid-ran"}, status={
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded",
                        "lastTransitionTime": "2026-12-01T08:00:00Z"}],
        "observed": {"peakBytes": 0, "peak": "0.00 GiB", "gpus": [], "imageDigest": digest,
                     "imageDigestTime": "2026-12-01T07:00:00Z"},
    })  # fmt: skip
    plan, _ = translate(dict(job["spec"]), None)
    assert plan is not None
    est = estimate_plan(plan)
    key = learned.job_key(job, {"profile": est.profile, "parallelism": plan.parallelism.api})
    key = replace(key, image=digest)
    predicted = est.per_gpu_bytes(plan.gpus, plan.parallelism)
    at = datetime(2026, 12, 1, 8, tzinfo=UTC)
    settings = LearningSettings(min_samples=3)
    taught = [learned.Sample(f"u{i}", key, "Steady", int(0.7 * predicted), predicted, predicted, at)
              for i in range(3)]  # fmt: skip
    (state,) = [s for s in learned.file_samples({}, taught, settings).values() if s.key == key]
    obj, status = learned.key_object(state, settings, at)
    finest = {**obj, "status": status}  # the digest's key alone: no coarser key to fall to
    dump = {"kind": "List", "items": [node, gpunode, ran, job, finest]}

    code, out, err = run(capsys, "--cluster", write(tmp_path, "dump.yaml", dump), "--json",
                         "--learning-min-samples", "3")  # fmt: skip
    assert code == 0, err
    (decided,) = decisions(out)
    objects = ClusterObjects()
    for item in dump["items"]:
        objects.add(item, "dump")
    operator = admission_pass(
        PassInput(
            objects=objects, workloads={}, job_pods={},
            estimates={"team/next": Estimated(1, plan=plan, estimate=est)},
            settings=AdmissionSettings(), now=datetime(2026, 12, 1, 10, tzinfo=UTC),
            learned=learned.records(learned.key_states([finest], settings)), learning=settings,
        )
    )  # fmt: skip
    (write_,) = [w for w in operator.writes if w.key == "team/next"]
    reserved = write_.patch["placement"]["perGpuBytes"]
    assert decided["per_gpu_bytes"] == reserved < predicted, "plan decides as the operator"
    # Without the job that reported the digest, the tag is a key of its own: nothing learned.
    dump["items"].remove(ran)
    _, alone, _ = run(capsys, "--cluster", write(tmp_path, "d.yaml", dump), "--json",
                      "--learning-min-samples", "3")  # fmt: skip
    assert decisions(alone)[0]["per_gpu_bytes"] == predicted


# -- traced estimates the operator kept in status ---------------------------------------------

TRACE_SPEC = {
    "model": {"preset": "llama-3.2-1b"},
    "method": "LoRA",
    "lora": {"rank": 8},
    "estimator": {"profile": "Trace"},
}
#: What the operator's trace found (made up: no trace runs here), as its status keeps it.
TRACED = Estimate(
    profile="trace",
    components={"weights": 3 * GIB, "activations": 5 * GIB},
    total_params=1_235_814_400,
    trainable_params=5_636_096,
    sharded_bytes=3 * GIB,
    replicated_bytes=5 * GIB,
    margin=Fraction(11, 10),
    moments=((3 * GIB, 5 * GIB),),
)


def _traced_dump(stored_for: dict[str, Any]) -> dict[str, Any]:
    """The cluster with one pending Trace job whose status keeps TRACED, computed (its digest
    says) from `stored_for`'s spec."""
    digest = estimate_digest(stored_for, None, estimate_identity())
    dump = _kubectl_dump(0)
    dump["items"].append(
        {
            "kind": "FineTuneJob",
            "metadata": {"name": "traced", "namespace": "team"},
            "spec": TRACE_SPEC,
            "status": {
                "estimate": {
                    "profile": "trace",
                    "digest": digest,
                    "traced": codec.encode(TRACED, trace_libraries()),
                }
            },
        }
    )
    return dump


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`plan`'s estimate_plan, recording each plan it would trace (answering TRACED, as the
    operator's trace did) and estimating the rest for real."""
    traced: list[str] = []
    real = plan_command.estimate_plan

    def estimate(plan: Any) -> Estimate:
        if needs_trace(plan):
            traced.append(plan.model)
            return TRACED
        return real(plan)

    monkeypatch.setattr(plan_command, "estimate_plan", estimate)
    return traced


def test_a_dumped_job_the_operator_traced_is_not_traced_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, traces: list[str]
) -> None:
    code, out, _ = run(
        capsys, "--cluster", write(tmp_path, "d.yaml", _traced_dump(TRACE_SPEC)), "--json"
    )
    assert code == 0 and traces == [], "read back from status"
    [decision] = decisions(out)
    assert decision["job"] == "team/traced"
    assert decision["per_gpu_bytes"] == TRACED.per_gpu_bytes(1, Parallelism.FSDP)


def test_a_dumped_trace_of_another_spec_is_traced_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, traces: list[str]
) -> None:
    other = {**TRACE_SPEC, "lora": {"rank": 16}}  # what the operator traced before an edit
    code, out, _ = run(
        capsys, "--cluster", write(tmp_path, "d.yaml", _traced_dump(other)), "--json"
    )
    assert code == 0 and traces == ["llama-3.2-1b"]
    assert decisions(out)[0]["per_gpu_bytes"] == TRACED.per_gpu_bytes(1, Parallelism.FSDP)


def test_a_profile_flag_ignores_the_kept_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, traces: list[str]
) -> None:
    dump = write(tmp_path, "d.yaml", _traced_dump(TRACE_SPEC))
    code, out, _ = run(capsys, "--cluster", dump, "--profile", "analytic", "--json")
    assert code == 0 and traces == []
    assert decisions(out)[0]["per_gpu_bytes"] != TRACED.per_gpu_bytes(1, Parallelism.FSDP)
