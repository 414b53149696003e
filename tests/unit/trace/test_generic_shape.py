"""Families no hand reading reads get an estimate: the generic reading of the built model.

Each family's own default config (transformers' config class) is cut to two decoder layers;
its generic shape (`model.generic.shape_from_inventory`) must count what transformers builds,
LoRA `all-linear` must add what PEFT adds, and the default profile, analytic and the trace
must answer. For hand-read families the generic reading is a cross-check: the same parameters
and the same linears per layer as the hand reading, which estimates keep using.
"""

from __future__ import annotations

import sys
from dataclasses import fields, replace
from fractions import Fraction
from typing import Any

import pytest

from tests.unit.trace_support import require_trace_extra

require_trace_extra()

from controller.estimator import Profile, SpecError, TrainingSettings, load_shape  # noqa: E402
from controller.estimator.errors import UnreadFamily  # noqa: E402
from controller.estimator.model import ArchDims, parse_config  # noqa: E402
from controller.estimator.model.generic import (  # noqa: E402
    generic_layout,
    shape_from_inventory,
)
from controller.estimator.settings import Attention, Method  # noqa: E402
from controller.jobs.profiles import estimate, read_shape  # noqa: E402
from controller.jobs.spec import translate  # noqa: E402
from controller.trace.inventory import build_meta_model, cut_layers, read_inventory  # noqa: E402

NEW_FAMILIES = (
    "phi",
    "gpt_neox",
    "falcon",
    "stablelm",
    "granite",
    "granitemoe",
    "olmoe",  # PEFT adapts its fused expert stacks and router under all-linear
    "starcoder2",
    "cohere",
    "smollm3",
    "exaone4",  # three sliding-window layers to one global, norms after each sublayer
    "qwen2_5_vl",
)
HAND_READ = ("llama", "qwen2", "olmo2")
RANK = 8


def _config(model_type: str, **fields: Any) -> dict[str, Any]:
    from transformers import AutoConfig

    config = cut_layers(AutoConfig.for_model(model_type, **fields), 2).to_dict()
    return {k: v for k, v in config.items() if k != "transformers_version"}


def _meta_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _peft_lora(model: Any, targets: Any = "all-linear", vision: str | None = None) -> int:
    """The adapter parameters PEFT adds for `targets`, those under `vision` (a frozen vision
    tower's path, left out of `all-linear` by the generic reading) aside."""
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(model, LoraConfig(r=RANK, target_modules=targets))
    return sum(
        p.numel()
        for name, p in peft.named_parameters()
        if p.requires_grad and not (vision and f".{vision}." in f".{name}")
    )


@pytest.mark.parametrize("model_type", NEW_FAMILIES)
def test_a_family_without_a_hand_reading_is_read_from_the_built_model(model_type: str) -> None:
    config = _config(model_type)
    with pytest.raises(UnreadFamily):
        parse_config(config)
    shape = read_shape(config)
    model = build_meta_model(config)[0]
    assert shape.total_params == _meta_params(model)
    vision = read_inventory(config).vision_path
    assert shape.lora_params_per_rank(("all-linear",)) * RANK == _peft_lora(model, vision=vision)
    assert "read generically" in shape.config_warnings[0][1]
    for profile in (Profile.CALIBRATED, Profile.ANALYTIC):
        for method in (Method.FULL, Method.LORA, Method.QLORA):
            settings = TrainingSettings(profile=profile, method=method, seq_len=128)
            est = estimate(shape, settings)
            assert est.total_bytes > 0
            assert sum(est.components.values()) == est.total_bytes


@pytest.mark.parametrize("model_type", NEW_FAMILIES)
def test_a_shape_from_a_kept_layout_is_what_its_constructors_build(model_type: str) -> None:
    """A generic shape takes its layers, their grouping and its parameter count from the
    inventory's layout (`generic_layout`, kept per inventory): they must be what the shape's
    own properties compute, and a second config of the same model must share the layers
    and read its own fields."""
    config = _config(model_type)
    inv = read_inventory(config)
    shape = shape_from_inventory(inv, config)
    rebuilt = replace(shape)  # through __init__: its cached properties compute anew
    assert rebuilt == shape
    assert [(id(layer), n) for layer, n in rebuilt.layer_counts] == [
        (id(layer), n) for layer, n in shape.layer_counts
    ]
    assert rebuilt.total_params == shape.total_params
    dims = {f.name: getattr(shape.dims, f.name) for f in fields(ArchDims)}
    assert set(vars(shape.dims)) == set(dims) and ArchDims(**dims) == shape.dims

    text = config.get("text_config", config)
    longer = config | {"text_config": text | {"max_position_embeddings": 12_345}}
    if text is config:
        longer = config | {"max_position_embeddings": 12_345}
    other = shape_from_inventory(inv, longer)
    assert generic_layout(inv) is generic_layout(read_inventory(config))  # kept by value
    assert other.layers is shape.layers and other.memo is not shape.memo
    assert other.max_position_embeddings == 12_345 != shape.max_position_embeddings
    assert other.source is longer and other.dims == shape.dims


@pytest.mark.parametrize("model_type", [t for t in NEW_FAMILIES if t != "qwen2_5_vl"])
def test_the_trace_estimates_a_family_without_a_hand_reading(model_type: str) -> None:
    shape = read_shape(_config(model_type))
    settings = TrainingSettings(profile=Profile.TRACE, method=Method.LORA, seq_len=64)
    est = estimate(shape, settings)
    formula = estimate(
        shape, TrainingSettings(profile=Profile.CALIBRATED, method=Method.LORA, seq_len=64)
    )
    assert est.total_params == formula.total_params  # the same model, adapters included
    assert est.total_bytes > 0


def test_the_trace_estimates_a_vision_language_family() -> None:
    config = _config("qwen2_5_vl")
    shape = read_shape(config)
    traced = estimate(
        shape, TrainingSettings(profile=Profile.TRACE, method=Method.LORA, seq_len=64)
    )
    calibrated = TrainingSettings(profile=Profile.CALIBRATED, method=Method.LORA, seq_len=64)
    formula = estimate(shape, calibrated)
    # the whole model (the vision tower included) with the same adapters as the generic reading
    assert (
        traced.total_params
        == formula.total_params
        == shape.total_params + (formula.trainable_params)
    )
    assert shape.total_params == _meta_params(build_meta_model(config)[0])


def test_the_vision_tower_is_counted_and_frozen() -> None:
    config = _config("qwen2_5_vl")
    inv = read_inventory(config)
    shape = shape_from_inventory(inv, config)
    assert inv.vision_params > 0 and shape.total_params == inv.params
    assert any("vision tower is frozen" in message for _, message in shape.config_warnings)
    text_only = inv.params - inv.vision_params
    # all-linear leaves the tower out (PEFT's own all-linear would adapt it)
    all_linear = _peft_lora(build_meta_model(config)[0], vision=inv.vision_path)
    for profile in (Profile.ANALYTIC, Profile.CALIBRATED):
        full = estimate(shape, TrainingSettings(profile=profile, method=Method.FULL, seq_len=128))
        # full fine-tuning trains the language model only; the tower's weights are held
        assert full.trainable_params == text_only and full.total_params == inv.params
        lora = estimate(shape, TrainingSettings(profile=profile, method=Method.LORA, seq_len=128))
        assert lora.trainable_params == all_linear * 16 // RANK
    # a target naming the tower's linears adapts them, as PEFT's name matching does
    named = ("qkv",)
    assert "qkv" not in {lin.name for layer in shape.layers for lin in layer.linears}
    peft_named = _peft_lora(build_meta_model(config)[0], list(named))
    assert shape.lora_params_per_rank(named) * RANK == peft_named > 0
    adapted = estimate(shape, TrainingSettings(method=Method.LORA, targets=named, seq_len=128))
    assert adapted.trainable_params == shape.lora_params_per_rank(named) * 16


@pytest.mark.parametrize("model_type", HAND_READ)
def test_the_generic_reading_agrees_with_the_hand_reading(model_type: str) -> None:
    config = _config(model_type, num_key_value_heads=4)
    hand = parse_config(config)
    generic = shape_from_inventory(read_inventory(config), config)
    assert generic.total_params == hand.total_params
    for mine, theirs in zip(generic.layers, hand.layers, strict=True):
        key = sorted((x.name, x.in_features, x.out_features, x.bias) for x in mine.linears)
        assert key == sorted(
            (x.name, x.in_features, x.out_features, x.bias) for x in theirs.linears
        )
    assert generic.dims.num_kv_heads == hand.dims.num_kv_heads == 4
    assert generic.dims.intermediate_size == hand.dims.intermediate_size
    # estimates keep the hand reading
    assert read_shape(config) is hand


def test_a_remote_code_type_is_refused_in_one_line() -> None:
    config = {
        "model_type": "my_remote_llm",
        "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"},
        "hidden_size": 64,
    }
    with pytest.raises(SpecError) as caught:
        read_shape(config, prefix="model.config")
    message = str(caught.value)
    assert "trust_remote_code" in message and "\n" not in message
    assert message.startswith("model.config.model_type: ")


def test_without_the_trace_extra_the_refusal_says_what_would_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "controller.trace.inventory", None)
    config = _config("gpt_neox") | {"hidden_size": 96}  # not a config read before
    with pytest.raises(UnreadFamily) as caught:
        read_shape(config)
    assert "is not a model family vramgate reads" in str(caught.value)
    assert "trace extra" in str(caught.value)


def test_a_job_of_such_a_family_is_planned_and_the_webhook_defers_it() -> None:
    spec = {
        "model": {"config": _config("phi")},
        "method": "LoRA",
        "lora": {"rank": 16},
    }
    plan, errors = translate(spec)
    assert not errors and plan is not None
    assert plan.shape.model_type == "phi"
    deferred, errors = translate(spec, generic="defer")
    assert deferred is not None and deferred.shape is None and not errors


def test_a_preset_of_such_a_family_is_read_generically_and_deferred_by_the_webhook() -> None:
    from controller.jobs.profiles import preset_shape

    spec = {"model": {"preset": "Phi-2"}, "method": "LoRA", "lora": {"rank": 16}}
    plan, errors = translate(spec)
    assert not errors and plan is not None and plan.model == "phi-2"
    assert plan.shape is not None and plan.shape.total_params == 2_779_683_840
    assert preset_shape("microsoft/phi-2").total_params == 2_779_683_840
    deferred, errors = translate(spec, generic="defer")
    assert deferred is not None and deferred.shape is None and not errors


@pytest.mark.parametrize("model_type", NEW_FAMILIES)
def test_unsloth_prices_a_generic_shape_from_its_own_inventory(model_type: str) -> None:
    """Seed 1's terms in the built model's counts: every parameter once (its Llama terms
    would count a 2-layer Phi's 310M as 344M), the linears and stacks QLoRA packs to 4 bits
    as the inventory says, PEFT's own adapter count."""
    shape = read_shape(_config(model_type), prefix="model.config")
    full = estimate(shape, TrainingSettings(method=Method.FULL, profile=Profile.UNSLOTH))
    frozen = sum(lin.params for lin in shape.frozen_linears) + shape.frozen_params
    assert (frozen > 0) == (model_type == "qwen2_5_vl"), "a vision tower, frozen"
    assert full.total_params == shape.total_params == full.trainable_params + frozen
    assert full.components["weights"] == 2 * shape.total_params
    lora = TrainingSettings(method=Method.LORA, rank=RANK, profile=Profile.UNSLOTH)
    adapters = estimate(shape, lora)
    assert adapters.trainable_params == RANK * shape.lora_params_per_rank(("all-linear",))
    head = estimate(shape, replace(lora, modules_to_save=("lm_head",)))
    copied = 0 if shape.dims.tie_word_embeddings else shape.lm_head_params
    assert head.trainable_params - adapters.trainable_params == copied
    qlora = estimate(shape, replace(lora, method=Method.QLORA))
    packed = sum(
        lin.weight_params * count
        for layer, count in shape.layer_counts
        for lin in layer.linears
        if not (lin.kept_16bit or lin.name == "router")
    ) + sum(
        lin.weight_params
        for lin in (*shape.outer_linears, *shape.frozen_linears)
        if not lin.kept_16bit
    )
    saved = packed * 2 - int(Fraction(packed * 2) / Fraction(16, 5))  # seed 1's NF4 factor
    assert adapters.components["weights"] - qlora.components["weights"] in (saved, saved + 1)


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b"])
def test_unsloth_reads_a_dense_family_generically_as_its_hand_reading_does(preset: str) -> None:
    """A hand-read dense family's config read from the built model instead (its type
    renamed, so nothing hand-written applies): the same figure in every method, but for what
    seed 1's terms leave out and the inventory counts (biases, a third and fourth norm per
    layer, the final norm: Qwen2.5-7B's q/k/v biases are 1.5 MiB of 87 GiB)."""
    from controller.estimator.presets import load_preset

    config = load_preset(preset).config_dict()
    generic = shape_from_inventory(read_inventory(config), config)
    generic = replace(generic, model_type=f"generic_{generic.model_type}", memo={})
    hand = load_shape(preset)
    for method, rank in ((Method.FULL, None), (Method.LORA, 16), (Method.QLORA, 16)):
        settings = TrainingSettings(method=method, rank=rank, profile=Profile.UNSLOTH)
        mine, theirs = estimate(generic, settings).total_bytes, estimate(hand, settings).total_bytes
        assert abs(mine - theirs) < theirs // 10_000, (method, mine - theirs)


def test_the_webhook_refuses_a_type_transformers_does_not_build_without_building(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import controller.trace.inventory as inventory

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the webhook built a model")

    monkeypatch.setattr(inventory, "build_meta_model", no_build)
    monkeypatch.setattr(inventory, "hf_model_config", no_build)
    config = {
        "model_type": "my_remote_llm",
        "auto_map": {"AutoModelForCausalLM": "modeling_my.MyForCausalLM"},
        "hidden_size": 64,
    }
    spec = {"model": {"config": config}, "method": "LoRA", "lora": {"rank": 16}}
    plan, errors = translate(spec, generic="defer")
    assert plan is None and len(errors) == 1
    with pytest.raises(inventory.UnknownModelType) as said:
        inventory.check_model_type(config)
    assert str(errors[0]) == f"spec.model.config.model_type: {said.value}"
    assert "trust_remote_code" in str(errors[0]) and "\n" not in str(errors[0])
    # a type transformers builds is still deferred to the operator, not built here
    deferred, errors = translate(spec | {"model": {"config": _config("phi")}}, generic="defer")
    assert deferred is not None and deferred.shape is None and not errors


def test_attention_dropout_is_traced_as_the_gpu_kernels_run_it() -> None:
    """CUDA's flash and memory-efficient kernels drop attention probabilities in the kernel
    (no s x s tensor); the CPU sdpa the trace runs would materialise them. Under eager
    attention the probabilities are materialised on a GPU too, dropout or not."""
    small = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4}
    quiet = {"residual_dropout": 0.0, "embedding_dropout": 0.0}
    settings = TrainingSettings(method=Method.LORA, profile=Profile.TRACE, seq_len=512)

    def traced(dropout: float) -> int:
        config = _config("starcoder2", vocab_size=1024, attention_dropout=dropout, **small, **quiet)
        return estimate(read_shape(config), settings).total_bytes

    assert traced(0.1) == traced(0.0)
    from controller.trace.build import hf_config

    dropped = _config("starcoder2", attention_dropout=0.1, **small)
    assert hf_config(dropped, Attention.EAGER).attention_dropout == 0.1
    assert hf_config(dropped, Attention.SDPA).attention_dropout == 0.0


def test_all_linear_is_refused_where_peft_would_wrap_a_router_that_returns_a_tuple() -> None:
    """PhiMoE's router is an nn.Linear returning (logits, weights, experts), as Llama 4's
    returns a tuple: PEFT's LoRA layer wraps it under all-linear and fails on the tuple in the
    first forward, so vramgate refuses all-linear in one line and takes the other names."""
    from controller.estimator.model import canonical_targets

    config = _config(
        "phimoe",
        hidden_size=64,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        vocab_size=100,
    )
    shape = read_shape(config)
    assert "router" in shape.module_names
    where = "spec.lora.targetModules"
    with pytest.raises(SpecError) as refused:
        canonical_targets(["all-linear"], shape, where)
    message = str(refused.value)
    assert "\n" not in message and "tuple" in message and "all-linear selects it" in message
    with pytest.raises(SpecError, match="tuple"):
        canonical_targets(["router"], shape, where)
    assert canonical_targets(["q_proj", "v_proj"], shape, where) == ("q_proj", "v_proj")


@pytest.mark.parametrize(
    ("skip", "kept"),
    [
        (["query_key_value"], 2),
        (["gpt_neox.layers.1.attention.query_key_value"], 1),
        (["attention"], 0),  # bnb's own matching: a suffix or a path from the root
    ],
)
def test_a_generic_shape_keeps_the_skip_lists_linears_16_bit(skip: list[str], kept: int) -> None:
    """`llm_int8_skip_modules` as bitsandbytes applies it (a suffix or a path from the root:
    a bare "attention" matches nothing), on a family read generically, whose module paths the hand
    reading's skip matching does not know: the kept linears are priced 16-bit, and the trace
    holds the same bytes more."""
    from controller.estimator.storage import block, nf4_bytes, static_bytes
    from controller.trace.run import trace_run

    h, inter = 64, 128
    config = _config(
        "gpt_neox", hidden_size=h, intermediate_size=inter, num_attention_heads=4, vocab_size=128
    )
    qc = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    job = TrainingSettings(method=Method.QLORA, rank=4, seq_len=16)
    plain = static_bytes(read_shape(config | {"quantization_config": qc}), job)
    skipped = config | {"quantization_config": qc | {"llm_int8_skip_modules": skip}}
    static = static_bytes(read_shape(skipped), job)
    qkv = h * 3 * h  # Pythia's fused query_key_value
    assert static.weights - plain.weights == kept * (block(2 * qkv) - nf4_bytes(qkv, False))
    if kept:  # the trace holds the same difference (its own figures are pinned elsewhere)

        def traced(config: dict[str, Any]) -> int:
            return int(trace_run(config, job).phase_peaks["forward"].breakdown["weights"])

        plain_config = config | {"quantization_config": qc}
        assert traced(skipped) - traced(plain_config) == static.weights - plain.weights


def test_a_linear_subclass_stays_16_bit_under_qlora_in_the_trace_and_the_reading() -> None:
    """transformers' bitsandbytes loader converts a module whose type is exactly `nn.Linear`
    (or GPT-2's `Conv1D`): Falcon's `FalconLinear` subclasses it and stays 16-bit. The
    inventory reads that rule from the built model; the trace must load the same way, or a
    Falcon QLoRA trace holds a quarter of the weights the GPU really keeps."""
    from controller.estimator.storage import static_bytes
    from controller.trace.run import trace_run

    qlora = TrainingSettings(method=Method.QLORA, rank=4, seq_len=16)
    lora = TrainingSettings(method=Method.LORA, rank=4, seq_len=16)

    def weights(config: dict[str, Any], job: TrainingSettings) -> tuple[int, int]:
        """(the reading's, the trace's) weights: the frozen base and the adapters."""
        traced = trace_run(config, job).phase_peaks["forward"].breakdown["weights"]
        return static_bytes(read_shape(config), job).weights, int(traced)

    falcon = _config("falcon", hidden_size=64, num_attention_heads=4, vocab_size=128)
    assert all(lin.kept_16bit for layer in read_shape(falcon).layers for lin in layer.linears)
    assert weights(falcon, qlora) == weights(falcon, lora)  # not one linear packed
    # A linear that is exactly nn.Linear is packed: the same job on Llama holds less.
    llama = _config(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128
    )
    packed, sixteen = weights(llama, qlora), weights(llama, lora)
    assert packed[0] < sixteen[0] and packed[1] < sixteen[1]


@pytest.mark.parametrize(("model_type", "fit"), [("olmoe", "qwen3_moe"), ("granitemoe", "gpt_oss")])
def test_a_generic_moe_is_priced_by_whether_peft_adapts_its_stacks(
    model_type: str, fit: str
) -> None:
    """PEFT's `all-linear` adapts OLMoE's fused expert stacks (a `ParamWrapper` that folds the
    update into the dequantised stack as each layer runs) and leaves Granite-MoE's alone: the
    first is priced with the fit that holds that folded stack (Qwen3-MoE's), the second with
    the one that has none (GPT-OSS's), and the shape's note names the fit."""
    from controller.estimator.model.generic import generic_fit

    shape = read_shape(_config(model_type, hidden_size=64, intermediate_size=32, vocab_size=128))
    assert shape.dims.num_experts > 1
    assert shape.peft_adapts_stacks is (fit == "qwen3_moe")
    assert generic_fit(shape, ("all-linear",)) == fit
    assert generic_fit(shape, ("q_proj", "v_proj")) == "gpt_oss", "no adapter on the stacks"
    assert generic_fit(shape) == "gpt_oss", "full fine-tuning adapts nothing"
    assert any(f"the {fit} fit" in note for _, note in shape.config_warnings)
