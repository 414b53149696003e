"""A model from its Hugging Face `config.json`: every tensor it owns, by layer.

    shape = parse_config(config_json)             # a ModelShape, kept by the config's content
    shape.total_params, shape.dims.hidden_size
    canonical_targets(["q_proj", "v_proj"], shape, "spec.lora.targets")

The modules, each built on the ones before it:

    families.py  the families the parser reads, as data (`FAMILIES`: biases, norms, fusions,
                 experts, a hybrid's stack)
    shape.py     what a parse gives: `ModelShape`, its layers and linears, the config-level
                 `ArchDims`, and the figures derived from them (per-layer widths, LoRA counts)
    read.py      reading a config dict: typed fields (`Reader`), the text model's fields with
                 its config class's defaults, what a config must state
    stacks.py    a hybrid's mixer per layer and the mixers' widths
    dims.py      the config's `ArchDims`, field by field
    targets.py   LoRA targets as PEFT matches them
    tensors.py   every tensor of a layer, as transformers builds the family's
    parse.py     `parse_config`, the entry point

Beside them, `inventory.py` holds what `controller.trace.inventory` reads from the model
transformers builds (`ModelInventory`), as plain data the estimator can take without torch,
and `generic.py` turns one into a `ModelShape` for a family `parse_config` does not read
(`shape_from_inventory`; the shells call it through `controller.jobs.profiles.read_shape`);
`tower.py` holds the parts of a hand-read multimodal model outside its language model (its
vision or audio tower and projector), read from the built model or stored in a preset.
"""

from __future__ import annotations

from controller.estimator.model.families import SUPPORTED_MODEL_TYPES, family_traits
from controller.estimator.model.parse import parse_config
from controller.estimator.model.read import (
    MAX_DIMENSION,
    MAX_EXPERTS,
    MAX_LAYERS,
    REQUIRED_DIMENSIONS,
)
from controller.estimator.model.shape import (
    MIXERS,
    TEXT_ROOTS,
    ArchDims,
    Layer,
    Linear,
    Memo,
    ModelShape,
    Quantization,
    is_kv_shared_layer,
    layer_attention_dims,
    layer_mlp_size,
    skip_module_matches,
    skip_module_matches_text,
)
from controller.estimator.model.targets import (
    PEFT_REFUSED_MODULES,
    canonical_targets,
    peft_adaptable_modules,
    peft_name,
)

__all__ = [
    "MAX_DIMENSION",
    "MAX_EXPERTS",
    "MAX_LAYERS",
    "MIXERS",
    "PEFT_REFUSED_MODULES",
    "REQUIRED_DIMENSIONS",
    "SUPPORTED_MODEL_TYPES",
    "TEXT_ROOTS",
    "ArchDims",
    "Layer",
    "Linear",
    "Memo",
    "ModelShape",
    "Quantization",
    "canonical_targets",
    "family_traits",
    "is_kv_shared_layer",
    "layer_attention_dims",
    "layer_mlp_size",
    "parse_config",
    "peft_adaptable_modules",
    "peft_name",
    "skip_module_matches",
    "skip_module_matches_text",
]
