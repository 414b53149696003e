"""The API's objects, as plain dicts, read into what admission decides on.

Nodes, GPUNodes, Pods and FineTuneJobs (as `kubectl get -o yaml` prints them, or as the
operator's caches hold them) become the packer's `Snapshot`: each node's labels and health,
the GPUs its agent measured, the GPUs its pods hold, and the reservations of jobs already
admitted (their `status.placement`). A GPU node whose GPUNode lists no GPUs (none yet, or
deleted and not yet made again by its agent) is a node whose GPUs are not yet reported, as
many and as large as its Node says, never a node without GPUs. Jobs not admitted yet become
`JobRequest`s through the same spec translation the webhook and the operator use, each ranked
by the PriorityClasses among the objects (`controller.admission.priority`). Pure: no I/O, no
Kubernetes client.

A compact cluster description (`nodes:` with their GPUs' memory, `compact.py`) serves
`vramgate plan` for clusters that do not exist yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller.admission import holds, kueue
from controller.admission.compact import CompactProblem, compact_nodes
from controller.admission.dump_checks import object_problem
from controller.admission.holds import Hold
from controller.admission.pods import live_pods, pod_gpus, quantity
from controller.admission.priority import Priorities
from controller.api.base import (
    COUNT_LABEL,
    GPU_RESOURCE,
    GROUP,
    JOB_LABEL,
    JOB_UID_LABEL,
    MEMORY_LABEL,
    PRESENT_LABEL,
    PRODUCT_LABEL,
)
from controller.api.conditions import ADMITTED, FAILED, READY, SUCCEEDED, find_condition
from controller.api.names import job_label_value
from controller.base.errors import PermanentError
from controller.base.units import MIB
from controller.decision.types import JobRequest
from controller.estimator import Estimate, SpecError, SpecErrors
from controller.jobs.spec import JobPlan, config_map_ref, translate
from controller.packing.constraints import from_pod_template
from controller.packing.inventory import (
    GpuDevice,
    NodeGpus,
    NodeState,
    Reservation,
    Snapshot,
    Taint,
)


class ClusterError(PermanentError, ValueError):
    """A cluster object or description that cannot be read: `where` says which one."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass
class ClusterObjects:
    """The objects of one cluster, by kind; FineTuneJobs keyed `namespace/name`."""

    nodes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    gpunodes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    pods: list[Mapping[str, Any]] = field(default_factory=list)
    jobs: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    config_maps: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: PriorityClasses (scheduling.k8s.io) by name: what ranks the jobs.
    priority_classes: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    compact: list[NodeState] = field(default_factory=list)
    #: Where each job came from (`FILE: document N`), for messages.
    origin: dict[str, str] = field(default_factory=dict)
    #: LearnedCorrections by name: what admission learned, which corrects the jobs' figures.
    learned: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Kueue Workloads by `kueue.workload_key`, and the names of the AdmissionChecks vramgate
    #: answers: a Workload whose check is Ready holds GPUs in the same ledger (`kueue.py`).
    kueue_workloads: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    kueue_checks: frozenset[str] = frozenset()
    #: Kueue's ResourceFlavors by name: the node labels and tolerations of a Workload's.
    kueue_flavors: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    #: What the TrainJob webhook promised TrainJobs it sized a moment ago (`holds`): charged
    #: as reservations until their pods' memory shows in the readings.
    holds: tuple[Hold, ...] = ()

    def add(self, obj: Mapping[str, Any], where: str) -> None:
        """One object (a `List` adds its items); unknown kinds are ignored."""
        kind = obj.get("kind")
        if kind == "List" or (isinstance(kind, str) and kind.endswith("List")):
            for i, item in enumerate(obj.get("items") or []):
                self.add(item, f"{where} item {i}")
            return
        if kind is None and "nodes" in obj:
            known = {node.name for node in self.compact}
            try:
                described = compact_nodes(obj)
            except CompactProblem as wrong:
                raise ClusterError(where, str(wrong)) from None
            for node in described:
                if node.name in known:  # merged, it would plan on half of what was described
                    raise ClusterError(where, f"nodes: node {node.name!r} is described twice")
                known.add(node.name)
                self.compact.append(node)
            return
        if not isinstance(kind, str):
            raise ClusterError(where, "must be a Kubernetes object (kind) or a `nodes:` list")
        group = str(obj.get("apiVersion") or "").partition("/")[0]
        if group == GROUP and kind not in VRAMGATE_KINDS:
            allowed = ", ".join(VRAMGATE_KINDS)
            raise ClusterError(where, f"kind: {kind!r} is not one of {GROUP}'s: {allowed}")
        name = _name(obj, where)
        problem = object_problem(obj)
        if problem:
            raise ClusterError(where, f"{kind} {name}: {problem}")
        if kind == "Node":
            self.nodes[name] = obj
        elif kind == "GPUNode":
            self.gpunodes[name] = obj
        elif kind == "Pod":
            self.pods.append(obj)
        elif kind == "FineTuneJob":
            key = job_key(obj)
            if key in self.jobs:
                raise ClusterError(where, f"FineTuneJob {key} is given twice")
            self.jobs[key] = obj
            self.origin[key] = where
        elif kind == "ConfigMap":
            self.config_maps[job_key(obj)] = obj
        elif kind == "PriorityClass" and group in (SCHEDULING_GROUP, ""):
            self.priority_classes[name] = obj
        elif kind == "LearnedCorrection":
            self.learned[name] = obj

    def priorities(self, raw_namespaces: Set[str] = frozenset()) -> Priorities:
        """What ranks these jobs: their PriorityClasses, and the namespaces whose jobs'
        spec.priority is honoured."""
        return Priorities(self.priority_classes, raw_namespaces)


#: The API group of PriorityClasses.
SCHEDULING_GROUP = "scheduling.k8s.io"


#: The kinds vramgate.dev serves.
VRAMGATE_KINDS = ("FineTuneJob", "GPUNode", "LearnedCorrection")


def job_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def pods_key(job: Mapping[str, Any]) -> str:
    """`namespace/<JOB_LABEL value>` of a job's pods: its name, or for a name too long to be
    a label value, its workload name."""
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{job_label_value(str(meta.get('name')))}"


def pods_by_job(
    pods: Iterable[Mapping[str, Any]], jobs: Mapping[str, Mapping[str, Any]]
) -> dict[str, list[Mapping[str, Any]]]:
    """The pods of each of `jobs` (by job key): labelled with its name and, where a pod has
    the uid label (workloads made since it exists), with its uid."""
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(JOB_LABEL)
        if owner:
            by_label.setdefault(f"{meta.get('namespace') or 'default'}/{owner}", []).append(pod)
    found: dict[str, list[Mapping[str, Any]]] = {}
    for key, job in jobs.items():
        labelled = by_label.get(pods_key(job))
        if not labelled:
            continue
        uid = str((job.get("metadata") or {}).get("uid"))
        own = [p for p in labelled if _labels(p).get(JOB_UID_LABEL, uid) == uid]
        if own:
            found[key] = own
    return found


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: Mapping[str, Any], where: str) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ClusterError(where, "metadata.name is required")
    return name


# -- Nodes, GPUNodes, Pods -> Snapshot ------------------------------------------------------


def node_state(
    name: str, node: Mapping[str, Any] | None, gpunode: Mapping[str, Any], allocated: int
) -> NodeState:
    """One node from its Node (None: unknown, so not placeable) and GPUNode."""
    status = gpunode.get("status") or {}
    gpus = tuple(_device(gpu) for gpu in status.get("gpus") or [])
    agent = find_condition(status.get("conditions") or [], READY)
    heartbeat = parse_time(status.get("heartbeatTime"))
    if node is None:
        return NodeState(name, gpus, ready=False, heartbeat=heartbeat)
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    node_status = node.get("status") or {}
    ready = find_condition(node_status.get("conditions") or [], "Ready")
    return NodeState(
        name,
        gpus,
        labels=dict(meta.get("labels") or {}),
        ready=ready is None or ready.get("status") == "True",
        cordoned=bool(spec.get("unschedulable")),
        agent_ready=agent is not None and agent.get("status") == "True",
        heartbeat=heartbeat,
        gpu_allocatable=quantity((node_status.get("allocatable") or {}).get(GPU_RESOURCE)),
        gpu_allocated=allocated,
        taints=tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or []
            if isinstance(t, Mapping)
        ),
    )


def unreported_node_state(name: str, node: Mapping[str, Any], allocated: int) -> NodeState:
    """A GPU node whose GPUNode lists no GPUs: its health from the Node, and the GPUs the
    Node says it has (`gpu_count`), as large as GPU feature discovery's label says (unknown
    without one), with no UUID and no free memory: no agent read them."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    mib = quantity(labels.get(MEMORY_LABEL))
    product = str(labels.get(PRODUCT_LABEL) or "")
    gpus = tuple(
        GpuDevice("", i, product, None if not mib else mib * MIB, None)
        for i in range(gpu_count(node))
    )
    return replace(node_state(name, node, {}, allocated), gpus=gpus, reported=False)


def gpu_count(node: Mapping[str, Any]) -> int:
    """The GPUs a Node says it has: the most of its `nvidia.com/gpu` capacity, allocatable
    (0 while the device plugin restarts) and GPU feature discovery's count label."""
    status = node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    said = (
        quantity((status.get("capacity") or {}).get(GPU_RESOURCE)),
        quantity((status.get("allocatable") or {}).get(GPU_RESOURCE)),
        quantity(labels.get(COUNT_LABEL)),
    )
    return max((n for n in said if n is not None), default=0)


def gpu_node(node: Mapping[str, Any]) -> bool:
    """Whether a Node has NVIDIA GPUs: the GPU operator's label, or GPUs in its resources."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(PRESENT_LABEL) == "true" or gpu_count(node) > 0


def _lists_gpus(gpunode: Mapping[str, Any]) -> bool:
    return bool((gpunode.get("status") or {}).get("gpus"))


def _device(gpu: Mapping[str, Any]) -> GpuDevice:
    supported = gpu.get("memoryInfoSupported", True)
    pods = {
        str(p["uid"]): int(p["usedBytes"])
        for p in gpu.get("pods") or []
        if p.get("uid") and p.get("usedBytes") is not None
    }
    return GpuDevice(
        uuid=str(gpu.get("uuid")),
        index=int(gpu.get("index") or 0),
        product=str(gpu.get("product") or ""),
        total_bytes=gpu.get("totalBytes") if supported else None,
        free_bytes=gpu.get("freeBytes") if supported else None,
        pod_used_bytes=pods,
        mig=gpu.get("mig") is not None,
    )


def parse_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def has_template(job: Mapping[str, Any]) -> bool:
    """Whether the job has a trainer pod template: without one nothing runs, and admission
    only says what it would do (NoTemplate)."""
    return bool((job.get("spec") or {}).get("template"))


def finished(job: Mapping[str, Any]) -> bool:
    """Whether the job's workload succeeded or failed: it holds nothing and waits for nothing."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in (SUCCEEDED, FAILED) and c.get("status") == "True" for c in conditions
    )


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The Kueue LocalQueue the job is Kueue's in, or None: the one it was handed to
    (status.queueName) whatever its spec says now; else spec.queueName, unless vramgate
    admitted it itself (a queue named after that is a change of an admitted job's spec, which
    is locked). So the ledger never counts a job both here and in its Kueue Workload, nor
    in neither."""
    status = job.get("status") or {}
    handed = status.get("queueName")
    if isinstance(handed, str) and handed:
        return handed
    admitted = find_condition(status.get("conditions") or [], ADMITTED)
    if status.get("placement") and admitted is not None and admitted.get("status") == "True":
        return None
    spec = job.get("spec")
    found = spec.get("queueName") if isinstance(spec, Mapping) else None
    return found if isinstance(found, str) and found else None


def admitted_by_kueue(job: Mapping[str, Any]) -> bool:
    """Whether the job, handed to Kueue, runs there (its spec is then locked as an admitted
    job's is)."""
    status = job.get("status") or {}
    admitted = find_condition(status.get("conditions") or [], ADMITTED)
    return (
        bool(status.get("queueName"))
        and admitted is not None
        and (admitted.get("status") == "True")
    )


def reservation(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> Reservation | None:
    """The hold of an admitted job (Admitted=True with a placement, not finished), with its
    live pods. A job handed to Kueue holds none itself: its Workload holds its GPUs, once
    vramgate's check placed it (`kueue.reservation`)."""
    if queue_name(job) is not None:
        return None
    status = job.get("status") or {}
    admitted = find_condition(status.get("conditions") or [], ADMITTED)
    placement = status.get("placement")
    if admitted is None or admitted.get("status") != "True" or not placement or finished(job):
        return None
    parts = tuple(
        NodeGpus(
            str(part["node"]),
            tuple(int(i) for i in part.get("gpuIndices") or []),
            tuple(str(u) for u in part.get("gpuUUIDs") or []),
        )
        for part in placement.get("nodes") or []
    )
    uids: set[str] = set()
    allocated: dict[str, int] = {}
    for pod in pods:
        uids.add(str((pod.get("metadata") or {}).get("uid")))
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            allocated[node] = allocated.get(node, 0) + pod_gpus(pod)
    return Reservation(
        job_key(job),
        parts,
        int(placement.get("perGpuBytes") or 0),
        frozenset(uids),
        allocated,
    )


def snapshot(objects: ClusterObjects, now: datetime | None) -> Snapshot:
    """The packer's snapshot of these objects. `now` judges heartbeats (None: never stale)."""
    return snapshot_and_settled(objects, now)[0]


def snapshot_and_settled(
    objects: ClusterObjects, now: datetime | None
) -> tuple[Snapshot, frozenset[str]]:
    """`snapshot`, and the jobs of the holds it no longer charges (`holds.settled`: their
    pods' memory shows in the readings), which the operator ends: one pass over the holds
    and the readings for both."""
    live = list(live_pods(objects.pods))
    allocated: dict[str, int] = {}
    for pod in live:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            allocated[node] = allocated.get(node, 0) + pod_gpus(pod)
    by_job = pods_by_job(live, objects.jobs)
    nodes = []
    for name, gpunode in objects.gpunodes.items():
        node = objects.nodes.get(name)
        if node is not None and not _lists_gpus(gpunode) and gpu_node(node):
            nodes.append(unreported_node_state(name, node, allocated.get(name, 0)))
        else:
            nodes.append(node_state(name, node, gpunode, allocated.get(name, 0)))
    for name, node in objects.nodes.items():
        if name not in objects.gpunodes and gpu_node(node):
            nodes.append(unreported_node_state(name, node, allocated.get(name, 0)))
    reservations = []
    for job in objects.jobs.values():
        held = reservation(job, by_job.get(job_key(job), []))
        if held is not None:
            reservations.append(held)
    if objects.kueue_checks:
        by_workload = kueue.pods_of(live)
        for workload in objects.kueue_workloads.values():
            uid = str((workload.get("metadata") or {}).get("uid"))
            hold = kueue.reservation(workload, objects.kueue_checks, by_workload.get(uid, []))
            if hold is not None:
                reservations.append(hold)
    measured = {node.name for node in nodes}
    for node in objects.compact:
        if node.name in measured:
            raise ClusterError(
                f"node {node.name}", "is described twice (a GPUNode or GPU Node, and nodes:)"
            )
    compact = [replace(node, heartbeat=now) for node in objects.compact]
    settled: frozenset[str] = frozenset()
    if objects.holds:  # until their pods' memory shows in the readings
        kept, settled = holds.charged(objects.holds, live, nodes + compact)
        reservations += kept
    return Snapshot(tuple(nodes + compact), tuple(reservations), now), settled


def pending_jobs(objects: ClusterObjects) -> dict[str, Mapping[str, Any]]:
    """The FineTuneJobs that hold no reservation and have not finished: what admission
    decides."""
    return {
        key: job
        for key, job in objects.jobs.items()
        if reservation(job, []) is None and not finished(job)
    }


# -- FineTuneJob -> JobRequest --------------------------------------------------------------

#: An estimate of (the job's plan, the job, its ConfigMap's config.json or None): the job
#: and the config are what a traced estimate kept in its status was computed from.
Estimator = Callable[[JobPlan, Mapping[str, Any], Mapping[str, Any] | None], Estimate]


def model_config(
    job: Mapping[str, Any], config_maps: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The config.json of the ConfigMap the job names, None where its spec holds its model;
    SpecError naming the field where the ConfigMap or its key cannot be read."""
    spec = job.get("spec")
    ref = config_map_ref(spec) if isinstance(spec, Mapping) else None
    if ref is None:
        return None
    namespace = (job.get("metadata") or {}).get("namespace") or "default"
    found = config_maps.get(f"{namespace}/{ref.name}")
    data = None if found is None else found.get("data") or {}
    return ref.config_in(namespace, data if isinstance(data, Mapping | None) else {})


def job_request(
    job: Mapping[str, Any],
    plan: JobPlan,
    estimate: Estimate,
    priorities: Priorities | None = None,
) -> JobRequest:
    """The job as admission decides it, ranked by `priorities` (None: no PriorityClasses, no
    raw priority allowed: a single job's decision, which no rank changes)."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    template = spec.get("template") if isinstance(spec.get("template"), Mapping) else None
    rank = (priorities or Priorities()).of(
        str(meta.get("namespace") or "default"), plan.priority, plan.priority_class_name, template
    )
    return JobRequest(
        key=job_key(job),
        estimate=estimate,
        parallelism=plan.parallelism,
        gpus=plan.gpus,
        policy=plan.admission_policy,
        min_gpus=plan.min_gpus,
        max_gpus=plan.max_gpus,
        selector=plan.gpu_selector,
        constraints=from_pod_template(job["spec"]["template"]) if has_template(job) else None,
        priority=rank.value,
        created=parse_time(meta.get("creationTimestamp")),
        suspend=plan.suspend,
        priority_problem=rank.problem,
        warnings=rank.warnings,
    )


def requests(
    jobs: Mapping[str, Mapping[str, Any]],
    config_maps: Mapping[str, Mapping[str, Any]],
    estimator: Estimator,
    origin: Mapping[str, str] | None = None,
    priorities: Priorities | None = None,
) -> tuple[list[JobRequest], dict[str, JobPlan], dict[str, ClusterError]]:
    """Every valid job as a request ranked by `priorities`, and each invalid one's error
    naming it (where it came from, the field): the caller decides whether an invalid job is
    the user's input to refuse or the cluster's state to report."""
    out, plans, invalid = [], {}, {}
    for key, job in jobs.items():
        where = f"{(origin or {}).get(key, 'FineTuneJob')} ({key})"
        try:
            config = model_config(job, config_maps)
        except SpecError as error:
            invalid[key] = ClusterError(where, str(SpecErrors([error])))
            continue
        plan, errors = translate(job.get("spec"), config)
        if plan is None:
            invalid[key] = ClusterError(where, str(SpecErrors(errors)))
            continue
        try:
            estimate = estimator(plan, job, config)
        except SpecError as error:
            invalid[key] = ClusterError(where, str(error))
            continue
        out.append(job_request(job, plan, estimate, priorities))
        plans[key] = plan
    return out, plans, invalid
