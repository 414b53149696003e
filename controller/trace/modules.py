"""A traced step read back module by module: what each module a device map places holds.

A device map (transformers' `device_map="auto"`) puts the model's modules on the job's GPUs
in order: the input embedding, each decoder layer, the final norm and LM head. Each GPU then
holds its modules' weights, gradients and optimizer state, the activations its modules save
for backward, and, while one of its modules runs, that module's working memory. The trace
runs all of it on one device; its log says which module each storage belongs to:

* a parameter's storages (its weights, its gradient, its optimizer state) belong to the
  module holding the parameter: `Owners` tags them as the run registers them
  (`StorageTracker.own`); a tied LM head's weight is the embedding's;
* every other storage belongs to the module whose region of the step created it (`run.py`'s
  regions: "head" is the embedding's stretch of forward, "layer k/..." layer k's, "tail/..."
  the final norm's, the LM head's and the loss's), where autograd runs its backward too.

`module_table` reads, per module, at the steady state (the last micro-batch of the last
step, the optimizer state made): the weights, the optimizer state and the activations held
when forward ends (the peak of saved tensors), the gradients held when the optimizer steps,
and the most its own stretches of forward and backward hold beyond those (`working`: the
layer's temporaries, or the logits and the loss on the LM head). `device_map.py` places the
modules and sums them per GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from controller.trace import qlora
from controller.trace.device_map import ModuleBytes, ModuleTable, layer_name
from controller.trace.optim import TracedOptimizer
from controller.trace.tracker import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER,
    WEIGHTS,
    StorageTracker,
)

EMBEDDING = "embedding"
LM_HEAD = "lm_head"
#: Where the optimizer step's own working memory is kept apart (no module runs it).
STEP = "step"


def _is_loaded(name: str) -> bool:
    """Whether a parameter is part of the model as loaded (PEFT adds the rest after)."""
    return ".lora_" not in f".{name}" and "modules_to_save" not in name


class Owners:
    """Which module each tensor of the model belongs to, and each module's loaded bytes."""

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, head: list[nn.Module]) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
        embedding = _module(base, "get_input_embeddings")
        output = _module(base, "get_output_embeddings")
        tails = [m for m in (*head, output) if m is not None]
        first = [] if embedding is None else [embedding]
        units: list[tuple[str, list[nn.Module]]] = [(EMBEDDING, first)]
        units += [(layer_name(i), [block]) for i, block in enumerate(blocks)]
        units += [(LM_HEAD, tails), (EMBEDDING, [model])]  # the rest runs first: embedding
        self.names = [EMBEDDING, *(layer_name(i) for i in range(len(blocks))), LM_HEAD]
        self.of_param: dict[int, str] = {}
        self.tensors: list[tuple[str, torch.Tensor]] = []
        self.loaded = dict.fromkeys(self.names, 0)
        seen: set[int] = set()
        for owner, modules in units:
            for module in modules:
                for name, tensor in _tensors(module):
                    key = id(tensor.untyped_storage())
                    if key in seen:
                        continue
                    seen.add(key)
                    self.tensors.append((owner, tensor))
                    if isinstance(tensor, nn.Parameter):
                        self.of_param[id(tensor)] = owner
                    if _is_loaded(name):
                        self.loaded[owner] += tensor.untyped_storage().nbytes()
        weight = getattr(output, "weight", None)
        self.tied_head = weight is not None and self.of_param.get(id(weight)) == EMBEDDING

    def tag(self, tracker: StorageTracker) -> None:
        """Tag every weight (registered already) with its module."""
        for owner, tensor in self.tensors:
            tracker.own(tensor, owner)

    def tag_gradient(self, tracker: StorageTracker, param: torch.Tensor) -> None:
        if param.grad is not None:
            tracker.own(param.grad, self.of_param.get(id(param), EMBEDDING))

    def tag_states(self, tracker: StorageTracker, optimizer: TracedOptimizer) -> None:
        """Tag the optimizer's state (registered already) with its parameters' modules;
        state shared by all parameters (bitsandbytes' quantisation maps) sits with the
        embedding, on the first GPU."""
        for param, tensor in optimizer.param_states():
            owner = EMBEDDING if param is None else self.of_param.get(id(param), EMBEDDING)
            tracker.own(tensor, owner)


def _module(model: nn.Module, getter: str) -> nn.Module | None:
    """The model's input or output embedding, None where it has none or does not say."""
    try:
        found = getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None
    return found if isinstance(found, nn.Module) else None


def _tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor `run._register_model` counts for `module`, with its name."""
    yield from module.named_parameters()
    yield from module.named_buffers()
    for tensor in qlora.quantized_tensors(module):
        yield "quant_state", tensor


def owner_of_region(region: str) -> str | None:
    """The module a region of the step runs ("layer 3/mlp.up_proj#..." -> "layer 3"); STEP
    for the optimizer's; None for the setup (the batch)."""
    region = region.partition("#")[0]
    if region.startswith("layer "):
        return region.partition("/")[0]
    if region == "head":
        return EMBEDDING
    if region.startswith("tail"):
        return LM_HEAD
    if region == "step":
        return STEP
    return None


def module_table(
    tracker: StorageTracker, owners: Owners, accumulating: bool, stepped_in_backward: bool = False
) -> ModuleTable:
    """Each module's bytes, read from the tracker's log after the run (module docstring).
    `stepped_in_backward`: the optimizer steps each parameter as its gradient is made and
    frees the gradient (`Switches.optimizer_in_backward`), so gradients are working memory
    of the module whose backward makes them."""
    segments = tracker.segments
    forward_end = tracker.forward_ends()
    held_at = max(forward_end.values())  # the last forward pass's end: activations held
    steps = [s for s in segments if s.phase == "optimizer"]
    step_at = steps[-1].start if steps else held_at
    names = owners.names
    kinds = (WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS)
    bytes_of = {name: dict.fromkeys(kinds, 0) for name in names}
    inputs = 0
    events: list[tuple[int, int, str | None]] = []  # (tick, +/- bytes, the region's owner)
    for record in tracker.records:
        role = record.role
        region_owner = owner_of_region(segments[record.segment].region)
        if role == GRADIENTS and stepped_in_backward:
            role = None
        if role is not None:
            owner = record.owner or EMBEDDING
            at = step_at if role == GRADIENTS else held_at
            if _live(record.born, record.died, at):
                bytes_of[owner][role] += record.nbytes
            continue
        if region_owner is None:  # the batch, made before the step
            inputs += record.nbytes if _live(record.born, record.died, held_at) else 0
            continue
        if tracker.category(record, forward_end) == ACTIVATIONS:
            if region_owner in bytes_of and _live(record.born, record.died, held_at):
                bytes_of[region_owner][ACTIVATIONS] += record.nbytes
            continue
        events.append((record.born, record.nbytes, region_owner))
        if record.died is not None:
            events.append((record.died, -record.nbytes, None))
    working = _working(events)
    modules = tuple(
        ModuleBytes(
            name=name,
            loaded=owners.loaded[name],
            weights=bytes_of[name][WEIGHTS],
            gradients=bytes_of[name][GRADIENTS],
            optimizer=bytes_of[name][OPTIMIZER],
            activations=bytes_of[name][ACTIVATIONS],
            working=working.get(name, 0),
        )
        for name in names
    )
    return ModuleTable(modules, owners.tied_head, working.get(STEP, 0), accumulating, inputs)


def _live(born: int, died: int | None, tick: int) -> bool:
    return born <= tick and (died is None or died > tick)


def _working(events: list[tuple[int, int, str | None]]) -> dict[str, int]:
    """The most temporaries live at once in each module's stretches of the step: one sweep
    over their births and deaths (each on a tick of its own), the count after a birth
    charged to the module whose region it was born in (what is live then is on its GPU:
    one GPU works at a time)."""
    events.sort(key=lambda e: e[0])
    live = 0
    most: dict[str, int] = {}
    for _, change, owner in events:
        live += change
        if owner is not None and live > most.get(owner, 0):
            most[owner] = live
    return most
