"""The config-level dimensions (`ArchDims`) of a config, read field by field: widths, heads,
experts and which layers hold them, per-layer attention types, Gemma 3n's additions, and a
hybrid stack's mixers (stacks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

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
from controller.estimator.model.shape import ArchDims
from controller.estimator.model.stacks import read_mixer_widths, read_period, read_stack

# Fields about experts the parser reads somewhere (shape) besides `read.EXPERT_COUNT_FIELDS`
# and `read.TOP_K_FIELDS`.
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
        period, offset = read_period(r, expert_period)
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


def read_dims(r: Reader, fam: Family) -> ArchDims:
    """The config-level dimensions of the text model `r` reads, laid out as `fam` says.

    Fields are read in one fixed order (the calls below, then the dict's), so a config with
    several bad fields reports the same one first as ever.
    """
    hidden = r.required_int("hidden_size", "n_embd", "d_model")
    mixers, layers = read_stack(r, fam)
    heads, kv_heads = _heads(r)
    # Absent, it is hidden_size // num_attention_heads (floored), as transformers' families
    # derive it (`getattr(config, "head_dim", hidden_size // num_attention_heads)`).
    head_dim = r.dim("head_dim")
    intermediate = _intermediate_size(r, hidden)
    vocab = r.required_int("vocab_size")
    moe_mixers = mixers is not None and "moe" in mixers
    num_experts, top_k = _experts(r, fam, moe_mixers)
    shared = _shared_experts(r, fam, moe_mixers, num_experts)
    layer_types = None if fam.stack else _layer_types(r, layers)  # hybrid: the mixers
    kv_shared = _kv_shared_layers(r, layers)
    kv_lora = r.dim("kv_lora_rank")
    if kv_lora is not None:
        for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            r.required_int(name)

    # `assemble`: see frozen.py.
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
                shared.moe_width
                if fam.experts is not None and fam.experts.widths is not None
                else _scalar(r, ("moe_intermediate_size", "ffn_config.ffn_hidden_size"), "first")
            ),
            "n_shared_experts": shared.number,
            "shared_expert_intermediate_size": shared.width,
            "shared_expert_gate": bool(shared.width) and fam.shared_expert_gate,
            "dense_intermediate_size": shared.dense_width,
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
            "layer_types": layer_types,
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
            **read_mixer_widths(r, fam, mixers, hidden),
            **_gemma3n_fields(r, fam, layers),
            "attention_output_gate": fam.gated_q,
            "moe_latent_size": r.dim("moe_latent_size") if moe_mixers else None,
        },
    )


def _heads(r: Reader) -> tuple[int, int]:
    """The attention heads and the key/value heads (as many when the config leaves them out),
    which must divide them."""
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
    return heads, kv_heads


def _intermediate_size(r: Reader, hidden: int) -> int:
    """The MLP width: the first of a [text, vision] list (ERNIE-VL), else under any of its
    names, else 4 x hidden."""
    inter_raw = r.config.get("intermediate_size")
    if isinstance(inter_raw, list):
        if not inter_raw or any(
            isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DIMENSION
            for x in inter_raw
        ):
            raise SpecError(
                r.path("intermediate_size"), f"must be integers from 1 to {MAX_DIMENSION}"
            )
        first: int = inter_raw[0]
        return first
    return (
        r.int("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_config.ffn_hidden_size")
        or 4 * hidden
    )


_EXPERT_LIMITS = {"minimum": 0, "maximum": MAX_EXPERTS}


def _experts(r: Reader, fam: Family, moe_mixers: bool) -> tuple[int, int]:
    """The routed experts per MoE layer and how many a token takes (1, 1: no MoE). A layout
    the parser does not know is refused rather than read as dense (`_check_expert_fields`),
    as are layers that are not attention in a family that is no hybrid."""
    if fam.experts_in_mixers and not moe_mixers:
        # Expert fields without an MoE layer (Nemotron-H's class defaults) shape nothing.
        return 1, 1
    if fam.experts is not None:
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
        for name in () if fam.stack else _NON_ATTENTION_FIELDS:
            if r.config.get(name) is not None:
                raise SpecError(
                    r.path(name),
                    "describes layers that are not attention (Mamba or linear attention), "
                    "which vramgate does not estimate for this model type yet; of the hybrid "
                    f"families it builds {', '.join(sorted(HYBRID_FAMILIES))}",
                )
        limits = _EXPERT_LIMITS
        num_experts = _scalar(r, EXPERT_COUNT_FIELDS, "first", default=1, **limits) or 1
        top_k = _scalar(r, TOP_K_FIELDS, "max", default=1 if num_experts == 1 else 2, **limits) or 1
    if num_experts > 1 and top_k > num_experts:
        raise SpecError(
            r.path("num_experts_per_tok"),
            f"must not exceed the number of experts ({num_experts}), got {top_k}",
        )
    return num_experts, top_k


class _Shared(NamedTuple):
    """The shared experts of an MoE layer: how many (they run as one MLP), the width of one
    where it has its own (Qwen-MoE's), the routed experts' width where the family's class
    names it (Nemotron 3), and the dense layers' MLP width where it is not
    intermediate_size (Llama 4's, which also implies one shared expert)."""

    number: int
    width: int | None
    moe_width: int | None
    dense_width: int | None


def _shared_experts(r: Reader, fam: Family, moe_mixers: bool, num_experts: int) -> _Shared:
    """`_Shared` from the config: a shared width implies one shared expert where no count is
    given."""
    shared_size = r.dim("shared_expert_intermediate_size")
    n_shared = _scalar(r, SHARED_COUNT_FIELDS, "first", default=0, **_EXPERT_LIMITS) or 0
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
    return _Shared(n_shared, shared_size, moe_size, dense_size)


def _layer_types(r: Reader, layers: int) -> tuple[str, ...] | None:
    """Each layer's attention type (`KNOWN_LAYER_TYPES`), None where the config lists none."""
    layer_types = r.config.get("layer_types")
    if layer_types is None:
        return None
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
    return tuple(layer_types)


def _kv_shared_layers(r: Reader, layers: int) -> int:
    """How many of the last layers reuse an earlier layer's k/v (Gemma 3n). Equal to the
    layer count, no layer shares (`is_kv_shared_layer`: there is no earlier layer to share
    with), as seed 1's reference and Gemma's modelling read it."""
    kv_shared = r.int("num_kv_shared_layers", default=0, minimum=0) or 0
    if kv_shared > layers:
        raise SpecError(
            r.path("num_kv_shared_layers"),
            f"must be less than or equal to num_hidden_layers ({layers}), got {kv_shared}",
        )
    return kv_shared


def _gemma3n_fields(r: Reader, fam: Family, layers: int) -> dict[str, Any]:
    """Gemma 3n's LAuReL rank, AltUp streams, activation sparsity and sliding window, read
    for its family only (`Family.laurel_altup`)."""
    if not fam.laurel_altup:
        return _NO_GEMMA3N
    return {
        "laurel_rank": r.int("laurel_rank", default=64) or 0,
        "altup_num_inputs": r.int("altup_num_inputs", default=4) or 0,
        "activation_sparsity": _activation_sparsity(r, layers),
        "sliding_window": r.int("sliding_window", default=_GEMMA3N_WINDOW),
    }


_NO_GEMMA3N: dict[str, Any] = {
    "laurel_rank": 0,
    "altup_num_inputs": 0,
    "activation_sparsity": (),
    "sliding_window": None,
}


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
