"""Every figure of seed 1 (`unsloth-vram-estimation.md`) through the unsloth profile: bytes."""

from __future__ import annotations

from controller.estimator import (
    Attention,
    Checkpointing,
    Method,
    Optimizer,
    Parallelism,
    Profile,
    TrainingSettings,
    parse_config,
)
from controller.estimator.unsloth import CUDA_OVERHEAD_BYTES
from controller.jobs.profiles import estimate
from controller.packing.fit import fit, select_device_map
from tests.unit.conftest import GIB, LLAMA_31_8B, QWEN25_05B

SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def unsloth(config: dict, **kw: object):  # type: ignore[no-untyped-def]
    base = {
        "profile": Profile.UNSLOTH,
        "targets": SEVEN,
        "gradient_checkpointing": Checkpointing.UNSLOTH,
        "optimizer": Optimizer.ADAMW_8BIT,
    }
    return estimate(parse_config(config), TrainingSettings(**(base | kw)))  # type: ignore[arg-type]


def test_llama_8b_qlora_batch_4() -> None:
    e = unsloth(LLAMA_31_8B, batch=4)
    assert e.components == {
        "weights": 6_463_946_752,
        "lora_adapters": 83_886_080,
        "optimizer": 167_772_160,
        "gradients": 713_072_640,
        "activations": 713_072_640,
        "cuda_overhead": 1_503_238_553,
    }
    assert e.total_bytes == 9_644_988_825
    assert e.per_gpu_bytes(2) == 5_930_650_009


def test_llama_8b_qlora_batch_2() -> None:
    assert unsloth(LLAMA_31_8B, batch=2).total_bytes == 8_931_916_185


def test_llama_8b_full_batch_2() -> None:
    e = unsloth(LLAMA_31_8B, batch=2, method=Method.FULL)
    c = e.components
    assert c["weights"] == 16_060_514_304
    assert c["optimizer"] == 32_121_028_608
    assert c["gradients"] == 16_060_514_304
    assert c["activations"] == 534_804_480
    assert c["lora_adapters"] == 0
    assert e.total_bytes == 66_280_100_249


def test_qwen_05b_tied_qlora_gradient_floor_binds() -> None:
    e = unsloth(QWEN25_05B, batch=2)
    c = e.components
    assert c["weights"] == 495_996_928
    assert c["lora_adapters"] == 17_596_416
    assert c["gradients"] == 74_399_539  # 0.15 x weights, above 2 bytes per adapter param
    assert c["gradients"] == int(c["weights"] * 0.15)
    assert e.total_bytes == 2_237_855_948


def test_eager_attention_adds_the_quadratic_term() -> None:
    e = unsloth(LLAMA_31_8B, batch=1, attention=Attention.EAGER)
    assert e.components["activations"] == 3_221_225_472
    flash = unsloth(LLAMA_31_8B, batch=1)
    assert flash.components["activations"] < e.components["activations"]
    sdpa = unsloth(LLAMA_31_8B, batch=1, attention=Attention.SDPA)
    assert sdpa.components["activations"] == flash.components["activations"]


def test_cuda_overhead_is_1_4_gib() -> None:
    assert int(1.4 * GIB) == CUDA_OVERHEAD_BYTES


def test_gpu_selection_picks_two_with_20_5_gib_usable() -> None:
    chosen = select_device_map([12 * GIB, 10 * GIB, 9 * GIB], 14 * GIB)
    assert chosen is not None
    gpus, usable = chosen
    assert gpus == (0, 1)
    assert usable == int(20.5 * GIB)


def test_gpu_selection_reports_no_fit() -> None:
    assert select_device_map([10 * GIB, 10 * GIB], 30 * GIB) is None


def test_device_map_fit_checks_the_per_gpu_minimum() -> None:
    e = unsloth(LLAMA_31_8B, batch=4)
    # Two 6 GiB GPUs pool 11.1 GiB >= 9.0 GiB, and each holds its 5.52 GiB minimum.
    ok = fit(e, [6 * GIB, 6 * GIB], Parallelism.DEVICE_MAP, gpus=2)
    assert ok.fits and ok.chosen == (0, 1) and ok.per_gpu_bytes == 5_930_650_009
    # A 5.5 GiB second GPU keeps the pool large enough but cannot hold its minimum.
    small = fit(e, [8 * GIB, int(5.5 * GIB)], Parallelism.DEVICE_MAP, gpus=2)
    assert not small.fits
    assert "device map" in small.reason
    # One big GPU alone is the smallest set.
    one = fit(e, [4 * GIB, 12 * GIB], Parallelism.DEVICE_MAP)
    assert one.chosen == (1,) and one.min_gpus == 1


def test_double_quant_uses_the_3_6_factor() -> None:
    plain = unsloth(LLAMA_31_8B)
    dq_config = LLAMA_31_8B | {
        "quantization_config": {"load_in_4bit": True, "bnb_4bit_use_double_quant": True}
    }
    dq = unsloth(dq_config)
    quantizable = (10240 * 4096 + 3 * 4096 * 14336) * 32
    expected_drop = int(quantizable * 2 / 3.2) - int(quantizable * 2 / 3.6)
    assert plain.components["weights"] - dq.components["weights"] == expected_drop


def test_skip_modules_keep_layers_in_16_bit() -> None:
    base = unsloth(LLAMA_31_8B)
    q_proj = 4096 * 4096
    skip = LLAMA_31_8B | {
        "quantization_config": {
            "load_in_4bit": True,
            "llm_int8_skip_modules": [
                "model.layers.0.self_attn.q_proj",
                "language_model.model.layers.0.self_attn",  # contains the q_proj above
                "vision_tower",
                "embed_tokens",
            ],
        }
    }
    skipped = unsloth(skip)
    attention = (4096 + 1024 + 1024 + 4096) * 4096
    # 16-bit instead of NF4: 2 bytes instead of 2/3.2, counted once for the nested match.
    delta = skipped.components["weights"] - base.components["weights"]
    assert abs(delta - (attention * 2 - attention * 2 / 3.2)) <= 1
    assert q_proj < attention


def test_structured_layer_fields_change_the_shapes() -> None:
    base = {
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 1024,
        "tie_word_embeddings": True,
    }
    structured = base | {
        "head_dim": 80,
        "global_head_dim": 96,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
    }
    plain, shaped = unsloth(base), unsloth(structured)
    assert plain.components["weights"] != shaped.components["weights"]
    assert plain.trainable_params != shaped.trainable_params
    # Sliding layers: q 4x80, k/v 2x80. Full layers: q 4x96, k 1x96 and no v (k == v).
    per_rank = 3 * ((256 + 320) * 2 + (256 + 160) * 2) + 3 * ((256 + 384) * 2 + (256 + 96))
    per_rank += 6 * ((256 + 512) * 3)
    assert shaped.trainable_params == 16 * per_rank


def test_kv_shared_layers_double_wide_mlp_and_per_layer_inputs() -> None:
    config = {
        "hidden_size": 192,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "intermediate_size": 384,
        "vocab_size": 512,
        "tie_word_embeddings": True,
        "head_dim": 32,
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "vocab_size_per_layer_input": 128,
        "hidden_size_per_layer_input": 48,
    }
    e = unsloth(config, method=Method.FULL)
    h, q, kv, pli, n = 192, 6 * 32, 2 * 32, 48, 4
    own_kv = h * q * 2 + h * kv * 2  # q, o, k, v
    shared = h * q * 2  # q, o only: k/v come from an earlier layer
    mlp = 3 * h * 384
    quantizable = 2 * (own_kv + mlp) + 2 * (shared + 2 * mlp)
    quantizable += n * (h * pli * 2) + h * n * pli
    non_quantizable = 2 * h * n + 512 * h + 128 * pli * n + h * n + pli
    assert e.components["weights"] == 2 * (quantizable + non_quantizable)
