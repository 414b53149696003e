"""Kueue Workloads as admission reads them: vramgate as a Kueue AdmissionCheck controller.

Why: a cluster that queues with Kueue keeps its quotas, fair sharing and preemption there, and
adds vramgate for the one thing Kueue cannot know: whether a job fits in the GPUs' *memory*,
and where. Kueue reserves quota for a Workload, then waits for each AdmissionCheck of its
ClusterQueue; vramgate answers the checks whose `spec.controllerName` is `CONTROLLER`, with
the same decision core, the same inventory and one ledger with its own FineTuneJobs:

* **Request.** A Workload whose check is Pending once its quota is reserved becomes a
  FineTuneJob-shaped job (`check_job`), whatever kind made it (a batch Job, a JobSet, a
  PyTorchJob, a TrainJob, a FineTuneJob's Job: Kueue's podSets are all it reads). Its GPU
  podSets (those whose pods ask for `nvidia.com/gpu`) are taken as the ranks of one training:
  its spec is the FineTuneJob spec fields (model, method, lora, training, estimator,
  parallelism) that their pod templates carry in the annotation `SPEC_ANNOTATION` (one of them
  at least; where several do, the same training, or it is Rejected); its GPUs are what they
  ask (pods x `nvidia.com/gpu`, each podSet's count as Kueue admitted it), never resized (a
  check cannot change resources: policy Enforce); its template is the first GPU podSet's, so
  node selectors, affinity and tolerations are those its pods will have (GPU podSets that
  select different nodes are Rejected: pinned together, one of them could not run). A podSet
  without GPUs (a JobSet's initializer, a launcher) is neither counted nor pinned. The pass
  decides these jobs in one queue with the FineTuneJobs, on one snapshot.
* **Answer** (`check_state`): admitted -> `Ready` with podSetUpdates that pin each GPU podSet
  to the chosen node (`kubernetes.io/hostname`), label its pods with the Workload's uid (so
  their usage is read against its reservation) and carry the placement and the GPUs' UUIDs as
  annotations; waiting -> `Retry` with `requeueAfterSeconds` (Kueue releases the quota and
  asks again); never fits -> `Rejected` with the numbers. An unreadable annotation, or none,
  is `Rejected` with a line that names the field.
* **Resize** (`to_resize`, `resize_of`): a batch Job created suspended with the annotation
  `kueue.x-k8s.io/admission-gated-by: vramgate.dev/vram` is held by Kueue (its
  AdmissionGatedBy gate) until vramgate has sized it: its Workload is decided with policy
  Resize (bounds from the annotation's `resources.minGPUs` / `maxGPUs`) without holding
  anything, and once a count fits now, the Job's GPU count is rewritten to it (a suspended
  Job's resources may change: Kubernetes 1.36) and vramgate's gate removed; Kueue then updates
  its Workload to the Job and asks the check as for any other. A count that never fits removes the
  gate unchanged (the check then rejects it with the numbers); while none fits now, the gate
  stays and the Job holds no quota.
* **Ledger** (`reservations`): a Workload whose check is Ready and that has not finished
  holds the placement written in its podSetUpdates, as an admitted FineTuneJob holds its
  status.placement: the ledger lives in the API, and a restarted operator reads it back.
  Kueue sets a check back to Pending when it evicts the Workload (a preemption): the hold
  ends with it.

A Workload's pods are pinned by one nodeSelector per podSet (a podSetUpdate is the podSet's,
not a pod's), so a Workload is placed on one node (`NodeConstraints.one_node`): every pod of
every GPU podSet goes there, a podSet of N pods of g GPUs needs N x g GPUs of that node, and a
Workload larger than every node is Rejected even where several nodes together would hold it
(Kubernetes would spread its pods, but vramgate could then neither pin them nor know which
GPUs each holds: its ledger would be wrong). The placement's UUIDs are on every pod of it. Its
node selection is its pod template's and the ResourceFlavors Kueue assigned it (their
nodeLabels and tolerations, which Kueue adds to its pods), so the node chosen is one its pods
may run on. Its rank is Kueue's (`spec.priority`). GPUs are counted as `nvidia.com/gpu`
requests: the check needs the devicePlugin GPU mode.

Where the annotation goes, by kind (each tested with the real Kueue v0.17, whose integration
for the kind must be enabled): a batch Job's pod template; a JobSet's GPU replicatedJobs' pod
templates; a PyTorchJob's Master and Worker templates; a TrainJob's trainer pod template
through a runtime patch of the user's own (`spec.runtimePatches`, any manager but Kueue's: the
podSets are the JobSet that its runtime makes), or the runtime's own template; not the
TrainJob's metadata, which only the create-time sizing of `admission.trainjob` reads.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import yaml

from controller.api.base import GPU_RESOURCE
from controller.api.conditions import find_condition
from controller.decision import Decision, Outcome
from controller.packing.inventory import NodeGpus, Reservation

#: The `spec.controllerName` of the AdmissionChecks vramgate answers.
CONTROLLER = "vramgate.dev/vram"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
#: On a podSet's pod template: the FineTuneJob spec fields (YAML or JSON) its job trains with.
SPEC_ANNOTATION = "vramgate.dev/finetune"
#: Added to a Ready Workload's pods (podSetUpdates): the Workload's uid.
WORKLOAD_UID_LABEL = "vramgate.dev/kueue-workload"
#: Added to a Ready Workload's pods: its placement, as a FineTuneJob's status.placement says it.
PLACEMENT_ANNOTATION = "vramgate.dev/placement"
#: Added to a Ready Workload's pods: the UUIDs of the GPUs chosen, comma-separated, for the
#: visibleDevices and DRA modes (NVIDIA_VISIBLE_DEVICES from the downward API).
UUIDS_ANNOTATION = "vramgate.dev/gpu-uuids"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: The FineTuneJob spec fields the annotation may set; the rest are the podSet's.
SPEC_FIELDS = (
    "model",
    "method",
    "lora",
    "training",
    "estimator",
    "parallelism",
    "estimateCorrection",
    "resources",
)
#: The only `resources` fields the annotation may set: the bounds of a resize.
RESIZE_FIELDS = ("minGPUs", "maxGPUs")
#: Kueue's annotation (feature AdmissionGatedBy): the controllers that hold a job's admission.
GATE_ANNOTATION = "kueue.x-k8s.io/admission-gated-by"
#: A key of the pass's jobs that no FineTuneJob key (`namespace/name`) can be.
KEY_PREFIX = "Workload "
#: How long Kueue waits before it reserves quota again for a Workload that waits for memory.
DEFAULT_RETRY_SECONDS = 30
#: The annotation's size at most: a FineTuneJob spec with an inline config.json fits; read on
#: every Workload that asks, it must not cost the operator seconds.
MAX_SPEC_BYTES = 16 * 1024
#: Kueue's limit on a check's message.
MAX_MESSAGE = 32768

PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
#: Each answer as the decision metrics name it (`vramgate_decisions`).
DECISION = {READY: "Admit", RETRY: "Queue", REJECTED: "Reject"}


@dataclass(frozen=True, slots=True)
class CheckWrite:
    """The state of `check` on the Workload `namespace/name` (uid `uid`), as an entry of its
    status.admissionChecks (server-side applied with vramgate's own field manager)."""

    key: str
    namespace: str
    name: str
    uid: str
    check: str
    entry: dict[str, Any]
    resource_version: str | None = None
    #: The answer in words, for an Event on the Workload's owner (the Job a person looks
    #: at): Kueue resets a Retry or Rejected entry to Pending at once, and the entry's message
    #: with it, so the Event is where the reason stays. A Warning when `rejected`.
    event: str | None = None
    #: The decision's reason (`controller.api.conditions`), for the log and the Event.
    reason: str = ""
    rejected: bool = False
    #: The Workload's owner (its controller ownerReference), which the Event is about.
    owner: Mapping[str, Any] | None = None


def our_checks(admission_checks: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The names of the AdmissionChecks vramgate answers."""
    return frozenset(
        str((ac.get("metadata") or {}).get("name"))
        for ac in admission_checks
        if (ac.get("spec") or {}).get("controllerName") == CONTROLLER
    )


def workload_key(workload: Mapping[str, Any]) -> str:
    meta = workload.get("metadata") or {}
    return f"{KEY_PREFIX}{meta.get('namespace') or 'default'}/{meta.get('name')}"


def check_of(workload: Mapping[str, Any], checks: frozenset[str]) -> Mapping[str, Any] | None:
    """The Workload's entry of the first of `checks` it lists, or None."""
    for entry in (workload.get("status") or {}).get("admissionChecks") or []:
        if isinstance(entry, Mapping) and entry.get("name") in checks:
            return entry
    return None


def _true(workload: Mapping[str, Any], kind: str) -> bool:
    found = find_condition((workload.get("status") or {}).get("conditions") or [], kind)
    return found is not None and found.get("status") == "True"


def finished(workload: Mapping[str, Any]) -> bool:
    return _true(workload, "Finished")


def to_decide(workload: Mapping[str, Any], checks: frozenset[str]) -> bool:
    """Whether the Workload asks vramgate now: quota reserved, our check Pending, not
    finished, not deactivated, not being evicted (Kueue resets the checks to Pending when it
    evicts, while QuotaReserved stays until the pods are gone: an answer then would outlive
    the quota, as Kueue's own check controllers know)."""
    entry = check_of(workload, checks)
    if entry is None or entry.get("state") != PENDING:
        return False
    if (workload.get("spec") or {}).get("active") is False or finished(workload):
        return False
    return _true(workload, "QuotaReserved") and not _true(workload, "Evicted")


def _requested(container: Any) -> int:
    resources = (container.get("resources") if isinstance(container, Mapping) else None) or {}
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(GPU_RESOURCE)
        if value is not None:
            with contextlib.suppress(ValueError):  # not a whole number: not a GPU count
                return max(0, int(str(value)))
            return 0
    return 0


def _gpus(template: Mapping[str, Any]) -> int:
    """nvidia.com/gpu one pod of `template` holds: the sum of its containers, or the most of
    its init containers (as `pods.pod_gpus` counts a pod)."""
    spec = template.get("spec") or {}
    main = sum(_requested(c) for c in spec.get("containers") or [])
    init = max((_requested(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


#: ResourceFlavors by name, as the API holds them (their spec's nodeLabels and tolerations).
Flavors = Mapping[str, Mapping[str, Any]]


class CheckProblem(ValueError):
    """A Workload vramgate cannot estimate: the message names the field and what is allowed."""


def gpu_pod_sets(workload: Mapping[str, Any]) -> list[tuple[str, int, int, Mapping[str, Any]]]:
    """(name, pods, GPUs per pod, template) of each podSet whose pods ask for GPUs."""
    assigned = {
        str(a.get("name")): a
        for a in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments")
        or []
        if isinstance(a, Mapping)
    }
    found = []
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        if not isinstance(pod_set, Mapping):
            continue
        template = pod_set.get("template") or {}
        per_pod = _gpus(template)
        name = str(pod_set.get("name"))
        # Partial admission: Kueue may have reserved quota for fewer pods than asked.
        count = (assigned.get(name) or {}).get("count", pod_set.get("count", 1))
        if isinstance(count, int) and count > 0 and per_pod > 0:
            found.append((name, count, per_pod, template))
    return found


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors and aliases: an alias-expanded annotation of a few hundred
    bytes can grow to gigabytes once the spec is serialised."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases (*name) are not allowed")
        return super().compose_node(parent, index)


def _flavored(
    template: Mapping[str, Any], name: str, workload: Mapping[str, Any], flavors: Flavors
) -> dict[str, Any]:
    """The podSet's template with the node labels and tolerations of the ResourceFlavors Kueue
    assigned it: Kueue adds them to its pods, so only nodes that have them may be chosen."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get(
        "podSetAssignments"
    ) or []
    names: set[str] = set()
    for assignment in assignments:
        if isinstance(assignment, Mapping) and assignment.get("name") == name:
            names |= {str(f) for f in (assignment.get("flavors") or {}).values()}
    labels: dict[str, str] = {}
    tolerations: list[Any] = []
    for flavor in sorted(names):
        spec = (flavors.get(flavor) or {}).get("spec") or {}
        labels.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        tolerations += list(spec.get("tolerations") or [])
    if not labels and not tolerations:
        return dict(template)
    pod_spec = dict(template.get("spec") or {})
    pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **labels}
    pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), *tolerations]
    return {**template, "spec": pod_spec}


@functools.lru_cache(maxsize=4096)
def _read_spec(raw: object) -> tuple[dict[str, Any], str | None]:
    """The annotation read once per distinct text (every pass asks again while a Workload
    waits): its spec fields, or what is wrong with it."""
    if not isinstance(raw, str) or len(raw.encode()) > MAX_SPEC_BYTES:
        return {}, f"must be at most {MAX_SPEC_BYTES // 1024} KiB of YAML"
    try:
        read = yaml.load(raw, Loader=_NoAliases)  # a SafeLoader, without aliases
    except (yaml.YAMLError, RecursionError) as error:
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        why = "without aliases" if "aliases" in str(error) else "or JSON"
        return {}, f"must be YAML {why}{at}"
    if not isinstance(read, Mapping):
        return {}, "must be a mapping of FineTuneJob spec fields"
    extra = sorted(str(k) for k in read if k not in SPEC_FIELDS)
    if extra:
        return {}, (
            f"{', '.join(extra)} may not be set here (allowed: {', '.join(SPEC_FIELDS)}; GPUs "
            "and nodes are the podSet's)"
        )
    bounds = read.get("resources", {})
    if not isinstance(bounds, Mapping) or any(k not in RESIZE_FIELDS for k in bounds):
        return {}, (
            f"resources may set only {' and '.join(RESIZE_FIELDS)} here (the bounds of a resize; "
            "the GPU count is the podSet's)"
        )
    return dict(read), None


def spec_annotation(spec: Mapping[str, Any]) -> str:
    """A FineTuneJob's training as the annotation says it (the spec fields the check reads),
    for the Job of a FineTuneJob handed to Kueue (spec.queueName); with policy Resize, the
    bounds of its sizing."""
    said = {k: spec[k] for k in SPEC_FIELDS if k != "resources" and spec.get(k) is not None}
    resources = spec.get("resources") or {}
    if spec.get("admissionPolicy") == "Resize":
        bounds = {k: resources[k] for k in RESIZE_FIELDS if resources.get(k) is not None}
        if bounds:
            said["resources"] = bounds
    return yaml.safe_dump(said, sort_keys=True)


def read_placement(raw: object) -> tuple[tuple[NodeGpus, ...], int] | None:
    """The placement vramgate wrote in PLACEMENT_ANNOTATION (`placement_of`): its nodes and
    per-GPU bytes; None for one it cannot read (absent, or written by another hand)."""
    return _read_placement(raw) if isinstance(raw, str) else None


@functools.lru_cache(maxsize=16384)
def _read_placement(raw: str) -> tuple[tuple[NodeGpus, ...], int] | None:
    """Parsed once per text: every pass reads every Ready Workload's placement (the snapshot,
    the metrics), and with Kueue handing Workloads over a few at a time passes come every
    fraction of a second (a profile of 1,000 Workloads found the parse 12% of the operator)."""
    try:
        placement = json.loads(raw)
        parts = tuple(
            NodeGpus(
                str(part["node"]),
                tuple(int(i) for i in part.get("gpuIndices") or []),
                tuple(str(u) for u in part.get("gpuUUIDs") or []),
            )
            for part in placement.get("nodes") or []
        )
        per_gpu = int(placement.get("perGpuBytes") or 0)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return (parts, per_gpu) if parts and per_gpu > 0 else None


def read_spec(raw: object) -> tuple[dict[str, Any], str | None]:
    """The FineTuneJob spec fields an annotation `SPEC_ANNOTATION` holds, the caller's own
    copy, or ({}, what is wrong with it): the one reader of the annotation, wherever it is
    found (a podSet's pod template here, a TrainJob's metadata in `admission.trainjob`)."""
    read, problem = _read_spec(raw)
    return copy.deepcopy(read), problem


def check_job(workload: Mapping[str, Any], flavors: Flavors | None = None) -> dict[str, Any]:
    """The Workload as a FineTuneJob-shaped job admission decides; CheckProblem when it
    cannot be read (no GPU podSet, no annotation, an annotation that is not a mapping of
    FineTuneJob spec fields, GPU podSets whose annotations say different trainings). Its GPUs
    are those of every GPU podSet; its node selection theirs, which must agree. The job's
    own fields are checked by the spec translation, as a FineTuneJob's are."""
    sets = gpu_pod_sets(workload)
    if not sets:
        raise CheckProblem(f"spec.podSets: no podSet asks for {GPU_RESOURCE}")
    specs: dict[str, dict[str, Any]] = {}
    for name, _, _, template in sets:
        raw = ((template.get("metadata") or {}).get("annotations") or {}).get(SPEC_ANNOTATION)
        if raw is None:
            continue
        read, problem = _read_spec(raw)
        if problem is not None:
            raise CheckProblem(f"podSet {name}: metadata.annotations[{SPEC_ANNOTATION}]: {problem}")
        specs[name] = read
    if any(read != next(iter(specs.values())) for read in specs.values()):
        raise CheckProblem(
            f"podSet {', '.join(specs)}: metadata.annotations[{SPEC_ANNOTATION}] must say the "
            "same training on every podSet that carries it: a Workload's GPU podSets are "
            "checked as one training (its ranks) on one node"
        )
    spec = copy.deepcopy(next(iter(specs.values()))) if specs else None
    if spec is None:
        names = ", ".join(name for name, _, _, _ in sets)
        raise CheckProblem(
            f"podSet {names}: metadata.annotations[{SPEC_ANNOTATION}] is required: the model "
            "and training settings (FineTuneJob spec fields: model, method, training, ...) "
            "whose GPU memory vramgate checks"
        )
    meta = workload.get("metadata") or {}
    gpus = sum(pods * per_pod for _, pods, per_pod, _ in sets)
    spec["resources"] = {**(spec.get("resources") or {}), "gpus": gpus}
    spec["admissionPolicy"] = "Resize" if gated(workload) else "Enforce"
    templates = {name: _flavored(template, name, workload, flavors or {})
                 for name, _, _, template in sets}  # fmt: skip
    if len({_node_selection(t) for t in templates.values()}) > 1:
        raise CheckProblem(
            f"podSet {', '.join(templates)}: must select the same nodes (nodeSelector, node "
            "affinity, tolerations and the flavors Kueue assigned): a Workload's GPU podSets "
            "are pinned to one node"
        )
    spec["template"] = templates[sets[0][0]]
    return {
        "apiVersion": "vramgate.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "generation", "creationTimestamp")
            if key in meta
        },
        "spec": spec,
    }


def _node_selection(template: Mapping[str, Any]) -> str:
    """What of a pod template says which nodes its pods may run on, as one comparable text:
    podSets pinned together must agree on it, or one of them is pinned where it cannot run."""
    pod = template.get("spec") or {}
    tolerations = sorted(json.dumps(t, sort_keys=True) for t in pod.get("tolerations") or [])
    return json.dumps(
        [pod.get("nodeSelector") or {}, (pod.get("affinity") or {}).get("nodeAffinity"),
         tolerations],
        sort_keys=True,
    )  # fmt: skip


def placement_of(decision: Decision) -> dict[str, Any]:
    return {
        "perGpuBytes": decision.per_gpu_bytes,
        "nodes": [
            {"node": p.node, "gpuIndices": list(p.indices), "gpuUUIDs": list(p.uuids)}
            for p in decision.placement
        ],
    }


def _entry(
    check: str, state: str, message: str, now: datetime, before: Mapping[str, Any] | None
) -> dict[str, Any]:
    message = " ".join(message.split())[:MAX_MESSAGE]
    same = before is not None and before.get("state") == state
    moved = before.get("lastTransitionTime") if same and before else None
    return {
        "name": check,
        "state": state,
        "message": message,
        "lastTransitionTime": moved or now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def check_state(
    workload: Mapping[str, Any],
    check: str,
    decision: Decision,
    now: datetime,
    hostnames: Mapping[str, str],
    retry_seconds: int = DEFAULT_RETRY_SECONDS,
) -> CheckWrite:
    """The check's answer to `decision` (made on the job `check_job` read). `hostnames`: each
    node's `kubernetes.io/hostname` label, which pins the pods (it need not be the node's
    name, and only a label value may stand in a nodeSelector)."""
    meta = workload.get("metadata") or {}
    before = check_of(workload, frozenset({check}))
    nodes = {p.node for p in decision.placement}
    node = next(iter(nodes)) if len(nodes) == 1 else ""
    reason, event = decision.reason, decision.message
    if decision.admitted and hostnames.get(node):
        uuids = ",".join(u for p in decision.placement for u in p.uuids if u)
        entry = _entry(check, READY, f"{decision.reason}: {decision.message}", now, before)
        annotations = {PLACEMENT_ANNOTATION: json.dumps(placement_of(decision), sort_keys=True)}
        if uuids:
            annotations[UUIDS_ANNOTATION] = uuids
        entry["podSetUpdates"] = [
            {
                "name": name,
                "labels": {WORKLOAD_UID_LABEL: str(meta.get("uid"))},
                "annotations": annotations,
                "nodeSelector": {HOSTNAME_LABEL: hostnames[node]},
            }
            for name, _, _, _ in gpu_pod_sets(workload)
        ]
    elif decision.outcome is Outcome.REJECT:
        entry = _entry(check, REJECTED, f"{decision.reason}: {decision.message}", now, before)
    else:
        if decision.admitted:  # placed where no nodeSelector can pin it
            reason, event = (
                "NoHostname",
                (
                    f"fits on {', '.join(sorted(nodes))}, whose Node has no {HOSTNAME_LABEL} "
                    "label to pin its pods to"
                ),
            )
        entry = _entry(check, RETRY, f"{reason}: {event}", now, before)
        entry["requeueAfterSeconds"] = retry_seconds
    return CheckWrite(
        key=workload_key(workload),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        check=check,
        entry=entry,
        resource_version=meta.get("resourceVersion"),
        event=" ".join(event.split())[:MAX_MESSAGE],
        reason=reason,
        rejected=entry["state"] == REJECTED,
        owner=owner_of(workload),
    )


def owner_of(workload: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object that owns the Workload (a Job, a JobSet, a TrainJob), as an object
    reference an Event can name; None when it has no controller."""
    meta = workload.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return {
                "apiVersion": ref.get("apiVersion"),
                "kind": ref.get("kind"),
                "metadata": {
                    "name": ref.get("name"),
                    "namespace": meta.get("namespace"),
                    "uid": ref.get("uid"),
                },
            }
    return None


def by_owner(workloads: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Workloads by the uid of the object that owns each (a batch Job)."""
    found = {}
    for workload in workloads:
        uid = ((owner_of(workload) or {}).get("metadata") or {}).get("uid")
        if uid:
            found[str(uid)] = workload
    return found


def problem_state(
    workload: Mapping[str, Any],
    check: str,
    problem: str,
    now: datetime,
    reason: str = "InvalidSpec",
) -> CheckWrite:
    """Rejected: the Workload cannot be estimated, and will not be until it is made again
    (a Workload's pod templates do not change)."""
    meta = workload.get("metadata") or {}
    before = check_of(workload, frozenset({check}))
    entry = _entry(check, REJECTED, f"{reason}: {problem}", now, before)
    return CheckWrite(
        workload_key(workload),
        str(meta.get("namespace") or "default"),
        str(meta.get("name")),
        str(meta.get("uid")),
        check,
        entry,
        meta.get("resourceVersion"),
        event=" ".join(problem.split())[:MAX_MESSAGE],
        reason=reason,
        rejected=True,
        owner=owner_of(workload),
    )


#: The AdmissionCheck's condition Kueue reads before it uses the check.
ACTIVE = "Active"


def active(admission_check: Mapping[str, Any]) -> bool:
    found = find_condition((admission_check.get("status") or {}).get("conditions") or [], ACTIVE)
    return found is not None and found.get("status") == "True"


def active_condition(now: datetime) -> dict[str, Any]:
    return {
        "type": ACTIVE,
        "status": "True",
        "reason": "Active",
        "message": "vramgate checks each Workload's GPU memory against the GPUs' free memory",
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def held(workload: Mapping[str, Any], checks: frozenset[str]) -> bool:
    """Whether the Workload holds GPUs in vramgate's ledger: our check Ready, its quota
    reserved, not finished. (Its running pods' usage is read from the GPUs either way.)"""
    entry = check_of(workload, checks)
    return (
        entry is not None
        and entry.get("state") == READY
        and _true(workload, "QuotaReserved")
        and not finished(workload)
    )


def reservation(
    workload: Mapping[str, Any], checks: frozenset[str], pods: Sequence[Mapping[str, Any]]
) -> Reservation | None:
    """The hold of a Ready, unfinished Workload, read from the placement vramgate wrote in
    its podSetUpdates; `pods`: those labelled with its uid."""
    if not held(workload, checks):
        return None
    entry = check_of(workload, checks) or {}
    for update in entry.get("podSetUpdates") or []:
        raw = (update.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        if raw is None:
            continue
        read = read_placement(raw)
        if read is None:
            return None  # not ours to read: written by another hand
        parts, per_gpu = read
        uids: set[str] = set()
        allocated: dict[str, int] = {}
        for pod in pods:
            uids.add(str((pod.get("metadata") or {}).get("uid")))
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                allocated[node] = allocated.get(node, 0) + _gpus(pod)
        return Reservation(workload_key(workload), parts, per_gpu, frozenset(uids), allocated)
    return None


def pods_of(
    pods: Iterable[Mapping[str, Any]],
) -> dict[str, list[Mapping[str, Any]]]:
    """Live pods by the Workload uid they are labelled with."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        uid = ((pod.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_UID_LABEL)
        if uid and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            found.setdefault(str(uid), []).append(pod)
    return found


# -- resize through Kueue's admission gate ------------------------------------------------------


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _gates(obj: Mapping[str, Any]) -> list[str]:
    value = _annotations(obj).get(GATE_ANNOTATION)
    return [g.strip() for g in str(value or "").split(",") if g.strip()]


def gated(workload: Mapping[str, Any]) -> bool:
    """Whether Kueue holds the Workload for vramgate to size it (its owner's gate, which
    Kueue copies onto it)."""
    return CONTROLLER in _gates(workload)


def to_resize(workload: Mapping[str, Any]) -> bool:
    """Whether vramgate sizes the Workload now: gated by it, active, not finished, owned by a
    batch Job (whose resources a suspended Job may change)."""
    if not gated(workload) or (workload.get("spec") or {}).get("active") is False:
        return False
    owner = owner_of(workload) or {}
    return (
        owner.get("kind") == "Job"
        and owner.get("apiVersion") == "batch/v1"
        and not finished(workload)
    )


@dataclass(frozen=True, slots=True)
class ResizeWrite:
    """Rewrite the suspended batch Job `name` (uid `uid`) to `gpus` GPUs in its container at
    `container` (its position in the pod template; None: leave its count), in each of
    `parts` (limits, requests: those it has), and its gate annotation from `gates_before` to
    `gates` (None: remove it): only while the Job is that one, still suspended, and still
    gated as it was read (the write's preconditions)."""

    key: str
    namespace: str
    name: str
    uid: str
    workload_uid: str
    container: int | None
    gpus: int | None
    gates: str | None
    gates_before: str
    #: What was done, for an Event on the Job.
    reason: str
    message: str
    parts: tuple[str, ...] = ()


def resize_of(
    workload: Mapping[str, Any], decision: Decision | None, problem: str | None
) -> ResizeWrite | None:
    """What to do with a gated Workload: its count when one fits now (`decision` admitted);
    the gate removed unchanged when none ever fits (Rejected: the check says why) or when it
    cannot be sized (`problem`); None while it waits for memory (the gate stays)."""
    owner = owner_of(workload)
    if owner is None:
        return None
    meta = owner.get("metadata") or {}
    rest = [g for g in _gates(workload) if g != CONTROLLER]
    ungated = ResizeWrite(
        key=workload_key(workload),
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name")),
        uid=str(meta.get("uid")),
        workload_uid=str((workload.get("metadata") or {}).get("uid")),
        container=None,
        gpus=None,
        gates=",".join(rest) or None,
        gates_before=str(_annotations(workload).get(GATE_ANNOTATION) or ""),
        reason="NotResized",
        message=problem or "",
    )
    if problem is not None:
        return ungated
    if decision is None:
        return None
    if decision.outcome is Outcome.REJECT:
        return replace(ungated, reason=decision.reason, message=f"not resized: {decision.message}")
    if not decision.admitted:
        return None
    sets = gpu_pod_sets(workload)
    gpus = decision.admitted_gpus or decision.requested_gpus
    pod_spec = sets[0][3].get("spec") or {} if sets else {}
    containers = [
        (i, c) for i, c in enumerate(pod_spec.get("containers") or []) if _requested(c) > 0
    ]
    if (
        len(sets) != 1
        or sets[0][1] != 1
        or len(containers) != 1
        or any(_requested(c) > 0 for c in pod_spec.get("initContainers") or [])
    ):
        return replace(
            ungated,
            message="not resized: only a Job of one pod whose GPUs one container (no init "
            "container) asks for is resized; its gate is removed as it is",
        )
    said = (
        "fits as asked"
        if gpus == decision.requested_gpus
        else f"resized from {decision.requested_gpus} to {gpus} GPUs"
    )
    index, container = containers[0]
    resources = container.get("resources") or {}
    return replace(
        ungated,
        container=index,
        parts=tuple(p for p in ("limits", "requests") if GPU_RESOURCE in (resources.get(p) or {})),
        gpus=gpus,
        reason=decision.reason,
        message=f"{said}: {decision.message}",
    )
