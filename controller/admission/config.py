"""The admission settings, one model for the operator and `vramgate plan`.

``gpuMode``, ``queueing``, ``headroom``, ``headroomPercent`` and ``heartbeatTtlSeconds``
decide how jobs are packed onto GPUs, ``rawPriorityNamespaces`` which jobs' raw
``spec.priority`` ranks them, the ``learning*`` settings how what finished jobs really used
corrects the next ones' figures (`controller.learning`). The operator reads them from flags,
its environment and its config file (`controller.operator.settings` inherits this model);
``vramgate plan`` from the same flags only, so that a plan is decided as the operator so
configured would decide.
Both go through `controller.base.settings.SettingsLoader`, so the flag spellings, checks and
one-line errors cannot differ. The defaults are the pure core's (`PackingSettings`,
`AdmissionSettings`, each default with its reason there), so they are stated once.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from controller.base.settings import MAX_SECONDS, Flag
from controller.base.units import Bytes
from controller.decision import AdmissionSettings, QueueingStrategy
from controller.learning import LearningSettings, Policy
from controller.packing.inventory import GpuMode, PackingSettings

#: Keeping more than half of every GPU free is a misconfiguration, not a margin.
MAX_HEADROOM_PERCENT = 50
#: How ``--help`` shows the defaults whose values read badly (bytes).
SHOWN_DEFAULTS = {"headroom": "0GiB"}
#: Where the defaults come from.
_PACKING = PackingSettings()
_ADMISSION = AdmissionSettings()
_LEARNING = LearningSettings()


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _namespace_name(value: str) -> str:
    """A namespace that cannot exist would be named silently, and match nothing."""
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise ValueError(
            "each namespace must be a DNS-1123 label (lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63)"
        )
    return value


NamespaceName = Annotated[str, AfterValidator(_namespace_name)]


class AdmissionConfig(BaseModel):
    """How admission packs jobs onto GPUs; each description says what it does and why its
    default."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    gpu_mode: GpuMode = Field(
        _PACKING.gpu_mode,
        description="how workloads get GPUs: devicePlugin (whole GPUs, works everywhere), "
        "visibleDevices (shared by memory), dra.",
    )
    queueing: QueueingStrategy = Field(
        _ADMISSION.queueing,
        description="BestEffortFIFO: a later job that fits may go first (keeps GPUs busy); "
        "StrictFIFO: never.",
    )
    #: A size with its unit (``2GiB``; a bare ``2`` would be bytes where a person means GB),
    #: zero in any unit, or an integer of bytes from YAML.
    headroom: Annotated[int, Bytes(unit=True), Flag(metavar="SIZE")] = Field(
        _PACKING.headroom_bytes,
        description="memory kept free on every GPU, a size like 2GiB; 0 because the estimate "
        "already includes the CUDA context.",
    )
    headroom_percent: int = Field(
        _PACKING.headroom_percent,
        description="percent of each GPU's memory kept free, 0 to 50; 0 as for headroom.",
    )
    heartbeat_ttl_seconds: int = Field(
        int(_PACKING.heartbeat_ttl.total_seconds()),
        ge=1,
        le=MAX_SECONDS,
        description="a GPU node whose agent has not written for this long takes no new job; "
        "a few of the agent's 30 s heartbeats.",
    )

    raw_priority_namespaces: Annotated[
        list[NamespaceName], Flag("--raw-priority-namespace", metavar="NAMESPACE")
    ] = Field(
        default_factory=lambda: sorted(_ADMISSION.raw_priority_namespaces),
        description="namespaces whose FineTuneJobs' spec.priority, a raw number, is honoured "
        "(an administrator's own, e.g. a platform team's); elsewhere a job's priority comes "
        "only from its PriorityClass, and a spec.priority is ignored with a warning. None by "
        "default: the number is any job author's to write.",
    )

    learning_policy: Policy = Field(
        _LEARNING.policy,
        description="what the correction learned from finished jobs (LearnedCorrections) may "
        "do to a job's per-GPU figure: off, raiseOnly (never lower) or adjust (up or down); "
        "adjust, since a p95 of what jobs like it really used, plus a margin, is a truer "
        "figure than the estimate alone. A job's spec.estimateCorrection overrides it.",
    )
    learning_min_samples: int = Field(
        _LEARNING.min_samples,
        ge=1,
        le=1000,
        description="jobs of a kind needed before their ratios correct the next one; 5, "
        "since fewer and one odd run moves a p95 (a coarser kind answers meanwhile).",
    )
    learning_percentile: int = Field(
        _LEARNING.percentile,
        ge=1,
        le=100,
        description="percentile of observed / predicted a correction reads; 95, VPA's upper "
        "bound for memory: a job past its reservation dies of OOM.",
    )
    learning_margin_percent: int = Field(
        _LEARNING.margin_percent,
        ge=0,
        le=100,
        description="margin on the learned ratio, in percent; 5, since a training step's "
        "peak repeats closely.",
    )
    learning_half_life_seconds: int = Field(
        _LEARNING.half_life_seconds,
        ge=1,
        le=MAX_SECONDS,
        description="how long a sample takes to lose half its weight; 14 days, so a trainer "
        "upgraded a month ago weighs a quarter of this week's runs.",
    )

    learning_steady_seconds: int = Field(
        _LEARNING.steady_seconds,
        ge=0,
        le=MAX_SECONDS,
        description="a running job whose observed peak has not grown for this long teaches "
        "at once (its end's sample then takes that one's place); 15 minutes, "
        "well past the first optimizer step, which allocates the optimizer states. 0: only "
        "a job's end teaches.",
    )

    @field_validator("headroom_percent")
    @classmethod
    def _percent(cls, value: int) -> int:
        if not 0 <= value <= MAX_HEADROOM_PERCENT:
            raise ValueError(f"must be between 0 and {MAX_HEADROOM_PERCENT}")
        return value

    def admission(self) -> AdmissionSettings:
        packing = PackingSettings(
            heartbeat_ttl=timedelta(seconds=self.heartbeat_ttl_seconds),
            headroom_bytes=self.headroom,
            headroom_percent=self.headroom_percent,
            gpu_mode=self.gpu_mode,
        )
        return AdmissionSettings(
            packing=packing,
            queueing=self.queueing,
            raw_priority_namespaces=frozenset(self.raw_priority_namespaces),
        )

    def learning(self) -> LearningSettings:
        return LearningSettings(
            policy=self.learning_policy,
            min_samples=self.learning_min_samples,
            percentile=self.learning_percentile,
            margin_percent=self.learning_margin_percent,
            half_life_seconds=self.learning_half_life_seconds,
            steady_seconds=self.learning_steady_seconds,
        )
