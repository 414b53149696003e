"""An admitted FineTuneJob -> the Kubernetes objects that run it on the GPUs admission chose.

One node: a batch/v1 Job of one pod. k nodes x g GPUs (DDP or FSDP with torchrun): an
Indexed Job of k pods, one per node, and a headless Service whose DNS name of pod 0 is
torchrun's MASTER_ADDR. Every object is owned by the FineTuneJob (deleting the job collects
its workload) and labelled with it: its name (the operator finds the pods by it) and its uid
(`kubectl get job -l vramgate.dev/finetunejob-uid=<uid>`, whatever the name).

How the pods get their GPUs depends on the cluster's GPU mode:

* `devicePlugin`: the trainer container asks for `nvidia.com/gpu: g` and the pod is pinned
  to the chosen nodes; the device plugin picks which of the node's GPUs.
* `visibleDevices`: no GPU resource; the chosen UUIDs in NVIDIA_VISIBLE_DEVICES (and
  CUDA_VISIBLE_DEVICES) on the one chosen node: GPUs shared by memory.
* `dra`: a ResourceClaim (one node) or ResourceClaimTemplate (k nodes: one claim per pod)
  whose CEL selector names the chosen UUIDs, so the scheduler allocates exactly those.

`backoffLimit: 0`: a training failure (an OOM above all) is reported, not retried into the
same failure; `FallbackToLogsOnError` puts the log tail of a crash, a CUDA out-of-memory's
traceback included, into the pod status where `state.py` reads it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.api.base import API_VERSION, GPU_RESOURCE, JOB_LABEL, JOB_UID_LABEL
from controller.api.names import job_label_value, workload_name
from controller.base.errors import PermanentError
from controller.packing.constraints import GPU_TOLERATION
from controller.packing.inventory import GpuMode, NodeGpus

#: The driver of the NVIDIA DRA driver for GPUs (k8s-dra-driver-gpu), which is also the
#: domain of its device attributes. Its kubelet plugin publishes each GPU as device
#: `gpu-<minor>` with the unqualified attribute `uuid` (string; MIG and VFIO devices too),
#: which a CEL selector reads as `device.attributes["gpu.nvidia.com"].uuid`
#: (NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/deviceinfo.go, GpuInfo.GetDevice).
DRA_DRIVER = "gpu.nvidia.com"
#: The pod's claim and the claim's one request are both called this.
CLAIM = "gpus"
#: The annotation the Job controller sets on each pod of an Indexed Job: its rank.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
HOSTNAME_KEY = "kubernetes.io/hostname"
RESOURCE_API_VERSION = "resource.k8s.io/v1"
_CONTAINERS = "spec.template.spec.containers"


class WorkloadError(PermanentError, ValueError):
    """The job (or its placement) cannot become a workload; the message names the field.

    Permanent: the same spec fails the same way, so the operator records it and waits for
    the spec to change."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission decided for a job: its GPUs, the memory each holds, the GPU mode."""

    nodes: tuple[NodeGpus, ...]
    per_gpu_bytes: int
    mode: GpuMode
    #: torchrun's rendezvous port on pod 0 (MASTER_PORT).
    master_port: int = 29500
    #: The DeviceClass of the claim (dra mode). The NVIDIA driver's chart installs
    #: `gpu.nvidia.com` for whole GPUs and `mig.nvidia.com` for MIG devices: a placement on
    #: MIG devices needs the latter, as the former selects `type == "gpu"` only.
    device_class: str = "gpu.nvidia.com"

    @property
    def gpus(self) -> int:
        """The total admitted GPUs (nodes x GPUs per node)."""
        return sum(len(node.indices) for node in self.nodes)

    @property
    def gpus_per_node(self) -> int:
        return len(self.nodes[0].indices) if self.nodes else 0


#: Kueue's label that puts a Job in a LocalQueue of its namespace.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass(frozen=True, slots=True)
class Queued:
    """A job handed to Kueue (spec.queueName): its LocalQueue, the annotations its pod
    template carries for vramgate's AdmissionCheck (its training, as the check reads it), and
    the annotation in which the check will name the GPUs chosen (read by the trainer through
    the downward API: VRAMGATE_GPU_UUIDS)."""

    queue: str
    annotations: Mapping[str, str]
    uuids_annotation: str
    #: Annotations of the Job itself (Kueue's admission gate, for a job to be sized first).
    job_annotations: Mapping[str, str] = field(default_factory=dict)
    #: spec.resources.gpuSelector: GPU node labels its pod must land on (the check reads the
    #: pod template's node selection).
    node_selector: Mapping[str, str] = field(default_factory=dict)
    #: spec.priorityClassName: Kueue ranks the Workload by its pods' PriorityClass.
    priority_class: str | None = None


def build_queued_workload(
    job: Mapping[str, Any], gpus: int, per_gpu_bytes: int, queued: Queued
) -> list[dict[str, Any]]:
    """The batch Job of a job handed to Kueue: one pod of `gpus` GPUs (the device plugin's),
    suspended in its LocalQueue and pinned to no node: Kueue starts it once vramgate's
    AdmissionCheck has placed it (podSetUpdates: its node, its placement, its GPUs' UUIDs)."""
    stand_in = Admission((NodeGpus("", tuple(range(gpus)), ()),), per_gpu_bytes,
                         GpuMode.DEVICE_PLUGIN)  # fmt: skip
    try:
        return _build_workload(job, stand_in, queued)
    except WorkloadError:
        raise
    except (TypeError, AttributeError, KeyError, ValueError) as error:
        raise WorkloadError(
            f"spec.template: the workload cannot be built from it ({error}); check its "
            "fields' types against the Pod API"
        ) from None


def build_workload(job: Mapping[str, Any], admission: Admission) -> list[dict[str, Any]]:
    """The objects that run `job` on `admission`'s GPUs, in creation order: the DRA claim
    (or claim template) and the headless Service before the batch/v1 Job that uses them.

    `job` is the FineTuneJob as the API returns it; it is never modified. The API server
    keeps `spec.template` as it was written (preserve-unknown-fields), so a field of the
    wrong type (`resources: "x"`) that no check here names is still a WorkloadError: an
    invalid spec of one job, never an error that stops the admission pass for every job.
    """
    try:
        return _build_workload(job, admission)
    except WorkloadError:
        raise
    except (TypeError, AttributeError, KeyError, ValueError) as error:
        raise WorkloadError(
            f"spec.template: the workload cannot be built from it ({error}); check its "
            "fields' types against the Pod API"
        ) from None


def _build_workload(
    job: Mapping[str, Any], admission: Admission, queued: Queued | None = None
) -> list[dict[str, Any]]:
    meta = _mapping(job.get("metadata"), "metadata")
    job_name = _required_str(meta, "name", "metadata")
    uid = _required_str(meta, "uid", "metadata")
    namespace = str(meta.get("namespace") or "default")
    _check_admission(admission)

    name = workload_name(job_name)
    label = job_label_value(job_name)
    owner = {
        "apiVersion": API_VERSION,
        "kind": "FineTuneJob",
        "name": job_name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }

    def metadata(object_name: str) -> dict[str, Any]:
        return {
            "name": object_name,
            "namespace": namespace,
            "labels": {JOB_LABEL: label, JOB_UID_LABEL: uid},
            "ownerReferences": [dict(owner)],
        }

    template = _pod_template(job)
    pod_spec = _obj(template, "spec", "spec.template")
    pod_labels = _obj(
        _obj(template, "metadata", "spec.template"), "labels", "spec.template.metadata"
    )
    pod_labels[JOB_LABEL] = label
    pod_labels[JOB_UID_LABEL] = uid
    containers: list[dict[str, Any]] = _list(pod_spec, "containers", "spec.template.spec")
    index = _gpu_container(containers)
    trainer, trainer_path = containers[index], f"{_CONTAINERS}[{index}]"
    multi_node = len(admission.nodes) > 1

    env = _placement_env(admission, name)
    if queued is not None:  # the GPUs are known once the check places it: read at start
        where = f"metadata.annotations['{queued.uuids_annotation}']"
        env = [v for v in env if v["name"] != "VRAMGATE_GPU_UUIDS"]
        env.append({"name": "VRAMGATE_GPU_UUIDS",
                    "valueFrom": {"fieldRef": {"fieldPath": where}}})  # fmt: skip
        annotations = _obj(
            _obj(template, "metadata", "spec.template"), "annotations", "spec.template.metadata"
        )
        annotations.update(queued.annotations)
        if queued.node_selector:
            selector = _obj(pod_spec, "nodeSelector", "spec.template.spec")
            selector.update(queued.node_selector)
        if queued.priority_class and not pod_spec.get("priorityClassName"):
            pod_spec["priorityClassName"] = queued.priority_class
    for i, container in enumerate(containers):
        container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        _set_env(container, env, f"{_CONTAINERS}[{i}]")
    if pod_spec.get("restartPolicy") != "OnFailure":
        pod_spec["restartPolicy"] = "Never"
    if queued is None:  # a queued job is pinned by the check's podSetUpdates
        _pin_to_nodes(pod_spec, [node.node for node in admission.nodes])

    objects: list[dict[str, Any]] = []
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(_list(pod_spec, kind, "spec.template.spec", False)):
            _drop_gpu_resource(container, f"spec.template.spec.{kind}[{i}]")
    if admission.mode is GpuMode.DEVICE_PLUGIN:
        count = str(admission.gpus_per_node)
        resources = _obj(trainer, "resources", trainer_path)
        _obj(resources, "limits", f"{trainer_path}.resources")[GPU_RESOURCE] = count
        if "requests" in resources:  # extended resources: requests, if given, equal limits
            _obj(resources, "requests", f"{trainer_path}.resources")[GPU_RESOURCE] = count
        # What the ExtendedResourceToleration admission plugin adds for a GPU request, set
        # here so GPU nodes tainted nvidia.com/gpu take the pods where it does not run:
        # packing places devicePlugin jobs on such nodes (packing/constraints.py).
        tolerations = _list(pod_spec, "tolerations", "spec.template.spec")
        toleration = {"key": GPU_TOLERATION.key, "operator": GPU_TOLERATION.operator,
                      "effect": GPU_TOLERATION.effect}  # fmt: skip
        if toleration not in tolerations:
            tolerations.append(toleration)
    elif admission.mode is GpuMode.VISIBLE_DEVICES:
        visible = ",".join(admission.nodes[0].uuids)
        env = [_env("NVIDIA_VISIBLE_DEVICES", visible), _env("CUDA_VISIBLE_DEVICES", visible)]
        _set_env(trainer, env, trainer_path)
    else:
        objects.append(_device_claim(admission, f"{name}-{CLAIM}", metadata, label, uid))
        source = "resourceClaimTemplateName" if multi_node else "resourceClaimName"
        _replace_named(
            pod_spec,
            "resourceClaims",
            "spec.template.spec",
            {"name": CLAIM, source: f"{name}-{CLAIM}"},
        )
        _replace_named(
            _obj(trainer, "resources", trainer_path),
            "claims",
            f"{trainer_path}.resources",
            {"name": CLAIM},
        )

    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "completions": len(admission.nodes),
        "parallelism": len(admission.nodes),
        "template": template,
    }
    if multi_node:
        job_spec["completionMode"] = "Indexed"
        pod_spec["subdomain"] = name  # pod i resolves as <name>-i.<name>
        pod_spec.pop("hostname", None)  # the Job controller names each pod's host <name>-<i>
        _one_pod_per_node(pod_spec, label)
        objects.append(_headless_service(metadata(name), label, admission.master_port))
    job_meta = metadata(name)
    if queued is not None:
        job_meta["labels"][QUEUE_LABEL] = queued.queue
        if queued.job_annotations:
            job_meta["annotations"] = dict(queued.job_annotations)
        job_spec["suspend"] = True  # Kueue unsuspends it once admitted
    objects.append(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}
    )
    return objects


# -- the pieces -------------------------------------------------------------------------------


def _check_admission(admission: Admission) -> None:
    nodes = admission.nodes
    if not nodes:
        raise WorkloadError("status.placement.nodes: must list at least one node, got none")
    names = [node.node for node in nodes]
    if len(set(names)) != len(names):
        raise WorkloadError(f"status.placement.nodes: must not repeat a node, got {names}")
    counts = {len(node.indices) for node in nodes}
    if len(counts) != 1 or 0 in counts:
        got = ", ".join(f"{node.node}: {len(node.indices)}" for node in nodes)
        raise WorkloadError(
            "status.placement.nodes: must hold the same number of GPUs (at least 1) on "
            f"every node, as torchrun runs the same number of ranks on each; got {got}"
        )
    if admission.mode is GpuMode.DEVICE_PLUGIN:
        return
    if admission.mode is GpuMode.VISIBLE_DEVICES and len(nodes) > 1:
        raise WorkloadError(
            f"status.placement.nodes: GPU mode visibleDevices pins GPUs on one node only, got "
            f"{len(nodes)} nodes ({', '.join(names)}); use devicePlugin or dra across nodes"
        )
    for i, node in enumerate(nodes):
        if len(node.uuids) != len(node.indices) or not all(node.uuids):
            raise WorkloadError(
                f"status.placement.nodes[{i}].gpuUUIDs: must name every GPU of "
                f"{node.node} (GPU mode {admission.mode.value} selects GPUs by UUID), "
                f"got {list(node.uuids)} for GPUs {list(node.indices)}"
            )


#: The stand-in placement of `workload_problem`: one GPU on one node.
_TRIAL = NodeGpus("trial-node", (0,), ("trial-gpu",))


def workload_problem(job: Mapping[str, Any], mode: GpuMode) -> str | None:
    """What building the job's workload would refuse (its pod template, mostly), on a
    stand-in placement, or None. The operator records it as InvalidSpec before it promises
    the job any GPU; the webhook refuses it at `kubectl apply`, and `vramgate plan` with it.
    A job not yet created has no uid or name: stand-ins take their place."""
    if not (job.get("spec") or {}).get("template"):
        return None  # no template, or an empty one: NoTemplate (advice only), not invalid
    meta = {"name": "trial", "uid": "trial", **dict(job.get("metadata") or {})}
    try:
        build_workload({**job, "metadata": meta}, Admission((_TRIAL,), 0, mode))
    except WorkloadError as error:
        return str(error)
    return None


def _pod_template(job: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, plain copy of spec.template with at least one container."""
    spec = job.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    if template is None:
        raise WorkloadError(
            f"{_CONTAINERS}: must list the trainer's containers; the job has no spec.template"
        )
    copied: dict[str, Any] = _plain(_mapping(template, "spec.template"))
    pod_spec = _obj(copied, "spec", "spec.template")
    containers = _list(pod_spec, "containers", "spec.template.spec")
    if not containers:
        raise WorkloadError(f"{_CONTAINERS}: must list at least one container, got none")
    if pod_spec.get("nodeName"):
        raise WorkloadError(
            "spec.template.spec.nodeName: must not be set; admission chooses the node"
        )
    for kind in ("containers", "initContainers"):
        for i, container in enumerate(_list(pod_spec, kind, "spec.template.spec", False)):
            if not isinstance(container, dict):
                raise WorkloadError(f"spec.template.spec.{kind}[{i}]: must be an object")
    return copied


def _gpu_container(containers: Sequence[Mapping[str, Any]]) -> int:
    """The trainer: the first container that asks for nvidia.com/gpu, else the first."""
    for i, container in enumerate(containers):
        resources = container.get("resources") or {}
        if not isinstance(resources, Mapping):
            raise WorkloadError(f"{_CONTAINERS}[{i}].resources: must be an object")
        if any(GPU_RESOURCE in (resources.get(part) or {}) for part in ("limits", "requests")):
            return i
    return 0


def _drop_gpu_resource(container: dict[str, Any], path: str) -> None:
    if "resources" not in container:
        return
    resources = _obj(container, "resources", path)
    for part in ("limits", "requests"):
        if part in resources:
            _obj(resources, part, f"{path}.resources").pop(GPU_RESOURCE, None)


def _placement_env(admission: Admission, name: str) -> list[dict[str, Any]]:
    """What the trainer learns of its placement: vramgate's own figures and torchrun's."""
    nodes = len(admission.nodes)
    rank: dict[str, Any]
    if nodes == 1:
        master, rank = "127.0.0.1", {"value": "0"}
    else:
        master = f"{name}-0.{name}"  # pod 0's DNS name under the headless Service
        annotation = f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"
        rank = {"valueFrom": {"fieldRef": {"fieldPath": annotation}}}
    return [
        _env("VRAMGATE_GPUS", str(admission.gpus)),
        _env("VRAMGATE_GPUS_PER_NODE", str(admission.gpus_per_node)),
        _env("VRAMGATE_NODES", str(nodes)),
        _env("VRAMGATE_PER_GPU_BYTES", str(admission.per_gpu_bytes)),
        _env("VRAMGATE_GPU_UUIDS", ",".join(u for node in admission.nodes for u in node.uuids)),
        _env("NNODES", str(nodes)),
        _env("NPROC_PER_NODE", str(admission.gpus_per_node)),
        _env("MASTER_PORT", str(admission.master_port)),
        _env("MASTER_ADDR", master),
        {"name": "NODE_RANK", **rank},
    ]


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _set_env(container: dict[str, Any], env: list[dict[str, Any]], path: str) -> None:
    """Append `env`; a variable of the same name the container had is replaced."""
    names = {var["name"] for var in env}
    existing = _list(container, "env", path)
    kept = [v for v in existing if not (isinstance(v, dict) and str(v.get("name")) in names)]
    container["env"] = [*kept, *env]


def _replace_named(parent: dict[str, Any], key: str, path: str, entry: dict[str, Any]) -> None:
    """Append `entry` to the list `parent[key]`, replacing an entry of the same name."""
    existing = _list(parent, key, path)
    kept = [e for e in existing if not (isinstance(e, dict) and e.get("name") == entry["name"])]
    parent[key] = [*kept, entry]


def _pin_to_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    """Require one of the chosen nodes, ANDed with whatever node affinity the template has.

    A `metadata.name` field selector takes exactly one value (the API server refuses more),
    so each node is a nodeSelectorTerm of its own (terms are ORed), and each of the
    template's terms is repeated once per node with the node's requirement added to it.
    """
    path = "spec.template.spec.affinity.nodeAffinity"
    affinity = _obj(pod_spec, "affinity", "spec.template.spec")
    node_affinity = _obj(affinity, "nodeAffinity", "spec.template.spec.affinity")
    required = _obj(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", path)
    path += ".requiredDuringSchedulingIgnoredDuringExecution"
    terms = _list(required, "nodeSelectorTerms", path) or [{}]
    pinned = []
    for i, term in enumerate(terms):
        if not isinstance(term, dict):
            raise WorkloadError(f"{path}.nodeSelectorTerms[{i}]: must be an object")
        fields = _list(term, "matchFields", f"{path}.nodeSelectorTerms[{i}]")
        for node in nodes:
            field = {"key": "metadata.name", "operator": "In", "values": [node]}
            pinned.append({**copy.deepcopy(term), "matchFields": [*copy.deepcopy(fields), field]})
    required["nodeSelectorTerms"] = pinned


def _one_pod_per_node(pod_spec: dict[str, Any], label: str) -> None:
    """torchrun runs one agent per node: no two pods of the job on one host."""
    path = "spec.template.spec.affinity"
    anti = _obj(_obj(pod_spec, "affinity", "spec.template.spec"), "podAntiAffinity", path)
    required = _list(
        anti, "requiredDuringSchedulingIgnoredDuringExecution", f"{path}.podAntiAffinity"
    )
    required.append(
        {"labelSelector": {"matchLabels": {JOB_LABEL: label}}, "topologyKey": HOSTNAME_KEY}
    )


def _uuid_selector(uuids: Sequence[str]) -> str:
    # json.dumps quotes as a CEL string literal does (double quotes, backslash escapes).
    listed = ", ".join(json.dumps(uuid) for uuid in uuids)
    return f'device.attributes["{DRA_DRIVER}"].uuid in [{listed}]'


def _device_claim(
    admission: Admission,
    claim_name: str,
    metadata: Callable[[str], dict[str, Any]],
    label: str,
    uid: str,
) -> dict[str, Any]:
    """One node: a ResourceClaim for exactly its chosen GPUs. k nodes: a template, so that
    each pod gets its own claim; the selector lists every chosen UUID and asks for the
    per-node count, and as a claim is allocated on its pod's node, it gets that node's."""
    uuids = [uuid for node in admission.nodes for uuid in node.uuids]
    # resource.k8s.io/v1 (GA in Kubernetes 1.34): a DeviceRequest holds an ExactDeviceRequest
    # under `exactly` (v1beta1 had these fields on the request itself).
    claim_spec = {
        "devices": {
            "requests": [
                {
                    "name": CLAIM,
                    "exactly": {
                        "deviceClassName": admission.device_class,
                        "allocationMode": "ExactCount",
                        "count": admission.gpus_per_node,
                        "selectors": [{"cel": {"expression": _uuid_selector(uuids)}}],
                    },
                }
            ]
        }
    }
    if len(admission.nodes) == 1:
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceClaim",
            "metadata": metadata(claim_name),
            "spec": claim_spec,
        }
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata(claim_name),
        "spec": {
            "metadata": {"labels": {JOB_LABEL: label, JOB_UID_LABEL: uid}},
            "spec": claim_spec,
        },
    }


def _headless_service(metadata: dict[str, Any], label: str, port: int) -> dict[str, Any]:
    """DNS for the pods of an Indexed Job: `<job>-<i>.<service>`, before they are Ready
    (torchrun's rendezvous is what makes them ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: label},
            "ports": [{"name": "torchrun", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


# -- plain data -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A deep copy as plain dicts and lists, whatever Mapping or Sequence the caller had."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return copy.deepcopy(value)


def _obj(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    """`parent[key]`, an object, created empty when absent (or null, as YAML's `key:`)."""
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    if not isinstance(value, dict):
        raise WorkloadError(f"{path}.{key}: must be an object, got {type(value).__name__}")
    return value


def _list(parent: dict[str, Any], key: str, path: str, create: bool = True) -> list[Any]:
    """`parent[key]`, a list, created empty when absent or null (or only read, with
    `create=False`)."""
    value = parent.get(key)
    if value is None:
        value = []
        if create:
            parent[key] = value
    if not isinstance(value, list):
        raise WorkloadError(f"{path}.{key}: must be a list, got {type(value).__name__}")
    return value


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{path}: must be an object, got {type(value).__name__}")
    return value


def _required_str(meta: Mapping[str, Any], key: str, path: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value:
        raise WorkloadError(f"{path}.{key}: must be set, got {value!r}")
    return value
