"""LearnedCorrection (vramgate.dev/v1alpha1, cluster-scoped): what admission learned of one
kind of job (`controller.learning.keys`).

Why an object per key, in the API and not in the operator's memory: a restart or a new leader
reads it back, a person can read it (`kubectl get learnedcorrections`), reset it (delete it:
the operator rebuilds it from the jobs still in the API that carry a sample, or set
`spec.resetAt` to forget every sample before a time) and pin a correction by hand
(`spec.pinnedPercent`). The leader alone writes its status.

The name is `lc-` and 16 hex digits of the SHA-256 of the key's canonical name
(`family=llama,method=LoRA,...,image=*`), which is no valid object name; `spec` spells the key
out and `status.key` repeats its canonical name.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from pydantic import Field

from controller.api.base import ApiModel
from controller.learning.keys import ANY, JobKey

KIND = "LearnedCorrection"
PLURAL = "learnedcorrections"
SINGULAR = "learnedcorrection"
SHORT_NAMES = ("lc",)
#: The most job uids a key's status remembers as counted; older samples are covered by
#: `countedThrough` (status docs below). 500 uids are about 19 KB of status.
MAX_COUNTED_UIDS = 500


def object_name(key: JobKey) -> str:
    """The LearnedCorrection's name for `key`: short, valid, and the same on every replica."""
    return "lc-" + hashlib.sha256(key.name.encode()).hexdigest()[:16]


def _key_field(name: str, what: str) -> str:
    return f"{name} is {what}, or * for any (a coarser key, which learns from every kind below it)."


class LearnedCorrectionSpec(ApiModel):
    family: str = Field(
        ANY, max_length=63, description=_key_field("family", "the model family (model_type)")
    )
    method: str = Field(ANY, max_length=63, description=_key_field("method", "Full, LoRA, QLoRA"))
    parallelism: str = Field(
        ANY, max_length=63, description=_key_field("parallelism", "DDP, FSDP or DeviceMap")
    )
    profile: str = Field(
        ANY, max_length=63, description=_key_field("profile", "the estimator profile")
    )
    framework: str = Field(
        ANY, max_length=63, description=_key_field("framework", "the trainer framework")
    )
    image: str = Field(
        ANY,
        max_length=253,
        description=_key_field("image", "the trainer image (by digest where the pod reports it)"),
    )
    config: str = Field(
        ANY,
        max_length=63,
        description=_key_field(
            "config",
            "the job's configuration: 12 hex digits of the SHA-256 of what in its spec decides "
            "its memory (model, method, lora, training, parallelism, estimator)",
        ),
    )
    pinned_percent: int | None = Field(
        None,
        ge=1,
        le=400,
        description="pinnedPercent is a correction set by hand, in whole percent of the "
        "estimate (86: reserve 0.86 x the estimate; 1 to 400): it wins over everything "
        "learned, for this key and every finer key without a pin of its own. Unset: learned.",
    )
    reset_at: datetime | None = Field(
        None,
        description="resetAt forgets every sample taken before this time (RFC 3339): set it "
        "after a trainer upgrade that changed how jobs of this kind allocate. The operator "
        "rebuilds status from the jobs' own samples taken since.",
    )

    def key(self) -> JobKey:
        return JobKey(
            self.family,
            self.method,
            self.parallelism,
            self.profile,
            self.framework,
            self.image,
            self.config,
        )


class HistogramStatus(ApiModel):
    """A decaying histogram of observed / predicted (`controller.learning.histogram`). Its
    real numbers are decimal strings (Python's shortest exact form): the API carries no
    floats, and a string reads back to the very same number."""

    half_life_seconds: int = Field(
        ge=1, description="halfLifeSeconds is how long a sample takes to lose half its weight."
    )
    scale: dict[str, str] = Field(
        description="scale is the bucket boundaries: lowest, highest and growth (each bucket "
        "wider than the one below by growth), as decimal strings."
    )
    reference_time: datetime | None = Field(
        None, description="referenceTime is the time the weights are relative to."
    )
    samples: int = Field(ge=0, description="samples is how many samples were ever added.")
    total_weight: str = Field(
        description="totalWeight is the sum of bucketWeights, for people (a decimal string)."
    )
    bucket_weights: dict[str, str] = Field(
        description="bucketWeights maps a bucket's index to its decayed weight (a decimal "
        "string); buckets of no weight are absent."
    )


class LearnedCorrectionStatus(ApiModel):
    key: str | None = Field(
        None, description="key is the key's canonical name (family=...,method=...,...)."
    )
    samples: int | None = Field(
        None, ge=0, description="samples is how many jobs this key learned from (0 or more)."
    )
    p95_ratio: str | None = Field(
        None,
        alias="p95Ratio",
        description="p95Ratio is the 95th percentile of observed / predicted per-GPU peaks, "
        "two decimals (above 1.00: the estimator under-predicts this kind of job).",
    )
    correction: str | None = Field(
        None,
        description="correction is the factor a job of exactly this key gets under policy "
        "adjust, two decimals (1.00: the estimate stands).",
    )
    correction_percent: int | None = Field(
        None, ge=1, description="correctionPercent is correction in whole percent."
    )
    source: str | None = Field(
        None,
        description="source is where correction comes from: Learned, Pinned, OutOfMemory or "
        "TooFewSamples.",
    )
    message: str | None = Field(
        None, description="message says correction and where it came from, in one line."
    )
    oom_factor_percent: int | None = Field(
        None,
        ge=1,
        description="oomFactorPercent is, after a job of exactly this key ran out of GPU "
        "memory, the least correction its next jobs get (percent), until one of them runs "
        "to its end.",
    )
    histogram: HistogramStatus | None = Field(
        None, description="histogram is the decaying histogram of observed / predicted."
    )
    counted_uids: list[str] | None = Field(
        None,
        alias="countedUIDs",
        description="countedUIDs are the uids of the FineTuneJobs whose samples are counted "
        f"(the latest {MAX_COUNTED_UIDS}): a job is never counted twice, across restarts and "
        "failovers.",
    )
    counted_through: datetime | None = Field(
        None,
        description="countedThrough is a time: every sample taken at or before it is "
        "counted (or forgotten by resetAt), whether or not its job's uid is still in "
        "countedUIDs.",
    )
    reset_at: datetime | None = Field(
        None,
        description="resetAt is the spec.resetAt this status was rebuilt for: when the spec's "
        "differs, the operator starts the histogram afresh from the samples taken since.",
    )
    update_time: datetime | None = Field(
        None, description="updateTime is when the operator last wrote this status."
    )
