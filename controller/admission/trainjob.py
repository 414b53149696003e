"""Kubeflow Trainer's TrainJobs sized when they are created: what the mutating webhook reads
and the JSON patch it answers with.

Why at create: a TrainJob's `spec.trainer` is immutable (trainer.kubeflow.org/v1alpha1,
Trainer v2), so its GPUs can be chosen only in the request that creates it. vramgate sizes it
on the free memory at that moment, with the estimator and decision core of FineTuneJobs, and
says where it fits (`Sizing.counted`); the webhook then holds those GPUs a short while
(`controller.admission.holds`: until its pods' memory shows, or `trainJobHoldSeconds`), so
the next TrainJob, and the scheduling pass's FineTuneJobs, are not sized onto the same
memory. Once its pods run, their use is read from the GPUs, as any pod's. Holds live in the
operator's memory only: a restarted operator forgets them, and at worst one burst is sized
on stale free memory, as before holds existed. Each replica holds only what it sized (the
chart runs 2, and a burst's creates spread over both), and only the leader's holds keep the
scheduling pass's FineTuneJobs off that memory.

* **Opt in**: the annotation `SPEC_ANNOTATION` on the TrainJob's metadata, the FineTuneJob
  spec fields as YAML, read by the Kueue check's reader (`kueue.read_spec`: model, method,
  lora, training, estimator, parallelism, and `resources.minGPUs` / `maxGPUs`, the bounds of a
  resize), or `POLICY_ANNOTATION` alone: asking for a policy is asking to be sized, and the
  rest is read from the TrainJob and its runtime. Without either a TrainJob passes untouched:
  a cluster's TrainJobs are not vramgate's unless their authors say so.
* **Policy**: the annotation `POLICY_ANNOTATION`, `Resize` or `Enforce` (the default), the
  words of a FineTuneJob's `spec.admissionPolicy`. A policy of its own, not implied by the
  bounds: a TrainJob that says only its model still gets the never-fits refusal and the
  does-not-fit-now warning, and one that says Resize may keep the default bounds.
* **Its runtime** (`trainer_runtime`, from the operator's cache; None where it is not cached
  yet): where the annotation says no model or no method, the model is the TrainJob's
  `spec.initializer.model.storageUri` or the runtime's model initializer's, and torchtune's
  config and overrides say the method and settings; the annotation's fields win, `training`
  and `lora` field by field. A warning says what was read and from where whenever the
  answer says anything. What was read, not written, is never a reason to refuse: a value
  out of range, a model no preset names, LoRA without a rank, a runtime not cached yet, a
  trainer that says no method: allowed with a warning.
* **GPUs**: `spec.trainer.numNodes` x `resourcesPerNode` `nvidia.com/gpu` (limits, else
  requests; both rewritten where both are set), each the runtime's where the TrainJob leaves
  it to it (`mlPolicy.numNodes`, the trainer container's resources: a TrainJob's
  resourcesPerNode replaces them whole). numNodes stays: a count chosen is a multiple of it,
  each node taking count / numNodes, and `numProcPerNode`, where it equals the GPUs per node,
  follows them. A resize writes what was the runtime's into `spec.trainer` (numNodes, and
  the runtime's resources whole with the new count), so the count holds whatever Trainer
  merges.
* **Where**: each trainer node is one pod, so one node takes all of a pod's GPUs: numNodes 1
  is placed on one node (`NodeConstraints.one_node`), and with more the packer is asked for
  numNodes pods of count / numNodes GPUs (`NodeConstraints.pods`): only layouts of k nodes x
  g GPUs whose g holds whole pods, so a resize keeps numNodes and changes the GPUs per node
  (a count numNodes does not divide is never tried). The packer gives every node of a
  layout the same g, so pods spread unevenly (two on one node, one on another) are not
  found: a TrainJob that would fit only so is refused (422, "no layout of whole pods with
  the same number of pods on every node exists"), or under Resize resized to a count that
  fits evenly where one does, though the kube-scheduler could place it as asked. The pods'
  nodeSelector, required node affinity and tolerations are the runtime's trainer pod's with
  the TrainJob's own `spec.runtimePatches` merged in as Trainer merges them
  (`trainer_runtime.placement`: a patch's tolerations replace the runtime's, its affinity
  and nodeSelector merge field by field, key by key).
* **Answer** (`size`): Resize: the count nearest the one asked, within the bounds, that
  fits now (ties to the larger), with a warning kubectl prints, and the count asked kept in
  `REQUESTED_GPUS_ANNOTATION`; none fits now: a count that can never fit is rewritten to
  the nearest that fits the empty cluster (as a FineTuneJob's mutating webhook does), one
  that can stays with a warning. Enforce: nothing changes; a warning when it does not fit
  now.
* **Refused**, as the FineTuneJob validating webhook refuses and the Kueue check rejects:
  an invalid annotation (each field named), and a TrainJob no count of which can ever fit
  (the Reject decision's numbers). The trainer cannot be fixed after the create, so the
  author hears it while the manifest can still change; the webhook still fails open when
  the operator is down.
* **Not sized, allowed with a warning**: what cannot be estimated in microseconds on the
  request path (a model in a ConfigMap, the Trace profile, a model type only the trace
  extra reads), and before the operator has seen a GPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.admission import trainer_runtime as runtimes
from controller.admission.cluster import job_request
from controller.admission.kueue import SPEC_ANNOTATION, read_spec
from controller.admission.trainer_runtime import Reading, RuntimeRef
from controller.api import conditions as cond
from controller.api.base import GPU_RESOURCE, REQUESTED_GPUS_ANNOTATION
from controller.api.enums import AdmissionPolicy
from controller.base.units import format_gib
from controller.decision import Decision, JobRequest, Outcome, decide
from controller.decision.decide import resize_counts
from controller.estimator import (
    MAX_GPUS,
    Estimate,
    Method,
    Parallelism,
    Profile,
    SpecError,
    SpecErrors,
)
from controller.jobs.spec import JobPlan, config_map_ref, estimate_plan, translate
from controller.packing.constraints import NodeConstraints, from_pod_template
from controller.packing.fit import plural
from controller.packing.inventory import NodeGpus
from controller.packing.view import ClusterView, Selection

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
#: On a TrainJob: `Resize` or `Enforce` (the default), as a FineTuneJob's admissionPolicy.
POLICY_ANNOTATION = "vramgate.dev/admission-policy"
POLICIES = (AdmissionPolicy.ENFORCE.value, AdmissionPolicy.RESIZE.value)
_GPUS_PATH = f"spec.trainer.resourcesPerNode[{GPU_RESOURCE}]"
_KUEUE_ONE_NODE = "a Kueue Workload runs on one node"


@dataclass(frozen=True, slots=True)
class Shape:
    """What a TrainJob's trainer asks: `nodes` pods of `per_node` GPUs each, the GPUs
    said in `parts` (limits, requests) as `raw` (an int or a quantity string), and
    numProcPerNode (None: unset)."""

    nodes: int
    per_node: int
    parts: tuple[str, ...]
    raw: object
    proc_per_node: object = None
    #: Read from the runtime, so a resize writes them into spec.trainer: numNodes (None:
    #: the TrainJob's), the trainer container's resources (None: resourcesPerNode's), and
    #: whether the TrainJob has a spec.trainer at all.
    runtime_nodes: int | None = None
    runtime_resources: Mapping[str, Any] | None = None
    has_trainer: bool = True

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node


@dataclass(frozen=True, slots=True)
class Sizing:
    """The webhook's answer: JSON Patch operations (RFC 6902) on the TrainJob, the warnings
    kubectl prints, or the refusal's message. `gpus`: the count it asks for after the
    patch (None: not sized)."""

    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    refusal: str | None = None
    gpus: int | None = None
    #: Where it fits now at `gpus`, which the webhook holds for it a while (`holds`); None
    #: where it was not placed (not sized, refused, or it does not fit now).
    counted: Counted | None = None


@dataclass(frozen=True, slots=True)
class Counted:
    """The GPUs a sizing counted on: the placement found now, the bytes per GPU, and the
    TrainJob's pods (numNodes) that will take them."""

    placement: tuple[NodeGpus, ...]
    per_gpu_bytes: int
    pods: int = 1


class _NotSized(Exception):
    """The TrainJob cannot be sized here: allowed as it is, with this warning."""


class _Refused(Exception):
    """The TrainJob's own input is wrong: refused with this message."""


Estimator = Callable[[JobPlan], Estimate]


def size(
    trainjob: Mapping[str, Any],
    view: ClusterView | None,
    estimator: Estimator = estimate_plan,
    *,
    runtime: Mapping[str, Any] | None = None,
) -> Sizing:
    """What the mutating webhook does with a TrainJob being created (see the module);
    `runtime`: the runtime it names (`trainer_runtime.runtime_ref`) as the operator caches
    it, None where it is not in the cache."""
    annotations = (trainjob.get("metadata") or {}).get("annotations") or {}
    if SPEC_ANNOTATION not in annotations and POLICY_ANNOTATION not in annotations:
        return Sizing()
    try:
        return _size(trainjob, annotations, view, estimator, runtime)
    except _NotSized as why:
        return Sizing(warnings=(f"vramgate: not sized: {why}",))
    except _Refused as why:
        return Sizing(refusal=f"vramgate: {why}")


def _size(
    trainjob: Mapping[str, Any],
    annotations: Mapping[str, Any],
    view: ClusterView | None,
    estimator: Estimator,
    runtime: Mapping[str, Any] | None,
) -> Sizing:
    said: dict[str, Any] = {}
    if SPEC_ANNOTATION in annotations:
        said, problem = read_spec(annotations[SPEC_ANNOTATION])
        if problem is not None:
            problem = problem.replace("the podSet's", "the TrainJob's spec.trainer's")
            raise _Refused(f"metadata.annotations[{SPEC_ANNOTATION}]: {problem}")
    policy = annotations.get(POLICY_ANNOTATION, AdmissionPolicy.ENFORCE.value)
    if policy not in POLICIES:
        raise _Refused(
            f"metadata.annotations[{POLICY_ANNOTATION}]: unsupported value {policy!r}; "
            f"allowed: {', '.join(POLICIES)}"
        )
    fields, read_from, sources = _training(trainjob, said, runtime)
    shape = read_shape(trainjob, runtime)
    if shape.runtime_nodes is not None or shape.runtime_resources is not None:
        sources += (f"{shape.nodes} node(s) x {shape.per_node} GPUs (the runtime's trainer)",)
    spec = {**fields, "admissionPolicy": policy}
    spec["resources"] = {**(fields.get("resources") or {}), "gpus": shape.gpus}
    if config_map_ref(spec) is not None:
        raise _NotSized("a model in a ConfigMap is read by the operator only")
    if _at(spec, "estimator").get("profile") in (Profile.TRACE.api, Profile.TRACE.value):
        raise _NotSized("profile Trace takes seconds, more than a webhook may")
    plan, errors = translate(spec, generic="defer")
    guessed = [e for e in errors if _was_read(e.field, read_from)]
    if guessed:  # what was read, not written, is no reason to refuse the TrainJob
        raise _NotSized(f"{_read_as(guessed[0].field)}: {guessed[0].message}")
    if errors:
        raise _Refused(str(SpecErrors([_on_trainjob(e) for e in errors])))
    if plan is None:
        raise _NotSized("its model type is read only by the operator's trace extra")
    try:
        estimate = estimator(plan)
    except SpecError as error:
        raise _Refused(str(_on_trainjob(error))) from None
    notes = tuple(f"vramgate: {_in_annotation(w)}" for w in plan.warnings)
    if shape.nodes > 1 and plan.parallelism is Parallelism.DEVICE_MAP:
        raise _NotSized(
            "parallelism DeviceMap with spec.trainer.numNodes > 1: each pod loads a model of "
            "its own over its own GPUs, which vramgate does not estimate"
        )
    if view is None:
        raise _NotSized("the operator has not read its GPU inventory yet")
    meta = trainjob.get("metadata") or {}
    request = replace(
        job_request({"metadata": meta, "spec": spec}, plan, estimate),
        # Each trainer node is one pod, whole on its node: numNodes pods of count / numNodes
        # GPUs each, whatever count is tried (one node for numNodes 1, as a Kueue pod set).
        constraints=replace(
            pod_constraints(trainjob, runtime),
            one_node=shape.nodes == 1,
            pods=shape.nodes if shape.nodes > 1 else 0,
        ),
    )
    where = view.select(request.selector, request.constraints)
    if where.gpus == 0 and view.select({}).gpus == 0:
        raise _NotSized("the operator has seen no GPU yet")
    found = _decide(request, shape, view, where)
    if sources and (found.warnings or found.refusal or found.patch or notes):
        ref = runtimes.runtime_ref(trainjob)
        told = f"read from the TrainJob and its runtime ({ref}): {'; '.join(sources)}"
        if found.refusal is not None:
            return replace(found, refusal=f"{found.refusal} ({told})")
        notes = (f"vramgate: {told}; {SPEC_ANNOTATION} overrides any of them", *notes)
    return replace(found, warnings=(*notes, *found.warnings))


def _training(
    trainjob: Mapping[str, Any], said: Mapping[str, Any], runtime: Mapping[str, Any] | None
) -> tuple[dict[str, Any], frozenset[str], tuple[str, ...]]:
    """The FineTuneJob spec fields the TrainJob trains with: the annotation's, and where it
    does not say its model or method, what the TrainJob and its runtime say
    (`trainer_runtime.read`), the annotation's fields winning one by one (`training` and
    `lora` field by field). Also the fields taken from the reading (paths below `spec.`),
    and where each came from."""
    if "model" in said and "method" in said:
        return dict(said), frozenset(), ()
    methods = [m.api for m in Method]
    if "method" in said and said["method"] not in methods:  # wrong whatever the runtime says
        raise _Refused(
            f"metadata.annotations[{SPEC_ANNOTATION}].method: unsupported value "
            f"{said['method']!r}; allowed: {', '.join(methods)}"
        )
    reading = runtimes.read(trainjob, runtime)
    fields = dict(said)
    taken: set[str] = set()
    for key, value in reading.fields.items():
        if key not in fields:
            fields[key] = value
            taken.add(key)
        elif key in ("training", "lora") and isinstance(fields[key], Mapping):
            mine = dict(fields[key])
            fields[key] = {**value, **mine}
            taken |= {f"{key}.{k}" for k in value if k not in mine}
    for key in ("model", "method"):
        if key not in fields:
            raise _NotSized(_unread(trainjob, reading, key, runtime))
    lora = fields.get("lora") or {}  # not a mapping: the annotation's, which translate refuses
    if fields["method"] == "Full":
        if "lora" in taken:  # torchtune's LoRA overrides on a full fine-tune: nothing to price
            del fields["lora"]
    elif "method" in taken and isinstance(lora, Mapping) and not lora.get("rank"):
        raise _NotSized(
            f"method {fields['method']} read from its torchtune config, but no LoRA rank: add "
            f"model.lora_rank=<r> to spec.trainer.args, or lora.rank to {SPEC_ANNOTATION}"
        )
    said_where = tuple(
        text for key, text in reading.sources
        if key in taken or any(t.startswith(f"{key}.") for t in taken)
    )  # fmt: skip
    return fields, frozenset(taken), (*said_where, *reading.notes)


def _unread(
    trainjob: Mapping[str, Any], reading: Reading, key: str, runtime: Mapping[str, Any] | None
) -> str:
    why = reading.unread.get(key, f"no {key}")
    if runtime is None:
        why += f" ({_no_runtime(runtimes.runtime_ref(trainjob))})"
    return f"{why}; say it in {SPEC_ANNOTATION}"


def _no_runtime(ref: RuntimeRef | None) -> str:
    if ref is None:
        return "spec.runtimeRef names no Trainer runtime"
    return (
        f"its runtime {ref} is not in the operator's cache: it does not exist, or was "
        "created a moment ago"
    )


def _was_read(path: str, read_from: frozenset[str]) -> bool:
    """Whether the field at `path` (`spec.training.sequenceLength`) is one `_training` took
    from the reading (`training`, or `training.sequenceLength`)."""
    parts = path.removeprefix("spec.").split(".")
    return any(".".join(parts[:i]) in read_from for i in range(1, len(parts) + 1))


def _read_as(path: str) -> str:
    return f"{path.removeprefix('spec.')} (read from the TrainJob and its runtime)"


def restore(old: Mapping[str, Any], new: Mapping[str, Any]) -> Sizing:
    """A TrainJob resized at its create whose manifest is applied again: its trainer asks
    again for the count asked at create (`REQUESTED_GPUS_ANNOTATION`), which the API server
    would refuse (spec.trainer is immutable). The stored count, and numProcPerNode with it,
    is kept, as a FineTuneJob's is (the FineTuneJob webhook's `_as_at_create`); so are the
    numNodes and resourcesPerNode the webhook wrote from its runtime, where the manifest,
    which never said them, leaves them out (`trainer_runtime.refill`: a server-side apply
    drops what its manager no longer says). An update that changes anything else of the
    trainer is left for the API server to refuse."""
    asked = ((old.get("metadata") or {}).get("annotations") or {}).get(REQUESTED_GPUS_ANNOTATION)
    stored = (old.get("spec") or {}).get("trainer")
    trainer = (new.get("spec") or {}).get("trainer")
    if not isinstance(asked, str) or not isinstance(stored, Mapping):
        return Sizing()
    ops, trainer = runtimes.refill(stored, trainer, new.get("spec"))
    if not isinstance(trainer, Mapping) or (trainer == stored and not ops):
        return Sizing()
    try:
        before, now = read_shape(old), read_shape({"spec": {"trainer": trainer}})
    except _NotSized:
        return Sizing()
    if trainer != stored and (
        str(now.gpus) != asked or now.nodes != before.nodes or now.parts != before.parts
    ):
        return Sizing()
    kept = copy.deepcopy(dict(trainer))
    for part in now.parts:
        kept["resourcesPerNode"][part][GPU_RESOURCE] = stored["resourcesPerNode"][part][
            GPU_RESOURCE
        ]
    if "numProcPerNode" in stored:
        kept["numProcPerNode"] = stored["numProcPerNode"]
    if kept != stored:
        return Sizing()  # more than the count asked again: the API server says what
    base = "/spec/trainer"
    for part in now.parts:
        count = stored["resourcesPerNode"][part][GPU_RESOURCE]
        if trainer["resourcesPerNode"][part][GPU_RESOURCE] != count:
            path = f"{base}/resourcesPerNode/{part}/{_pointer(GPU_RESOURCE)}"
            ops.append({"op": "replace", "path": path, "value": count})
    if "numProcPerNode" in stored and trainer.get("numProcPerNode") != stored["numProcPerNode"]:
        op = "replace" if "numProcPerNode" in trainer else "add"
        ops.append({"op": op, "path": f"{base}/numProcPerNode", "value": stored["numProcPerNode"]})
    annotations = (new.get("metadata") or {}).get("annotations")
    if not isinstance(annotations, Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {REQUESTED_GPUS_ANNOTATION: asked}})  # fmt: skip
    elif annotations.get(REQUESTED_GPUS_ANNOTATION) != asked:
        path = f"/metadata/annotations/{_pointer(REQUESTED_GPUS_ANNOTATION)}"
        ops.append({"op": "add", "path": path, "value": asked})
    said = (
        f"vramgate: {asked} GPUs asked again; spec.trainer keeps the {before.gpus} it was sized "
        "to at create (it is immutable): delete and create the TrainJob to size it again"
    )
    return Sizing(tuple(ops), (said,), gpus=before.gpus)


def read_shape(trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> Shape:
    """numNodes x the GPUs per node the TrainJob's trainer asks for, its runtime's where it
    leaves them to it (None: not at hand); _NotSized where they cannot be known or are
    said in a way no pod could use."""
    trainer = (trainjob.get("spec") or {}).get("trainer")
    has_trainer = isinstance(trainer, Mapping)
    trainer = trainer if isinstance(trainer, Mapping) else {}
    nodes, where = trainer.get("numNodes"), "spec.trainer.numNodes"
    if nodes is None:
        if runtime is None:
            ref = runtimes.runtime_ref(trainjob)
            raise _NotSized(f"spec.trainer.numNodes is not set and {_no_runtime(ref)}")
        nodes, said_at = runtimes.runtime_nodes(runtime)
        where = f"its runtime's {said_at}"
    if type(nodes) is not int or nodes < 1:
        raise _NotSized(f"{where} must be a whole number of at least 1, got {nodes!r}")
    from_runtime = nodes if trainer.get("numNodes") is None else None
    resources, container = trainer.get("resourcesPerNode"), None
    if resources is None:  # a TrainJob's resourcesPerNode replaces the container's whole
        if runtime is None:
            ref = runtimes.runtime_ref(trainjob)
            raise _NotSized(f"{_GPUS_PATH} is not set and {_no_runtime(ref)}")
        container = runtimes.trainer_container(runtime).get("resources") or {}
        resources = container
    said = runtimes.gpus_of(resources if isinstance(resources, Mapping) else {})
    if not said:
        where = "" if container is None else " nor in its runtime's trainer container"
        raise _NotSized(f"{_GPUS_PATH} is not set{where}: set it in limits or requests")
    counts = {_whole(v) for v in said.values()}
    (count,) = counts if len(counts) == 1 else (None,)
    if count is None or count < 1:
        shown = ", ".join(f"{part} {value}" for part, value in said.items())
        raise _NotSized(f"{_GPUS_PATH} must be one whole number of at least 1, got {shown}")
    raw = said.get("limits", said.get("requests"))
    return Shape(
        nodes, count, tuple(said), raw, trainer.get("numProcPerNode"),
        runtime_nodes=from_runtime, runtime_resources=container, has_trainer=has_trainer,
    )  # fmt: skip


def pod_constraints(
    trainjob: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
) -> NodeConstraints:
    """Where the trainer's pods may run: the runtime's trainer pod's nodeSelector, affinity
    and tolerations (None: not at hand) with the TrainJob's `spec.runtimePatches` merged in
    as Trainer merges them (`trainer_runtime.placement`)."""
    return from_pod_template({"spec": runtimes.placement(trainjob, runtime)})


def _decide(request: JobRequest, shape: Shape, view: ClusterView, where: Selection) -> Sizing:
    asked = shape.gpus
    est, parallelism = request.estimate, request.parallelism
    counts = [asked]
    if request.policy is AdmissionPolicy.RESIZE:
        high = min(request.max_gpus or MAX_GPUS, where.gpus)
        counts = [n for n in resize_counts(asked, request.min_gpus, high) if n % shape.nodes == 0]
    for n in counts:  # the selection's `pods`: only placements of whole pods per node
        placed = view.place_now(est, parallelism, n, where)
        if placed is not None:
            counted = Counted(view.node_gpus(placed), placed.per_gpu_bytes, shape.nodes)
            if n == asked:
                return Sizing(gpus=asked, counted=counted)
            at_n = decide(replace(request, gpus=n, policy=AdmissionPolicy.ENFORCE), view)
            never = not view.fits_empty(est, parallelism, asked, where)
            why = "can never fit this cluster" if never else "do not fit now"
            said = f"resized {asked} -> {n} GPUs (policy Resize): {plural(asked)} {why}"
            return replace(_resized(shape, n, f"{said}; {at_n.message}"), counted=counted)
    decision = decide(request, view, nodes_waited_for=False)
    empty = next((n for n in counts if view.fits_empty(est, parallelism, n, where)), None)
    if empty is None:
        widest = view.widest_empty(where)
        return Sizing(refusal=f"vramgate: {_never(decision, shape, counts, widest, where.gpus)}")
    if empty == asked:
        said = f"vramgate: does not fit now (policy {request.policy.value}): {decision.message}"
        return Sizing(warnings=(said,), gpus=asked)
    each = format_gib(est.per_gpu_bytes(empty, parallelism))
    said = (
        f"{plural(asked)} can never fit this cluster; the nearest count that can is {empty} "
        f"({each} each with {parallelism.api}), and none fits now"
    )
    return _resized(shape, empty, said)


def _never(decision: Decision, shape: Shape, counts: list[int], widest: int, matching: int) -> str:
    """The refusal of a TrainJob no count of which ever fits: the decision's numbers, or,
    where only a count that numNodes does not divide would, that. Where the decision found
    no layout (InsufficientGPUs with enough matching GPUs), said in pods, the TrainJob's
    terms: no node holds one pod (`widest`, the most GPUs a matching node has), or the
    pods fit only unevenly, which vramgate does not place."""
    if (
        decision.reason == cond.REASON_INSUFFICIENT_GPUS
        and shape.nodes > 1
        and (widest < shape.per_node or matching >= shape.gpus)
    ):
        # The decision core says k nodes x g GPUs; a TrainJob's GPUs are numNodes pods.
        asked = (
            f"needs {shape.nodes} pods of {shape.per_node} GPUs, each pod on one node "
            f"(spec.trainer.numNodes x {_GPUS_PATH})"
        )
        if widest < shape.per_node:
            return (
                f"{decision.reason}: {asked}; the matching nodes have at most "
                f"{plural(widest)} each, so no such placement exists"
            )
        return (
            f"{decision.reason}: no layout of whole pods with the same number of pods on every "
            f"node exists: {asked}, and the {matching} matching GPUs are on nodes of at most "
            f"{plural(widest)} each; vramgate does not place a TrainJob's pods unevenly (more "
            "on one node than on another)"
        )
    if decision.outcome is Outcome.REJECT:
        # The decision core words a job pinned to one node as the Kueue Workload it was, and
        # its advice in a FineTuneJob's fields.
        said = decision.message.replace(_KUEUE_ONE_NODE, "a TrainJob of one node runs one pod")
        said = said.replace("spec.resources.gpus", f"spec.trainer (numNodes x {_GPUS_PATH})")
        said = said.replace("admissionPolicy Resize", f"{POLICY_ANNOTATION}: Resize")
        return f"{decision.reason}: {said}"
    return (
        f"{cond.REASON_INSUFFICIENT_VRAM}: no count of GPUs that spec.trainer.numNodes "
        f"({shape.nodes}) divides fits this cluster, even when it is empty (tried "
        f"{', '.join(str(n) for n in sorted(counts)) or 'none'}); {decision.message}"
    )


def _resized(shape: Shape, n: int, said: str) -> Sizing:
    """The patch that makes the TrainJob ask for n GPUs, and its warning."""
    per_node = n // shape.nodes
    value: object = per_node if type(shape.raw) is int else str(per_node)
    ops: list[dict[str, Any]] = []
    change = f"{_GPUS_PATH} {shape.per_node} -> {per_node}"
    if shape.runtime_resources is None:
        base = "/spec/trainer/resourcesPerNode"
        ops += [
            {"op": "replace", "path": f"{base}/{part}/{_pointer(GPU_RESOURCE)}", "value": value}
            for part in shape.parts
        ]
    else:  # the runtime's resources whole, as the TrainJob's replace them whole
        change += " (set from its runtime's trainer resources)"
    set_from_runtime: dict[str, Any] = {}
    if shape.runtime_nodes is not None:
        set_from_runtime["numNodes"] = shape.runtime_nodes
        change += f", numNodes {shape.runtime_nodes} (set from its runtime's)"
    if shape.runtime_resources is not None:
        resources = copy.deepcopy(dict(shape.runtime_resources))
        for part in shape.parts:
            resources[part] = {**resources[part], GPU_RESOURCE: value}
        set_from_runtime["resourcesPerNode"] = resources
    if not shape.has_trainer:
        ops.append({"op": "add", "path": "/spec/trainer", "value": set_from_runtime})
    else:
        ops += [
            {"op": "add", "path": f"/spec/trainer/{key}", "value": value}
            for key, value in set_from_runtime.items()
        ]
    if shape.nodes > 1:
        change += f" on each of {shape.nodes} nodes"
    proc = shape.proc_per_node
    if proc is not None and str(proc) == str(shape.per_node):
        follows: object = per_node if type(proc) is int else str(per_node)
        ops.append({"op": "replace", "path": "/spec/trainer/numProcPerNode", "value": follows})
        change += f", numProcPerNode {proc} -> {per_node}"
    ops.append(
        {
            "op": "add",
            "path": f"/metadata/annotations/{_pointer(REQUESTED_GPUS_ANNOTATION)}",
            "value": str(shape.gpus),
        }
    )
    return Sizing(tuple(ops), (f"vramgate: {said}: {change}",), gpus=n)


def _on_trainjob(error: SpecError) -> SpecError:
    """A FineTuneJob spec error at the TrainJob's own path: the count is its trainer's,
    everything else the annotation's."""
    if error.field == "spec.resources.gpus":
        return SpecError(f"spec.trainer (numNodes x {_GPUS_PATH})", error.message)
    return SpecError(_in_annotation(error.field), error.message)


def _in_annotation(path: str) -> str:
    """`spec.lora.rank...` as the annotation's field: `metadata.annotations[...].lora.rank`."""
    if path == "spec" or not path.startswith("spec."):
        return path
    return f"metadata.annotations[{SPEC_ANNOTATION}].{path.removeprefix('spec.')}"


def _whole(value: object) -> int | None:
    """A quantity of whole GPUs (2, "2"), or None."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _pointer(key: str) -> str:
    """A map key as one JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _at(obj: object, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else {}
