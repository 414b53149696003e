"""Every figure of seed 2 (`finetuning-vram-calculator.md`) through the analytic profile."""

from __future__ import annotations

import pytest

from controller.estimator import (
    Checkpointing,
    Method,
    Optimizer,
    Parallelism,
    TrainingSettings,
    load_shape,
    parse_config,
)
from controller.estimator.analytic import OVERHEAD
from controller.jobs.profiles import estimate
from controller.packing.fit import fit
from tests.unit.conftest import GIB, LLAMA_31_8B, LLAMA_65B

LLAMA = parse_config(LLAMA_31_8B)


def gib(n: int) -> float:
    return n / GIB


def run(**kw: object) -> object:
    return estimate(LLAMA, TrainingSettings(**kw))  # type: ignore[arg-type]


def test_parameter_count_and_adapter_size() -> None:
    e = run()
    assert e.total_params == 8_030_261_248
    assert e.trainable_params == 41_943_040  # PEFT's print_trainable_parameters()
    assert round(e.trainable_params / e.total_params * 100, 2) == 0.52


def test_qlora_worked_example_line_by_line() -> None:
    e = run()
    c = e.components
    assert c["weights"] == 4_015_130_624
    assert c["gradients"] == 83_886_080
    assert c["optimizer"] == 335_544_320
    assert c["activations"] == 536_870_912
    assert c["logits"] == 2_101_346_304
    assert round(gib(c["weights"]), 2) == 3.74
    assert round(gib(c["gradients"]), 2) == 0.08
    assert round(gib(c["optimizer"]), 2) == 0.31
    assert round(gib(c["activations"]), 2) == 0.50
    assert round(gib(c["logits"]), 2) == 1.96
    subtotal = e.total_bytes - c["overhead"]
    assert round(gib(subtotal), 2) == 6.59
    assert round(gib(e.total_bytes), 2) == 7.25
    assert round(e.total_bytes / 1e9, 2) == 7.78  # "7.78 GB in decimal"


@pytest.mark.parametrize(
    ("kw", "expected_gib", "digits"),
    [
        ({"method": Method.LORA}, 19.6, 1),
        ({"method": Method.FULL}, 101.4, 1),
        ({"method": Method.FULL, "optimizer": Optimizer.ADAMW_8BIT}, 52, 0),
        ({"method": Method.FULL, "optimizer": Optimizer.ADAMW_FP32_MASTER}, 134, 0),
        ({"seq_len": 8192}, 15.4, 1),
        ({"batch": 4}, 15.4, 1),
    ],
)
def test_seed_totals(kw: dict[str, object], expected_gib: float, digits: int) -> None:
    assert round(gib(run(**kw).total_bytes), digits) == expected_gib  # type: ignore[attr-defined]


def test_checkpointing_off_multiplies_the_layer_term_by_17() -> None:
    on, off = run(), run(gradient_checkpointing=Checkpointing.OFF)
    assert off.components["activations"] == 17 * on.components["activations"]
    assert round(gib(off.components["activations"]), 2) == 8.50
    # The seed prints 16.1: 16.046 rounded to 16.05 first, then to one decimal.
    assert round(round(gib(off.total_bytes), 2), 1) == 16.1


def test_full_bf16_is_12_bytes_per_parameter_before_activations() -> None:
    e = run(method=Method.FULL)
    static = e.components["weights"] + e.components["gradients"] + e.components["optimizer"]
    assert static == 12 * 8_030_261_248
    assert round(static / 1e9, 2) == 96.36
    assert round(gib(static), 2) == 89.75
    assert round(gib(e.components["activations"] + e.components["logits"]), 2) == 2.46


def test_fsdp_full_bf16_on_80gb_cards_takes_two() -> None:
    e = run(method=Method.FULL)
    # "On 80 GB cards that is 2 with FSDP: 44.9 GiB of shards plus 2.46 GiB of activations
    # each." The per-GPU figure keeps the profile's x1.1 margin, as the total does, so that
    # one GPU of any parallelism holds exactly the total.
    assert fit(e, [80 * 10**9] * 8, Parallelism.FSDP).min_gpus == 2
    result = fit(e, [80 * 10**9] * 8, Parallelism.FSDP, gpus=2)
    shard = e.sharded_bytes // 2
    assert round(gib(shard), 1) == 44.9
    assert round(gib(e.replicated_bytes), 2) == 2.46
    assert result.fits and result.per_gpu_bytes == int((shard + e.replicated_bytes) * OVERHEAD)
    assert not fit(e, [80 * 10**9], Parallelism.FSDP).fits
    assert e.per_gpu_bytes(1, Parallelism.FSDP) == e.total_bytes


def test_mistral_7b_qlora_costs_about_2_gib_less_than_llama_8b() -> None:
    mistral = estimate(load_shape("mistral-7b-v0.1"), TrainingSettings())
    difference = gib(run().total_bytes - mistral.total_bytes)
    assert 1.5 < difference < 2.5


def test_llama_70b_qlora_is_about_43_gib() -> None:
    e = estimate(load_shape("llama-3.1-70b"), TrainingSettings())
    assert round(gib(e.total_bytes)) == 43


@pytest.mark.parametrize(("seq_len", "expected"), [(512, 42.3), (2048, 44.8)])
def test_qlora_paper_65b_with_rank_64(seq_len: int, expected: float) -> None:
    e = estimate(parse_config(LLAMA_65B), TrainingSettings(rank=64, seq_len=seq_len))
    assert abs(gib(e.total_bytes) / expected - 1) < 0.005


def test_gemma2_logits_at_2048_tokens() -> None:
    e = estimate(load_shape("gemma-2-9b"), TrainingSettings())
    assert e.components["logits"] == 2048 * 256_000 * 8
    assert round(gib(e.components["logits"]), 1) == 3.9


def test_attention_only_adapter_formula() -> None:
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    e = run(targets=targets)
    h, kv, layers, r = 4096, 1024, 32, 16
    assert e.trainable_params == layers * r * (6 * h + 2 * kv)


def test_all_linear_adapter_formula() -> None:
    h, kv, i, layers, r = 4096, 1024, 14336, 32, 16
    assert run().trainable_params == layers * r * (9 * h + 2 * kv + 3 * i)


def test_fused_loss_drops_the_logits_term() -> None:
    assert run(fused_loss=True).components["logits"] == 0


def test_modules_to_save_train_embeddings_and_head_in_full() -> None:
    base = run()
    saved = run(modules_to_save=("embed_tokens", "lm_head"))
    extra = saved.trainable_params - base.trainable_params
    assert extra == 2 * 128_256 * 4096
    assert round(extra / 1e9, 2) == 1.05
    static = lambda e: e.components["gradients"] + e.components["optimizer"]  # noqa: E731
    assert static(saved) - static(base) == 10 * extra  # "at 10 bytes each"


def test_sequence_and_batch_are_the_same_thing_to_memory() -> None:
    assert run(seq_len=8192).total_bytes == run(batch=4).total_bytes
    assert run(gradient_accumulation=8).total_bytes == run().total_bytes
