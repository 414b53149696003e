"""The `trace` profile: a real training step on fake tensors, counted exactly.

Small configs (a 4-layer, 512-wide Llama; shrunk bundled presets) keep each trace under a
second or two; fake tensors make width free, so the large-model checks trace a few layers of
the real widths. Needs the `trace` extra; CI installs it, and there a missing torch fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra, with_layers

require_trace_extra()

from controller.cli import main  # noqa: E402
from controller.estimator import (  # noqa: E402
    Attention,
    Checkpointing,
    Method,
    Offloading,
    Optimizer,
    Profile,
    SpecError,
    Switches,
    TrainingSettings,
    load_shape,
    parse_config,
)
from controller.estimator.presets import load_preset  # noqa: E402
from controller.estimator.storage import block, nf4_bytes, static_bytes  # noqa: E402
from controller.jobs.profiles import estimate  # noqa: E402
from controller.trace import TraceUnsupported, trace  # noqa: E402
from controller.trace.extrapolate import extend  # noqa: E402
from controller.trace.run import trace_run  # noqa: E402
from controller.trace.tracker import StorageTracker, allocated_bytes  # noqa: E402

FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=256)
LORA = TrainingSettings(method=Method.LORA, seq_len=256)
QLORA = TrainingSettings(method=Method.QLORA, seq_len=256)
# Three input tensors (ids, mask, labels) of b x s int64 sit on the device for the step.
BATCH_BYTES = 3 * block(256 * 8)


def settings(base: TrainingSettings, **changes: Any) -> TrainingSettings:
    return replace(base, **changes)


# -- the storage tracker ----------------------------------------------------------------------


def test_tracker_counts_storages_not_views_and_sees_frees() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    tracker = StorageTracker()
    with FakeTensorMode(), tracker:
        a = torch.empty(1000, dtype=torch.bfloat16)  # 2,000 bytes -> 2,048 charged
        view = a[10:20]
        assert tracker.current == 2048
        b = torch.empty(10, dtype=torch.float32)
        assert tracker.current == 2048 + 512
        del a
        assert tracker.current == 2048 + 512  # the view keeps the storage alive
        del view
        assert tracker.current == 512
        del b
    assert tracker.current == 0
    assert tracker.peak == 2048 + 512


def test_split_ops_cut_a_layer_op_by_op_at_the_same_peaks() -> None:
    """A Mamba-2 scan runs between two modules: cut op by op, each op is a region named by
    the model's line that ran it, and every module region's peak is the largest of its
    ops' (nothing moves, the same run is only seen finer)."""
    import random

    from controller.calibration.calibrate import _in_a_layer, moments, shrunk_hybrid

    config = shrunk_hybrid("nemotron_h", random.Random("split"), "M-")
    job = TrainingSettings(method=Method.LORA, rank=8, targets=("in_proj",), seq_len=256)
    whole = trace_run(config, job, steps=1, breakdowns=False)
    cut = trace_run(config, job, steps=1, breakdowns=False, split_ops=_in_a_layer)
    regions = [seg.region for seg in cut.segments]
    scan = {r for r in regions if r.startswith("layer 0/") and "#modeling_nemotron_h.py:" in r}
    assert any(":bmm:" in r for r in scan) and len(scan) > 50
    # every cut op is named by a line of the model's code (or PEFT's); backward's own ops,
    # run from the trace's driver, are not cut: they stay in their module's region
    for site in {r.partition("#")[2] for r in regions if "#" in r}:
        assert re.fullmatch(r"[\w.]+\.py:\d+:\w+:\d+", site) and not site.startswith("run.py")
    fine = moments(cut)
    for key, peak in moments(whole).items():
        assert max(v for k, v in fine.items() if k.partition("#")[0] == key) == peak, key


def test_allocator_rounding() -> None:
    assert allocated_bytes(0) == 0
    assert allocated_bytes(1) == 512
    assert allocated_bytes(512) == 512
    assert allocated_bytes(513) == 1024


def test_the_estimator_core_does_not_import_torch() -> None:
    code = (
        "import sys, controller.estimator, controller.cli; "
        "from controller.estimator import load_shape, TrainingSettings, Profile; "
        "from controller.jobs.profiles import estimate; "
        "estimate(load_shape('llama-3.1-8b'), TrainingSettings(profile=Profile.CALIBRATED)); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- what a step holds ------------------------------------------------------------------------


def test_full_finetuning_peak_is_the_foreach_adamw_step_exactly() -> None:
    """bf16 weights + bf16 gradients + two bf16 moments + foreach's parameter-sized scratch."""
    run = trace_run(TINY_LLAMA, FULL)
    static = static_bytes(parse_config(TINY_LLAMA), FULL)
    step = run.phase_peaks["optimizer"]
    buffers = 2 * block(32 * 4)  # RoPE's inv_freq and original_inv_freq (head_dim / 2 fp32)
    assert step.breakdown["weights"] == static.weights + buffers
    assert step.breakdown["gradients"] == static.gradients
    assert step.breakdown["optimizer"] == static.optimizer
    assert step.breakdown["temporaries"] == static.optimizer_scratch + BATCH_BYTES
    assert run.peak == step.peak == sum(step.breakdown.values())
    assert run.trainable_params == run.total_params == parse_config(TINY_LLAMA).total_params


def test_adamw_moments_follow_the_parameter_dtype() -> None:
    """4 bytes per bf16 parameter (PyTorch AdamW), 8 per fp32 LoRA adapter parameter."""
    full = trace_run(TINY_LLAMA, FULL)
    params = parse_config(TINY_LLAMA).total_params
    assert abs(full.phase_peaks["optimizer"].breakdown["optimizer"] - 4 * params) < 0.01 * params
    lora = trace_run(TINY_LLAMA, LORA)
    state = lora.phase_peaks["forward"].breakdown["optimizer"]
    assert abs(state - 8 * lora.trainable_params) < 0.02 * 8 * lora.trainable_params


def test_lora_trainable_count_is_pefts_and_the_estimators() -> None:
    run = trace_run(TINY_LLAMA, LORA)
    shape = parse_config(TINY_LLAMA)
    assert run.trainable_params == 16 * shape.lora_params_per_rank(("all-linear",))


def test_the_first_step_under_reports() -> None:
    """Optimizer state exists only from the first step() on: step 2's forward holds more."""
    run = trace_run(TINY_LLAMA, LORA)
    forward = {s.step: s.peak for s in run.segments if s.phase == "forward" and s.region == "tail"}
    assert forward[1] > forward[0]


def test_qlora_weights_are_the_nf4_storage_model() -> None:
    run = trace_run(TINY_LLAMA, QLORA)
    shape = parse_config(TINY_LLAMA)
    static = static_bytes(shape, QLORA)
    weights = run.phase_peaks["forward"].breakdown["weights"]
    assert weights == static.weights + 2 * block(32 * 4)  # + RoPE's two buffers
    q_proj = 512 * 512
    blocks = q_proj // 64
    # Packed 4-bit codes, the 16-entry NF4 code book, absmax per 64 (uint8 when double-
    # quantised), fp32 absmax per 256 of those, the 256-entry nested code book, the offset.
    expected = block(q_proj // 2) + block(16 * 4) + block(blocks) + block(4 * -(-blocks // 256))
    assert nf4_bytes(q_proj) == expected + block(256 * 4) + block(4)
    assert nf4_bytes(q_proj, double_quant=False) == block(q_proj // 2) + block(64) + 4 * blocks
    # Embeddings and the LM head stay 16-bit.
    assert weights > 2 * (2 * 4096 * 512)


def test_qlora_dequantises_each_weight_into_a_temporary() -> None:
    """bitsandbytes' forward materialises out x in bf16 of the layer being run."""
    run = trace_run(TINY_LLAMA, settings(QLORA, gradient_checkpointing=Checkpointing.OFF))
    mlp = [s for s in run.segments if s.region.endswith("mlp.up_proj.base_layer")]
    assert max(s.breakdown["temporaries"] for s in mlp) >= 2 * 512 * 1536


def test_checkpointing_keeps_one_hidden_state_per_layer() -> None:
    on = trace_run(TINY_LLAMA, LORA)
    off = trace_run(TINY_LLAMA, settings(LORA, gradient_checkpointing=Checkpointing.OFF))
    kept_on = on.phase_peaks["forward"].breakdown["activations"]
    kept_off = off.phase_peaks["forward"].breakdown["activations"]
    assert kept_off > 4 * kept_on


def test_peft_keeps_fp32_copies_of_adapter_inputs() -> None:
    """Without checkpointing each adapted linear saves its input cast to fp32 (4 bytes per
    element, one copy per module even where q/k/v read the same input): at least that much
    is held per layer at the end of forward."""
    gc_off = settings(LORA, gradient_checkpointing=Checkpointing.OFF)
    kept = trace_run(TINY_LLAMA, gc_off).phase_peaks["forward"].breakdown["activations"]
    fp32_copies = 4 * 256 * (6 * 512 + 1536)  # q,k,v,o,gate,up read h (o: q = h); down: i
    assert kept >= 4 * fp32_copies
    bf16_inputs_only = 2 * 256 * (6 * 512 + 1536)
    assert kept - 4 * fp32_copies > 4 * bf16_inputs_only // 4  # and the block's own tensors


def test_eager_attention_keeps_the_score_matrix() -> None:
    sdpa = trace_run(TINY_LLAMA, settings(LORA, attention=Attention.SDPA, seq_len=1024))
    eager = trace_run(TINY_LLAMA, settings(LORA, attention=Attention.EAGER, seq_len=1024))
    assert eager.peak - sdpa.peak > 8 * 1024 * 1024 * 2  # heads x s^2 x bf16, at least


def test_flash_attention_is_traced_as_sdpa() -> None:
    flash = trace(TINY_LLAMA, settings(LORA, attention=Attention.FLASH_ATTENTION_2))
    sdpa = trace(TINY_LLAMA, settings(LORA, attention=Attention.SDPA))
    assert flash.peak_bytes == sdpa.peak_bytes
    assert flash.attention_traced_as == "sdpa"


@pytest.mark.parametrize(
    ("optimizer", "state_per_param"),
    [
        (Optimizer.SGD, 0),
        (Optimizer.ADAMW_8BIT, 2),
        (Optimizer.PAGED_ADAMW_32BIT, 8),
        (Optimizer.ADAMW_FP32_MASTER, 12),
        (Optimizer.ADAMW_TORCH, 4),
    ],
)
def test_optimizer_state(optimizer: Optimizer, state_per_param: int) -> None:
    run = trace_run(TINY_LLAMA, settings(FULL, optimizer=optimizer))
    static = static_bytes(parse_config(TINY_LLAMA), settings(FULL, optimizer=optimizer))
    held = run.phase_peaks["forward"].breakdown["optimizer"]
    assert held == static.optimizer
    params = run.trainable_params
    assert abs(held - state_per_param * params) <= 0.02 * max(state_per_param * params, 1) + 8192


def test_fused_adamw_needs_no_scratch_and_foreach_does() -> None:
    fused = trace_run(TINY_LLAMA, settings(FULL, optimizer=Optimizer.ADAMW_TORCH))
    foreach = trace_run(TINY_LLAMA, FULL)
    scratch = foreach.phase_peaks["optimizer"].peak - fused.phase_peaks["optimizer"].peak
    assert scratch == static_bytes(parse_config(TINY_LLAMA), FULL).optimizer_scratch


def test_under_fsdp_the_steps_scratch_is_sharded_and_the_layers_buffers_are_not() -> None:
    """At the optimizer step each GPU updates its own shard, so foreach's parameter-sized
    scratch divides with the parameters and only the batch is whole on every GPU; a peak in
    forward or backward keeps its working buffers whole on every GPU."""
    from controller.trace import estimate as trace_estimate

    static = static_bytes(parse_config(TINY_LLAMA), FULL)
    report = trace(TINY_LLAMA, FULL)
    assert report.peak_at.phase == "optimizer"
    full = trace_estimate(TINY_LLAMA, FULL)
    assert full.replicated_bytes == BATCH_BYTES + full.fixed_bytes
    assert full.sharded_bytes == report.peak_bytes - BATCH_BYTES
    assert full.sharded_bytes >= static.weights + static.optimizer + static.optimizer_scratch
    # Each phase's peak is a moment of its own; on 4 GPUs each needs the largest of them.
    assert len(full.moments) == len(report.phases) == 3
    held = max(s // 4 + r for s, r in ((full.sharded_bytes, full.replicated_bytes),
                                       *full.moments))  # fmt: skip
    # each of 4 ranks also holds NCCL's communicator buffers
    with_margin = int((held - full.fixed_bytes) * full.margin) + full.fixed_bytes
    assert full.per_gpu_bytes(4) == with_margin + full.comm_bytes

    eager = settings(LORA, attention=Attention.EAGER)  # its peak: the score matrices
    report = trace(TINY_LLAMA, eager)
    assert report.peak_at.phase != "optimizer"
    lora = trace_estimate(TINY_LLAMA, eager)
    assert lora.replicated_bytes == (
        report.breakdown["activations"] + report.breakdown["temporaries"] + lora.fixed_bytes
    )


def test_gradient_accumulation_holds_gradients_through_the_next_backward() -> None:
    one = trace_run(TINY_LLAMA, settings(FULL, optimizer=Optimizer.ADAMW_TORCH))
    two = trace_run(
        TINY_LLAMA, settings(FULL, optimizer=Optimizer.ADAMW_TORCH, gradient_accumulation=4)
    )
    grads = static_bytes(parse_config(TINY_LLAMA), FULL).gradients
    assert two.phase_peaks["forward"].peak - one.phase_peaks["forward"].peak == grads


def test_unsupported_jobs_say_why() -> None:
    offloaded = Switches(activation_offloading=Offloading.CPU)
    with pytest.raises(TraceUnsupported, match="activation offloading"):
        trace(TINY_LLAMA, settings(LORA, switches=offloaded))
    with pytest.raises(SpecError, match="activation offloading"):
        job = settings(LORA, switches=offloaded, profile=Profile.TRACE)
        estimate(load_shape("llama-3.2-1b"), job)


def test_the_cli_names_its_flag_when_the_trace_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["estimate", "--model", "llama-3.2-1b", "--profile", "trace"]
    assert main([*argv, "--activation-offloading", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vramgate: --profile: trace: activation offloading is not traced")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rms_norm_eps": "x"}, "StrictDataclassFieldValidationError: Validation error for field"),
        ({"hidden_act": "nope"}, "KeyError: 'nope'"),
        ({"model_type": "mistral", "sliding_window": 10**30}, "OverflowError"),
    ],
)
def test_what_transformers_cannot_build_or_run_is_one_line(
    change: dict[str, object], words: str
) -> None:
    with pytest.raises(TraceUnsupported, match="transformers cannot build or run") as error:
        trace(TINY_LLAMA | change, settings(LORA))
    assert words in str(error.value) and "\n" not in str(error.value)


# -- mixture of experts -----------------------------------------------------------------------

MOE_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b")


def moe_config(preset: str) -> dict[str, Any]:
    """The preset at its real widths, cut to its first MoE layers (DeepSeek-V3's first
    three layers are dense, so it keeps four)."""
    from controller.trace.build import text_config

    return text_config(load_preset(preset).config, 4 if preset == "deepseek-v3" else 2)


def resident_bytes(config: dict[str, Any], job: TrainingSettings) -> dict[str, int]:
    """What the traced model holds before the step: weights (parameters, 4-bit state and
    buffers other than RoPE's tables), their trainable part, and the counts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from controller.trace import qlora
    from controller.trace.build import build_model

    with FakeTensorMode():
        model = build_model(config, job)
        params = list(model.parameters())
        buffers = [b for n, b in model.named_buffers() if "rotary" not in n]
        held = [*params, *buffers, *qlora.quantized_tensors(model)]
        return {
            "weights": sum(block(t.numel() * t.element_size()) for t in held),
            "gradients": sum(
                block(p.numel() * p.element_size()) for p in params if p.requires_grad
            ),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
        }


@pytest.mark.parametrize("preset", MOE_PRESETS)
@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA], ids=lambda m: m.value)
def test_moe_resident_bytes_are_the_estimators_exactly(preset: str, method: Method) -> None:
    """Fused expert stacks, routers (fp32 in DeepSeek-V3), PEFT's LoRA on the stacks where it
    maps "all-linear" onto them (not GPT-OSS; not DeepSeek's dense MLPs), 4-bit stacks."""
    config = moe_config(preset)
    job = TrainingSettings(method=method, rank=None if method is Method.FULL else 16, seq_len=64)
    traced = resident_bytes(config, job)
    static = static_bytes(parse_config(config), job)
    assert traced == {
        "weights": static.weights,
        "gradients": static.gradients,
        "trainable": static.trainable_params,
    }


def test_moe_memory_follows_token_expert_pairs_not_experts() -> None:
    """grouped_mm computes t x k rows whatever the routing: what the forward saves grows
    with the experts each token visits, and barely with the number of experts (only the
    router's t x E scores)."""
    base = moe_config("qwen3-30b-a3b")
    job = settings(FULL, gradient_checkpointing=Checkpointing.OFF, seq_len=512)

    def saved(config: dict[str, Any]) -> int:
        return trace_run(config, job).phase_peaks["forward"].breakdown["activations"]

    start = saved(base)  # 128 experts, 8 per token
    pairs = 2 * 512 * 8  # two layers of 512 tokens x 8 more experts each
    assert saved(base | {"num_experts_per_tok": 16}) - start > pairs * 2 * 2048 * 2
    assert saved(base | {"num_experts": 256}) - start < 2 * 512 * 128 * 4 * 2


def test_qlora_moe_dequantises_the_expert_stacks_while_they_run() -> None:
    config = moe_config("mixtral-8x7b")
    job = settings(QLORA, gradient_checkpointing=Checkpointing.OFF)
    run = trace_run(config, job)
    static = static_bytes(parse_config(config), job)
    experts = [s for s in run.segments if ".experts" in s.region and s.phase == "forward"]
    assert max(s.breakdown["temporaries"] for s in experts) >= static.expert_stacks
    assert static.weights < 0.4 * static_bytes(parse_config(config), LORA).weights


# -- deep models from shallow traces ----------------------------------------------------------

EXTRAPOLATED = [
    ("llama-3.2-1b", FULL),
    ("llama-3.2-1b", settings(LORA, gradient_checkpointing=Checkpointing.OFF)),
    ("qwen2.5-0.5b", QLORA),
    ("gemma-3-270m", settings(LORA, attention=Attention.EAGER)),
    ("smollm2-1.7b", settings(FULL, optimizer=Optimizer.ADAMW_FP32_MASTER)),
]


@pytest.mark.parametrize(("preset", "job"), EXTRAPOLATED, ids=[p for p, _ in EXTRAPOLATED])
def test_extrapolation_agrees_with_the_full_trace(preset: str, job: TrainingSettings) -> None:
    """Traces at 4 and 5 layers, extended per layer, within 0.5 % of tracing all layers
    (the presets here have 16-30 layers; widths are the real ones), and what the allocator
    reserves for them within 1 % (the deeper run replayed at the whole depth)."""
    config = load_preset(preset).config
    whole = trace_run(config, job)
    extended = extend(trace_run(config, job, 4), trace_run(config, job, 5), whole.layers)
    assert abs(extended.peak - whole.peak) <= 0.005 * whole.peak
    assert extended.total_params == whole.total_params
    for category, n_bytes in whole.breakdown.items():
        assert abs(extended.breakdown[category] - n_bytes) <= 0.005 * whole.peak
    assert abs(extended.reserved - whole.reserved) <= 0.01 * whole.reserved


@pytest.mark.parametrize("preset", ["deepseek-v3", "qwen3-30b-a3b"])
def test_moe_extrapolation_agrees_with_the_full_trace(preset: str) -> None:
    """12 layers at real widths: traced whole, and from two shallow traces (DeepSeek-V3 at 7
    and 8 layers, its three dense ones and four MoE ones), within 0.5 %."""
    from controller.trace.build import text_config

    config = text_config(load_preset(preset).config, 12)
    whole = trace(config, LORA, layers="full")
    extended = trace(config, LORA)
    assert extended.traced_layers == ((7, 8) if preset == "deepseek-v3" else (4, 5))
    assert abs(extended.peak_bytes - whole.peak_bytes) <= 0.005 * whole.peak_bytes
    assert extended.total_params == whole.total_params
    reserved = whole.peak_bytes + whole.extras["allocator_reserve"]
    extended_reserved = extended.peak_bytes + extended.extras["allocator_reserve"]
    assert abs(extended_reserved - reserved) <= 0.01 * reserved


def test_interleaved_moe_extrapolation_adds_a_period_and_agrees_with_the_full_trace() -> None:
    """Llama 4 Maverick's widths over 12 layers, dense and MoE in turn: traced at 4 and 6
    layers and extended per period, within 0.5 % of tracing all 12 and with their parameter
    count (one layer at a time, every added layer was read as an MoE one)."""
    from controller.trace.build import text_config

    config = text_config(load_preset("llama-4-maverick").config, 12)
    config["moe_layers"] = [i for i in config["moe_layers"] if i < 12]
    job = settings(LORA, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    whole = trace(config, job, layers="full")
    extended = trace(config, job)
    assert extended.traced_layers == (4, 6)
    assert extended.total_params == whole.total_params
    # the trace counts the adapters too
    assert whole.total_params - whole.trainable_params == parse_config(config).total_params
    assert abs(extended.peak_bytes - whole.peak_bytes) <= 0.005 * whole.peak_bytes


def test_auto_traces_shallow_models_whole_and_deep_ones_extended() -> None:
    shallow = trace(with_layers(TINY_LLAMA, 6), LORA)
    assert shallow.traced_layers == (6,)
    deep = trace(with_layers(TINY_LLAMA, 12), LORA)
    assert deep.traced_layers == (4, 5)
    assert deep.layers == 12


# -- llama-3.1-8b at 2,048 tokens: the documented cases --------------------------------------


def test_llama_8b_lora_breakdown() -> None:
    """LoRA r=16 all-linear, 2,048 tokens, checkpointing, AdamW: bf16 base (14.96 GiB), fp32
    adapters (0.16 GiB), their moments (0.31 GiB), one checkpoint per layer (0.5 GiB) and
    the loss's fp32 log-probabilities (0.98 GiB) held, the loss gradient in flight."""
    report = trace(load_preset("llama-3.1-8b").config, TrainingSettings(method=Method.LORA))
    gib = 2**30
    assert report.peak_at.phase == "backward" and report.peak_at.region == "tail"
    assert 14.9 * gib < report.breakdown["weights"] - 41_943_040 * 4 < 15.0 * gib
    assert report.breakdown["optimizer"] == pytest.approx(41_943_040 * 8, rel=0.01)
    assert 1.4 * gib < report.breakdown["activations"] < 1.6 * gib
    assert 18.5 * gib < report.peak_bytes < 19.5 * gib


# -- the command line -------------------------------------------------------------------------


def test_trace_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trace", "--model", "qwen2.5-0.5b", "--method", "lora", "--seq-len", "512",
                 "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["profile"] == "trace"
    assert sum(out["breakdown"].values()) == out["peak_bytes"]
    assert out["total_bytes"] == out["peak_bytes"] + sum(out["extras"].values())
    assert set(out["phases"]) == {"forward", "backward", "optimizer"}
    assert out["traced_layers"] == [4, 5] and out["layers"] == 24
    assert out["attention_traced_as"] == "sdpa"


def test_trace_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trace", "--model", "qwen2.5-0.5b", "--method", "qlora", "--seq-len", "256"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("forward peak", "backward peak", "optimizer peak", "CUDA context", "total"):
        assert text in out


def test_estimate_profile_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model", "qwen2.5-0.5b", "--profile", "trace", "--seq-len",
                 "256", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["profile"] == "trace"
    assert sum(out["components"].values()) == out["total_bytes"]
    assert out["components"]["cuda_context"] > 0


def test_trace_bad_input_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "--model", "qwen2.5-0.5b", "--trace-layers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trace-layers" in err
    assert main(["trace", "--model", "qwen2.5-0.5b", "--activation-offloading", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "activation offloading" in err


# -- MoE families whose experts are not transformers' grouped_mm ---------------------------


def test_a_config_the_parser_refuses_is_traced_as_transformers_builds_it() -> None:
    """The trace needs no parser's reading (its depth included): a field the parser refuses
    and transformers ignores leaves the trace as it was."""
    config = TINY_LLAMA | {"moe_layer_stride": 2}  # an expert field the parser does not know
    with pytest.raises(SpecError, match="moe_layer_stride"):
        parse_config(config)
    assert trace(config, settings(LORA)).peak_bytes == trace(TINY_LLAMA, settings(LORA)).peak_bytes


def dbrx_config() -> dict[str, Any]:
    """DBRX's preset shrunk to two layers and widths of a few hundred, its 16 experts (top
    4) kept: a router wide enough that 4-bit and 16-bit differ by whole blocks."""
    from controller.trace.build import text_config

    config = text_config(load_preset("dbrx-instruct").config, 2)
    config |= {"d_model": 512, "n_heads": 4, "vocab_size": 4096}
    config["ffn_config"] = dict(config["ffn_config"]) | {
        "ffn_hidden_size": 256, "moe_num_experts": 16, "moe_top_k": 4,
    }  # fmt: skip
    config["attn_config"] = dict(config["attn_config"]) | {"kv_n_heads": 2}
    return config


@pytest.mark.parametrize("method", [Method.FULL, Method.LORA, Method.QLORA], ids=lambda m: m.value)
def test_dbrx_resident_bytes_are_the_estimators_exactly(method: Method) -> None:
    """DBRX's 2-D expert stacks (w1 and v1 apart, 4-bit under QLoRA) and its nn.Linear
    router (4-bit under QLoRA, adapted by PEFT's all-linear, as any linear) as storage and
    analytic count them; and the step runs (its experts' loop over a uniform routing,
    `trace/dbrx.py`)."""
    config = dbrx_config()
    shape = parse_config(config)
    job = TrainingSettings(method=method, rank=None if method is Method.FULL else 8, seq_len=64)
    static = static_bytes(shape, job)
    assert resident_bytes(config, job) == {
        "weights": static.weights,
        "gradients": static.gradients,
        "trainable": static.trainable_params,
    }
    if method is not Method.FULL:
        assert static.trainable_params == 8 * shape.lora_params_per_rank(job.targets)
    assert trace_run(config, job, breakdowns=False).trainable_params == static.trainable_params


def test_dbrx_lora_on_named_modules_is_what_peft_adapts() -> None:
    """Targets in DBRX's own names (what PEFT matches) train what storage and analytic
    count; the trace hands PEFT those names whichever spelling the job used."""
    from controller.estimator.model import canonical_targets

    config = dbrx_config()
    shape = parse_config(config)
    for written in (["Wqkv", "layer"], ["qkv_proj", "router"]):
        job = TrainingSettings(method=Method.LORA, rank=8, seq_len=64,
                               targets=canonical_targets(written, shape, "t"))  # fmt: skip
        traced = trace_run(config, job, breakdowns=False).trainable_params
        assert traced == static_bytes(shape, job).trainable_params
        assert traced == 8 * shape.lora_params_per_rank(job.targets)


@pytest.mark.parametrize(("experts", "tokens"), [(4, 64), (8, 256), (16, 64), (8, 1024), (16, 2)])
def test_dbrx_uniform_routing_allocates_what_its_eager_loop_does(experts: int, tokens: int) -> None:
    """On real tensors with a real (random) routing, DBRX's own loop and the trace's uniform
    one save the same tensors for backward and reach the same peak over forward and
    backward (full fine-tuning: each expert's weight gradient accumulated), within 2 %."""
    import types

    import torch
    from transformers.models.dbrx.configuration_dbrx import DbrxFFNConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxExperts

    from controller.trace import dbrx

    torch.manual_seed(experts * tokens)
    cfg = DbrxFFNConfig(ffn_hidden_size=96, moe_num_experts=experts, moe_top_k=2, hidden_size=64)
    loop = DbrxExperts(cfg)
    uniform = DbrxExperts(cfg)
    uniform.load_state_dict(loop.state_dict())
    uniform.forward = types.MethodType(dbrx._forward, uniform)  # type: ignore[method-assign]
    x = torch.randn(1, tokens, 64, requires_grad=True)
    weights, index = torch.topk(torch.softmax(torch.randn(tokens, experts), -1), 2, dim=-1)
    weights = weights.detach().requires_grad_(True)

    def measured(module: Any) -> tuple[int, int]:
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        tracker = StorageTracker()
        with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            for tensor in (*module.parameters(), x, weights):
                tracker.register(tensor)
            module(x, index, weights).sum().backward()
        return sum(saved.values()), tracker.peak

    (loop_saved, loop_peak), (uniform_saved, uniform_peak) = measured(loop), measured(uniform)
    assert abs(uniform_saved - loop_saved) <= 0.02 * loop_saved
    assert abs(uniform_peak - loop_peak) <= 0.02 * loop_peak


def llama4_config() -> dict[str, Any]:
    """Llama 4 Maverick's preset shrunk: two layers (the second MoE, 4 experts), narrow."""
    config = load_preset("llama-4-maverick").config_dict()
    config["text_config"] |= {"hidden_size": 512, "intermediate_size": 1024,
                              "intermediate_size_mlp": 1536, "num_local_experts": 4,
                              "vocab_size": 4096, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "head_dim": 128,
                              "num_hidden_layers": 2, "moe_layers": [1]}  # fmt: skip
    return config


def test_llama4_full_fine_tuning_traces_as_the_static_count() -> None:
    """Llama 4's experts take no experts implementation; they run as one batched matmul."""
    config = llama4_config()
    run = trace_run(config, FULL)
    assert run.trainable_params == static_bytes(parse_config(config), FULL).trainable_params


def test_llama4_lora_traces_with_named_targets_and_fails_on_its_router() -> None:
    """With the router left out, PEFT's LoRA on Llama 4 trains what every count says; with
    it (all-linear), PEFT's LoRA layer fails on the router's tuple, which is why the
    estimator refuses such targets (`model.PEFT_REFUSED_MODULES`)."""
    config = llama4_config()
    shape = parse_config(config)
    targets = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    job = TrainingSettings(method=Method.LORA, rank=8, seq_len=64, targets=targets)
    run = trace_run(config, job, breakdowns=False)
    assert run.trainable_params == static_bytes(shape, job).trainable_params
    assert run.trainable_params == 8 * shape.lora_params_per_rank(targets)
    with pytest.raises(AttributeError, match="'tuple' object has no attribute"):
        trace_run(config, replace(job, targets=("all-linear",)), breakdowns=False)
