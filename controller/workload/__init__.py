"""Workload: an admitted FineTuneJob as the Kubernetes objects that run it, and their state.

    build.py   the objects to create (a batch/v1 Job; the headless Service of a job across
               nodes; the DRA ResourceClaim or ResourceClaimTemplate), pinned to the GPUs
               admission chose, in each of the three GPU modes
    state.py   the batch Job and its pods -> Pending, Running, Succeeded or Failed, said
               plainly (a host OOM kill and a CUDA out-of-memory are told apart), and the
               FineTuneJob conditions that follow
    lost.py    a workload created and then deleted: how it ended, from what it left behind
               (its Events, its pods), so a training never runs twice

Pure: plain dicts in, plain dicts out, no Kubernetes client. The operator creates what
`build_workload` returns and feeds what it reads back to `workload_state`.
"""

from controller.api.names import job_label_value, workload_name
from controller.workload.build import (
    QUEUE_LABEL,
    Admission,
    Queued,
    WorkloadError,
    build_queued_workload,
    build_workload,
    workload_problem,
)
from controller.workload.lost import Remains, ending
from controller.workload.state import Phase, WorkloadState, workload_conditions, workload_state

__all__ = [
    "QUEUE_LABEL",
    "Admission",
    "Phase",
    "Queued",
    "Remains",
    "WorkloadError",
    "WorkloadState",
    "build_queued_workload",
    "build_workload",
    "ending",
    "job_label_value",
    "workload_conditions",
    "workload_name",
    "workload_problem",
    "workload_state",
]
