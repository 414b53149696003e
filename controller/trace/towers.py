"""The towers of a multimodal model whose language model a hand reading reads, as built.

    tower = read_tower(config_json)     # controller.estimator.model.tower.Tower
    python -m controller.trace.towers gemma-3-4b    # the JSON a preset stores

The model is built as a job of the config builds it (`inventory.build_meta_model`: the
image-text-to-text class where the config states a vision tower), on the meta device at its
own depth, and read by the module inventory; its encoders are the modules transformers' own
`get_encoder` finds for images and for audio. `controller.estimator.model.tower.tower_of` turns
that into plain data, which `controller.jobs.profiles.read_shape` adds to the hand reading, and
which the bundled presets store (so an image without this extra prices their towers too:
tests/unit/trace/test_towers.py holds the stored figures to this reading).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from torch import nn

from controller.estimator.model.tower import Tower, tower_of, tower_to_json
from controller.trace.build import TraceUnsupported
from controller.trace.inventory import (
    _config_from,
    _guarded,
    _path_of,
    _skip_modules,
    _under,
    build_meta_model,
    inventory_of,
)

#: The modalities whose encoders are towers (`get_encoder(modality=...)`).
MODALITIES = ("image", "audio")


def encoder_paths(model: Any) -> tuple[str, ...]:
    """The module paths of the model's encoders, one per modality that has one of its own
    (none nested in another: a video encoder is most often the image one)."""
    found: list[str] = []
    for modality in MODALITIES:
        try:
            encoder = model.get_encoder(modality=modality)
        except (TypeError, ValueError, AttributeError):
            continue  # a class that takes no modality, or has no such encoder
        if not isinstance(encoder, nn.Module) or encoder is model:
            continue
        if encoder is getattr(model, "base_model", None):
            continue
        path = _path_of(model, encoder)
        if path and not any((path + ".").startswith(p + ".") for p in found):
            found.append(path)
    return tuple(found)


def read_tower(config: Mapping[str, Any]) -> Tower:
    """The parts of the model `config` describes outside its language model (see the module
    docstring). Raises `TraceUnsupported` where transformers cannot build it."""
    model, model_type, auto, depth = build_meta_model(config)
    inv = _guarded(inventory_of, model, model_type, auto, depth, _skip_modules(config))
    params = dict(model.named_parameters())
    encoders = {path: _under(params, path) for path in encoder_paths(model)}
    try:
        return tower_of(inv, encoders)
    except ValueError as error:
        raise TraceUnsupported(str(error)) from None


def source_line() -> str:
    """Where a stored tower's figures come from: this transformers, on the meta device."""
    import transformers

    return (
        f"transformers {transformers.__version__}, the model built on the meta device "
        "(python -m controller.trace.towers <preset>)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m controller.trace.towers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("model", help="a config.json path, a vramgate preset or a model_type")
    args = parser.parse_args(argv)
    try:
        tower = read_tower(_config_from(args.model))
    except TraceUnsupported as error:
        print(f"vramgate: {error}", file=sys.stderr)
        return 2
    data = tower_to_json(tower) | {"source": source_line()}
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
