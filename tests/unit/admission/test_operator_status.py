"""What the operator records: only changes, each with one Event; nothing when nothing changed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller.admission import status as rules
from controller.api import conditions as cond
from controller.base.units import format_gib
from controller.estimator import SpecErrors
from controller.jobs.spec import estimate_plan, translate

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
LATER = T0 + timedelta(hours=1)
SPEC = {
    "model": {"preset": "llama-3.1-8b"},
    "method": "QLoRA",
    "lora": {"rank": 16},
    "estimator": {"profile": "Analytic"},
}


def _estimated(status: dict[str, Any], generation: int = 1, now: datetime = T0, **spec: Any):
    plan, errors = translate({**SPEC, **spec})
    assert plan is not None, errors
    return rules.estimated(plan, estimate_plan(plan), generation, status, now)


def _invalid(status: dict[str, Any], generation: int = 1, now: datetime = T0):
    _, errors = translate({**SPEC, "lora": {"rank": 0}, "training": {"optimizer": "Lion"}})
    return rules.invalid(str(SpecErrors(errors)), generation, status, now)


def _by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_first_estimate_sets_status_conditions_and_an_event() -> None:
    update = _estimated({})
    estimate = update.patch["estimate"]
    assert estimate["totalBytes"] == 7_780_056_064
    assert estimate["perGpuBytes"] == 7_780_056_064
    assert estimate["total"] == estimate["perGpu"] == "7.25 GiB"
    assert estimate["components"]["weights"] == 4_015_130_624
    assert sum(estimate["components"].values()) == estimate["totalBytes"]
    assert estimate["model"] == "llama-3.1-8b" and estimate["profile"] == "analytic"
    assert (estimate["totalParams"], estimate["trainableParams"]) == (8_030_261_248, 41_943_040)
    assert update.patch["observedGeneration"] == 1
    conditions = _by_type(update.patch)
    assert conditions["Estimated"]["status"] == "True"
    assert conditions["Estimated"]["message"] == "7.25 GiB per GPU on 1 GPU with FSDP"
    assert conditions["Admitted"]["status"] == "Unknown"
    assert conditions["Admitted"]["reason"] == cond.REASON_PENDING
    assert update.event is not None and update.event.type == "Normal"
    assert update.event.message.startswith("7.25 GiB per GPU on 1 GPU")
    assert "QLoRA r=16, 2048 tokens x batch 1" in update.event.message


def test_the_same_job_again_changes_nothing() -> None:
    status = _estimated({}).patch
    again = _estimated(status, now=LATER)
    assert again.patch == {} and again.event is None


def test_a_new_generation_moves_the_figures_but_not_the_transition_time() -> None:
    status = _estimated({}).patch
    update = _estimated(status, generation=2, now=LATER, training={"sequenceLength": 4096})
    assert update.patch["observedGeneration"] == 2
    assert update.patch["estimate"]["totalBytes"] > status["estimate"]["totalBytes"]
    estimated = _by_type(update.patch)["Estimated"]
    assert estimated["observedGeneration"] == 2
    assert estimated["lastTransitionTime"] == "2025-03-01T12:00:00Z"


def test_an_invalid_spec_fails_both_conditions_and_drops_the_estimate() -> None:
    status = _estimated({}).patch
    update = _invalid(status, generation=2, now=LATER)
    assert update.patch["estimate"] is None
    message = (
        "spec.lora.rank: must be greater than or equal to 1, got 0; "
        "spec.training.optimizer: unsupported value 'Lion'; allowed: AdamW, AdamW8bit, "
        "AdamWFp32Master, AdamWTorch, PagedAdamW32bit, SGD"
    )
    for condition in update.patch["conditions"]:
        assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
        assert condition["message"] == message
        assert condition["lastTransitionTime"] == "2025-03-01T13:00:00Z"
    assert update.event is not None and update.event.type == "Warning"
    assert update.event.message == message


def test_an_invalid_spec_seen_twice_changes_nothing() -> None:
    status = _invalid({}).patch
    assert _invalid(status, now=LATER).patch == {}


def test_fixing_the_spec_returns_admission_to_pending() -> None:
    status = _invalid({}).patch
    update = _estimated(status, generation=2, now=LATER)
    admitted = _by_type(update.patch)["Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("Unknown", "Pending")
    assert admitted["lastTransitionTime"] == "2025-03-01T13:00:00Z"


def test_an_admission_decision_is_left_alone() -> None:
    status = _estimated({}).patch
    admitted = {
        "type": "Admitted",
        "status": "True",
        "reason": cond.REASON_FITS,
        "message": "admitted on gpu-node-0",
        "observedGeneration": 1,
        "lastTransitionTime": "2025-03-01T12:00:30Z",
    }
    status = {**status, "conditions": [status["conditions"][0], admitted]}
    update = _estimated(status, generation=2, now=LATER, training={"sequenceLength": 1024})
    assert _by_type(update.patch)["Admitted"] == admitted


def test_not_estimated_says_why_in_admitted_too() -> None:
    """`kubectl get ftj` shows Admitted's status and reason, not Estimated's."""
    update = rules.not_estimated(
        cond.REASON_CONFIGMAP_UNAVAILABLE, "spec.model.configMapRef.name: not found", 1, {}, T0
    )
    conditions = _by_type(update.patch)
    assert conditions["Estimated"]["reason"] == "ConfigMapUnavailable"
    admitted = conditions["Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("False", "ConfigMapUnavailable")
    assert admitted["message"] == (
        "not admitted until estimated: spec.model.configMapRef.name: not found"
    )
    assert "estimate" not in update.patch, "nothing to remove"
    assert update.event is not None and update.event.type == "Warning"
    # Once the ConfigMap is there, the job waits for admission like any estimated job.
    later = _estimated({"conditions": update.patch["conditions"]}, generation=1, now=LATER)
    admitted = _by_type(later.patch)["Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("Unknown", "Pending")


def test_not_estimated_leaves_a_decision_alone() -> None:
    decided = {
        "type": "Admitted",
        "status": "False",
        "reason": "WaitingForVRAM",
        "message": "queued",
        "observedGeneration": 1,
        "lastTransitionTime": "2025-03-01T12:00:30Z",
    }
    update = rules.not_estimated(
        cond.REASON_CONFIGMAP_UNAVAILABLE, "gone", 1, {"conditions": [decided]}, T0
    )
    assert _by_type(update.patch)["Admitted"] == decided


def test_messages_are_one_bounded_line() -> None:
    update = rules.not_estimated(cond.REASON_ESTIMATION_FAILED, "a\nb " + "x" * 10_000, 1, {}, T0)
    ddp = _by_type(_estimated({}, resources={"gpus": 4}, parallelism="DDP").patch)["Estimated"]
    assert ddp["message"].endswith("per GPU on 4 GPUs with DDP")  # every GPU holds it all
    message = _by_type(update.patch)["Estimated"]["message"]
    assert "\n" not in message and len(message) == rules.MAX_MESSAGE
    assert message.startswith("a b x") and message.endswith("...")


def test_per_gpu_figures_follow_the_gpu_count() -> None:
    update = _estimated({}, resources={"gpus": 4})
    estimate = update.patch["estimate"]
    assert estimate["gpus"] == 4 and estimate["parallelism"] == "FSDP"
    assert estimate["perGpuBytes"] < estimate["totalBytes"]
    ddp = _by_type(_estimated({}, resources={"gpus": 4}, parallelism="DDP").patch)["Estimated"]
    assert ddp["message"].endswith("per GPU on 4 GPUs with DDP")  # every GPU holds it all
    message = _by_type(update.patch)["Estimated"]["message"]
    # The 1-GPU total is named as such, so it does not read as a sum over the four; what
    # FSDP does not divide says why the figure is more than a quarter of it.
    plan, _ = translate({**SPEC, "resources": {"gpus": 4}})
    assert plan is not None
    est = estimate_plan(plan)
    undivided = format_gib(est.undivided_bytes(4))
    assert message == (
        f"{estimate['perGpu']} per GPU on 4 GPUs with FSDP "
        f"({undivided} of it FSDP does not divide; {estimate['total']} on one GPU)"
    )
    assert 0 < est.undivided_bytes(4) < estimate["perGpuBytes"]


def test_a_resized_admission_restates_the_estimate_at_the_admitted_count() -> None:
    """Asked 8, admitted on 4 (policy Resize): status.estimate and the Estimated message say
    the same count and figure, and that the count was resized; the condition keeps its
    transition time and no Event is posted (the admission's says it)."""
    plan, _ = translate({**SPEC, "method": "Full", "lora": None, "admissionPolicy": "Resize",
                         "resources": {"gpus": 8, "minGPUs": 1}})  # fmt: skip
    assert plan is not None
    est = estimate_plan(plan)
    status = rules.estimated(plan, est, 1, {}, T0).patch
    update = rules.admitted_estimate(plan, est, 4, 1, status, LATER)
    after = {**status, **update.patch}
    estimate, estimated = after["estimate"], _by_type(after)["Estimated"]
    assert estimate["gpus"] == 4
    assert estimate["perGpuBytes"] == est.per_gpu_bytes(4, plan.parallelism)
    assert estimated["message"] == (
        f"{estimate['perGpu']} per GPU on 4 GPUs with FSDP "
        f"({format_gib(est.undivided_bytes(4))} of it FSDP does not divide; "
        f"{estimate['total']} on one GPU); resized from the 8 GPUs asked for (policy Resize)"
    )
    assert estimated["lastTransitionTime"] == _by_type(status)["Estimated"]["lastTransitionTime"]
    assert update.event is None
    assert rules.admitted_estimate(plan, est, 8, 1, status, LATER).patch == {}, "as asked"


def test_a_sequence_beyond_the_context_is_estimated_and_the_condition_says_so() -> None:
    update = _estimated({}, training={"sequenceLength": 200_000})
    estimated = _by_type(update.patch)["Estimated"]
    assert estimated["status"] == "True"
    assert "; warning: spec.training.sequenceLength: 200000 is longer than" in estimated["message"]


def test_defaults_a_config_leaves_to_its_class_are_said_in_the_condition() -> None:
    """A nested text_config without its dimensions (transformers 4 saved LLaVA-1.5-7B's so)
    is estimated with its class's defaults, and the Estimated condition says which."""
    llava = {"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 32064}}
    update = _estimated({}, model={"config": llava})
    estimated = _by_type(update.patch)["Estimated"]
    assert estimated["status"] == "True"
    assert (
        "; warning: spec.model.config.text_config: estimated with the defaults of transformers' "
        "llama config class for what the config leaves out (hidden_size=4096, "
    ) in estimated["message"]
    heads = "; warning: spec.model.config.text_config.num_key_value_heads: not in the config"
    assert heads in estimated["message"]
