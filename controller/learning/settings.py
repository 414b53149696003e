"""How admission turns what it learned into a correction: the policy and its numbers.

Integers where people write them (percent, seconds, bytes), as the API's conventions ask of
settings: `percentile: 95`, `marginPercent: 5`, `minFactorPercent: 60`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from controller.base.units import MIB
from controller.learning.histogram import DEFAULT_HALF_LIFE_SECONDS


class Policy(StrEnum):
    """What a learned correction may do to the estimator's per-GPU figure."""

    OFF = "off"  # the estimate stands; samples are still recorded
    RAISE_ONLY = "raiseOnly"  # a factor below 1.00 is read as 1.00: never reserve less
    ADJUST = "adjust"  # the learned factor, up or down within the clamp


@dataclass(frozen=True, slots=True)
class LearningSettings:
    """Each default and why:

    * `min_samples` 5: fewer samples than that and one odd run moves a p95; the coarser key
      answers meanwhile (`keys.py`).
    * `percentile` 95 and `margin_percent` 5: VPA's recommender reads memory at p90 of the
      observed peaks for its target and p95 for its upper bound, plus a safety margin of 15 %
      (`recommender/config/config.go`: `TargetMemoryPercentile: 0.9`,
      `UpperBoundMemoryPercentile: 0.95`, `SafetyMarginFraction: 0.15`). A job that passes its
      reservation dies of OOM rather than being throttled, so the upper bound; a training
      step's peak repeats far more exactly than a service's load, so a smaller margin.
    * `min_factor_percent` 60, `max_factor_percent` 150: however skewed the samples, learning
      moves a figure by at most that much; past it the estimator is wrong in a way a person
      should look at (the alert on a key's p95 says so). An OOM is not a sample to be wary
      of: its raise goes past the clamp, and stays while the configuration's jobs need it.
    * `steady_seconds` 900: a running job whose observed peak has not grown for 15 minutes
      is past its first optimizer steps (the step that allocates the optimizer states comes
      within a few minutes of the first batch), so it teaches while it runs rather than only
      when it ends; its end's sample then takes that one's place. 0: only a job's end
      teaches.
    * `oom_bump_percent` 120 and `oom_min_bump_bytes` 100 MiB: VPA's OOM rule
      (`recommender/model/aggregations_config.go`, `DefaultOOMBumpUpRatio = 1.2`,
      `DefaultOOMMinBumpUp = 100 * 1024 * 1024`; applied in `model/container.go`,
      `RecordOOM`).
    """

    policy: Policy = Policy.ADJUST
    min_samples: int = 5
    percentile: int = 95
    margin_percent: int = 5
    min_factor_percent: int = 60
    max_factor_percent: int = 150
    half_life_seconds: int = DEFAULT_HALF_LIFE_SECONDS
    steady_seconds: int = 900
    oom_bump_percent: int = 120
    oom_min_bump_bytes: int = 100 * MIB

    def __post_init__(self) -> None:
        checks = (
            ("minSamples", self.min_samples >= 1, "must be at least 1"),
            ("percentile", 1 <= self.percentile <= 100, "must be between 1 and 100"),
            ("marginPercent", 0 <= self.margin_percent <= 100, "must be between 0 and 100"),
            ("minFactorPercent", 1 <= self.min_factor_percent <= 100, "must be 1 to 100"),
            (
                "maxFactorPercent",
                100 <= self.max_factor_percent <= 400,
                "must be between 100 and 400",
            ),
            ("halfLifeSeconds", self.half_life_seconds >= 1, "must be at least 1"),
            ("steadySeconds", self.steady_seconds >= 0, "must not be negative (0: off)"),
            ("oomBumpPercent", 100 <= self.oom_bump_percent <= 400, "must be 100 to 400"),
            ("oomMinBumpBytes", self.oom_min_bump_bytes >= 0, "must not be negative"),
        )
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"learning.{name}: {rule}")
        if not isinstance(self.policy, Policy):
            allowed = ", ".join(p.value for p in Policy)
            raise ValueError(f"learning.policy: must be one of {allowed}")
