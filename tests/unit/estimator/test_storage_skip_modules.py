"""`llm_int8_skip_modules` in the exact static bytes (storage.py): the linears a 4-bit job's
skip list names stay 16-bit, matched by path as the trace (`qlora.quantize_linears`) and
transformers' loader match them, so storage's weights are the trace's byte for byte."""

from __future__ import annotations

import random
from typing import Any

import pytest

from controller.estimator import Method, TrainingSettings, parse_config
from controller.estimator.module_paths import MLP_NAMES
from controller.estimator.storage import block, nf4_bytes, static_bytes
from tests.unit.trace_support import TINY_LLAMA, require_trace_extra

QLORA = TrainingSettings(method=Method.QLORA, rank=4, seq_len=32)
LORA = TrainingSettings(method=Method.LORA, rank=4, seq_len=32)


def _with_skip(config: dict[str, Any], skip: list[str] | None, double: bool = False) -> dict:
    qc: dict[str, Any] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    if double:
        qc["bnb_4bit_use_double_quant"] = True
    if skip is not None:
        qc["llm_int8_skip_modules"] = skip
    return config | {"quantization_config": qc}


def _kept_16_bit(numel: int, double: bool = False) -> int:
    """What one linear of `numel` weights adds by staying 16-bit (bf16) instead of NF4."""
    return block(2 * numel) - nf4_bytes(numel, double)


def _buffers(config: dict[str, Any]) -> int:
    """The model's buffers (RoPE tables, scales), one allocation each: weights the trace
    holds that storage does not count (DeepSeek's score-correction bias, which it does,
    aside)."""
    import torch
    from transformers import AutoModelForCausalLM

    from controller.estimator.settings import Attention
    from controller.trace.build import hf_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(config, Attention.SDPA))
    return sum(
        block(buf.numel() * buf.element_size())
        for name, buf in model.named_buffers()
        if not name.endswith("e_score_correction_bias")
    )


def _traced_weights(config: dict[str, Any], job: TrainingSettings) -> int:
    from controller.trace.run import trace_run

    return trace_run(config, job).phase_peaks["forward"].breakdown["weights"]


def _check(config: dict[str, Any], skip: list[str], job: TrainingSettings, added: int) -> None:
    """Storage agrees with the trace with `skip`, and the skip list adds `added` bytes
    against the same job without one (so a storage ignoring it fails here)."""
    skipped = _with_skip(config, skip)
    static = static_bytes(parse_config(skipped), job)
    plain = static_bytes(parse_config(_with_skip(config, None)), job)
    assert static.weights - plain.weights == added > 0
    assert _traced_weights(skipped, job) == static.weights + _buffers(config)


# -- pure: the figures storage gives, without the trace --------------------------------------

H, INTER, KV = 512, 1536, 128  # TINY_LLAMA: 4 layers, GQA (2 of 8 heads of 64)
Q_PROJ, O_PROJ, MLP = H * H, H * H, (H * INTER, H * INTER, INTER * H)


@pytest.mark.parametrize(
    ("skip", "added"),
    [
        (["q_proj"], 4 * _kept_16_bit(Q_PROJ)),  # a bare name: in every layer
        (["self_attn.q_proj", "q_proj"], 4 * _kept_16_bit(Q_PROJ)),  # counted once
        (["model.layers.1.mlp"], sum(map(_kept_16_bit, MLP))),  # one layer's MLP
        (["model.layers.1"], sum(map(_kept_16_bit, (Q_PROJ, H * KV, H * KV, O_PROJ, *MLP)))),
        (["layers.0.self_attn.o_proj"], _kept_16_bit(O_PROJ)),
        (["language_model.model.layers.3.self_attn.o_proj"], _kept_16_bit(O_PROJ)),
        (["lm_head", "embed_tokens", "vision_tower", "model.layers.11"], 0),
    ],
)
def test_skipped_linears_are_priced_16_bit(skip: list[str], added: int) -> None:
    plain = static_bytes(parse_config(_with_skip(TINY_LLAMA, None)), QLORA)
    static = static_bytes(parse_config(_with_skip(TINY_LLAMA, skip)), QLORA)
    assert static.weights - plain.weights == added
    # nothing else changes: adapters, gradients, optimizer state are the same tensors
    assert static.gradients == plain.gradients and static.optimizer == plain.optimizer
    assert static.layer_parts == plain.layer_parts


def test_a_skipped_linear_is_not_dequantised() -> None:
    """`dequantized` is the largest 4-bit weight dequantised while it runs: a 16-bit one
    never is."""
    plain = static_bytes(parse_config(_with_skip(TINY_LLAMA, None)), QLORA)
    assert plain.dequantized == block(2 * H * INTER)
    no_mlp = static_bytes(parse_config(_with_skip(TINY_LLAMA, [r"model\.layers\.\d+\.mlp"])), QLORA)
    assert no_mlp.dequantized == block(2 * H * H)  # q_proj, o_proj
    one_layer = static_bytes(parse_config(_with_skip(TINY_LLAMA, ["model.layers.2.mlp"])), QLORA)
    assert one_layer.dequantized == block(2 * H * INTER)  # the other layers' MLPs still 4-bit


def test_without_a_skip_list_nothing_changes() -> None:
    """No skip list, an empty one, or one matching nothing: the same figures; a 16-bit job
    ignores the skip list; the per-layer matching runs only when there is a list."""
    shapes = [parse_config(_with_skip(TINY_LLAMA, skip)) for skip in (None, [], ["vision"])]
    for job in (QLORA, LORA):
        figures = {static_bytes(shape, job) for shape in shapes}
        assert len(figures) == 1
    assert "skipped-linears" not in shapes[0].memo and "skipped-linears" not in shapes[1].memo
    full = TrainingSettings(method=Method.LORA, rank=4)
    sixteen = static_bytes(parse_config(TINY_LLAMA | {"quantization_config": {}}), full)
    assert sixteen == static_bytes(parse_config(TINY_LLAMA), full)
    dense_skip = TINY_LLAMA | {"quantization_config": {"llm_int8_skip_modules": ["q_proj"]}}
    assert static_bytes(parse_config(dense_skip), full) == sixteen  # not 4-bit: no effect


def test_expert_stacks_stay_4_bit_whatever_the_skip_list_says() -> None:
    """The trace's `quantize_experts` quantises every expert stack (the skip list is the
    loader's, for nn.Linear modules); storage does what the trace does."""
    from controller.calibration.calibrate import shrunk

    config = shrunk("qwen3_moe", random.Random(3), layers=2)
    plain = static_bytes(parse_config(_with_skip(config, None)), QLORA)
    skip = ["mlp.experts", "model.layers.0.mlp.experts", "experts"]
    assert static_bytes(parse_config(_with_skip(config, skip)), QLORA) == plain


# -- against the trace -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("skip", "job", "added"),
    [
        (["q_proj"], QLORA, 4 * _kept_16_bit(Q_PROJ)),
        (["model.layers.1.mlp"], QLORA, sum(map(_kept_16_bit, MLP))),
        (["layers.0.self_attn.o_proj"], LORA, _kept_16_bit(O_PROJ)),  # a 4-bit checkpoint
    ],
)
def test_llama_storage_is_the_trace(skip: list[str], job: TrainingSettings, added: int) -> None:
    require_trace_extra()
    _check(TINY_LLAMA, skip, job, added)


QWEN2_MOE: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 128,
    "intermediate_size": 192,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 96,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "mlp_only_layers": [1],  # layer 1 keeps a dense MLP (mlp.gate_proj, ...)
    "max_position_embeddings": 4096,
}


def test_qwen_moe_shared_expert_is_matched_by_its_path() -> None:
    """The shared expert from the root (the loader matches each linear's own name: a bare
    `mlp.shared_expert` is no linear's suffix and keeps nothing): layer 0's 3 linears of
    128 x 96, not its `mlp.shared_expert_gate` beside them, nor layer 1's dense MLP."""
    require_trace_extra()
    bare = static_bytes(parse_config(_with_skip(QWEN2_MOE, ["mlp.shared_expert"])), QLORA)
    assert bare == static_bytes(parse_config(_with_skip(QWEN2_MOE, None)), QLORA)
    skip = [r"model\.layers\.\d+\.mlp\.shared_expert"]
    _check(QWEN2_MOE, skip, QLORA, 3 * _kept_16_bit(128 * 96))


def test_deepseek_shared_experts_are_matched_by_their_path() -> None:
    """DeepSeek's shared experts (`mlp.shared_experts`) in its MoE layer, not the dense
    layer's MLP; the expert stacks, named too, stay 4-bit in the trace and in storage."""
    require_trace_extra()
    from controller.calibration.calibrate import shrunk

    config = shrunk("deepseek_v3", random.Random(5), layers=2)
    shape = parse_config(config)
    moe = [layer for layer in shape.layers if layer.moe]
    assert moe  # the shrunk model has an MoE layer with shared experts
    # an MoE layer's non-expert MLP linears are its shared experts (no dense MLP beside)
    mlp = [lin for lin in moe[0].linears if not lin.expert and lin.name in MLP_NAMES]
    added = len(moe) * sum(_kept_16_bit(lin.weight_params) for lin in mlp)
    skip = [r"model\.layers\.\d+\.mlp\.shared_experts", "mlp.experts"]
    _check(config, skip, QLORA, added)


# PEFT refuses all-linear on Mamba models (out_proj, conv1d): the targets are named.
MAMBA_TARGETS = ("in_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


def test_nemotron_h_mixer_paths() -> None:
    """Nemotron-H holds every layer's mixer at `mixer`: `mixer.in_proj` is the Mamba-2
    layer's in_proj, `model.layers.2` the MLP layer (up_proj, down_proj)."""
    require_trace_extra()
    from controller.calibration.calibrate import shrunk_hybrid

    config = shrunk_hybrid("nemotron_h", random.Random(7), "M*-")
    shape = parse_config(config)
    in_proj = next(lin for lin in shape.layers[0].linears if lin.name == "in_proj")
    mlp = shape.layers[2].linears
    added = _kept_16_bit(in_proj.weight_params) + sum(
        _kept_16_bit(lin.weight_params) for lin in mlp
    )
    job = TrainingSettings(method=Method.QLORA, rank=4, seq_len=32, targets=MAMBA_TARGETS)
    _check(config, ["mixer.in_proj", "model.layers.2"], job, added)
