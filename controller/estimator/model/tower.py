"""What a multimodal model holds beside the language model a hand reading reads: its towers.

    shape = with_tower(parse_config(config), tower)   # the text reading, plus the towers

`parse_config` reads a multimodal config's `text_config` by hand (Gemma 3, LLaVA, Mistral 3,
InternVL...), byte-exact for the language model, and nothing else of it. The model a job
fine-tunes holds more: a vision (or audio) encoder, a projector into the language model's
width, sometimes more (Janus' image generation head). Those come from the model
transformers builds, read into plain data here (`tower_of`, from the module inventory the
trace extra reads; or stored in a preset, `tower_from_json`), and priced as the generic
reading prices the same parts (`controller.estimator.model.generic`):

* an encoder (the modules transformers' `get_encoder` finds for images or audio) is frozen:
  its linears that bitsandbytes quantises are `ModelShape.frozen_linears`, the rest of it
  `frozen_params` (weights only under full fine-tuning; LoRA only on linears a target names,
  never under `all-linear`);
* the linears outside the encoders and the language model that PEFT's `all-linear` adapts and
  bitsandbytes quantises (a projector's) are trained as the language model's outer linears
  (`outer_linears`), and every other parameter there (a projector's norm, a learned
  separator) as the final norm is;
* the LM head is tied or not as the built model ties it: transformers follows the outer
  config's `tie_word_embeddings` (Mistral 3's, InternVL's default true), where the hand
  reading reads the text config's.

The language model's own figures (its layers, embeddings, final norm) are the hand reading's,
unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from controller.estimator.model.inventory import ModelInventory
from controller.estimator.model.shape import Linear, ModelShape

#: The note of a shape whose towers were counted: what of them is trained (no spec field says).
TOWER_NOTE = (
    "the vision (or audio) tower is counted from the model transformers builds and frozen "
    "(weights only, as vision-language fine-tuning recipes keep it): full fine-tuning trains "
    "the language model and the projector, and LoRA adapts the tower's linears only where "
    "lora.targetModules names them (all-linear leaves them out)"
)
#: The note of a hand-read multimodal config whose towers could not be read (no trace extra).
UNCOUNTED_NOTE = (
    "only the language model is counted: its vision (or audio) tower and projector are read "
    "from the model transformers builds, which needs the trace extra "
    "(pip install 'vramgate[trace]'; the bundled presets carry theirs), so the estimate is "
    "short by the tower's weights"
)
#: The config fields that state a tower beside the text model.
TOWER_FIELDS = ("vision_config", "audio_config")


@dataclass(frozen=True)
class Tower:
    """The parts of a multimodal model outside its language model (see the module docstring).

    `source` says where the figures come from (a preset's: the transformers that built it)."""

    frozen_linears: tuple[Linear, ...]
    frozen_params: int
    projector_linears: tuple[Linear, ...]
    projector_params: int
    tied: bool
    source: str = ""

    @property
    def params(self) -> int:
        return (
            sum(lin.params for lin in (*self.frozen_linears, *self.projector_linears))
            + self.frozen_params
            + self.projector_params
        )


def states_tower(config: Mapping[str, Any]) -> bool:
    """Whether `config` states a tower beside its text model (`TOWER_FIELDS`): a cheap test
    on the config alone, before anything is built."""
    return any(isinstance(config.get(name), Mapping) for name in TOWER_FIELDS)


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def tower_of(inventory: ModelInventory, encoders: Mapping[str, int]) -> Tower:
    """The parts of the model `inventory` was read from outside its language model, given
    its encoders (`encoders`: module path -> parameters under it, as built).

    The language model is the decoder layers, the modules beside them (the parent of the
    layer list: embeddings, final norm) and the output embedding; everything else is an
    encoder's or the projector's. Raises ValueError where the counts do not add up."""
    inv = inventory
    layers = inv.layers_path + "."
    root = inv.layers_path.rpartition(".")[0]
    own = root + "." if root else None
    inside = tuple(path + "." for path in encoders)
    frozen: list[Linear] = []
    projector: list[Linear] = []
    for group in inv.linears:
        if group.name.startswith(layers) or not group.quantized_4bit:
            continue  # kept 16-bit and never a LoRA target of ours: counted with the rest
        if own is not None and group.name.startswith(own):
            continue  # the language model's own (the hand reading counts it)
        linear = Linear(
            _leaf(group.name), group.in_features, group.out_features, group.bias, group.count
        )
        if inside and group.name.startswith(inside):
            frozen.append(linear)
        elif group.all_linear:
            projector.append(linear)
    beside = sum(
        part.params for part in inv.outside if own is None or not (part.name + ".").startswith(own)
    )
    beside -= inv.head_params  # the output embedding is the language model's
    encoded = sum(encoders.values())
    frozen_rest = encoded - sum(lin.params for lin in frozen)
    projector_rest = beside - encoded - sum(lin.params for lin in projector)
    if frozen_rest < 0 or projector_rest < 0:
        raise ValueError(
            f"{inv.model_type}: the parts outside the language model ({beside:,} parameters) "
            f"do not hold its encoders ({encoded:,}) and their linears"
        )
    return Tower(
        frozen_linears=tuple(frozen),
        frozen_params=frozen_rest,
        projector_linears=tuple(projector),
        projector_params=projector_rest,
        tied=inv.tied_embeddings,
    )


def with_tower(shape: ModelShape, tower: Tower, where: str | None) -> ModelShape:
    """`shape` (a hand reading of the language model) with `tower` counted and priced as the
    generic reading prices the same parts, its LM head tied as the built model ties it, and
    `TOWER_NOTE` said at `where`, the config's field path (None: no note, as for a preset,
    which warns of nothing)."""
    dims, head = shape.dims, shape.lm_head_params
    if tower.tied != dims.tie_word_embeddings:
        dims = replace(dims, tie_word_embeddings=tower.tied)
        head = 0 if tower.tied else dims.vocab_size * dims.hidden_size
    return replace(
        shape,
        dims=dims,
        lm_head_params=head,
        outer_linears=(*shape.outer_linears, *tower.projector_linears),
        final_norm_params=shape.final_norm_params + tower.projector_params,
        frozen_linears=(*shape.frozen_linears, *tower.frozen_linears),
        frozen_params=shape.frozen_params + tower.frozen_params,
        config_warnings=(*shape.config_warnings, *([(where, TOWER_NOTE)] if where else [])),
        memo={},
    )


def without_tower(shape: ModelShape, where: str, why: str = "") -> ModelShape:
    """`shape` (a hand reading of a multimodal config whose towers were not read) with a note
    at `where` that says the estimate counts its language model alone (`UNCOUNTED_NOTE`, or
    `why` where the build failed)."""
    note = (where, why or UNCOUNTED_NOTE)
    return replace(shape, config_warnings=(*shape.config_warnings, note), memo={})


# -- stored in a preset -------------------------------------------------------------------


def tower_to_json(tower: Tower) -> dict[str, Any]:
    """`tower` as a preset stores it: linears as [name, in, out, bias, count] rows."""

    def rows(linears: tuple[Linear, ...]) -> list[list[Any]]:
        return [[x.name, x.in_features, x.out_features, x.bias, x.copies] for x in linears]

    return {
        "source": tower.source,
        "frozen_linears": rows(tower.frozen_linears),
        "frozen_params": tower.frozen_params,
        "projector_linears": rows(tower.projector_linears),
        "projector_params": tower.projector_params,
        "tied": tower.tied,
    }


def tower_from_json(data: Mapping[str, Any]) -> Tower:
    """The `Tower` a preset stores (`tower_to_json`)."""

    def linears(rows: Any) -> tuple[Linear, ...]:
        return tuple(
            Linear(str(name), int(i), int(o), bool(bias), int(count))
            for name, i, o, bias, count in rows
        )

    return Tower(
        frozen_linears=linears(data["frozen_linears"]),
        frozen_params=int(data["frozen_params"]),
        projector_linears=linears(data["projector_linears"]),
        projector_params=int(data["projector_params"]),
        tied=bool(data["tied"]),
        source=str(data.get("source", "")),
    )
