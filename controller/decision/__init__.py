"""Admission decisions: Admit, Resize, Queue or Reject, each with a message in numbers.

    decide.py   one job against the cluster's free memory now and when empty
    plan.py     many jobs in queue order, each admission charged before the next
    explain.py  the messages people read in `kubectl describe ftj` and `vramgate plan`
    types.py    JobRequest, Decision, AdmissionSettings

Pure like `controller.packing`: the operator's loop and `vramgate plan` both call `plan`.
"""

from controller.decision.decide import decide
from controller.decision.plan import plan, plan_on, queue_order
from controller.decision.types import (
    ADVISE,
    AdmissionSettings,
    Decision,
    JobRequest,
    Outcome,
    QueueingStrategy,
)

__all__ = [
    "ADVISE",
    "AdmissionSettings",
    "Decision",
    "JobRequest",
    "Outcome",
    "QueueingStrategy",
    "decide",
    "plan",
    "plan_on",
    "queue_order",
]
