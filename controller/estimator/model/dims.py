"""The config-level dimensions (`ArchDims`) of a config, read field by field: widths, heads,
experts and which layers hold them, per-layer attention types, and a hybrid stack's mixers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.estimator.errors import SpecError, shown
from controller.estimator.frozen import assemble
from controller.estimator.model.families import HYBRID_FAMILIES, Family, Period
from controller.estimator.model.read import (
    EXPERT_COUNT_FIELDS,
    MAX_DIMENSION,
    MAX_EXPERTS,
    MAX_LAYERS,
    SHARED_COUNT_FIELDS,
    TOP_K_FIELDS,
    Reader,
)
from controller.estimator.model.shape import ArchDims, DeltaNetDims, Mamba1Dims, SsmDims

# Fields about experts the parser reads somewhere (shape) besides the two lists above.
_MOE_SHAPE_FIELDS = frozenset(
    {
        "moe_use_aux_free",
        *SHARED_COUNT_FIELDS,
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "moe_layer_freq",
        "moe_layers",
        "interleave_moe_layer_step",
        "moe_layer_start_index",
        "moe_layer_end_index",
        "moe_layer_interval",
        "enable_moe_block",
        "expert_layer_period",  # Jamba
        "expert_layer_offset",
    }
)
# Fields about experts that change no tensor shape: routing and loss hyperparameters, flags,
# capacity limits. Any other field naming experts or MoE with an integer or a list is a
# layout the parser does not know, and refused rather than estimated as a dense model.
_MOE_IGNORED_FIELDS = frozenset(
    {
        "moe_capacity",  # ERNIE: tokens per expert at inference, not a shape
        "moe_jitter_eps",
        "moe_loss_weight",
        "moe_aux_loss_coeff",
        "moe_z_loss_coeff",
        "moe_normalize_expert_weights",
        "moe_router_topk_scaling_factor",
        "moe_shared_expert_overlap",
        "moe_group_topk",
        "moe_group_size",
        "num_expert_group",
        "topk_group",
        "n_group",
        "moe_norm_min",
        "expert_capacity",
        "ep_size",
    }
)
# Nested objects that hold a family's MoE fields (searched by the same rule).
_MOE_NESTED = ("ffn_config", "moe_config")
_KNOWN_EXPERT_FIELDS = frozenset({*EXPERT_COUNT_FIELDS, *TOP_K_FIELDS, *_MOE_SHAPE_FIELDS})
_EXPERT_FIELDS_TEXT = ", ".join(EXPERT_COUNT_FIELDS)
# Fields that say some layers are not attention (Mamba / SSM, linear attention): the parser
# builds no such layer yet, so a config carrying one is refused, not estimated as all-attention.
_NON_ATTENTION_FIELDS = (
    "hybrid_override_pattern",  # Nemotron-H
    "attn_layer_period",  # Jamba
    "full_attention_interval",  # Qwen3-Next
    "linear_num_key_heads",
    "mamba_d_state",  # Falcon-H1
    "mamba_d_ssm",
    "ssm_state_size",
    "mamba_num_heads",
)


# Nemotron-H's layer list, in each spelling its configs use: `hybrid_override_pattern` (one
# character a layer), or transformers 5's `layers_block_type` (alias `layer_types`), whose
# "linear_attention" is the Mamba-2 mixer; the remote code's older names too.
_NEMOTRON_PATTERN = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_BLOCKS = {
    "mamba": "mamba2",
    "linear_attention": "mamba2",
    "attention": "attention",
    "full_attention": "attention",
    "mlp": "mlp",
    "moe": "moe",
}


# Layer types the parser builds (`layer_types`); any other is refused.
KNOWN_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _layer_list(r: Reader, name: str, num_layers: int) -> list[int]:
    """A list of layer indices (`moe_layers`, `mlp_only_layers`), each in [0, num_layers)."""
    raw = r.get(name) or []
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in raw
    ):
        raise SpecError(r.path(name), "must be a list of layer indices")
    if any(i < 0 or i >= num_layers for i in raw):
        raise SpecError(r.path(name), f"indices must be in [0, {num_layers})")
    return raw


def _dense_layer_indices(
    r: Reader, num_layers: int, num_experts: int, expert_period: Period | None = None
) -> tuple[int, ...]:
    """Which layers of an MoE model keep a dense MLP. Position matters (DeepSeek, Qwen-MoE,
    Llama 4's interleaving, ERNIE's start/interval/end, Jamba's `Family.expert_period`)."""
    if num_experts <= 1:
        return ()
    if expert_period is not None:
        period, offset = _period(r, expert_period)
        return tuple(i for i in range(num_layers) if i % period != offset)
    mlp_types = r.config.get("mlp_layer_types")
    if mlp_types:
        # Entry i is layer i's MLP; a shorter list leaves the layers after it MoE and a longer
        # one's extra entries name no layer, as seed 1's reference reads them.
        if not isinstance(mlp_types, list) or not all(isinstance(t, str) for t in mlp_types):
            raise SpecError(r.path("mlp_layer_types"), "must be a list of strings")
        return tuple(i for i, t in enumerate(mlp_types[:num_layers]) if t.lower() == "dense")
    if r.has("moe_layers"):  # Llama 4: the MoE layers by index
        moe = set(_layer_list(r, "moe_layers", num_layers))
        return tuple(i for i in range(num_layers) if i not in moe)
    if r.has("interleave_moe_layer_step"):  # Llama 4 without moe_layers, as its config class
        interleave = r.int("interleave_moe_layer_step") or 1
        return tuple(i for i in range(num_layers) if (i + 1) % interleave != 0)
    if r.has("moe_layer_start_index") or r.has("moe_layer_interval"):
        # ERNIE 4.5: MoE where (i + 1) % interval == 0 within [start, end]; end -1: the last.
        start = r.int("moe_layer_start_index", default=0, minimum=0, maximum=MAX_LAYERS) or 0
        interval = r.int("moe_layer_interval", default=1) or 1
        end = r.int("moe_layer_end_index", default=-1, minimum=-1, maximum=None)
        last = num_layers - 1 if end is None or end == -1 else min(end, num_layers - 1)
        return tuple(
            i for i in range(num_layers) if not (start <= i <= last and (i + 1) % interval == 0)
        )
    first_k = r.int("first_k_dense_replace", minimum=0)
    if first_k is not None:
        if first_k > num_layers:
            raise SpecError(
                r.path("first_k_dense_replace"),
                f"must not exceed num_hidden_layers ({num_layers}), got {first_k}",
            )
        freq = r.int("moe_layer_freq", default=1) or 1
        if freq == 1:  # what the expression below gives, without a loop over the layers
            return tuple(range(first_k))
        return tuple(i for i in range(num_layers) if i < first_k or (i - first_k) % freq != 0)
    step = r.int("decoder_sparse_step", minimum=0)
    only = _layer_list(r, "mlp_only_layers", num_layers)
    if step:
        dense = set(only)
        return tuple(i for i in range(num_layers) if i in dense or (i + 1) % step != 0)
    return tuple(sorted(set(only)))


def _check_expert_fields(r: Reader) -> None:
    """Refuse an MoE layout the parser would misread as something else: any field naming
    experts or MoE that it neither reads nor knows to leave shapes alone, holding a count
    (an integer above 1) or a list or object."""
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", r.config)]
    scopes += [
        (f"{name}.", r.config[name])
        for name in _MOE_NESTED
        if isinstance(r.config.get(name), Mapping)
    ]
    for prefix, fields in scopes:
        for key, value in fields.items():
            low = key.lower()
            if "expert" not in low and "moe" not in low:
                continue
            name = prefix + key
            if name in _KNOWN_EXPERT_FIELDS or key in _MOE_IGNORED_FIELDS:
                continue
            if isinstance(value, bool) or value is None or isinstance(value, float | str):
                continue
            if isinstance(value, int) and value <= 1:
                continue
            raise SpecError(
                r.path(name),
                "is an expert field vramgate does not understand, so the model cannot be "
                f"estimated as what it is; expert counts are read from {_EXPERT_FIELDS_TEXT}",
            )


def _scalar(r: Reader, names: tuple[str, ...], pick: str, **limits: Any) -> int | None:
    """`r.int(*names)`, also accepting a list: ERNIE-VL states experts and their width as
    [text, vision] pairs (the text model's is the first: `pick="first"`), Hunyuan its top-k
    per layer (the largest bounds the activations: `pick="max"`)."""
    for name in names:
        value = r.get(name)
        if isinstance(value, list):
            if not value or any(
                isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_DIMENSION
                for v in value
            ):
                raise SpecError(r.path(name), f"must be integers from 0 to {MAX_DIMENSION}")
            chosen = value[0] if pick == "first" else max(value)
            maximum = limits.get("maximum", MAX_DIMENSION)
            if maximum is not None and chosen > maximum:
                raise SpecError(
                    r.path(name), f"must be less than or equal to {maximum}, got {chosen}"
                )
            return int(chosen)
        if value is not None:
            return r.int(name, **limits)
    return limits.get("default")


def _nemotron_mixers(r: Reader) -> tuple[str, ...]:
    """Nemotron-H's mixer per layer, from whichever field states them (transformers 5's
    `layers_block_type` wins over the older `hybrid_override_pattern`, as its config class
    reads them), MoE layers ("E", "moe": Nemotron 3) included."""
    for name in ("layers_block_type", "layer_types"):
        blocks = r.get(name)
        if blocks is None:
            continue
        if (
            not isinstance(blocks, list)
            or not blocks
            or not all(isinstance(b, str) for b in blocks)
        ):
            raise SpecError(r.path(name), "must be a non-empty list of layer types")
        path, items, table = r.path(name), blocks, _NEMOTRON_BLOCKS
        break
    else:
        pattern = r.get("hybrid_override_pattern")
        path = r.path("hybrid_override_pattern")
        if pattern is None:
            raise SpecError(path, "is required in a nemotron_h config (or layers_block_type)")
        if not isinstance(pattern, str) or not pattern:
            raise SpecError(
                path, f"must be a non-empty string of M, E, * and -, got {shown(pattern)}"
            )
        items, table = list(pattern), _NEMOTRON_PATTERN
    if len(items) > MAX_LAYERS:
        raise SpecError(path, f"must list at most {MAX_LAYERS} layers, got {len(items)}")
    mixers = []
    for i, item in enumerate(items):
        mixer = table.get(item)
        if mixer is None:
            known = ", ".join(repr(k) for k in table)
            raise SpecError(
                f"{path}[{i}]", f"{shown(item)} is an unknown layer type; allowed: {known}"
            )
        mixers.append(mixer)
    stated = r.int("num_hidden_layers", maximum=MAX_LAYERS)
    if stated is not None and stated != len(mixers):
        raise SpecError(path, f"must give one layer type per layer ({stated}), got {len(mixers)}")
    return tuple(mixers)


def _ssm_dims(r: Reader) -> SsmDims:
    """Nemotron-H's Mamba-2 widths, with its config class's defaults; the `mamba_*` spellings
    win where both are given, as the class's `__post_init__` reads them."""
    heads = r.int("mamba_num_heads", default=128) or 128
    groups = r.int("mamba_n_groups", "n_groups", default=8) or 8
    if heads % groups:
        raise SpecError(r.path("n_groups"), f"must divide mamba_num_heads ({heads}), got {groups}")
    conv_bias = r.get("mamba_conv_bias")
    return SsmDims(
        num_heads=heads,
        head_dim=r.int("mamba_head_dim", default=64) or 64,
        n_groups=groups,
        state_size=r.int("ssm_state_size", default=128) or 128,
        conv_kernel=r.int("mamba_d_conv", "conv_kernel", default=4) or 4,
        chunk_size=r.int("mamba_chunk_size", "chunk_size", default=128) or 128,
        conv_bias=r.bool("mamba_conv_bias" if conv_bias is not None else "use_conv_bias", True),
        proj_bias=r.bool("use_bias", False),
        out_bias=r.bool("use_bias", False),
    )


def _falcon_ssm_dims(r: Reader, hidden: int) -> SsmDims:
    """Falcon-H1's Mamba-2 widths, with its config class's defaults: the SSM width is
    `mamba_d_ssm` (1024 when absent; null: mamba_expand x hidden), its head dim
    `mamba_d_head` ("auto": the width over the heads), and the two must agree."""
    heads = r.int("mamba_n_heads", default=128) or 128
    if "mamba_d_ssm" in r.config and r.config["mamba_d_ssm"] is None:
        inner = (r.int("mamba_expand", default=2) or 2) * hidden
    else:
        inner = r.int("mamba_d_ssm", default=1024) or 1024
    raw_head = r.get("mamba_d_head")
    if raw_head is None or raw_head == "auto":
        if inner % heads:
            raise SpecError(
                r.path("mamba_n_heads"), f"must divide the SSM width ({inner}), got {heads}"
            )
        head_dim = inner // heads
    else:
        head_dim = r.int("mamba_d_head") or 1
        if head_dim * heads != inner:
            raise SpecError(
                r.path("mamba_d_head"),
                f"times mamba_n_heads ({heads}) must be the SSM width ({inner}), got {head_dim}",
            )
    groups = r.int("mamba_n_groups", default=1) or 1
    if heads % groups:
        raise SpecError(
            r.path("mamba_n_groups"), f"must divide mamba_n_heads ({heads}), got {groups}"
        )
    return SsmDims(
        num_heads=heads,
        head_dim=head_dim,
        n_groups=groups,
        state_size=r.int("mamba_d_state", default=256) or 256,
        conv_kernel=r.int("mamba_d_conv", default=4) or 4,
        chunk_size=r.int("mamba_chunk_size", default=256) or 256,
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
        out_bias=r.bool("projectors_bias", False),
        gated_norm=r.bool("mamba_rms_norm", False),
    )


def _period(r: Reader, kind: Period) -> tuple[int, int]:
    """A `Period`'s (period, offset): layer i is of that kind when i % period == offset; the
    offset must be below the period, as Jamba's config class checks."""
    period_name, period_default = kind.period_field, kind.period_default
    offset_name, offset_default = kind.offset_field, kind.offset_default
    period = r.int(period_name, default=period_default) or period_default
    offset = r.int(offset_name, default=offset_default, minimum=0, maximum=MAX_LAYERS)
    offset = offset_default if offset is None else offset
    if offset >= period:
        raise SpecError(
            r.path(offset_name), f"must be less than {period_name} ({period}), got {offset}"
        )
    return period, offset


def _qwen3_next_mixers(r: Reader, layers: int) -> tuple[str, ...]:
    """Qwen3-Next's layers: `layer_types` ("linear_attention" / "full_attention"), else full
    attention every `full_attention_interval` layers (4), as its config class builds them."""
    types = r.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", default=4) or 4
        return tuple(
            "deltanet_mlp" if (i + 1) % interval else "attention_mlp" for i in range(layers)
        )
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise SpecError(r.path("layer_types"), "must be a list of strings")
    if len(types) != layers:
        raise SpecError(
            r.path("layer_types"), f"must list one type per layer ({layers}), got {len(types)}"
        )
    table = {"linear_attention": "deltanet_mlp", "full_attention": "attention_mlp"}
    for i, kind in enumerate(types):
        if kind not in table:
            raise SpecError(
                f"{r.path('layer_types')}[{i}]",
                f"unknown layer type {shown(kind)}; allowed: {', '.join(table)}",
            )
    return tuple(table[kind] for kind in types)


def _deltanet_dims(r: Reader) -> DeltaNetDims:
    """Qwen3-Next's Gated DeltaNet widths, with its config class's defaults; the value heads
    are grouped over the key heads, so their count must divide."""
    k_heads = r.int("linear_num_key_heads", default=16) or 16
    v_heads = r.int("linear_num_value_heads", default=32) or 32
    if v_heads % k_heads:
        raise SpecError(
            r.path("linear_num_value_heads"),
            f"must be a multiple of linear_num_key_heads ({k_heads}), got {v_heads}",
        )
    return DeltaNetDims(
        num_k_heads=k_heads,
        num_v_heads=v_heads,
        head_k_dim=r.int("linear_key_head_dim", default=128) or 128,
        head_v_dim=r.int("linear_value_head_dim", default=128) or 128,
        conv_kernel=r.int("linear_conv_kernel_dim", default=4) or 4,
    )


def _mamba1_dims(r: Reader, hidden: int) -> Mamba1Dims:
    """Jamba's Mamba widths with its config class's defaults (`mamba_dt_rank` "auto":
    ceil(hidden / 16))."""
    rank = r.get("mamba_dt_rank")
    dt_rank = -(-hidden // 16) if rank is None or rank == "auto" else r.int("mamba_dt_rank")
    return Mamba1Dims(
        inner=(r.int("mamba_expand", default=2) or 2) * hidden,
        state_size=r.int("mamba_d_state", default=16) or 16,
        conv_kernel=r.int("mamba_d_conv", default=4) or 4,
        dt_rank=dt_rank or 1,
        conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False),
    )


def read_dims(r: Reader, fam: Family) -> ArchDims:
    hidden = r.required_int("hidden_size", "n_embd", "d_model")
    hybrid = bool(fam.stack)
    mixers = _nemotron_mixers(r) if fam.stack == "pattern" else None
    layers = (
        len(mixers)
        if mixers is not None
        else r.required_int(
            "num_hidden_layers", "n_layer", "num_layers", "n_layers", maximum=MAX_LAYERS
        )
    )
    if fam.stack == "parallel":
        mixers = ("parallel",) * layers  # every layer the same (`layers_block_type`: "hybrid")
    elif fam.stack == "periodic":
        assert fam.attention_period is not None  # every periodic stack states its period
        period, offset = _period(r, fam.attention_period)
        mixers = tuple(
            "attention_mlp" if i % period == offset else "mamba1_mlp" for i in range(layers)
        )
    elif fam.stack == "interval":
        mixers = _qwen3_next_mixers(r, layers)
    heads = r.required_int("num_attention_heads", "n_head", "n_heads")
    kv_heads = (
        r.int("num_key_value_heads", "num_kv_heads", "attn_config.kv_n_heads", default=heads)
        or heads
    )
    if heads % kv_heads:
        raise SpecError(
            r.path("num_key_value_heads"),
            f"must divide num_attention_heads ({heads}), got {kv_heads}",
        )
    # Absent, it is hidden_size // num_attention_heads (floored), as transformers' families
    # derive it (`getattr(config, "head_dim", hidden_size // num_attention_heads)`).
    head_dim = r.dim("head_dim")
    inter_raw = r.config.get("intermediate_size")
    if isinstance(inter_raw, list):
        if not inter_raw or any(
            isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIMENSION
            for x in inter_raw
        ):
            raise SpecError(
                r.path("intermediate_size"), f"must be integers from 1 to {MAX_DIMENSION}"
            )
        intermediate = inter_raw[0]
    else:
        intermediate = (
            r.int("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_config.ffn_hidden_size")
            or 4 * hidden
        )
    vocab = r.required_int("vocab_size")

    limits = {"minimum": 0, "maximum": MAX_EXPERTS}
    moe_mixers = mixers is not None and "moe" in mixers
    if fam.experts_in_mixers and not moe_mixers:
        # Expert fields without an MoE layer (Nemotron-H's class defaults) shape nothing.
        num_experts, top_k = 1, 1
    elif fam.experts is not None:
        # Its config class's names and defaults (Jamba; Nemotron 3, whose fields shape the MoE
        # layers only: dense Nemotron-H configs carry them too, as class defaults, and are
        # read as one expert above).
        if not fam.experts_in_mixers:
            _check_expert_fields(r)
        (number, number_default), (top, top_default) = fam.experts.number, fam.experts.top_k
        num_experts = r.int(number, default=number_default, minimum=1, maximum=MAX_EXPERTS) or 1
        top_k = r.int(top, default=top_default, minimum=1, maximum=MAX_EXPERTS) or 1
    else:
        _check_expert_fields(r)
        for name in () if hybrid else _NON_ATTENTION_FIELDS:
            if r.config.get(name) is not None:
                raise SpecError(
                    r.path(name),
                    "describes layers that are not attention (Mamba or linear attention), "
                    "which vramgate does not estimate for this model type yet; of the hybrid "
                    f"families it builds {', '.join(sorted(HYBRID_FAMILIES))}",
                )
        num_experts = _scalar(r, EXPERT_COUNT_FIELDS, "first", default=1, **limits) or 1
        top_k = _scalar(r, TOP_K_FIELDS, "max", default=1 if num_experts == 1 else 2, **limits) or 1
    if num_experts > 1 and top_k > num_experts:
        raise SpecError(
            r.path("num_experts_per_tok"),
            f"must not exceed the number of experts ({num_experts}), got {top_k}",
        )
    shared_size = r.dim("shared_expert_intermediate_size")
    n_shared = _scalar(r, SHARED_COUNT_FIELDS, "first", default=0, **limits) or 0
    moe_size = None
    widths = fam.experts.widths if fam.experts is not None else None
    if widths is not None:
        # One shared expert in every MoE layer, whatever n_shared_experts says (transformers
        # builds one MLP of the shared width: Nemotron 3).
        (width, width_default), (shared, shared_default) = widths
        n_shared = 1 if moe_mixers else 0
        shared_size = r.int(shared, default=shared_default) if moe_mixers else None
        moe_size = r.int(width, default=width_default) if moe_mixers else None
    if shared_size and n_shared == 0:
        n_shared = 1
    dense_size = r.dim("intermediate_size_mlp")
    if dense_size and num_experts > 1 and n_shared == 0:
        n_shared = 1  # Llama 4: one shared expert in every MoE layer

    layer_types = None if hybrid else r.config.get("layer_types")  # hybrid: the mixers
    if layer_types is not None:
        if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise SpecError(r.path("layer_types"), "must be a list of strings")
        if len(layer_types) != layers:
            raise SpecError(
                r.path("layer_types"),
                f"must list one type per layer ({layers}), got {len(layer_types)}",
            )
        for i, kind in enumerate(layer_types):
            if kind not in KNOWN_LAYER_TYPES:
                raise SpecError(
                    f"{r.path('layer_types')}[{i}]",
                    f"unknown layer type {shown(kind)}; allowed: {', '.join(KNOWN_LAYER_TYPES)}",
                )
    # Equal to the layer count, no layer shares (`is_kv_shared_layer`: there is no earlier
    # layer to share with), as seed 1's reference and Gemma's modelling read it.
    kv_shared = r.int("num_kv_shared_layers", default=0, minimum=0) or 0
    if kv_shared > layers:
        raise SpecError(
            r.path("num_kv_shared_layers"),
            f"must be less than or equal to num_hidden_layers ({layers}), got {kv_shared}",
        )
    kv_lora = r.dim("kv_lora_rank")
    if kv_lora is not None:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            r.required_int(name)

    # Read in this order (the dict's), so a config with several bad fields reports the same
    # one first as ever; `assemble`: see frozen.py.
    return assemble(
        ArchDims,
        {
            "hidden_size": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": intermediate,
            "vocab_size": vocab,
            "num_experts": num_experts,
            "experts_per_token": top_k,
            "moe_intermediate_size": (
                moe_size
                if widths is not None
                else _scalar(r, ("moe_intermediate_size", "ffn_config.ffn_hidden_size"), "first")
            ),
            "n_shared_experts": n_shared,
            "shared_expert_intermediate_size": shared_size,
            "shared_expert_gate": bool(shared_size) and fam.shared_expert_gate,
            "dense_intermediate_size": dense_size,
            "dense_layers": _dense_layer_indices(r, layers, num_experts, fam.expert_period),
            "moe_has_dense_mlp": r.bool("enable_moe_block", False),
            "q_lora_rank": r.dim("q_lora_rank"),
            "kv_lora_rank": kv_lora,
            "qk_nope_head_dim": r.dim("qk_nope_head_dim"),
            "qk_rope_head_dim": r.dim("qk_rope_head_dim"),
            "v_head_dim": r.dim("v_head_dim"),
            "global_head_dim": r.dim("global_head_dim"),
            "num_global_kv_heads": r.dim("num_global_key_value_heads"),
            "attention_k_eq_v": r.bool("attention_k_eq_v", False),
            "layer_types": tuple(layer_types) if layer_types is not None else None,
            "num_kv_shared_layers": kv_shared,
            "use_double_wide_mlp": r.bool("use_double_wide_mlp", False),
            "vocab_size_per_layer_input": (
                r.int("vocab_size_per_layer_input", default=0, minimum=0) or 0
            ),
            "hidden_size_per_layer_input": (
                r.int("hidden_size_per_layer_input", default=0, minimum=0) or 0
            ),
            # Read last, as ever (`Family.never_tied`: Nemotron-H's lm_head is its own).
            "tie_word_embeddings": r.bool("tie_word_embeddings", fam.tie_default)
            and not fam.never_tied,
            "mixers": mixers,
            "ssm": (
                _falcon_ssm_dims(r, hidden)
                if fam.stack == "parallel"
                else _ssm_dims(r)
                if mixers is not None and "mamba2" in mixers
                else None
            ),
            "mamba1": _mamba1_dims(r, hidden) if fam.stack == "periodic" else None,
            "deltanet": _deltanet_dims(r) if fam.stack == "interval" else None,
            "laurel_rank": r.int("laurel_rank", default=64) or 0 if fam.laurel_altup else 0,
            "altup_num_inputs": (
                r.int("altup_num_inputs", default=4) or 0 if fam.laurel_altup else 0
            ),
            "activation_sparsity": (_activation_sparsity(r, layers) if fam.laurel_altup else ()),
            "sliding_window": (
                r.int("sliding_window", default=_GEMMA3N_WINDOW) if fam.laurel_altup else None
            ),
            "attention_output_gate": fam.gated_q,
            "moe_latent_size": r.dim("moe_latent_size") if moe_mixers else None,
        },
    )


#: Gemma 3n's default when the config leaves `activation_sparsity_pattern` out (its config
#: class's): the first ten layers at 0.95 in a model of more than ten, none otherwise.
_SPARSE_LAYERS, _SPARSITY = 10, 0.95
_GEMMA3N_WINDOW = 512


def _activation_sparsity(r: Reader, layers: int) -> tuple[float, ...]:
    """Gemma 3n's `activation_sparsity_pattern`: one number in [0, 1] per layer (at 1 the
    Gaussian cut is infinite and the gate all zeros, as transformers runs it)."""
    pattern = r.get("activation_sparsity_pattern")
    if pattern is None:
        sparse = _SPARSE_LAYERS if layers > _SPARSE_LAYERS else 0
        return (_SPARSITY,) * sparse + (0.0,) * (layers - sparse)
    field = r.path("activation_sparsity_pattern")
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise SpecError(
            field, f"must be a list of one number per layer ({layers}), got {shown(pattern)}"
        )
    for i, value in enumerate(pattern):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise SpecError(f"{field}[{i}]", f"must be a number in [0, 1], got {shown(value)}")
    return tuple(float(value) for value in pattern)
