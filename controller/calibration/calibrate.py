"""Regenerate `controller/estimator/calibration.json`: fit the calibrated profile to traces.

    python -m controller.calibration.calibrate [--samples 20] [--workers N] [--out PATH]
        [--families F,F...]  # trace and fit only these; merged into --out, the rest kept

For every architecture family among the bundled presets (the mixture-of-experts ones
included), and every method (full / LoRA / QLoRA), checkpointing (on / off) and attention
(sdpa / eager), it traces `--samples` shrunk variants of the family's smallest preset (twice
as many for an MoE family, `_shrink_moe` for their ranges): 2-3 layers, 128-512 tokens,
batch 1-2, LoRA rank 8/16/32, tied or untied embeddings, and random widths in the
proportions of real models (4 or 8 heads of 64 or 128, k/v heads dividing them, hidden
512-1024, MLP 2.5-4x hidden, vocabulary 4-16x hidden). The proportions matter: which op of a
layer holds the most memory depends on them (an MLP narrower than the hidden size peaks
elsewhere), and the fit is linear only within one such regime. Fake tensors make a trace
cost the same at any width; shallow depth and short sequences keep the run to about half an
hour on 2 cores for the first twelve families (3,840 traced variants, each at two depths);
GLM-4.5 and ERNIE 4.5 MoE add 960 (`--families glm4_moe,ernie4_5_moe --samples 10` traces
them alone at half the samples, 480 variants, about 15 minutes on 2 idle cores).

Each variant is traced at 2 and 3 layers (one optimizer step each). For each moment of the
step (`calibrated.py`), the difference between the two is what one layer adds: its
coefficients are fitted by least squares against `calibrated.LAYER_FEATURES`; what is left
at 0 layers is fitted against `LOCAL_FEATURES`. One pair per family x method x
checkpointing x attention x moment; the data file records the library versions, each
class's worst relative error over its samples, and the scope.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from controller.estimator.calibrated import (
    DATA_FILE,
    LAYER_FEATURES,
    LOCAL_FEATURES,
    OPTIMIZER_KEY,
    dynamic_bytes,
    features,
)
from controller.estimator.model import parse_config
from controller.estimator.presets import load_preset
from controller.estimator.settings import (
    Attention,
    Checkpointing,
    Method,
    TrainingSettings,
)
from controller.estimator.storage import static_bytes

#: The smallest bundled preset of each family: the template of its shrunk variants.
FAMILY_PRESETS = {
    "llama": "llama-3.2-1b",
    "mistral": "mistral-7b-v0.1",
    "qwen2": "qwen2.5-0.5b",
    "qwen3": "qwen3-0.6b",
    "gemma2": "gemma-2-2b",
    "gemma3_text": "gemma-3-1b",
    "phi3": "phi-3-mini-4k",
    "olmo2": "olmo-2-7b",
    "mixtral": "mixtral-8x7b",
    "qwen3_moe": "qwen3-30b-a3b",
    "deepseek_v3": "deepseek-v3",
    "gpt_oss": "gpt-oss-20b",
    "ernie4_5_moe": "ernie-4.5-21b-a3b",
    "glm4_moe": "glm-4.5",
}
# Not in the grid: DBRX (traced since its experts' loop runs over a uniform routing,
# `dbrx.py`, but not fitted yet) and Llama 4 (its router is an nn.Linear returning a tuple,
# which PEFT 0.21's all-linear LoRA wraps and breaks). Both read as a fitted relative
# (`calibrated.FAMILY_ALIASES`). Kimi K2 is DeepSeek-V3's code at another size (the trace
# builds it as that class, `build.BUILT_AS`): DeepSeek-V3's fit prices it.
MOE_FAMILIES = ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "ernie4_5_moe", "glm4_moe")
METHODS = (Method.FULL, Method.LORA, Method.QLORA)
CHECKPOINTING = (Checkpointing.ON, Checkpointing.OFF)
ATTENTIONS = (Attention.SDPA, Attention.EAGER)
# Fields dropped from a shrunk variant: token ids must fit the smaller vocabulary, RoPE
# scaling tables are sized for the original head dimension (neither changes memory).
_DROPPED = ("bos_token_id", "eos_token_id", "pad_token_id", "rope_scaling", "layer_types")


def shrunk(family: str, rng: random.Random, layers: int) -> dict[str, Any]:
    """A random small config of `family` (see the module docstring for the ranges)."""
    config = load_preset(FAMILY_PRESETS[family]).config_dict()
    for name in _DROPPED:
        config.pop(name, None)
    config["pad_token_id"] = 0  # class defaults may exceed the smaller vocabulary
    heads = rng.choice((4, 8))
    head_dim = rng.choice((64, 128))
    if family == "deepseek_v3":  # latent attention: hidden is free of the heads
        hidden = rng.choice((512, 768, 1024))
    elif "head_dim" in config:  # the family states head_dim: hidden is free
        hidden = rng.choice((512, 768, 1024))
        config["head_dim"] = head_dim
        config["query_pre_attn_scalar"] = head_dim
    else:
        hidden = heads * head_dim
    kv = rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0])
    config.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=_round(hidden * rng.uniform(2.5, 4.0)),
        vocab_size=_round(hidden * rng.uniform(4.0, 16.0)),
        num_hidden_layers=layers,
        tie_word_embeddings=rng.random() < 0.5,
        max_position_embeddings=4096,
    )
    if config.get("sliding_window") and family != "gpt_oss":  # GPT-OSS's 128 is its design
        config["sliding_window"] = 4096
    if family in MOE_FAMILIES:
        _shrink_moe(family, config, rng, hidden)
    return config


#: Hybrid families: fitted by `controller.calibration.calibrate_hybrid` (a layer's kind depends on
#: its place in the stack, so two depths alone do not isolate one layer), on shrunk variants
#: of these presets (`shrunk_hybrid`).
HYBRID_PRESETS = {
    "nemotron_h": "nemotron-nano-9b-v2",
    "nemotron_3": "nemotron-3-nano-30b-a3b",
    "falcon_h1": "falcon-h1-1.5b",
    "qwen3_next": "qwen3-next-80b-a3b",
    "gemma3n": "gemma-3n-e4b",
    "jamba": "jamba-v0.1",
}
#: Qwen3-Next's layer types by `shrunk_hybrid`'s pattern characters.
QWEN3_NEXT_LAYERS = {"L": "linear_attention", "A": "full_attention"}
#: Gemma 3n's layer kinds (`hybrid_fit.layer_kinds`) by `shrunk_hybrid`'s pattern characters.
GEMMA3N_LAYERS = {"S": "sparse", "D": "dense", "H": "shared"}
#: Jamba's layer kinds by `shrunk_hybrid`'s pattern characters: (attention, experts).
JAMBA_LAYERS = {"m": (False, False), "e": (False, True), "a": (True, False), "x": (True, True)}


def shrunk_hybrid(
    family: str, rng: random.Random, pattern: str, chunks: tuple[int, ...] = (128,)
) -> dict[str, Any]:
    """A random small config of a hybrid family with the layers of `pattern` (Nemotron-H's
    M / * / - characters; Falcon-H1, whose layers are all alike, takes only its length):
    widths drawn as `shrunk` draws them, the Mamba-2 mixer in the presets' proportions (SSM
    width 2-2.5x hidden in heads of 64, 1-8 groups, state 64 or 128 (Falcon-H1: or 256),
    chunks of one of `chunks` tokens: 2-4 chunks of 128 at the grid's 256 and 512 tokens);
    `nemotron_3` (Nemotron-H with MoE layers, E in `pattern`) draws its experts too."""
    if family == "qwen3_next":
        return _shrunk_qwen3_next(rng, pattern)
    if family == "gemma3n":
        return _shrunk_gemma3n(rng, pattern)
    if family == "jamba":
        return _shrunk_jamba(rng, pattern)
    config = load_preset(HYBRID_PRESETS[family]).config_dict()
    for name in (*_DROPPED, "hybrid_override_pattern"):
        config.pop(name, None)
    config["pad_token_id"] = 0
    heads = rng.choice((4, 8))
    head_dim = rng.choice((64, 128))
    hidden = rng.choice((512, 768, 1024))
    ssm_heads = _round(hidden * rng.uniform(2.0, 2.5), 64) // 64
    groups = rng.choice([g for g in (1, 2, 4, 8) if ssm_heads % g == 0])
    config.update(
        hidden_size=hidden,
        head_dim=head_dim,
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0]),
        intermediate_size=_round(hidden * rng.uniform(2.5, 4.0)),
        vocab_size=_round(hidden * rng.uniform(4.0, 16.0)),
        num_hidden_layers=len(pattern),
        hybrid_override_pattern=pattern,
        tie_word_embeddings=rng.random() < 0.5,
        max_position_embeddings=4096,
    )
    # The state sizes of the family's published models and below (Nemotron-H 128, Falcon-H1
    # up to 256): drawn to 256 for Nemotron-H too, its fit's samples were 7.7 % off.
    state = rng.choice((64, 128, 256) if family == "falcon_h1" else (64, 128))
    chunk = rng.choice(chunks) if len(chunks) > 1 else chunks[0]
    if family == "falcon_h1":
        config.pop("hybrid_override_pattern")
        config.update(
            mamba_n_heads=ssm_heads,
            mamba_d_head=64,
            mamba_d_ssm=ssm_heads * 64,
            mamba_n_groups=groups,
            mamba_d_state=state,
            mamba_chunk_size=chunk,
        )
    else:
        config.update(
            mamba_num_heads=ssm_heads,
            mamba_head_dim=64,
            n_groups=groups,
            ssm_state_size=state,
            chunk_size=chunk,
        )
    if family == "nemotron_3":  # drawn last: the other families' draws stay as they were
        _shrink_nemotron_moe(config, rng, hidden)
    return config


def _shrunk_qwen3_next(rng: random.Random, pattern: str) -> dict[str, Any]:
    """A small Qwen3-Next with the layers of `pattern` (L: Gated DeltaNet, A: gated
    attention), every one with an MoE: attention drawn as `shrunk_hybrid` draws it, the
    DeltaNet in the preset's proportions (2-8 key heads, 1-2x as many value heads, heads of
    64 or 128; the 80B: 16 key heads and 32 value heads of 128 over 2048), 8-32 experts of
    0.25-1x hidden, 2-8 per token, a shared expert of 0.25-1x (the 80B: 512 experts of 0.25x,
    10 per token, a shared expert of 0.25x)."""
    config = load_preset(HYBRID_PRESETS["qwen3_next"]).config_dict()
    for name in _DROPPED:
        config.pop(name, None)
    heads = rng.choice((4, 8))
    hidden = rng.choice((512, 768, 1024))
    k_heads = rng.choice((2, 4, 8))
    config.update(
        pad_token_id=0,
        hidden_size=hidden,
        head_dim=rng.choice((64, 128)),
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0]),
        intermediate_size=_round(hidden * rng.uniform(2.5, 4.0)),
        vocab_size=_round(hidden * rng.uniform(4.0, 16.0)),
        num_hidden_layers=len(pattern),
        layer_types=[QWEN3_NEXT_LAYERS[c] for c in pattern],
        tie_word_embeddings=rng.random() < 0.5,
        max_position_embeddings=4096,
        linear_num_key_heads=k_heads,
        linear_num_value_heads=k_heads * rng.choice((1, 2)),
        linear_key_head_dim=rng.choice((64, 128)),
        linear_value_head_dim=rng.choice((64, 128)),
        num_experts=rng.choice((8, 16, 32)),
        num_experts_per_tok=rng.choice((2, 4, 8)),
        moe_intermediate_size=_round(hidden * rng.uniform(0.25, 1.0), 64),
        shared_expert_intermediate_size=_round(hidden * rng.uniform(0.25, 1.0), 64),
    )
    return config


def _shrunk_gemma3n(rng: random.Random, pattern: str) -> dict[str, Any]:
    """A small Gemma 3n text model with the layers of `pattern` (S: activation-sparse, D:
    dense, H: kv-shared; `gemma3n_layers`): attention as `shrunk` draws it with heads of 128
    or 256 (the E2B's and E4B's: 256), an MLP 4-8x hidden (8x), 2-4 AltUp streams (4),
    LAuReL rank 16-64 (64), per-layer inputs of 64-256 (256), a sliding window of 64-256
    tokens (512: the samples' 128-512 tokens reach it as real lengths reach 512, so the
    window's mask is there as it is at 2,048 tokens), and a per-layer table of as many rows
    as the vocabulary to 64k, log-uniform (E4B: 262,144 rows, 128x hidden). The table is drawn
    apart from the vocabulary, and last so the other draws stay as they were: with the
    vocabulary's 4-16x hidden it was at most 16k rows, too little for the fit to tell its
    gradients (G_p) from the rest, and E4B's full fine-tune without checkpointing came out
    1.8 % under the trace."""
    config = dict(load_preset(HYBRID_PRESETS["gemma3n"]).config_dict()["text_config"])
    for name in (*_DROPPED, "activation_sparsity_pattern"):
        config.pop(name, None)
    heads = rng.choice((4, 8))
    hidden = rng.choice((512, 768, 1024))
    head_dim = rng.choice((128, 256))
    vocab = _round(hidden * rng.uniform(4.0, 16.0))
    config.update(
        pad_token_id=0,
        hidden_size=hidden,
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([d for d in (1, 2, 4) if heads % d == 0]),
        intermediate_size=_round(hidden * rng.uniform(4.0, 8.0)),
        vocab_size=vocab,
        vocab_size_per_layer_input=vocab,
        hidden_size_per_layer_input=rng.choice((64, 128, 256)),
        laurel_rank=rng.choice((16, 32, 64)),
        altup_num_inputs=rng.choice((2, 3, 4)),
        sliding_window=rng.choice((64, 128, 256)),
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    config["vocab_size_per_layer_input"] = _round(vocab * (65536 / vocab) ** rng.random())
    return config | gemma3n_layers(pattern)


def gemma3n_layers(pattern: str) -> dict[str, Any]:
    """The fields that make a Gemma 3n stack of `pattern`'s kinds: the kv-shared layers come
    last (transformers shares from the last layer before them of the same attention type),
    every layer a sliding one (a full-attention layer adds, once, its RoPE table: t x head
    dim x 4 bytes, 0.07 % of a shrunk stack's peak as measured, 2 MB of E4B's 2,048 tokens)."""
    kinds = [GEMMA3N_LAYERS[c] for c in pattern]
    if "H" in pattern.rstrip("H"):
        raise ValueError(f"kv-shared layers (H) come last in a Gemma 3n stack, not {pattern!r}")
    return {
        "num_hidden_layers": len(kinds),
        "activation_sparsity_pattern": [0.95 if k == "sparse" else 0.0 for k in kinds],
        "num_kv_shared_layers": kinds.count("shared"),
        "layer_types": ["sliding_attention"] * len(kinds),
    }


def _shrunk_jamba(rng: random.Random, pattern: str) -> dict[str, Any]:
    """A small Jamba with the layers of `pattern` (`jamba_layers`): attention as `shrunk`
    draws it, the Mamba mixer in the preset's proportions (inner width 2x hidden, a dt rank of
    1/32-1/8 hidden (1/16), state 8, 16 or 32 (16)), 4-16 experts of the MLP's width, 1-2 per
    token (16, top 2)."""
    config = load_preset(HYBRID_PRESETS["jamba"]).config_dict()
    for name in _DROPPED:
        config.pop(name, None)
    heads = rng.choice((4, 8))
    hidden = rng.choice((512, 768, 1024))
    config.update(
        pad_token_id=0,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=rng.choice([d for d in (1, 2, 4, 8) if heads % d == 0]),
        intermediate_size=_round(hidden * rng.uniform(2.5, 4.0)),
        vocab_size=_round(hidden * rng.uniform(4.0, 16.0)),
        tie_word_embeddings=rng.random() < 0.5,
        max_position_embeddings=4096,
        mamba_d_state=rng.choice((8, 16, 32)),
        mamba_dt_rank=_round(hidden * rng.uniform(1 / 32, 1 / 8), 16),
        num_experts=rng.choice((4, 8, 16)),
        num_experts_per_tok=rng.choice((1, 2)),
    )
    return config | jamba_layers(pattern)


def jamba_layers(pattern: str) -> dict[str, Any]:
    """The fields that make a Jamba stack of `pattern`'s kinds (JAMBA_LAYERS): Jamba places
    attention and experts by period and offset (layer i has them when i % period == offset),
    so only stacks those can say are made, the smallest periods first."""
    kinds = [JAMBA_LAYERS[c] for c in pattern]
    out: dict[str, Any] = {"num_hidden_layers": len(kinds)}
    for which, field in enumerate(("attn_layer", "expert_layer")):
        wanted = [kind[which] for kind in kinds]
        layout = next(
            (
                (period, offset)
                for period in range(1, len(kinds) + 2)
                for offset in range(period)
                if wanted == [i % period == offset for i in range(len(kinds))]
            ),
            None,
        )
        if layout is None:
            raise ValueError(f"Jamba's {field}_period and _offset cannot make {pattern!r}")
        out[f"{field}_period"], out[f"{field}_offset"] = layout
    return out


def _shrink_nemotron_moe(config: dict[str, Any], rng: random.Random, hidden: int) -> None:
    """Nemotron 3's MoE layers in its proportions to hidden (Nano 30B-A3B: 128 experts of
    0.69x, 6 per token, a shared expert of 1.38x): 8-32 experts of 0.25-1x, 2-6 per token, a
    shared expert of 0.5-2x, and in half the samples a latent width of 0.25-0.5x
    (`moe_latent_size`, which Nemotron 3's larger models use); one router group."""
    latent = _round(hidden * rng.uniform(0.25, 0.5), 64)
    config.update(
        n_routed_experts=rng.choice((8, 16, 32)),
        num_experts_per_tok=rng.choice((2, 4, 6)),
        moe_intermediate_size=_round(hidden * rng.uniform(0.25, 1.0), 64),
        moe_shared_expert_intermediate_size=_round(hidden * rng.uniform(0.5, 2.0), 64),
        moe_latent_size=latent if rng.random() < 0.5 else None,
        n_group=1,
        topk_group=1,
    )


def _shrink_moe(family: str, config: dict[str, Any], rng: random.Random, hidden: int) -> None:
    """8-32 experts, 2 or 4 per token, expert widths in the family's proportion to hidden
    (Mixtral 2.5-4x as drawn above, GPT-OSS 0.5-1.25x, Qwen3, DeepSeek, GLM-4.5 and
    ERNIE 4.5 0.25-1x); every layer an MoE layer (GLM's first_k_dense_replace and ERNIE's
    moe_layer_start_index 0); DeepSeek's latent ranks in its proportions to hidden (k/v 0.07-0.25x,
    q 0.2-0.5x; DeepSeek-V3: 512 and 1536 of 7168)."""
    experts = rng.choice((8, 16, 32))
    top_k = rng.choice((2, 4))
    for name in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if name in config:
            config[name] = experts
    if family == "ernie4_5_moe":
        config["moe_k"] = top_k
    else:
        config["num_experts_per_tok"] = top_k
    if "experts_per_token" in config:
        config["experts_per_token"] = top_k
    if family == "gpt_oss":
        config["intermediate_size"] = _round(hidden * rng.uniform(0.5, 1.25), 64)
    elif family != "mixtral":
        config["moe_intermediate_size"] = _round(hidden * rng.uniform(0.25, 1.0), 64)
    if family == "qwen3_moe":
        config.update(decoder_sparse_step=1, mlp_only_layers=[])
    if family == "ernie4_5_moe":
        config.update(moe_layer_start_index=0, moe_layer_interval=1)
        config.pop("moe_layer_end_index", None)
    if family == "glm4_moe":
        config["first_k_dense_replace"] = 0
    if family == "deepseek_v3":
        nope = rng.choice((64, 128))
        config.update(
            first_k_dense_replace=0,
            n_group=1,
            topk_group=1,
            kv_lora_rank=_round(hidden * rng.uniform(0.07, 0.25), 64),
            q_lora_rank=_round(hidden * rng.uniform(0.2, 0.5), 64),
            qk_rope_head_dim=64,
            qk_nope_head_dim=nope,
            v_head_dim=nope,
            num_key_value_heads=config["num_attention_heads"],
        )


def _round(value: float, multiple: int = 128) -> int:
    return max(multiple, round(value / multiple) * multiple)


def moments(result: Any) -> dict[str, int]:
    """The fitted moments of a one-step run (`calibrated.py`): each one's largest peak."""
    out: dict[str, int] = {}
    for seg in result.segments:
        if seg.phase == "optimizer":
            key = OPTIMIZER_KEY
        else:
            place = _place(seg.region, result.layers)
            if place is None:
                continue
            key = f"{seg.phase}/{place}"
        out[key] = max(out.get(key, 0), seg.peak)
    return out


def _place(region: str, layers: int) -> str | None:
    region, split, op = region.partition("#")  # an op of its own (`StorageTracker.split_ops`)
    if region.startswith("tail"):
        return region + split + op
    if not region.startswith("layer "):
        return None
    layer, _, part = region.partition("/")
    index = int(layer.split()[1])
    name = "last" if index == layers - 1 else "first" if index == 0 else None
    if name is None:
        return None
    return (f"{name}/{part}" if part else name) + split + op


def _in_a_layer(region: str) -> bool:
    return region.startswith("layer ")


def _measure(
    config: dict[str, Any], settings: TrainingSettings, split_layers: bool = False
) -> dict[str, Any]:
    """One single-step trace: each moment's dynamic bytes, the static part, the peak.
    `split_layers`: each op run inside a layer is a moment of its own."""
    from controller.trace.run import trace_run

    # One step: its forward and backward run without optimizer state, which the calibrated
    # profile adds exactly (the steady step allocates the same plus the state).
    split = _in_a_layer if split_layers else None
    result = trace_run(config, settings, steps=1, breakdowns=False, split_ops=split)
    static = static_bytes(parse_config(config), settings)
    step = static.weights + static.gradients + static.optimizer + static.optimizer_scratch
    dynamic = {
        key: peak - (step if key == OPTIMIZER_KEY else static.weights)
        for key, peak in moments(result).items()
    }
    return {
        "dynamic": dynamic,
        "base": static.weights + static.optimizer,
        "static_step": step,
        # The steady step's peak: the same segments, with the optimizer state held throughout.
        "peak": max(
            seg.peak + (0 if seg.phase == "optimizer" else static.optimizer)
            for seg in result.segments
        ),
    }


Task = tuple[str, str, str, str, int]  # family, method, checkpointing, attention, seed


def variant(task: Task) -> tuple[dict[str, Any], TrainingSettings]:
    """The 2-layer config and the settings of one sample (deterministic in the task)."""
    family, method, gc, attention, seed = task
    rng = random.Random(f"{family}/{method}/{gc}/{attention}/{seed}")
    config = shrunk(family, rng, layers=2)
    settings = TrainingSettings(
        method=Method.parse(method, "method"),
        rank=None if method == "full" else rng.choice((8, 16, 32)),
        batch=rng.choice((1, 2)),
        seq_len=rng.choice((128, 256, 384, 512)),
        gradient_checkpointing=Checkpointing.parse(gc, "gradient_checkpointing"),
        attention=Attention.parse(attention, "attention"),
    )
    return config, settings


def _features(task: Task) -> tuple[list[int], list[int]]:
    config, settings = variant(task)
    shape = parse_config(config)
    return features(shape, settings, static_bytes(shape, settings))


def sample(task: Task) -> dict[str, Any]:
    """Trace one shrunk variant at 2 and 3 layers: per-layer and once-per-step bytes."""
    config, settings = variant(task)
    two = _measure(config, settings)
    three = _measure(config | {"num_hidden_layers": 3}, settings)
    per_layer, once = _features(task)
    keys = two["dynamic"].keys() & three["dynamic"].keys()
    delta = {k: three["dynamic"][k] - two["dynamic"][k] for k in keys}
    return {
        "task": list(task),
        "class": task[:4],
        "per_layer": per_layer,
        "once": once,
        "delta": delta,
        "at_zero": {k: two["dynamic"][k] - 2 * delta[k] for k in keys},
        "runs": {2: two, 3: three},
    }


#: MoE families fill more of the features (experts, their stacks, latent attention): twice
#: the samples keep their fit as well determined as a dense family's.
MOE_SAMPLES_FACTOR = 2


def tasks(samples: int, families: tuple[str, ...] = ()) -> Iterator[Task]:
    for family in families or tuple(FAMILY_PRESETS):
        count = samples * (MOE_SAMPLES_FACTOR if family in MOE_FAMILIES else 1)
        for method in METHODS:
            for gc in CHECKPOINTING:
                for attention in ATTENTIONS:
                    for seed in range(count):
                        yield family, method.value, gc.value, attention.value, seed


#: Moments are kept until, at every sample and depth, the largest kept one comes within this
#: share of the largest of all: the others never decide an estimate, and dropping them keeps
#: the estimate fast (a handful of moments instead of a hundred).
KEEP_WITHIN = 0.998


DEPTHS = (32, 80)  # real depths a moment must be checked at before it is dropped


def _affine(row: dict[str, Any], name: str, layers: int) -> float:
    """A static quantity of the row's model at any depth (it is affine in the depth)."""
    a, b = row["runs"][2][name], row["runs"][3][name]
    return a + (layers - 2) * (b - a)


def _predict(key: str, coefs: list[list[float]], row: dict[str, Any], layers: int) -> float:
    dynamic = max(0.0, dynamic_bytes(layers, row["per_layer"], row["once"], coefs))
    return _affine(row, "static_step" if key == OPTIMIZER_KEY else "base", layers) + dynamic


def _deciding(fitted: dict[str, list[list[float]]], rows: list[dict[str, Any]]) -> set[str]:
    """The deciding moments (`keep_deciding`) at every sample, at 2 and 3 layers and at the
    real depths."""
    return keep_deciding(
        [
            {k: _predict(k, c, row, layers) for k, c in fitted.items()}
            for row in rows
            for layers in (2, 3, *DEPTHS)
        ]
    )


def keep_deciding(points: list[dict[str, float]]) -> set[str]:
    """The fewest moments (greedily) whose largest is within KEEP_WITHIN of the largest of
    all at every point (each point: every moment's predicted bytes)."""
    if not points:
        return set()
    tops = [max(p.values()) for p in points]
    keep: set[str] = set()
    open_points = set(range(len(points)))
    while open_points:
        best = max(
            points[0],
            key=lambda k: sum(points[i][k] >= KEEP_WITHIN * tops[i] for i in open_points),
        )
        keep.add(best)
        open_points = {i for i in open_points if points[i][best] < KEEP_WITHIN * tops[i]}
    return keep


def library_versions() -> dict[str, str]:
    """The versions a fit was traced with (a refit under others is not the same fit)."""
    import peft
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


def by_class(rows: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The samples grouped by their class (family, method, checkpointing[, attention])."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row["class"]), []).append(row)
    return dict(sorted(groups.items()))


def _lstsq(rows: list[list[int]], targets: list[int]) -> list[float]:
    import numpy as np

    x = np.array(rows, dtype=np.float64)
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    solution, *_ = np.linalg.lstsq(x / scale, np.array(targets, dtype=np.float64), rcond=None)
    return [float(f"{c:.9g}") for c in solution / scale]


def fit(rows: list[dict[str, Any]]) -> tuple[dict[str, list[list[float]]], float]:
    """Per moment: per-layer coefficients from the 3-minus-2-layer differences, the rest from
    what is left at 0 layers. Keeps the deciding moments (`_deciding`); returns them and the
    worst relative error of the predicted peak at 2 and 3 layers."""
    fitted: dict[str, list[list[float]]] = {}
    for key in sorted(set.intersection(*(set(r["delta"]) for r in rows))):
        per_layer = _lstsq([r["per_layer"] for r in rows], [r["delta"][key] for r in rows])
        once = _lstsq([r["once"] for r in rows], [r["at_zero"][key] for r in rows])
        fitted[key] = [per_layer, once]
    keep = _deciding(fitted, rows)
    coefficients = {k: fitted[k] for k in sorted(keep)}
    worst = max(
        abs(max(_predict(k, c, row, n) for k, c in coefficients.items()) - row["runs"][n]["peak"])
        / row["runs"][n]["peak"]
        for row in rows
        for n in (2, 3)
    )
    return coefficients, worst


def calibrate(
    samples: int,
    workers: int,
    dump: Path | None = None,
    refit: Path | None = None,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    started = time.perf_counter()
    if refit is not None:  # traced moments kept, features recomputed (they may have changed)
        rows = json.loads(refit.read_text())
        for row in rows:
            row["runs"] = {int(k): v for k, v in row["runs"].items()}
            row["per_layer"], row["once"] = _features(tuple(row["task"]))  # type: ignore[arg-type]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(pool.map(sample, tasks(samples, only), chunksize=4))
    if dump is not None:
        dump.write_text(json.dumps(rows))
    families: dict[str, Any] = {}
    errors: dict[str, float] = {}
    for (family, method, gc, attention), group in by_class(rows).items():
        coefficients, worst = fit(group)
        families.setdefault(family, {}).setdefault(method, {}).setdefault(gc, {})[attention] = (
            coefficients
        )
        errors[f"{family}/{method}/{gc}/{attention}"] = worst
    return {
        "generated_by": "python -m controller.calibration.calibrate",
        "versions": library_versions(),
        "samples_per_class": {
            "dense": _count(rows, lambda family: family not in MOE_FAMILIES),
            "moe": _count(rows, lambda family: family in MOE_FAMILIES),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "refit_of_stored_samples": refit is not None,
        "scope": (
            "bf16, AdamW, all-linear LoRA, sdpa (also used for flash/flex) or eager; other "
            "optimizers and targets change only the exact static part; fp32 doubles the "
            "fitted terms; MoE experts as transformers' grouped_mm runs them (memory "
            "independent of the routing); an MoE model's dense layers charged as MoE layers"
        ),
        "layer_features": list(LAYER_FEATURES),
        "local_features": list(LOCAL_FEATURES),
        "worst_relative_error": max(errors.values()),
        "errors": errors,
        "families": families,
    }


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old` with the families fitted in `new` replaced (or added); each family's fit stands
    alone, so the others stay valid while their features and the libraries are unchanged."""
    if old["layer_features"] != new["layer_features"] or (
        old["local_features"] != new["local_features"]
    ):
        raise SystemExit("--families: the features changed; regenerate every family")
    if old["versions"] != new["versions"]:
        raise SystemExit("--families: the library versions changed; regenerate every family")
    out = dict(old)
    out["families"] = old["families"] | new["families"]
    fitted = tuple(new["families"])
    kept = {k: v for k, v in old["errors"].items() if k.split("/")[0] not in fitted}
    out["errors"] = kept | new["errors"]
    out["worst_relative_error"] = max(out["errors"].values())
    out["samples_per_class"] = old["samples_per_class"] | {
        f"moe ({', '.join(fitted)})": new["samples_per_class"]["moe"],
    }
    out["seconds"] = old["seconds"]
    out["merged"] = sorted(set(old.get("merged", [])) | set(fitted))
    return out


def _count(rows: list[dict[str, Any]], chosen: Any) -> int:
    """Samples per class among the classes of the chosen families (0 when none)."""
    picked = [row for row in rows if chosen(row["class"][0])]
    return len(picked) // max(1, len({tuple(row["class"]) for row in picked}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20, help="traces per dense class")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    default_out = Path(__file__).resolve().parents[1] / "estimator" / DATA_FILE
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--rows", type=Path, help="also write the traced samples here (JSON)")
    parser.add_argument("--refit", type=Path, help="fit samples written by --rows, no tracing")
    parser.add_argument(
        "--families",
        help="comma-separated: trace and fit only these families and merge them into --out, "
        "the other families' fits kept as they are (their features must be unchanged)",
    )
    args = parser.parse_args(argv)
    families = tuple(args.families.split(",")) if args.families else ()
    unknown = set(families) - set(FAMILY_PRESETS)
    if unknown:
        parser.error(f"--families: not in the grid: {', '.join(sorted(unknown))}")
    data = calibrate(args.samples, args.workers, args.rows, args.refit, families)
    if families:
        data = merged(json.loads(args.out.read_text()), data)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"wrote {args.out}: {len(data['errors'])} classes, worst error "
        f"{data['worst_relative_error']:.4%}, {data['seconds']} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
