"""What admission learns from the peaks its jobs really reached. Pure: plain data in and out.

    histogram.py   a decaying histogram of observed / predicted ratios (VPA's recommender's)
    keys.py        what makes jobs alike, and the coarser keys a job falls back to
    record.py      a key's record; a steady job's or an OOM-killed job's sample filed under it
    settings.py    the policy (off, raiseOnly, adjust) and its numbers
    correction.py  a new job's per-GPU figure: estimate x learned factor, and why, in one line

Every record is plain data with `to_dict` / `from_dict` (a status subresource's JSON); time
comes in as arguments, never read here. The operator files samples and persists records;
admission asks `correct` for each job's figure.
"""

from controller.learning.correction import Correction, Source, correct
from controller.learning.histogram import DecayingHistogram, RatioScale
from controller.learning.keys import ANY, JobKey, image_digest
from controller.learning.record import (
    KeyRecord,
    Records,
    oom_need_bytes,
    pin,
    record_oom,
    record_steady,
)
from controller.learning.settings import LearningSettings, Policy

__all__ = [
    "ANY",
    "Correction",
    "DecayingHistogram",
    "JobKey",
    "KeyRecord",
    "LearningSettings",
    "Policy",
    "RatioScale",
    "Records",
    "Source",
    "correct",
    "image_digest",
    "oom_need_bytes",
    "pin",
    "record_oom",
    "record_steady",
]
