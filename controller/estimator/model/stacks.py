"""A hybrid stack read from its config: each layer's mixer (`shape.MIXERS`), as the family's
config lists them (`Family.stack`), and the mixers' widths under the family's field names.
"""

from __future__ import annotations

from typing import Any

from controller.estimator.errors import SpecError, shown
from controller.estimator.model.families import Family, Period
from controller.estimator.model.read import MAX_LAYERS, Reader
from controller.estimator.model.shape import DeltaNetDims, Mamba1Dims, SsmDims

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


def read_stack(r: Reader, fam: Family) -> tuple[tuple[str, ...] | None, int]:
    """A hybrid's mixer per layer (`Family.stack`; None for attention + MLP blocks), and the
    number of layers (Nemotron-H's pattern counts them, so it is read first)."""
    if fam.stack == "pattern":
        mixers = _nemotron_mixers(r)
        return mixers, len(mixers)
    layers = r.required_int(
        "num_hidden_layers", "n_layer", "num_layers", "n_layers", maximum=MAX_LAYERS
    )
    if fam.stack == "parallel":
        return ("parallel",) * layers, layers  # all alike (`layers_block_type`: "hybrid")
    if fam.stack == "periodic":
        assert fam.attention_period is not None  # every periodic stack states its period
        period, offset = read_period(r, fam.attention_period)
        kinds = ("attention_mlp" if i % period == offset else "mamba1_mlp" for i in range(layers))
        return tuple(kinds), layers
    if fam.stack == "interval":
        return _qwen3_next_mixers(r, layers), layers
    return None, layers


def read_mixer_widths(
    r: Reader, fam: Family, mixers: tuple[str, ...] | None, hidden: int
) -> dict[str, Any]:
    """A hybrid's mixer widths (by their `ArchDims` fields), read under the field names of
    its `Family.stack`."""
    return {
        "ssm": (
            _falcon_ssm_dims(r, hidden)
            if fam.stack == "parallel"
            else _ssm_dims(r)
            if mixers is not None and "mamba2" in mixers
            else None
        ),
        "mamba1": _mamba1_dims(r, hidden) if fam.stack == "periodic" else None,
        "deltanet": _deltanet_dims(r) if fam.stack == "interval" else None,
    }


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


def read_period(r: Reader, kind: Period) -> tuple[int, int]:
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
