"""What the operator watches, kept in kopf indexes: the inventory admission decides on.

Why kopf indexes: kopf lists every indexed resource before it calls any other handler, so the
scheduler's first decision after a (re)start sees every admitted job's placement, every
GPUNode and every GPU pod: the reservation ledger is rebuilt from the API, never from memory.

Each index keeps only the fields admission reads (a slim copy), so 5,000 GPUNodes and 10,000
FineTuneJobs fit the operator's memory budget: Nodes without their images and addresses, pods
without their specs beyond GPU requests, FineTuneJobs whole (their spec is what is decided).

Pods indexed are those that hold GPUs (an `nvidia.com/gpu` request: the device plugin's
slots) or belong to a FineTuneJob (`JOB_LABEL`: their state and their GPU usage).
PriorityClasses (a handful in any cluster) rank the jobs in the queue. With `trainJobSizing`,
Kubeflow Trainer's runtimes (ClusterTrainingRuntimes, TrainingRuntimes: a handful per cluster)
are what the TrainJob webhook reads of the runtime a TrainJob leaves its training to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Any, cast

import kopf

from controller.admission import kueue
from controller.admission import trainer_runtime as runtimes
from controller.admission.cluster import (
    SCHEDULING_GROUP,
    ClusterObjects,
    job_key,
    pods_by_job,
)
from controller.admission.pods import pod_gpus
from controller.api.base import GPU_RESOURCE, GROUP, JOB_LABEL, VERSION
from controller.api.finetunejob import PLURAL
from controller.api.gpunode import PLURAL as GPUNODE_PLURAL
from controller.api.learnedcorrection import PLURAL as LEARNED_PLURAL
from controller.learning import image_digest

FINETUNEJOBS = "vramgate_finetunejobs"
GPUNODES = "vramgate_gpunodes"
NODES = "vramgate_nodes"
PODS = "vramgate_pods"
WORKLOADS = "vramgate_workloads"
PRIORITY_CLASSES = "vramgate_priorityclasses"
LEARNED = "vramgate_learnedcorrections"
KUEUE_WORKLOADS = "vramgate_kueue_workloads"
ADMISSION_CHECKS = "vramgate_admission_checks"
RESOURCE_FLAVORS = "vramgate_resource_flavors"
INDEXES = (FINETUNEJOBS, GPUNODES, NODES, PODS, WORKLOADS, PRIORITY_CLASSES, LEARNED)
CLUSTER_TRAINING_RUNTIMES = "vramgate_clustertrainingruntimes"
TRAINING_RUNTIMES = "vramgate_trainingruntimes"
#: Registered with `kueueAdmissionCheck` only: without Kueue's CRDs there is nothing to watch.
KUEUE_INDEXES = (KUEUE_WORKLOADS, ADMISSION_CHECKS, RESOURCE_FLAVORS)
#: Registered with `trainJobSizing` only: Trainer's runtimes, by name (`namespace/name` for
#: the namespaced kind), as `trainer_runtime.slim` keeps them.
TRAINER_INDEXES = (CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES)
CLUSTER_TRAINING_RUNTIME_RESOURCE = (runtimes.GROUP, "v1alpha1", runtimes.CLUSTER_PLURAL)
TRAINING_RUNTIME_RESOURCE = (runtimes.GROUP, "v1alpha1", runtimes.NAMESPACED_PLURAL)
#: Kueue's Workloads and AdmissionChecks: (group, version, plural).
KUEUE_WORKLOAD_RESOURCE = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, "workloads")
ADMISSION_CHECK_RESOURCE = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, "admissionchecks")
RESOURCE_FLAVOR_RESOURCE = (kueue.KUEUE_GROUP, kueue.KUEUE_VERSION, "resourceflavors")
#: PriorityClasses: (group, version, plural).
PRIORITY_CLASS_RESOURCE = (SCHEDULING_GROUP, "v1", "priorityclasses")
#: batch Jobs vramgate made carry its job label.
WORKLOAD_LABELS = {JOB_LABEL: kopf.PRESENT}


#: Strings this short are shared (interned) in the caches; longer ones (messages, the
#: last-applied copy) rarely repeat.
_SHARED_MAX = 40


def compact(value: Any) -> Any:
    """`value` (decoded JSON) with its keys and short strings shared: every watch event is
    decoded on its own, so each cached object would otherwise hold its own copy of every
    key (`lastTransitionTime`, `gpuUUIDs`, ...) and of every repeated value (`True`, a
    reason, a product name, a node name): about half of the caches' strings.

    A value nested deeper than the interpreter's recursion limit (an inline model config
    takes any fields) is kept as it is: an index handler that raised would drop the job
    from the cache, and with it its decision."""
    try:
        return _compact(value)
    except RecursionError:
        return value


def _compact(value: Any) -> Any:
    if type(value) is dict:
        return {(intern(k) if type(k) is str else k): _compact(v) for k, v in value.items()}
    if type(value) is list:
        return [_compact(v) for v in value]
    if type(value) is str and len(value) <= _SHARED_MAX:
        return intern(value)
    return value


def _meta(body: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {key: meta[key] for key in keys if key in meta}


#: Annotations admission never reads and that can be as large as the object itself.
_HEAVY_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def slim_job(body: Mapping[str, Any]) -> dict[str, Any]:
    """A FineTuneJob without its managedFields and kubectl's last-applied copy of itself:
    together often more than half of what the API server sends for it."""
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and any(key in annotations for key in _HEAVY_ANNOTATIONS):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in _HEAVY_ANNOTATIONS}
    return compact({**{k: v for k, v in body.items() if k != "metadata"}, "metadata": meta})


def slim_node(body: Mapping[str, Any]) -> dict[str, Any]:
    status = body.get("status") or {}
    allocatable = status.get("allocatable") or {}
    capacity = status.get("capacity") or {}
    return {
        "metadata": _meta(body, "name", "labels"),
        "spec": {
            "unschedulable": bool((body.get("spec") or {}).get("unschedulable")),
            # Which jobs' pods may run there (packing/constraints.py).
            "taints": [dict(t) for t in (body.get("spec") or {}).get("taints") or []],
        },
        "status": {
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ],
            "allocatable": {GPU_RESOURCE: allocatable[GPU_RESOURCE]}
            if GPU_RESOURCE in allocatable
            else {},
            # How many GPUs a node has whose agent has not reported them (cluster.gpu_count).
            "capacity": {GPU_RESOURCE: capacity[GPU_RESOURCE]} if GPU_RESOURCE in capacity else {},
        },
    }


def slim_gpunode(body: Mapping[str, Any]) -> dict[str, Any]:
    return compact({"metadata": _meta(body, "name"), "status": dict(body.get("status") or {})})


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    spec = body.get("spec") or {}
    status = body.get("status") or {}

    def gpu_only(container: Mapping[str, Any]) -> dict[str, Any]:
        resources = container.get("resources") or {}
        return {
            "name": container.get("name"),
            "resources": {
                part: {GPU_RESOURCE: (resources.get(part) or {})[GPU_RESOURCE]}
                for part in ("limits", "requests")
                if GPU_RESOURCE in (resources.get(part) or {})
            },
        }

    return {
        "metadata": _meta(body, "name", "namespace", "uid", "labels", "deletionTimestamp"),
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [gpu_only(c) for c in spec.get("containers") or []],
            "initContainers": [gpu_only(c) for c in spec.get("initContainers") or []],
        },
        "status": {
            **{
                key: status[key]
                for key in ("phase", "reason", "message", "conditions")
                if key in status
            },
            # An init container's too: one that cannot pull or keeps failing is why the
            # pod waits or failed (`controller.workload.state`).
            **{
                key: [slim_container_status(c) for c in status[key] if isinstance(c, Mapping)]
                for key in ("initContainerStatuses", "containerStatuses")
                if isinstance(status.get(key), list)
            },
        },
    }


def slim_container_status(container: Mapping[str, Any]) -> dict[str, Any]:
    """A container's status as admission reads it: its name and states (why it waits, how
    it ended: `controller.workload.state`) and its image's digest alone (the trainer's is
    the job's learned key: `observed.reported_digest`), shared. The rest (image, containerID,
    resources, volume mounts) is the kubelet's."""
    kept: dict[str, Any] = {
        key: container[key] for key in ("state", "lastState") if key in container
    }
    if isinstance(container.get("name"), str):
        kept["name"] = intern(container["name"])
    digest = image_digest(container.get("imageID"))
    if digest is not None:
        kept["imageID"] = intern(digest)
    return kept


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A FineTuneJob's batch Job as admission reads it; for one handed to Kueue, whether Kueue
    holds it (`suspend`) and the placement vramgate's check gave its pods."""
    spec = body.get("spec") or {}
    kept = {key: spec[key] for key in ("completions", "parallelism", "suspend") if key in spec}
    annotations = (((spec.get("template") or {}).get("metadata") or {}).get("annotations")) or {}
    if kueue.PLACEMENT_ANNOTATION in annotations:
        placement = annotations[kueue.PLACEMENT_ANNOTATION]
        kept["template"] = {"metadata": {"annotations": {kueue.PLACEMENT_ANNOTATION: placement}}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(
            body,
            "name",
            "namespace",
            "uid",
            "labels",
            "ownerReferences",
            "deletionTimestamp",
            "creationTimestamp",  # how long it has had no pod (workload/state.py)
        ),
        "spec": kept,
        "status": dict(body.get("status") or {}),
    }


def slim_priority_class(body: Mapping[str, Any]) -> dict[str, Any]:
    """A PriorityClass as ranking reads it: its name, value and whether it is the default."""
    return {
        "metadata": _meta(body, "name"),
        "value": body.get("value"),
        "globalDefault": body.get("globalDefault") is True,
    }


def slim_learned(body: Mapping[str, Any]) -> dict[str, Any]:
    """A LearnedCorrection as admission reads it: its name, resourceVersion (its status is
    written only if unchanged since), spec and status."""
    return compact(
        {
            "metadata": _meta(body, "name", "resourceVersion"),
            "spec": dict(body.get("spec") or {}),
            "status": dict(body.get("status") or {}),
        }
    )


_WORKLOAD_META = (
    "name",
    "namespace",
    "uid",
    "generation",
    "resourceVersion",
    "creationTimestamp",
    "ownerReferences",
    "deletionTimestamp",
)


def slim_kueue_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Kueue Workload as the check reads it: its podSets with only what a decision reads
    of their templates (GPU requests, node constraints, vramgate's annotation), its active
    flag, and its status's conditions and admission checks."""
    spec = body.get("spec") or {}

    def template(pod_set: Mapping[str, Any]) -> dict[str, Any]:
        tpl = pod_set.get("template") or {}
        annotations = (tpl.get("metadata") or {}).get("annotations") or {}
        pod_spec = tpl.get("spec") or {}
        constraints = ("nodeSelector", "affinity", "tolerations")
        kept = {k: pod_spec[k] for k in constraints if k in pod_spec}
        for part in ("containers", "initContainers"):
            kept[part] = [
                {"name": c.get("name"), "resources": c.get("resources") or {}}
                for c in pod_spec.get(part) or []
                if isinstance(c, Mapping)
            ]
        meta = {}
        if kueue.SPEC_ANNOTATION in annotations:
            meta["annotations"] = {kueue.SPEC_ANNOTATION: annotations[kueue.SPEC_ANNOTATION]}
        return {"metadata": meta, "spec": kept}

    status = body.get("status") or {}
    meta = _meta(body, *_WORKLOAD_META)
    gate = ((body.get("metadata") or {}).get("annotations") or {}).get(kueue.GATE_ANNOTATION)
    if gate is not None:  # whom Kueue waits for before it admits (`kueue.to_resize`)
        meta["annotations"] = {kueue.GATE_ANNOTATION: gate}
    return compact(
        {
            "metadata": meta,
            "spec": {
                "active": spec.get("active", True),
                "priority": spec.get("priority"),
                "podSets": [
                    {"name": p.get("name"), "count": p.get("count"), "template": template(p)}
                    for p in spec.get("podSets") or []
                ],
            },
            "status": {
                "conditions": [_workload_condition(c) for c in status.get("conditions") or []],
                "admissionChecks": list(status.get("admissionChecks") or []),
                # The flavors (their node labels) and pod counts Kueue reserved quota for.
                "admission": {
                    "podSetAssignments": [
                        {k: a.get(k) for k in ("name", "flavors", "count") if k in a}
                        for a in (status.get("admission") or {}).get("podSetAssignments") or []
                        if isinstance(a, Mapping)
                    ]
                },
            },
        }
    )


def slim_resource_flavor(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceFlavor as a Workload's node selection reads it."""
    spec = body.get("spec") or {}
    return {
        "metadata": _meta(body, "name"),
        "spec": {k: spec[k] for k in ("nodeLabels", "tolerations") if k in spec},
    }


def _workload_condition(condition: Mapping[str, Any]) -> dict[str, Any]:
    """A Workload's condition as the check reads it; QuotaReserved's message too (why Kueue
    reserves no quota, a LocalQueue that does not exist say: said on a FineTuneJob)."""
    kept = {k: condition.get(k) for k in ("type", "status", "reason")}
    if condition.get("type") == "QuotaReserved":
        kept["message"] = str(condition.get("message") or "")[:300]
    return kept


def slim_admission_check(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": _meta(body, "name"),
        "spec": {"controllerName": (body.get("spec") or {}).get("controllerName")},
        "status": {"conditions": list((body.get("status") or {}).get("conditions") or [])},
    }


def gpu_or_job_pod(body: kopf.Body, **_: Any) -> bool:
    labels = (body.get("metadata") or {}).get("labels") or {}
    return JOB_LABEL in labels or pod_gpus(body) > 0


def _controller_ref(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The FineTuneJob that owns a workload: its controller ownerReference."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "FineTuneJob" and ref.get("controller"):
            return ref
    return None


def _owner_key(body: Mapping[str, Any]) -> str | None:
    ref = _controller_ref(body)
    if ref is None:
        return None
    return f"{(body.get('metadata') or {}).get('namespace')}/{ref.get('name')}"


def _owner_uid(body: Mapping[str, Any]) -> str | None:
    ref = _controller_ref(body)
    return None if ref is None else str(ref.get("uid"))


def register(
    registry: kopf.OperatorRegistry, with_kueue: bool = False, with_trainer: bool = False
) -> None:
    """The seven indexes (three more `with_kueue`, two `with_trainer`), under the ids
    `Caches.of` reads them by.

    Coroutines, so kopf calls them on its event loop: a plain function is run in kopf's
    thread pool, two thread hops per watch event for a fraction of a millisecond's work."""

    def by_name(slim: Any) -> Any:
        async def index(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
            return {name: slim(body)}

        return index

    async def finetunejobs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {f"{namespace}/{name}": slim_job(body)}

    async def pods(body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {str((body.get("metadata") or {}).get("uid")): slim_pod(body)}

    async def workloads(body: kopf.Body, **_: Any) -> dict[str, Any] | None:
        owner = _owner_key(body)
        return None if owner is None else {owner: slim_workload(body)}

    kopf.index(GROUP, VERSION, PLURAL, id=FINETUNEJOBS, registry=registry)(cast(Any, finetunejobs))
    kopf.index(GROUP, VERSION, GPUNODE_PLURAL, id=GPUNODES, registry=registry)(
        by_name(slim_gpunode)
    )
    kopf.index("v1", "nodes", id=NODES, registry=registry)(by_name(slim_node))
    kopf.index("v1", "pods", id=PODS, when=gpu_or_job_pod, registry=registry)(pods)
    kopf.index("batch", "v1", "jobs", id=WORKLOADS, labels=WORKLOAD_LABELS, registry=registry)(
        workloads
    )
    kopf.index(*PRIORITY_CLASS_RESOURCE, id=PRIORITY_CLASSES, registry=registry)(
        by_name(slim_priority_class)
    )
    kopf.index(GROUP, VERSION, LEARNED_PLURAL, id=LEARNED, registry=registry)(by_name(slim_learned))
    if with_kueue:

        async def kueue_workloads(body: kopf.Body, **_: Any) -> dict[str, Any]:
            return {kueue.workload_key(body): slim_kueue_workload(body)}

        kopf.index(*KUEUE_WORKLOAD_RESOURCE, id=KUEUE_WORKLOADS, registry=registry)(
            cast(Any, kueue_workloads)
        )
        kopf.index(*ADMISSION_CHECK_RESOURCE, id=ADMISSION_CHECKS, registry=registry)(
            by_name(slim_admission_check)
        )
        kopf.index(*RESOURCE_FLAVOR_RESOURCE, id=RESOURCE_FLAVORS, registry=registry)(
            by_name(slim_resource_flavor)
        )
    if with_trainer:

        async def training_runtimes(
            namespace: str, name: str, body: kopf.Body, **_: Any
        ) -> dict[str, Any]:
            return {f"{namespace}/{name}": compact(runtimes.slim(body))}

        kopf.index(
            *CLUSTER_TRAINING_RUNTIME_RESOURCE, id=CLUSTER_TRAINING_RUNTIMES, registry=registry
        )(by_name(lambda body: compact(runtimes.slim(body))))
        kopf.index(*TRAINING_RUNTIME_RESOURCE, id=TRAINING_RUNTIMES, registry=registry)(
            cast(Any, training_runtimes)
        )


#: How many times `Caches.runtime` reads a store that kopf's loop changes under it.
_RUNTIME_READS = 3


def _values(index: Mapping[Any, Any]) -> Iterator[Any]:
    for store in index.values():
        yield from store


@dataclass
class Caches:
    """The seven indexes, as the handlers receive them."""

    finetunejobs: Mapping[Any, Any]
    gpunodes: Mapping[Any, Any]
    nodes: Mapping[Any, Any]
    pods: Mapping[Any, Any]
    workloads: Mapping[Any, Any]
    priority_classes: Mapping[Any, Any] = field(default_factory=dict)
    learned: Mapping[Any, Any] = field(default_factory=dict)
    kueue_workloads: Mapping[Any, Any] = field(default_factory=dict)
    admission_checks: Mapping[Any, Any] = field(default_factory=dict)
    resource_flavors: Mapping[Any, Any] = field(default_factory=dict)
    cluster_training_runtimes: Mapping[Any, Any] = field(default_factory=dict)
    training_runtimes: Mapping[Any, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, kwargs: Mapping[str, Any]) -> Caches:
        return cls(
            *(kwargs[name] for name in INDEXES),
            *(kwargs.get(n, {}) for n in (*KUEUE_INDEXES, *TRAINER_INDEXES)),
        )

    def runtime(self, ref: runtimes.RuntimeRef) -> Mapping[str, Any] | None:
        """The Trainer runtime `ref` names, as cached (`trainer_runtime.slim`); None where
        it is not (yet) in the cache.

        Called on the review server's thread while kopf's loop may change the index: a
        lookup is a read of two dicts (the index's, its store's), which kopf changes only by
        setting or deleting a key (each cached value is a new object, never changed in
        place). Iterating a store while kopf adds or drops one of its values raises
        RuntimeError: read again (`_RUNTIME_READS` times), then None (the TrainJob is then
        sized as with a runtime not cached yet, and its warning says so)."""
        index = self.training_runtimes if ref.namespace else self.cluster_training_runtimes
        for _ in range(_RUNTIME_READS):
            try:
                return cast(Mapping[str, Any] | None, next(iter(index.get(ref.key, ())), None))
            except RuntimeError:  # changed size during iteration: kopf's loop wrote it
                continue
        return None

    def objects(
        self, jobs: Iterable[Mapping[str, Any]] | None = None
    ) -> tuple[ClusterObjects, dict[str, dict[str, Any]], dict[str, list[Any]]]:
        """The cluster now: the objects admission reads, the workloads by job key, and each
        job's pods by job key. Read in one go, without awaiting, so it is one moment's view.

        `jobs`, a fresh list from the API server (a new leader's), replaces the cached jobs,
        and workloads and pods are matched against it: matched against the cache's, a job
        re-created meanwhile would be paired with its deleted namesake's workload."""
        objects = ClusterObjects()
        for node in _values(self.nodes):
            objects.nodes[node["metadata"]["name"]] = node
        for gpunode in _values(self.gpunodes):
            objects.gpunodes[gpunode["metadata"]["name"]] = gpunode
        objects.pods = list(_values(self.pods))
        for priority_class in _values(self.priority_classes):
            objects.priority_classes[priority_class["metadata"]["name"]] = priority_class
        for job in _values(self.finetunejobs) if jobs is None else jobs:
            objects.jobs[job_key(job)] = job
        workloads: dict[str, dict[str, Any]] = {}
        for key, store in self.workloads.items():
            job = objects.jobs.get(key)
            uid = None if job is None else (job.get("metadata") or {}).get("uid")
            for workload in store:
                meta = workload.get("metadata") or {}
                # A deleted namesake's, until the garbage collector removes it, is not this
                # job's: taken for it, its end would be this job's end.
                if not meta.get("deletionTimestamp") and _owner_uid(workload) == uid:
                    workloads[key] = workload
        job_pods = pods_by_job(objects.pods, objects.jobs)
        objects.kueue_checks = kueue.our_checks(_values(self.admission_checks))
        if objects.kueue_checks:
            for flavor in _values(self.resource_flavors):
                objects.kueue_flavors[flavor["metadata"]["name"]] = flavor
            for workload in _values(self.kueue_workloads):
                if not (workload.get("metadata") or {}).get("deletionTimestamp"):
                    objects.kueue_workloads[kueue.workload_key(workload)] = workload
        return objects, workloads, job_pods

    def learned_objects(self) -> list[Any]:
        """The LearnedCorrections, as cached."""
        return list(_values(self.learned))
