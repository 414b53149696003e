"""Each GPU needs the largest of `sharded / n + replicated` over the step's moments.

Without gradient checkpointing, backward keeps a whole micro-batch of activations on every
GPU, which FSDP does not divide, while the optimizer step, the step's largest total, is all
sharded: on 8 GPUs the trace of llama-3.1-8b full fine-tuning at 2,048 tokens needs about
25 GiB per GPU, where the optimizer step's split alone says 11.75 GiB. The trace gives its
phases as moments (test_trace.py), the calibrated profile its fitted moments, each with the
gradients it surely holds by then counted as sharded.
"""

from __future__ import annotations

from controller.base.units import GIB
from controller.estimator import Checkpointing, Method, TrainingSettings, calibrated, load_shape
from controller.estimator.result import Estimate
from controller.estimator.settings import Parallelism
from controller.estimator.storage import static_bytes


def test_the_largest_moment_on_n_gpus_is_each_gpus_need() -> None:
    step = Estimate("x", {"a": 80 * GIB}, 0, 0, sharded_bytes=80 * GIB, replicated_bytes=0,
                    moments=((45 * GIB, 16 * GIB),))  # fmt: skip
    assert step.per_gpu_bytes(1) == 80 * GIB  # one GPU: the peak itself
    assert step.per_gpu_bytes(2) == 40 * GIB + 0  # the step's 80 / 2 beats 22.5 + 16
    assert step.per_gpu_bytes(8) == 45 * GIB // 8 + 16 * GIB  # backward's beats the step's 10
    assert step.per_gpu_bytes(8, Parallelism.DDP) == 80 * GIB
    assert step.most_replicated_bytes == 16 * GIB


def test_the_fewest_gpus_hint_starts_from_each_moments_own_fewest() -> None:
    """llama-3.1-70b full: 73.74 GiB per GPU on 10 GPUs of 80 GiB. Starting the search from
    the step's sharded part over the largest whole part of any moment said 11."""
    from controller.decision import Outcome, decide
    from tests.unit.builders.decision import job
    from tests.unit.builders.packing import node, view

    settings = TrainingSettings(method=Method.FULL, rank=None)
    big = calibrated.estimate(load_shape("llama-3.1-70b"), settings)
    assert big.per_gpu_bytes(10) <= 80 * GIB < big.per_gpu_bytes(9)
    decision = decide(job("big", big), view(node("a", [80, 80])))
    assert decision.outcome is Outcome.REJECT
    assert "(at least 10 GPUs of that size would hold it with FSDP" in decision.message


def full(preset: str, checkpointing: Checkpointing) -> Estimate:
    settings = TrainingSettings(method=Method.FULL, rank=None, gradient_checkpointing=checkpointing)
    return calibrated.estimate(load_shape(preset), settings)


def test_calibrated_fsdp_without_checkpointing_holds_backwards_activations_on_every_gpu() -> None:
    off, on = full("llama-3.1-8b", Checkpointing.OFF), full("llama-3.1-8b", Checkpointing.ON)
    # the optimizer step's tensors either way (the allocator's share differs by setting)
    slack = "allocator_slack"
    assert off.total_bytes - off.components[slack] == on.total_bytes - on.components[slack]
    # Checkpointing keeps little: the root's parameters and gradients and the blocks in
    # flight (FSDP2's, 4.6 GiB) over the shards, the allocator's reserve (an FSDP rank's
    # share: 2.4 GiB) and NCCL's buffers.
    assert on.per_gpu_bytes(8) < 18 * GIB
    assert off.per_gpu_bytes(8) > 24 * GIB  # about 16 GiB of activations on each GPU
    # Every moment the fits know is one the per-GPU need covers.
    for sharded, replicated in off.moments:
        assert off.per_gpu_bytes(8) >= sharded // 8 + replicated


def test_calibrated_shards_the_gradients_a_backward_moment_holds() -> None:
    """qwen2.5-32b full, checkpointing on: the first layer's recompute in backward holds the
    gradients of the 63 layers done (61 GiB). Counted whole on every GPU they made it
    92.5 GiB per GPU on 8 GPUs; FSDP has each GPU hold 1/8 of them, all but the layer being
    worked on and the one being reduce-scattered (the head's stay whole: FSDP's root unit)."""
    est = full("qwen2.5-32b", Checkpointing.ON)
    shape = load_shape("qwen2.5-32b")
    settings = TrainingSettings(method=Method.FULL, rank=None)
    static = static_bytes(shape, settings)
    done = (shape.num_layers - 2) * static.layer_gradients
    first = [m for m in est.moments if m[0] == static.weights + static.optimizer + done]
    assert first, "no backward moment shards exactly the gradients of the layers done"
    assert est.per_gpu_bytes(8) < 47 * GIB  # the gradients whole: over 92 GiB
    assert all(replicated < done for _, replicated in est.moments)  # none whole on each GPU


def test_a_traced_rank_answers_for_its_own_parallelism_and_count_only() -> None:
    """The trace profile traces one rank at the job's world size (controller/trace/
    distributed.py); that figure holds what the rule cannot see, and only there."""
    rule = Estimate("x", {"a": 80 * GIB}, 0, 0, sharded_bytes=80 * GIB, replicated_bytes=0)
    traced = Estimate("x", {"a": 80 * GIB}, 0, 0, sharded_bytes=80 * GIB, replicated_bytes=0,
                      traced_per_gpu=(("fsdp", 8, 13 * GIB), ("ddp", 8, 95 * GIB)))  # fmt: skip
    assert traced.per_gpu_bytes(8, Parallelism.FSDP) == 13 * GIB  # not the rule's 10
    assert traced.per_gpu_bytes(8, Parallelism.DDP) == 95 * GIB  # buckets on top of 80
    for n, parallelism in (
        (4, Parallelism.FSDP),
        (8, Parallelism.DEVICE_MAP),
        (1, Parallelism.DDP),
    ):
        assert traced.per_gpu_bytes(n, parallelism) == rule.per_gpu_bytes(n, parallelism)
