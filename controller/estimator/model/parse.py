"""`parse_config`: a Hugging Face config.json (as a dict) to its `ModelShape`, kept by content.

A config naming no `model_type` is read as Llama's (`_family_type`).
"""

from __future__ import annotations

import marshal
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from controller.estimator.context import rope_context
from controller.estimator.errors import SpecError, SpecErrors, UnreadFamily, shown
from controller.estimator.frozen import assemble
from controller.estimator.model.dims import read_dims
from controller.estimator.model.families import FAMILIES, SUPPORTED_MODEL_TYPES, family_traits
from controller.estimator.model.read import (
    Defaulted,
    Reader,
    defaults_read,
    missing_dimensions,
    model_defaults,
    read_quantization,
    read_text_config,
)
from controller.estimator.model.shape import ModelShape
from controller.estimator.model.tensors import build_layers, outer_linears

#: Parsed shapes kept by content (`parse_config`): enough for every model a cluster trains at
#: once. A config beyond the bounds (real ones are 1-10 KB with a few dozen objects and
#: lists) is parsed every time, so hostile specs cannot pin much memory here: a kept config
#: holds at most about 10x its marshalled size in strings and numbers, plus its containers
#: (an empty `{}` is 2 bytes marshalled, 64 as an object, hence their own bound).
PARSED_CONFIGS = 128
PARSED_CONFIG_MAX_BYTES = 16 * 1024
PARSED_CONFIG_MAX_CONTAINERS = 512


def parse_config(config: Mapping[str, Any], prefix: str = "") -> ModelShape:
    """Read a Hugging Face config.json (as a dict) into a `ModelShape`.

    `prefix` is the field path of the config in the caller's spec (e.g. `spec.model.config`),
    so errors point at the field the user wrote. Raises `SpecError` on missing or
    contradictory fields.

    The operator and `vramgate plan` see the same config in many jobs (one ConfigMap, one
    inline config copied into every manifest), and parsing costs several times the estimate
    itself, so a shape is kept by the config's exact content and shared: `marshal` writes
    the value with its types (1, 1.0 and true stay three different configs) and without
    object references (format 2), so equal bytes mean an equal config, and the shape is
    parsed from a copy of its own, which the caller's later changes do not reach. Shapes
    are immutable; their `memo` only caches what the shape determines, and their `source`
    (the copy) is shared by every caller of that config: read it, never change it (the
    trace copies what it changes). Anything marshal cannot write (a mapping
    that is not a plain dict, values YAML decoded into dates) is parsed as it is.
    """
    try:
        blob = marshal.dumps(config, 2)  # type: ignore[arg-type]  # any value; ValueError if not
    except ValueError:  # not plain JSON data, or nested too deeply for marshal
        return _parse_config(config, prefix)
    if len(blob) > PARSED_CONFIG_MAX_BYTES or _containers(blob) > PARSED_CONFIG_MAX_CONTAINERS:
        return _parse_config(config, prefix)
    return _parse_marshalled(blob, prefix)


def _containers(blob: bytes) -> int:
    """At least the number of dicts, lists and tuples marshalled in `blob` (their type codes;
    the same bytes inside strings count too, which only keeps a config out of the cache)."""
    return blob.count(b"{") + blob.count(b"[") + blob.count(b"(")


@lru_cache(maxsize=PARSED_CONFIGS)
def _parse_marshalled(blob: bytes, prefix: str) -> ModelShape:
    """A shape by its config's marshalled bytes (errors are raised, not cached)."""
    return _parse_config(marshal.loads(blob), prefix)


def _parse_config(config: Mapping[str, Any], prefix: str) -> ModelShape:
    """`parse_config` without the cache."""
    if not isinstance(config, Mapping):
        raise SpecError(prefix or "config", "must be a JSON object (a Hugging Face config.json)")
    text, text_prefix, defaulted = read_text_config(config, prefix)
    r = Reader(text, text_prefix)
    try:
        return _parse_text(config, prefix, text, r, defaulted)
    except SpecError as error:
        if type(error) is SpecError and error.field in {r.path(f) for f in defaulted.fields}:
            # A value the user never wrote: say where it came from, or the refusal reads as
            # nonsense ("got 32" of a config without the field).
            raise SpecError(
                error.field,
                f"{error.message} (not in the config: the default of transformers' "
                f"{defaulted.model_type} config class; set it in the config)",
            ) from None
        raise


def _family_type(config: Mapping[str, Any], prefix: str) -> str:
    """The `model_type` whose layout the parser reads: the text_config's own, else the
    config's; a wrapper whose text_config names none is read as the text model transformers
    builds it with (`_text_config_types`: Mistral 3's is a Mistral), unless the wrapper is a
    family of its own (Gemma 3, Llama 4). Any other type is refused with the field: read as
    a Llama-style block, GPT-NeoX came out at 9.0B parameters instead of 6.9B. A config
    naming no model_type (hand-written; transformers always writes one) is read as Llama's,
    as the trace builds it and the operator labels it."""
    nested = config.get("text_config")
    own = nested.get("model_type") if isinstance(nested, Mapping) else None
    if own:
        model_type, field = own, "text_config.model_type"
    else:
        model_type, field = config.get("model_type"), "model_type"
    if not model_type:
        return "llama"
    path = f"{prefix}.{field}" if prefix else field
    if not isinstance(model_type, str):
        raise SpecError(path, f"must be a string, got {shown(model_type)}")
    if model_type in FAMILIES:
        return model_type
    if nested is not None and not own and model_type in model_defaults()[1]:
        return model_defaults()[1][model_type]
    raise UnreadFamily(
        path,
        f"{shown(model_type)} is not a model family vramgate reads (its layers may differ "
        "from the Llama-style block, so it is not estimated as one); supported: "
        f"{', '.join(SUPPORTED_MODEL_TYPES)}, or a multimodal config whose text_config is one "
        "of them (or use a preset: `vramgate presets`)",
    )


def _parse_text(
    config: Mapping[str, Any],
    prefix: str,
    text: Mapping[str, Any],
    r: Reader,
    defaulted: Defaulted,
) -> ModelShape:
    """The shape of the language model whose fields (class defaults filled in) `r` reads."""
    model_type = _family_type(config, prefix)
    fam = family_traits(model_type)
    missing = missing_dimensions(r, defaulted, fam)
    if missing:
        raise SpecErrors(missing)
    dims = read_dims(r, fam)
    tie = dims.tie_word_embeddings
    mlp_bias = r.bool("mlp_bias", False)
    h = dims.hidden_size
    norm = 2 * h if fam.layernorm_bias else h

    layers, runs = build_layers(dims, fam, r, mlp_bias)
    n = dims.num_layers
    embedding = dims.vocab_size * h
    if dims.hidden_size_per_layer_input:
        pli = dims.hidden_size_per_layer_input
        embedding += dims.vocab_size_per_layer_input * pli * n  # embed_tokens_per_layer
        embedding += pli  # per_layer_projection_norm
    # Only compared with the sequence length, so no upper bound.
    max_pos = r.int(
        "max_position_embeddings",
        "n_positions",
        "max_sequence_length",
        "max_seq_len",
        maximum=None,
    )
    return assemble(
        ModelShape,
        {
            "model_type": model_type,
            "dims": dims,
            "layers": layers,
            "embedding_params": embedding,
            "lm_head_params": 0 if tie else dims.vocab_size * h,
            "final_norm_params": norm,
            "max_position_embeddings": max_pos,
            "context_length": rope_context(text, r.prefix, max_pos),  # read before
            "quantization": read_quantization(config, text, prefix),
            "source": config,
            "memo": {},
            "outer_linears": outer_linears(dims),
            "frozen_linears": (),
            "frozen_params": 0,
            "unpriced_mixers": (),
            "peft_adapts_stacks": False,
            "config_warnings": defaults_read(r, defaulted, dims),
            # What the `layer_counts` cached property would compute (one object per distinct
            # key, counted), where it keeps it; `dataclasses.replace` builds a shape without.
            "layer_counts": runs,
        },
    )
