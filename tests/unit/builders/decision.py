"""Builders of the decision core's inputs: job requests, and the check that a message says
what it must."""

from __future__ import annotations

from controller.decision import (
    Decision,
    JobRequest,
)
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism
from controller.packing.inventory import (
    PackingSettings,
)

EXCLUSIVE = PackingSettings()  # the default: device plugin, whole GPUs


FSDP = Parallelism.FSDP


def job(
    name: str,
    estimate: Estimate,
    gpus: int = 1,
    parallelism: Parallelism = FSDP,
    **kw: object,
) -> JobRequest:
    return JobRequest(f"ns/{name}", estimate, parallelism, gpus, **kw)  # type: ignore[arg-type]


def says(decision: Decision, *parts: str) -> None:
    """The message holds each of these key parts (numbers, names, what to change)."""
    missing = [part for part in parts if part not in decision.message]
    assert not missing, f"{missing} not in {decision.message!r}"
