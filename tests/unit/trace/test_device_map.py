"""A device-map job's GPUs from the traced step's per-module bytes.

The 4- and 5-layer, 512-wide Llamas at 128 tokens trace in about a second each; the
placement is checked against transformers' own `device_map="auto"` on the same configs.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from tests.unit.trace_support import TINY_LLAMA, require_trace_extra, with_layers

require_trace_extra()

from controller.estimator import (  # noqa: E402
    Estimate,
    LoadPath,
    Method,
    Parallelism,
    Switches,
    TrainingSettings,
)
from controller.estimator.load import with_load_moment  # noqa: E402
from controller.trace import TraceReport, estimate, trace  # noqa: E402
from controller.trace.device_map import (  # noqa: E402
    BNB_4BIT_SHARE,
    ModuleTable,
    balanced_caps,
    device_map_tensors,
    place,
)

LORA = TrainingSettings(method=Method.LORA, seq_len=128)
FULL = TrainingSettings(method=Method.FULL, rank=None, seq_len=128)
QLORA = TrainingSettings(method=Method.QLORA, seq_len=128)
DEVICE_MAP = Parallelism.DEVICE_MAP
TIED = TINY_LLAMA | {"tie_word_embeddings": True}

_TRACES: dict[tuple[str, TrainingSettings, str], TraceReport] = {}


def traced(
    config: dict[str, Any], settings: TrainingSettings = LORA, layers: str = "auto"
) -> TraceReport:
    """One traced step (cached: several tests read the same one)."""
    key = (repr(sorted(config.items())), settings, layers)
    if key not in _TRACES:
        _TRACES[key] = trace(config, settings, layers)
    return _TRACES[key]


def table(config: dict[str, Any], settings: TrainingSettings = LORA) -> ModuleTable:
    modules = traced(config, settings).modules
    assert modules is not None
    return modules


def expected_tensors(table: ModuleTable, on: list[int]) -> int:
    """What the GPU holding modules `on` holds at its fullest, summed here from the
    per-module numbers: weights and optimizer state all through; in backward through module
    k the activations up to k, the gradients from k on and k's working memory; at the step
    all its gradients and its share of the step's scratch."""
    mods = [table.modules[i] for i in on]
    held = sum(m.weights + m.optimizer for m in mods) + (table.inputs if 0 in on else 0)
    acts = [m.activations for m in mods]
    grads = [m.gradients for m in mods]
    backward = max(sum(acts[: k + 1]) + sum(grads[k:]) + mods[k].working for k in range(len(mods)))
    every = sum(m.gradients for m in table.modules)
    step = sum(grads) + table.step_working * sum(grads) // every
    return held + max(backward, step)


def on_gpu(where: tuple[int, ...], gpu: int) -> list[int]:
    return [i for i, g in enumerate(where) if g == gpu]


# -- placement: transformers' device_map="auto" ------------------------------------------------


def _transformers_map(config: dict[str, Any], gpus: int) -> tuple[int, ...]:
    """The GPU of each module (embedding, layers, LM head) in transformers' own
    `device_map="auto"` of the model built on the meta device, alike GPUs of 80 GiB."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations.accelerate import get_balanced_memory, infer_auto_device_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**config), dtype=torch.bfloat16
        )
    no_split = model._no_split_modules
    memory = get_balanced_memory(
        model, max_memory=dict.fromkeys(range(gpus), 80 * 2**30), no_split_module_classes=no_split
    )
    device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split)

    def device(name: str) -> int:
        while name not in device_map:
            name = name.rpartition(".")[0]
        return int(device_map[name])

    layers = [f"model.layers.{i}" for i in range(config["num_hidden_layers"])]
    return tuple(device(name) for name in ("model.embed_tokens", *layers, "lm_head"))


@pytest.mark.parametrize("config", [TINY_LLAMA, TIED], ids=["untied", "tied"])
@pytest.mark.parametrize("layers", [4, 5])
def test_modules_go_where_transformers_device_map_auto_puts_them(
    config: dict[str, Any], layers: int
) -> None:
    config = with_layers(config, layers)
    modules = table(config)
    sizes = [m.loaded for m in modules.modules]
    for gpus in (2, 3, 4):
        assert place(sizes, gpus, modules.tied_head) == _transformers_map(config, gpus), gpus


def test_a_4bit_load_keeps_90_percent_of_each_gpu() -> None:
    """bitsandbytes' quantizer shrinks each GPU's budget to 90 %; a layer that fitted the
    first GPU at 100 % moves on."""
    sizes = [40, *[10] * 8, 0]
    assert balanced_caps(sizes, 2, BNB_4BIT_SHARE) == [int(Fraction(9, 10) * (120 // 2 + 50))]
    full, quantized = place(sizes, 2), place(sizes, 2, share=BNB_4BIT_SHARE)
    assert full.count(0) > quantized.count(0)


# -- what each GPU holds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        LORA,
        FULL,
        QLORA,
        replace(FULL, gradient_accumulation=2),
        replace(FULL, switches=Switches(optimizer_in_backward=True)),
    ],
    ids=["lora", "full", "qlora", "accumulation", "optimizer-in-backward"],
)
def test_one_gpu_holds_the_traced_peak(settings: TrainingSettings) -> None:
    """Every byte of the step is some module's: on one GPU the modules hold the traced peak,
    over it only where two moments are summed as one (within 3 %). Gradient accumulation
    holds the gradients through backward; an optimizer stepped in backward frees each
    gradient as it is made, so gradients are a module's working memory there."""
    report = traced(TINY_LLAMA, settings)
    held = device_map_tensors(table(TINY_LLAMA, settings), 1)[1][0]
    assert report.peak_bytes <= held <= report.peak_bytes * 1.03


def test_on_two_gpus_each_holds_less_than_one_and_more_than_half() -> None:
    est = estimate(TINY_LLAMA, LORA, 2, DEVICE_MAP)
    fixed = est.fixed_bytes  # the CUDA context and cuBLAS workspace, on every GPU
    per_gpu = est.per_gpu_bytes(2, DEVICE_MAP)
    assert (est.total_bytes - fixed) / 2 < per_gpu - fixed < est.total_bytes - fixed
    assert est.per_gpu_levels(2, DEVICE_MAP).nvml == per_gpu


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_gpu_with_the_lm_head_holds_the_logits(tied: bool) -> None:
    """The logits (batch x tokens x vocabulary, fp32 for the loss: here 16 MiB, more than a
    layer's working memory, as in a real model) are on the LM head's GPU: the last under an
    untied head, the embedding's (the first) under a tied one."""
    config = TINY_LLAMA | {"vocab_size": 32768, "tie_word_embeddings": tied}
    modules = table(config)
    where, per_gpu = device_map_tensors(modules, 2)
    head = where[-1]
    assert head == (0 if modules.tied_head else 1)
    logits = LORA.batch * LORA.seq_len * config["vocab_size"] * 4
    static = [sum(modules.modules[i].static for i in on_gpu(where, g)) for g in (0, 1)]
    assert per_gpu[head] - static[head] >= logits
    assert per_gpu[1 - head] - static[1 - head] < logits


def test_an_uneven_split_is_the_heavier_gpus_figure_its_modules_bytes_and_extras() -> None:
    """Five layers on two GPUs: one GPU takes more of them. The job's per-GPU figure is
    the heavier GPU's, summed from the placed modules' traced bytes, with the allocator's
    reserve on them and the per-GPU constants."""
    config = with_layers(TINY_LLAMA, 5)
    modules = table(config)
    where = place([m.loaded for m in modules.modules], 2, modules.tied_head)
    layers = where[1:-1]
    assert layers.count(0) != layers.count(1)
    tensors = [expected_tensors(modules, on_gpu(where, g)) for g in (0, 1)]
    assert tensors[0] != tensors[1]
    est = estimate(config, LORA, 2, DEVICE_MAP)
    held = max(tensors)
    assert (
        est.per_gpu_bytes(2, DEVICE_MAP) == held + int(held * est.margin) - held + est.fixed_bytes
    )
    assert device_map_tensors(modules, 2)[1] == tuple(tensors)


def test_other_counts_keep_the_rule() -> None:
    est = estimate(TINY_LLAMA, LORA, 2, DEVICE_MAP)
    rule = replace(est, traced_per_gpu=())
    assert est.per_gpu_bytes(3, DEVICE_MAP) == rule.per_gpu_bytes(3, DEVICE_MAP)
    assert est.per_gpu_bytes(2, DEVICE_MAP) != rule.per_gpu_bytes(2, DEVICE_MAP)


def test_a_deep_model_from_two_shallow_traces_places_as_traced_whole() -> None:
    """Ten layers are traced from four and five and extended: each GPU holds what the
    whole model's trace says, within 0.5 %."""
    config = with_layers(TINY_LLAMA, 10)
    extended = traced(config, FULL).modules
    whole = traced(config, FULL, "full").modules
    assert extended is not None and whole is not None
    assert traced(config, FULL).traced_layers == (4, 5)
    for gpus in (2, 3):
        where, per_gpu = device_map_tensors(extended, gpus)
        assert where == device_map_tensors(whole, gpus)[0]
        for got, want in zip(per_gpu, device_map_tensors(whole, gpus)[1], strict=True):
            assert abs(got - want) <= want * 0.005


def test_loading_the_whole_model_per_rank_leaves_a_device_map_alone() -> None:
    """A device map never loads the whole model onto each GPU: its traced figure stays,
    while an FSDP rank's takes the load."""
    est = Estimate(
        profile="trace",
        components={"weights": 1000, "activations": 10},
        total_params=500,
        trainable_params=500,
        sharded_bytes=1000,
        replicated_bytes=10,
        traced_per_gpu=(("device-map", 2, 600), ("fsdp", 2, 520)),
    )
    settings = replace(LORA, switches=Switches(load_path=LoadPath.WHOLE_MODEL_PER_RANK))
    loaded = with_load_moment(est, settings)
    assert loaded.per_gpu_bytes(2, DEVICE_MAP) == 600
    assert loaded.per_gpu_bytes(2, Parallelism.FSDP) == 1000
