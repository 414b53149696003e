"""Short holds on the GPU memory a TrainJob was sized onto at its create: data in, data out.

A TrainJob is sized on the free memory the GPUs report (`controller.admission.trainjob`), and
its pods take that memory only seconds to minutes later. Without a hold, TrainJobs created
together (a sweep, a pipeline's burst) are each sized on the same free memory and all count
on the same GPUs. So the TrainJob webhook (`controller.webhook.trainjob`) records what each
sized create counted on (`Hold`: the placement found, the bytes per GPU, its pods) in a
ledger the next sizing charges as reservations (`reservation`), and so does the operator's
scheduling pass: a FineTuneJob does not take memory just promised to a TrainJob.

A hold ends, whichever comes first:

* when every one of its pods (numNodes of them, found by the JobSet name Trainer gives
  them, `JOBSET_LABEL`, the TrainJob's own name; not pods being deleted, which are a
  former TrainJob's of that name) has its memory in a GPUNode's readings (`settled`): from
  then the readings count it, as any pod's. Until then a pod already scheduled has its
  `nvidia.com/gpu` counted with its node's (`Reservation.allocated_gpus`), so a node's
  slots are never counted twice;
* when the same TrainJob (namespace and name) is sized again: a create the API server
  refused after the webhook answered (Trainer's own validation, a name already taken, the
  API server calling the webhook again) leaves a hold that the next create of that name
  replaces, and that create is never sized against its own earlier hold;
* when its TrainJob is not there (`looked_up`): the webhook labels each TrainJob it holds
  for with the hold's token (`HOLD_LABEL`), and the operator lists them by that label
  `CHECK_AFTER_S` after the create and every few seconds after, then looks for a named one
  whose label it did not find by its name (replaced or applied server-side without the
  label, or the first of two creates of one name): a TrainJob the API server refused after
  the webhook answered, or deleted since, ends its hold. The listing also names the hold of
  a TrainJob created with `generateName` (the webhook sees no name), so its pods are found
  as any other's; one that lost its label before then is taken for gone;
* when it expires (`live`): the operator's `trainJobHoldSeconds` after the create, for
  a TrainJob whose pods never start, or while the listing cannot be made. A runtime with
  initializers (Trainer's dataset and model initializers, which the trainer job waits for)
  starts the GPU pods only after the download, often minutes later: the default, 600 s,
  leaves them that time.

A hold is charged on the GPUs the sizing found, in full until its pods' memory shows. The
kube-scheduler, not vramgate, places a TrainJob's pods: they may run on other GPUs, and the
held ones then stay charged until the pods' memory shows elsewhere or the hold expires. That
is the safe side for a short while.

Why only in memory: a hold lives seconds to minutes, and the TrainJob itself, not vramgate,
owns its GPUs once its pods run. A restarted operator forgets its holds: at worst one burst
of TrainJobs is sized on stale free memory, as without holds, and each is still checked by
the kube-scheduler's GPU count. Each replica keeps its own holds (the chart runs 2): a burst's
creates spread over the replicas behind the webhook's Service, each replica holds only what
it sized, so creates that reach different replicas may be sized onto the same memory; and
only the leader's holds (the replica that runs the scheduling pass) keep FineTuneJobs off
held memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.admission.pods import finished, pod_gpus
from controller.packing.inventory import NodeGpus, NodeState, Reservation

#: The label JobSet gives a JobSet's pods, with the JobSet's name; Trainer names a
#: TrainJob's JobSet after the TrainJob.
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: A hold's job name in the ledger of reservations: never a FineTuneJob's (`namespace/name`).
JOB_PREFIX = "trainjob-hold:"
#: The label the webhook gives a TrainJob it holds GPUs for: the hold's token.
HOLD_LABEL = "vramgate.dev/hold"
#: Seconds after a hold is made before its TrainJob is looked for: the API server stores the
#: create after the webhook answers, and under a burst that can take seconds. A hold ended
#: too early lets the next TrainJob be sized onto its memory: the unsafe side, so long.
CHECK_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class Hold:
    """What a sized TrainJob create counted on: `per_gpu_bytes` on each GPU of `placement`,
    for `pods` pods (numNodes), until `expires_s` (the ledger's clock, in seconds).
    `namespace`/`name` find its pods (`name` "" where the create said only generateName);
    `serial` tells apart two holds of one name in the reservations' ledger; `token` is the
    `HOLD_LABEL` value its TrainJob carries, `made_s` when it was made. (No uid: a
    TrainJob's is given after mutating admission, so the webhook never sees it.)"""

    namespace: str
    name: str
    placement: tuple[NodeGpus, ...]
    per_gpu_bytes: int
    pods: int
    expires_s: float
    serial: int = 0
    token: str = ""
    made_s: float = 0.0

    @property
    def job(self) -> str:
        """Its name as a reservation's job: unique in the ledger."""
        return f"{JOB_PREFIX}{self.namespace}/{self.name or '?'}#{self.serial}"


def live(holds: Iterable[Hold], now_s: float) -> tuple[Hold, ...]:
    """The holds not yet expired at `now_s`: one expires at its `expires_s` exactly."""
    return tuple(hold for hold in holds if now_s < hold.expires_s)


def due(holds: Iterable[Hold], now_s: float) -> list[Hold]:
    """The holds whose TrainJob is to be looked for now: labelled, made `CHECK_AFTER_S` ago."""
    return [hold for hold in holds if hold.token and now_s - hold.made_s >= CHECK_AFTER_S]


def looked_up(looked: Iterable[Hold], found: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """What the listing of TrainJobs by `HOLD_LABEL` says of the holds `looked` for (`due`):
    `found` maps a token to the name of the TrainJob that carries it (not being deleted).
    Returns the jobs of the holds no TrainJob carries the token of (a named one is then
    looked for by its name before it ends: `Scheduler.look_for_held`), and, by job, the
    name of a `generateName` hold's TrainJob."""
    gone, named = [], {}
    for hold in looked:
        name = found.get(hold.token)
        if name is None:
            gone.append(hold.job)
        elif not hold.name:
            named[hold.job] = name
    return gone, named


def pods_of(hold: Hold, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The hold's TrainJob's pods (its JobSet's, in its namespace) that have not finished
    and are not being deleted: a TrainJob deleted and created again under its name has its
    first one's pods terminating a while, which are not the new one's and must not settle
    its hold. (A pod's creationTimestamp would tell them apart too, but the caches' slim pod
    does not keep it, and a hold's clock is monotonic, not the API server's.)"""
    if not hold.name:
        return []
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (
            meta.get("namespace") == hold.namespace
            and (meta.get("labels") or {}).get(JOBSET_LABEL) == hold.name
            and not meta.get("deletionTimestamp")
            and not finished(pod)
        ):
            found.append(pod)
    return found


def read_pods(nodes: Iterable[NodeState]) -> frozenset[str]:
    """The uids of the pods whose memory the GPUNodes' readings show."""
    return frozenset(uid for node in nodes for gpu in node.gpus for uid in gpu.pod_used_bytes)


def settled(hold: Hold, pods: Iterable[Mapping[str, Any]], read: frozenset[str]) -> bool:
    """Whether every pod of the hold has its memory in the readings (`read_pods`): the
    readings count its TrainJob from now on, and the hold has ended."""
    own = pods_of(hold, pods)
    uids = {str((pod.get("metadata") or {}).get("uid")) for pod in own}
    return len(own) >= hold.pods and uids <= read


def reservation(hold: Hold, pods: Iterable[Mapping[str, Any]] = ()) -> Reservation:
    """The hold as the packer charges it: its placement at its bytes per GPU, with the pods
    of its TrainJob known (`pods_of`), whose GPUs their nodes already count."""
    own = pods_of(hold, pods)
    allocated: dict[str, int] = {}
    for pod in own:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            allocated[node] = allocated.get(node, 0) + pod_gpus(pod)
    uids = frozenset(str((pod.get("metadata") or {}).get("uid")) for pod in own)
    return Reservation(hold.job, hold.placement, hold.per_gpu_bytes, uids, allocated)


def charged(
    holds: Iterable[Hold], pods: Iterable[Mapping[str, Any]], nodes: Iterable[NodeState]
) -> tuple[list[Reservation], frozenset[str]]:
    """The reservations of the holds not `settled`, and the jobs of those that are."""
    pods, read = list(pods), read_pods(nodes)
    kept, ended = [], set()
    for hold in holds:
        if settled(hold, pods, read):
            ended.add(hold.job)
        else:
            kept.append(reservation(hold, pods))
    return kept, frozenset(ended)
