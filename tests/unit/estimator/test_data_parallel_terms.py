"""What FSDP2 and DDP add to each rank, in the calibrated profile's per-GPU figure.

A rank of an FSDP2 job holds its shards and, unsharded, the root's parameters (embedding,
final norm, LM head: all-gathered as forward starts, resharded when backward ends) and the
blocks in flight (the current one and the prefetched one); a DDP rank holds the whole job
and its gradient buckets. `sharded / n + replicated` of a single-GPU fit holds neither. The
figures here are computed from the model's own sizes, not read from the estimator.
"""

from __future__ import annotations

from controller.estimator import Checkpointing, Method, TrainingSettings, calibrated, load_shape
from controller.estimator.settings import Parallelism
from controller.estimator.storage import block, static_bytes

FULL = TrainingSettings(method=Method.FULL, rank=None)

# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json): hidden 4096, MLP 14336, 32 heads of
# 128, 8 kv heads, vocabulary 128256, untied head; bf16, two bytes an element.
H, MLP, KV, V = 4096, 14336, 1024, 128256
ROOT = 2 * block(V * H * 2) + block(H * 2)  # embedding, LM head, final norm
BLOCK = 2 * block(H * H * 2) + 2 * block(H * KV * 2) + 3 * block(H * MLP * 2) + 2 * block(H * 2)


def _old_rule(est, n: int, share: tuple[int, int] | None = None) -> int:  # type: ignore[no-untyped-def]
    """`sharded / n + replicated` over the single-GPU moments, with the margin: the figure
    before FSDP2's terms, the allocator's reserve at `share` (an FSDP rank's by default)."""
    pairs = ((est.sharded_bytes, est.replicated_bytes), *est.moments)
    held = max(s // n + r for s, r in pairs)
    # the allocator's reserve beyond this rank's share of weights
    num, den = share or est.fsdp_reserve_share
    reserve = max(0, held - est.fixed_bytes - est.resident_bytes // n) * num // den
    return held + reserve + est.comm_bytes


def test_the_static_sizes_fsdp2_gathers_are_the_models_own() -> None:
    static = static_bytes(load_shape("llama-3.1-8b"), FULL)
    assert static.root_weights == ROOT
    assert static.layer_weights == BLOCK


def _with_margin(est, held: int, n: int) -> int:  # type: ignore[no-untyped-def]
    num, den = est.fsdp_reserve_share
    return held + max(0, held - est.fixed_bytes - est.resident_bytes // n) * num // den


def test_an_fsdp_rank_holds_the_root_and_a_block_unsharded_beyond_its_share() -> None:
    est = calibrated.estimate(load_shape("llama-3.1-8b"), FULL)
    # On 2 GPUs the optimizer step's shards decide (half of 75 GiB), as before.
    assert est.per_gpu_bytes(2, Parallelism.FSDP) == _old_rule(est, 2)
    tail_sharded, tail_replicated = est.moments[0]  # backward's tail
    for n in (8, 64):
        tail = tail_sharded // n + tail_replicated
        # Backward's tail plus the root's parameters and the last block, unsharded.
        assert est.per_gpu_bytes(n, Parallelism.FSDP) >= _with_margin(est, tail + ROOT + BLOCK, n)
        assert est.per_gpu_bytes(n, Parallelism.FSDP) > _old_rule(est, n)


def test_backward_ends_with_the_roots_parameters_and_gradients_whole() -> None:
    """The embedding's backward: root parameters and gradients (LM head, final norm,
    embedding: untied) whole, the first block's gradients awaiting their reduce-scatter, the
    other blocks' sharded."""
    static = static_bytes(load_shape("llama-3.1-8b"), FULL)
    est = calibrated.estimate(load_shape("llama-3.1-8b"), FULL)
    layer_grads = 32 * BLOCK  # every block's parameters train, all in bf16
    whole = ROOT + ROOT + BLOCK  # parameters, gradients, the first block's gradients
    sharded = static.weights + static.optimizer + layer_grads
    assert (sharded, whole + est.fixed_bytes) in est.fsdp_moments
    held = sharded // 64 + whole + est.fixed_bytes
    assert est.per_gpu_bytes(64, Parallelism.FSDP) >= _with_margin(est, held, 64)


def test_in_a_backward_block_two_blocks_are_unsharded() -> None:
    """LoRA with checkpointing: a last-layer recompute moment holds the layer and the
    prefetched one before it, the root's parameters too; forward's start the root twice."""
    settings = TrainingSettings(method=Method.LORA, rank=16)
    est = calibrated.estimate(load_shape("llama-3.1-8b"), settings)
    static = static_bytes(load_shape("llama-3.1-8b"), settings)
    fitted = calibrated._moments("llama", Method.LORA, "on", "sdpa")
    assert len(est.fsdp_moments) == len(fitted) + 1  # forward's start; no embedding gradient
    for (key, *_), (s, r), (fs, fr) in zip(fitted, est.moments, est.fsdp_moments, strict=False):
        assert fs == s
        if key.startswith("backward/last/"):
            assert fr - r == static.root_weights + 2 * static.layer_weights
        elif key == "backward/tail":  # an untied root: gathered again, output and copies
            assert fr - r == 2 * static.root_weights
        elif key == calibrated.OPTIMIZER_KEY:
            assert fr == r  # the step works on the shards alone
        else:
            assert fr - r == static.root_weights + static.layer_weights
    _, start = est.fsdp_moments[-1]
    assert start - est.fixed_bytes >= 2 * static.root_weights + static.layer_weights


def test_a_ddp_rank_holds_the_whole_job_and_its_gradient_buckets() -> None:
    est = calibrated.estimate(load_shape("llama-3.1-8b"), FULL)
    gradients = static_bytes(load_shape("llama-3.1-8b"), FULL).gradients
    assert gradients >= ROOT + 32 * BLOCK  # every parameter trains
    assert est.per_gpu_bytes(1, Parallelism.DDP) == est.total_bytes
    for n in (2, 8):
        assert est.per_gpu_bytes(n, Parallelism.DDP) >= est.total_bytes + gradients


def test_one_gpu_and_a_device_map_are_what_they_were() -> None:
    for method in (Method.FULL, Method.LORA, Method.QLORA):
        for gc in (Checkpointing.ON, Checkpointing.OFF):
            settings = TrainingSettings(
                method=method, rank=None if method is Method.FULL else 16, gradient_checkpointing=gc
            )
            est = calibrated.estimate(load_shape("llama-3.1-8b"), settings)
            for mode in Parallelism:
                assert est.per_gpu_bytes(1, mode) == est.total_bytes
            # a device map is one process: no NCCL communicator
            device_map = _old_rule(est, 4, est.reserve_share) - est.comm_bytes
            assert est.per_gpu_bytes(4, Parallelism.DEVICE_MAP) == device_map
