"""Builders of the admission pass's inputs, the API's objects as dicts, and readers of what
a pass wrote (its status patches merged as the API server merges them)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from controller.admission.admission_pass import (
    Estimated,
    PassInput,
    PassOutput,
    Refused,
    StatusWrite,
    admission_pass,
)
from controller.admission.cluster import ClusterObjects, job_key
from controller.admission.observed import Peaks
from controller.api.base import API_VERSION, GPU_RESOURCE
from controller.decision import AdmissionSettings
from controller.jobs.spec import estimate_plan, translate
from controller.workload import Remains

GIB = 2**30


NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


HEARTBEAT = "2025-03-01T11:59:50Z"


#: llama-3.1-8b QLoRA r=16 on one GPU: about 11.6 GiB (calibrated profile).
SPEC: dict[str, Any] = {
    "model": {"preset": "llama-3.1-8b"},
    "method": "QLoRA",
    "lora": {"rank": 16},
}


TEMPLATE: dict[str, Any] = {
    "spec": {"containers": [{"name": "trainer", "image": "registry.invalid/train:1"}]}
}


def node(name: str, gpus: int, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {GPU_RESOURCE: str(gpus)},
        },
    }


def gpunode(name: str, free_gib: Sequence[float], total_gib: float = 80) -> dict[str, Any]:
    """A GPUNode as the agent writes it (tests/integration/gpunodes.py), Ready and fresh."""
    total = int(total_gib * GIB)
    gpus = []
    for i, free_g in enumerate(free_gib):
        free = int(free_g * GIB)
        gpus.append(
            {
                "uuid": f"GPU-{name}-{i}",
                "index": i,
                "product": "NVIDIA-H100-80GB-HBM3",
                "memoryInfoSupported": True,
                "totalBytes": total,
                "freeBytes": free,
                "usedBytes": total - free,
                "pods": [],
            }
        )
    return {
        "apiVersion": API_VERSION,
        "kind": "GPUNode",
        "metadata": {"name": name},
        "spec": {"nodeName": name},
        "status": {
            "gpus": gpus,
            "gpuCount": len(gpus),
            "heartbeatTime": HEARTBEAT,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "GPUsRead",
                    "message": "read 2 GPUs",
                    "lastTransitionTime": "2025-03-01T11:00:00Z",
                }
            ],
        },
    }


def ftj(
    name: str,
    *,
    minute: int = 0,
    generation: int = 1,
    template: dict[str, Any] | None = TEMPLATE,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A FineTuneJob created at 11:`minute` (queue order), of SPEC with `spec` over it."""
    body: dict[str, Any] = {**copy.deepcopy(SPEC), **spec}
    if template is not None:
        body["template"] = copy.deepcopy(template)
    job: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "FineTuneJob",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": generation,
            "resourceVersion": f"{100 + generation}",
            "creationTimestamp": f"2025-03-01T11:{minute:02d}:00Z",
        },
        "spec": body,
    }
    if status is not None:
        job["status"] = copy.deepcopy(status)
    return job


def cluster(
    *jobs: Mapping[str, Any],
    gpus: Mapping[str, Sequence[float]] | None = None,
    total_gib: float = 80,
    labels: Mapping[str, str] | None = None,
) -> ClusterObjects:
    """Jobs on nodes with the given free GiB per GPU (default: one node, one free GPU)."""
    free = gpus if gpus is not None else {"n1": [80]}
    return ClusterObjects(
        nodes={name: node(name, len(frees), labels) for name, frees in free.items()},
        gpunodes={name: gpunode(name, frees, total_gib) for name, frees in free.items()},
        jobs={job_key(job): job for job in jobs},
    )


def estimated(job: Mapping[str, Any], generation: int | None = None) -> Estimated:
    plan, errors = translate(dict(job["spec"]))
    assert plan is not None, errors
    gen = job["metadata"]["generation"] if generation is None else generation
    return Estimated(gen, plan=plan, estimate=estimate_plan(plan))


def run(
    objects: ClusterObjects,
    *,
    estimates: Mapping[str, Estimated] | None = None,
    workloads: Mapping[str, Mapping[str, Any]] | None = None,
    job_pods: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    now: datetime = NOW,
    last_written: Mapping[str, datetime] | None = None,
    peaks: Mapping[str, Peaks] | None = None,
    settings: AdmissionSettings | None = None,
    remains: Mapping[str, Remains] | None = None,
    refused: Mapping[str, Refused] | None = None,
    created: Mapping[str, str] | None = None,
) -> PassOutput:
    """One pass; every job estimated at its generation unless `estimates` says otherwise."""
    if estimates is None:
        estimates = {key: estimated(job) for key, job in objects.jobs.items()}
    return admission_pass(
        PassInput(
            objects=objects,
            workloads=workloads or {},
            job_pods=job_pods or {},
            estimates=estimates,
            settings=settings or AdmissionSettings(),
            now=now,
            last_written=last_written or {},
            peaks=peaks or {},
            remains=remains or {},
            refused=refused or {},
            created=created or {},
        )
    )


def merge(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies a status patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):  # nulls inside a new object are dropped too
            before = out.get(key)
            out[key] = merge(before if isinstance(before, Mapping) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def written(job: Mapping[str, Any], out: PassOutput) -> dict[str, Any]:
    """`job` with the pass's status write for it applied (unchanged when none)."""
    after = copy.deepcopy(dict(job))
    for w in out.writes:
        if w.key == job_key(job):
            after["status"] = merge(after.get("status") or {}, w.patch)
    return after


def write_for(out: PassOutput, key: str) -> StatusWrite:
    (found,) = [w for w in out.writes if w.key == key]
    return found


def status_after(out: PassOutput, key: str) -> dict[str, Any]:
    """The status a job had no status before and got this pass's write."""
    return merge({}, write_for(out, key).patch)


def condition(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    (found,) = [c for c in status.get("conditions") or [] if c["type"] == type_]
    return dict(found)


def reasons(write: StatusWrite) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in write.events]


def placed_on(status: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
    return [(part["node"], part["gpuIndices"]) for part in status["placement"]["nodes"]]


def admitted(name: str, *, gpus: Mapping[str, Sequence[float]] | None = None, **spec: Any):
    """A job admitted by an earlier pass, as the API holds it after that pass's write."""
    job = ftj(name, **spec)
    out = run(cluster(job, gpus=gpus))
    assert write_for(out, job_key(job)).resource_version is not None
    return written(job, out), out.creates[0].objects
