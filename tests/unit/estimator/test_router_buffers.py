"""DeepSeek-V3-style routers' score-correction bias: a buffer, held on the GPU, no parameter.

transformers 5 registers `e_score_correction_bias` as an fp32 `nn.Buffer` (DeepseekV3TopkRouter,
Glm4MoeTopkRouter, NemotronHTopkRouter): `num_parameters` leaves it out, the optimizer never
sees it, yet its bytes sit beside the weights. ERNIE 4.5's is an `nn.Parameter`. The test over
every model type checks the parameter counts at default sizes; these check the bytes, which
that test does not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from controller.estimator import Method, Profile, TrainingSettings, formula_estimate, parse_config
from controller.estimator.model.shape import ModelShape
from controller.estimator.storage import block, static_bytes

EXPERTS = 24  # a size no other tensor of the layer has
DEEPSEEK: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,  # one dense layer, two MoE layers
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 100,
    "n_routed_experts": EXPERTS,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "q_lora_rank": 16,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
}
MOE_LAYERS = 2


def _without_buffers(shape: ModelShape) -> ModelShape:
    layers = tuple(replace(layer, fp32_buffers=()) for layer in shape.layers)
    return replace(shape, layers=layers, memo={})


@pytest.mark.parametrize("model_type", ["deepseek_v3", "glm4_moe", "kimi_k2"])
def test_the_correction_bias_is_a_buffer_not_a_parameter(model_type: str) -> None:
    shape = parse_config(DEEPSEEK | {"model_type": model_type})
    moe = [layer for layer in shape.layers if layer.moe]
    assert len(moe) == MOE_LAYERS
    assert all(layer.fp32_buffers == (EXPERTS,) for layer in moe)
    assert all(EXPERTS not in layer.other_tensors for layer in moe)
    assert shape.buffer_bytes == 4 * EXPERTS * MOE_LAYERS
    assert shape.total_params == _without_buffers(shape).total_params


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA])
def test_its_bytes_are_weights_never_trained(method: Method) -> None:
    shape = parse_config(DEEPSEEK)
    job = TrainingSettings(method, rank=4 if method is not Method.FULL else None)
    held, bare = static_bytes(shape, job), static_bytes(_without_buffers(shape), job)
    assert held.weights - bare.weights == MOE_LAYERS * block(4 * EXPERTS)
    assert (held.gradients, held.optimizer) == (bare.gradients, bare.optimizer)
    assert held.trainable_params == bare.trainable_params
    if method is Method.FULL:
        assert held.trainable_params == shape.total_params
    analytic = replace(job, profile=Profile.ANALYTIC)
    weights = formula_estimate(shape, analytic).components["weights"]
    assert weights - formula_estimate(_without_buffers(shape), analytic).components["weights"] == (
        4 * EXPERTS * MOE_LAYERS
    )


def test_ernies_correction_bias_is_a_parameter() -> None:
    ernie = {
        "model_type": "ernie4_5_moe",
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "moe_layer_start_index": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 100,
        "moe_num_experts": EXPERTS,
        "moe_k": 2,
    }
    shape = parse_config(ernie)
    moe = [layer for layer in shape.layers if layer.moe]
    assert moe and all(EXPERTS in layer.other_tensors and not layer.fp32_buffers for layer in moe)
    assert shape.buffer_bytes == 0
