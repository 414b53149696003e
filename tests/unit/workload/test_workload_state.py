"""workload_state and workload_conditions: a batch Job and its pods, said plainly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.api import conditions as cond
from controller.workload import Phase, WorkloadState, workload_conditions, workload_state
from controller.workload.build import COMPLETION_INDEX_ANNOTATION

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)

CUDA_OOM = """Traceback (most recent call last):
  File "/app/train.py", line 88, in <module>
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total \
capacity of 79.10 GiB of which 1.21 GiB is free.
"""


def batch_job(
    *conditions: tuple[str, str, str], completions: int = 1, backoff_limit: int = 0, **status: Any
) -> dict[str, Any]:
    """A batch/v1 Job with True conditions (type, reason, message)."""
    return {
        "metadata": {"name": "llama"},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": backoff_limit,
        },
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions
            ],
            **status,
        },
    }


def pod(
    name: str = "llama-0-abcde",
    phase: str = "Pending",
    node: str | None = None,
    containers: list[dict[str, Any]] | None = None,
    index: int | None = None,
    **status: Any,
) -> dict[str, Any]:
    annotations = {COMPLETION_INDEX_ANNOTATION: str(index)} if index is not None else {}
    spec = {"nodeName": node} if node else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase, "containerStatuses": containers or [], **status},
    }


def terminated(
    exit_code: int, reason: str = "Error", message: str = "", name: str = "trainer"
) -> dict[str, Any]:
    return {
        "name": name,
        "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}},
    }


def waiting(reason: str, message: str = "", name: str = "trainer") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


# -- pending --------------------------------------------------------------------------------


def test_a_workload_not_created_yet_is_starting() -> None:
    assert workload_state(None, []) == WorkloadState(
        Phase.PENDING, cond.REASON_STARTING, "the workload is not created yet"
    )


def test_a_job_without_pods_yet_is_starting() -> None:
    state = workload_state(batch_job(), [])
    assert (state.phase, state.reason) == (Phase.PENDING, cond.REASON_STARTING)
    assert "llama" in state.message


def test_a_job_whose_pods_are_refused_says_where_to_look_after_a_minute() -> None:
    """A ResourceQuota, a LimitRange or a webhook refusing the pods leaves the Job podless;
    the Job controller says why only in the Job's Events. A tester's job read 'no pod yet'
    for as long as he watched, with its GPU held."""
    job = batch_job()
    job["metadata"] |= {"namespace": "team", "creationTimestamp": "2025-03-01T12:00:00Z"}
    assert workload_state(job, [], T0 + timedelta(seconds=59)).message == (
        "Job llama is created; no pod yet"
    )
    later = workload_state(job, [], T0 + timedelta(seconds=60))
    assert (later.phase, later.reason) == (Phase.PENDING, cond.REASON_STARTING)
    assert later.message == (
        "Job llama has had no pod for over 1 minute: something refuses its pods (a "
        "ResourceQuota, a LimitRange, an admission webhook); see `kubectl describe job "
        "llama -n team`"
    )
    # The same words at every later pass: a status written once, not at each pass.
    assert workload_state(job, [], T1) == later
    assert workload_state(job, [pod()], T1).message != later.message  # a pod: starting


def test_pods_being_created_are_starting() -> None:
    state = workload_state(
        batch_job(completions=2), [pod("a", containers=[waiting("ContainerCreating")]), pod("b")]
    )
    assert state == WorkloadState(Phase.PENDING, cond.REASON_STARTING, "2 of 2 pods starting")


def test_a_pod_stuck_on_its_image_says_so() -> None:
    stuck = pod(containers=[waiting("ImagePullBackOff", 'Back-off pulling image "x:1"')])
    state = workload_state(batch_job(), [stuck])
    assert (state.phase, state.reason) == (Phase.PENDING, "ImagePullBackOff")
    assert state.message == (
        "container trainer of pod llama-0-abcde is waiting (ImagePullBackOff): "
        'Back-off pulling image "x:1"'
    )


def test_an_unschedulable_pod_says_why_the_scheduler_refused() -> None:
    refused = pod(
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ]
    )
    state = workload_state(batch_job(), [refused])
    assert (state.phase, state.reason) == (Phase.PENDING, "Unschedulable")
    assert state.message.endswith("3 Insufficient nvidia.com/gpu.")
    assert "llama-0-abcde" in state.message


def test_a_reason_that_is_no_condition_reason_becomes_starting() -> None:
    state = workload_state(batch_job(), [pod(containers=[waiting("not a word!")])])
    assert state.reason == cond.REASON_STARTING


# -- running --------------------------------------------------------------------------------


def test_running_pods_are_counted_with_their_nodes() -> None:
    pods = [pod("b", "Running", "node-b", index=1), pod("a", "Running", "node-a", index=0)]
    state = workload_state(batch_job(completions=2), pods)
    assert state == WorkloadState(
        Phase.RUNNING, cond.REASON_RUNNING, "2 of 2 pods running on node-a, node-b"
    )


def test_one_running_pod_of_two_is_running() -> None:
    pods = [pod("a", "Running", "node-a"), pod("b")]
    state = workload_state(batch_job(completions=2), pods)
    assert (state.phase, state.message) == (Phase.RUNNING, "1 of 2 pods running on node-a")


# -- succeeded ------------------------------------------------------------------------------


@pytest.mark.parametrize("verdict", ["Complete", "SuccessCriteriaMet"])
def test_a_complete_job_succeeded(verdict: str) -> None:
    job = batch_job((verdict, "CompletionsReached", ""), succeeded=1)
    state = workload_state(job, [pod(phase="Succeeded", node="node-a")])
    assert state == WorkloadState(
        Phase.SUCCEEDED, cond.REASON_SUCCEEDED, "Job llama completed: 1 of 1 pods succeeded"
    )


def test_a_false_condition_is_no_verdict() -> None:
    job = batch_job()
    job["status"]["conditions"] = [{"type": "Complete", "status": "False"}]
    assert workload_state(job, [pod(phase="Running", node="n")]).phase is Phase.RUNNING


# -- failed ---------------------------------------------------------------------------------


def test_an_oom_killed_trainer_is_host_memory_said_plainly() -> None:
    failed = pod("llama-0-x", "Failed", "node-a", [terminated(137, "OOMKilled")])
    state = workload_state(batch_job(("Failed", "BackoffLimitExceeded", "")), [failed])
    assert (state.phase, state.reason) == (Phase.FAILED, cond.REASON_OOM_KILLED)
    assert state.message.startswith(
        "container trainer of pod llama-0-x was OOMKilled (exit 137): the node ran out of "
        "host memory"
    )
    assert "not GPU memory" in state.message


@pytest.mark.parametrize("text", [CUDA_OOM, "RuntimeError: CUDA out of memory."])
def test_a_cuda_out_of_memory_says_the_estimate_was_too_low(text: str) -> None:
    failed = pod("llama-0-x", "Failed", "node-a", [terminated(1, "Error", text)])
    state = workload_state(batch_job(("Failed", "BackoffLimitExceeded", "")), [failed])
    assert (state.phase, state.reason) == (Phase.FAILED, cond.REASON_GPU_OUT_OF_MEMORY)
    assert state.message.startswith("container trainer of pod llama-0-x ran out of GPU memory")
    assert "the GPU memory estimate was too low for this job" in state.message
    last = [line for line in text.splitlines() if "out of memory" in line][-1]
    assert state.message.endswith(" ".join(last.split()))


def test_a_failed_pod_fails_a_job_without_retries_before_the_job_says_so() -> None:
    failed = pod("llama-0-x", "Failed", "node-a", [terminated(2, "Error", "bad flag --lr")])
    state = workload_state(batch_job(), [failed])
    assert state == WorkloadState(
        Phase.FAILED,
        cond.REASON_WORKLOAD_FAILED,
        "container trainer of pod llama-0-x exited with code 2 (Error): bad flag --lr",
    )


def test_a_failed_pod_of_a_job_that_retries_is_not_yet_a_failure() -> None:
    failed = pod("llama-0-x", "Failed", "node-a", [terminated(2)])
    retry = pod("llama-0-y", "Running", "node-a")
    state = workload_state(batch_job(backoff_limit=3), [failed, retry])
    assert state.phase is Phase.RUNNING


def test_a_generic_failure_carries_the_jobs_reason_and_the_exit_code() -> None:
    failed = pod("llama-0-x", "Failed", "node-a", [terminated(3)])
    job = batch_job(("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff"))
    state = workload_state(job, [failed])
    assert (state.phase, state.reason) == (Phase.FAILED, "BackoffLimitExceeded")
    assert state.message == (
        "Job llama failed (BackoffLimitExceeded): Job has reached the specified backoff; "
        "container trainer of pod llama-0-x exited with code 3 (Error)"
    )


def test_a_deadline_is_the_jobs_reason_not_the_killed_containers() -> None:
    killed = pod("llama-0-x", "Failed", "node-a", [terminated(137, "Error")])
    job = batch_job(("Failed", "DeadlineExceeded", "Job was active longer than specified"))
    state = workload_state(job, [killed])
    assert state.reason == "DeadlineExceeded"
    assert state.message.startswith("Job llama failed (DeadlineExceeded): Job was active")


def test_failure_target_is_already_a_failure() -> None:
    job = batch_job(("FailureTarget", "BackoffLimitExceeded", "m"))
    assert workload_state(job, []).phase is Phase.FAILED


def test_across_nodes_the_rank_that_ran_out_of_memory_is_blamed() -> None:
    """Rank 0 fails second, on its broken NCCL connection: not the cause."""
    nccl = pod(
        "llama-0-x", "Failed", "node-a", [terminated(1, "Error", "NCCL error: remote")], index=0
    )
    oom = pod("llama-1-y", "Failed", "node-b", [terminated(1, "Error", CUDA_OOM)], index=1)
    state = workload_state(
        batch_job(("Failed", "BackoffLimitExceeded", ""), completions=2), [nccl, oom]
    )
    assert state.reason == cond.REASON_GPU_OUT_OF_MEMORY
    assert "pod llama-1-y" in state.message


def test_a_failed_init_container_is_blamed() -> None:
    failed = pod(
        "llama-0-x",
        "Failed",
        "node-a",
        initContainerStatuses=[terminated(1, "Error", "download failed", name="fetch")],
    )
    state = workload_state(batch_job(), [failed])
    assert state.message.startswith("container fetch of pod llama-0-x exited with code 1")


def test_an_evicted_pod_says_it_was_evicted() -> None:
    evicted = pod(
        "llama-0-x",
        "Failed",
        "node-a",
        reason="Evicted",
        message="The node was low on resource: ephemeral-storage.",
    )
    state = workload_state(batch_job(), [evicted])
    assert (state.phase, state.reason) == (Phase.FAILED, cond.REASON_WORKLOAD_FAILED)
    assert state.message == (
        "pod llama-0-x failed (Evicted): The node was low on resource: ephemeral-storage."
    )


def disrupted(reason: str, message: str, **kw: Any) -> dict[str, Any]:
    """A pod Kubernetes disrupted, as it writes one: Failed, with a DisruptionTarget."""
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason,
                 "message": message}  # fmt: skip
    return pod("llama-0-x", "Failed", "node-a", conditions=[condition], **kw)


def test_a_pod_whose_node_was_deleted_says_the_node_went_away_and_to_run_again() -> None:
    """PodGC (kube-controller-manager, pkg/controller/podgc) marks a pod whose node no longer
    exists Failed with DisruptionTarget DeletionByPodGC, then deletes it; the containers were
    never seen to stop. The Job then ends BackoffLimitExceeded, which says nothing of it."""
    gone = disrupted(
        "DeletionByPodGC",
        "PodGC: node no longer exists",
        containers=[{"name": "trainer", "state": {"running": {}}}],
    )
    message = (
        "pod llama-0-x was deleted because its node node-a no longer exists (PodGC: node no "
        "longer exists); the training stopped with it: run it again as a new job (a finished "
        "job is final: delete it and apply it again)"
    )
    assert workload_state(batch_job(), [gone]) == WorkloadState(
        Phase.FAILED, "DeletionByPodGC", message
    )
    verdict = batch_job(("Failed", "BackoffLimitExceeded", "Job has reached the specified "
                         "backoff limit"), failed=1)  # fmt: skip
    assert workload_state(verdict, [gone]) == WorkloadState(
        Phase.FAILED, "DeletionByPodGC", message
    )


def test_a_pod_the_kubelet_killed_for_a_disruption_is_not_blamed_on_its_exit_code() -> None:
    """The kubelet's SIGKILL gives exit 137: the training did not fail, the node did."""
    drained = disrupted("TerminationByKubelet", "The node was low on resource: memory.",
                        containers=[terminated(137)])  # fmt: skip
    state = workload_state(batch_job(("Failed", "BackoffLimitExceeded", "m"), failed=1),
                           [drained])  # fmt: skip
    assert state.reason == "TerminationByKubelet"
    assert state.message.startswith(
        "pod llama-0-x was terminated by the kubelet of node node-a (node-pressure eviction "
        "or a node shutdown) (The node was low on resource: memory.); the training stopped"
    )


def test_a_gpu_out_of_memory_is_still_blamed_before_a_disruption() -> None:
    oom = pod("llama-1-y", "Failed", "node-b", [terminated(1, "Error", CUDA_OOM)], index=1)
    evicted = disrupted("EvictionByEvictionAPI", "Eviction API: evicting", index=0)
    state = workload_state(batch_job(completions=2), [evicted, oom])
    assert state.reason == cond.REASON_GPU_OUT_OF_MEMORY


def test_a_failed_job_whose_failed_pod_is_gone_says_the_node_may_have_gone() -> None:
    """Once the Job counted it, the pod PodGC deleted is gone from the API; a failed pod
    otherwise stays. The Job's words alone would not say why."""
    job = batch_job(("Failed", "BackoffLimitExceeded", "Job has reached the specified "
                     "backoff limit"), failed=1)  # fmt: skip
    state = workload_state(job, [])
    assert (state.phase, state.reason) == (Phase.FAILED, "BackoffLimitExceeded")
    assert state.message == (
        "Job llama failed (BackoffLimitExceeded): Job has reached the specified backoff limit; "
        "its failed pod is gone, deleted by hand or by Kubernetes because its node went away "
        "(the training stopped with it); run it again as a new job (a finished job is final: "
        "delete it and apply it again)"
    )
    # Not for a deadline: the Job controller deletes the pods it stops itself.
    deadline = batch_job(("Failed", "DeadlineExceeded", "Job was active longer than "
                          "specified deadline"), failed=1)  # fmt: skip
    assert "node" not in workload_state(deadline, []).message


def test_a_long_termination_message_keeps_its_end() -> None:
    text = "x" * 5000 + " the real error"
    failed = pod("p", "Failed", "n", [terminated(1, "Error", text)])
    state = workload_state(batch_job(), [failed])
    assert state.message.endswith("the real error")
    assert len(state.message) < 500


def test_an_exit_code_zero_container_is_not_blamed() -> None:
    failed = pod("p", "Failed", "n", [terminated(0, "Completed", name="sidecar"), terminated(4)])
    state = workload_state(batch_job(), [failed])
    assert state.message.startswith("container trainer of pod p exited with code 4")


# -- conditions -----------------------------------------------------------------------------


def by_type(conditions: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in conditions}


RUNNING = WorkloadState(Phase.RUNNING, cond.REASON_RUNNING, "1 of 1 pods running on node-a")
OOM = WorkloadState(Phase.FAILED, cond.REASON_GPU_OUT_OF_MEMORY, "ran out of GPU memory")
DONE = WorkloadState(Phase.SUCCEEDED, cond.REASON_SUCCEEDED, "Job llama completed")
STARTING = WorkloadState(Phase.PENDING, cond.REASON_STARTING, "Job llama is created; no pod yet")


def test_a_starting_workload_is_not_running_and_has_no_verdict() -> None:
    out = workload_conditions(STARTING, [], 3, T0)
    assert by_type(out) == {"Running": ("False", "Starting")}
    assert out[0]["observedGeneration"] == 3 and out[0]["message"] == STARTING.message


def test_a_running_workload_is_running() -> None:
    assert by_type(workload_conditions(RUNNING, [], 1, T0)) == {"Running": ("True", "Running")}


def test_a_failed_workload_stops_running_and_fails_with_its_reason() -> None:
    running = workload_conditions(RUNNING, [], 1, T0)
    out = workload_conditions(OOM, running, 1, T1)
    assert by_type(out) == {
        "Running": ("False", "GPUOutOfMemory"),
        "Failed": ("True", "GPUOutOfMemory"),
    }
    failed = next(c for c in out if c["type"] == "Failed")
    assert failed["message"] == OOM.message
    assert failed["lastTransitionTime"] == "2025-03-01T12:05:00Z"


def test_a_succeeded_workload_stops_running_and_succeeds() -> None:
    out = workload_conditions(DONE, workload_conditions(RUNNING, [], 1, T0), 1, T1)
    assert by_type(out) == {"Running": ("False", "Succeeded"), "Succeeded": ("True", "Succeeded")}


def test_an_unchanged_state_records_nothing_new() -> None:
    first = workload_conditions(RUNNING, [], 1, T0)
    assert workload_conditions(RUNNING, first, 1, T1) == first


def test_a_new_run_turns_an_old_verdict_false() -> None:
    failed = workload_conditions(OOM, [], 1, T0)
    out = workload_conditions(RUNNING, failed, 2, T1)
    assert by_type(out) == {"Running": ("True", "Running"), "Failed": ("False", "Running")}


def test_other_conditions_are_kept_in_place() -> None:
    estimated = {
        "type": "Estimated",
        "status": "True",
        "reason": "Estimated",
        "message": "m",
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }
    out = workload_conditions(RUNNING, [estimated], 1, T0)
    assert out[0] == estimated and out[1]["type"] == "Running"
