"""What a decision reads and returns: plain data, so `plan` and the operator share it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from controller.api.enums import AdmissionPolicy
from controller.estimator import Estimate, Parallelism
from controller.packing.constraints import NodeConstraints
from controller.packing.inventory import NodeGpus, PackingSettings

#: A job queued longer than this blocks backfill onto the GPUs it is closest to fitting.
#: Half an hour: long enough that short jobs are not held back by every brief wait, short
#: enough that a big job does not starve behind a stream of small ones for a working day.
DEFAULT_STARVATION_LIMIT = timedelta(minutes=30)


class Outcome(StrEnum):
    ADMIT = "Admit"
    RESIZE = "Resize"
    QUEUE = "Queue"
    REJECT = "Reject"


#: The label, beside the outcomes, of a job told only what admission would do: in the
#: operator's metrics, policy Advise's admission by GPU count and a job without a template;
#: in `vramgate plan`, the job without a template (nothing runs, nothing is reserved).
ADVISE = "Advise"


class QueueingStrategy(StrEnum):
    """Whether a later job that fits may go ahead of an earlier one that waits."""

    BEST_EFFORT_FIFO = "BestEffortFIFO"  # yes (backfill), within the starvation limit
    STRICT_FIFO = "StrictFIFO"  # never


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """The operator's admission knobs (a Helm value each)."""

    packing: PackingSettings = field(default_factory=PackingSettings)
    queueing: QueueingStrategy = QueueingStrategy.BEST_EFFORT_FIFO
    starvation_limit: timedelta = DEFAULT_STARVATION_LIMIT
    #: The namespaces whose jobs' raw spec.priority is honoured (`controller.admission.priority`):
    #: read where requests are made, not by the decision, which takes each job's priority as
    #: given.
    raw_priority_namespaces: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One job as admission sees it: its estimate and how it asks to be placed.

    `key` is `namespace/name`. `max_gpus` None means no bound but the API's own.
    """

    key: str
    estimate: Estimate
    parallelism: Parallelism
    gpus: int
    policy: AdmissionPolicy = AdmissionPolicy.ENFORCE
    min_gpus: int = 1
    max_gpus: int | None = None
    selector: Mapping[str, str] = field(default_factory=dict)
    #: Its pod template's nodeSelector, required node affinity and tolerations; None for a
    #: job without a template, which runs no pods (NoTemplate).
    constraints: NodeConstraints | None = None
    #: Its rank in the queue, higher first: its PriorityClass's value
    #: (`controller.admission.priority`).
    priority: int = 0
    created: datetime | None = None
    suspend: bool = False
    #: Why the job has no rank (the PriorityClass it names does not exist), or None: such a
    #: job is not decided, and is told so (PriorityClassUnavailable).
    priority_problem: str | None = None
    #: Said with every decision of the job (a spec.priority that was ignored).
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """What admission does with one job, and why, in words with numbers.

    `per_gpu_bytes` is for `admitted_gpus` when admitted, else for the count the message
    speaks of. `placement` is empty unless the job is admitted (Admit or Resize).
    """

    job: str
    outcome: Outcome
    reason: str
    message: str
    requested_gpus: int
    admitted_gpus: int | None = None
    per_gpu_bytes: int = 0
    placement: tuple[NodeGpus, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def admitted(self) -> bool:
        return self.outcome in (Outcome.ADMIT, Outcome.RESIZE)
