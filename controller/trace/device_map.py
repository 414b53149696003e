"""A device map's GPUs from a traced step's per-module bytes: where each module goes, and
what the fullest GPU holds.

Placement is transformers' for `device_map="auto"` (`integrations/accelerate.py`,
`get_balanced_memory` then `infer_auto_device_map`, the same rule as accelerate's
`utils/modeling.py`), which sizes each module by its weights as loaded:

* every GPU but the last may take `model // n + 1.25 x its largest block` (the largest
  decoder layer or leaf module, the embedding often); the last takes what is left (its
  whole memory, assumed to hold it). A 4-bit (bitsandbytes) load keeps 90 % of each
  (`Bnb4BitHfQuantizer.adjust_max_memory`).
* Modules go in forward order onto the current GPU while they fit, then onto the next; a
  decoder layer is never split (`_no_split_modules`). The first GPU keeps room for the
  largest module not yet placed (accelerate's "main device" reserve for an offloaded
  layer). A tied LM head goes with the embedding.

One GPU works at a time (the batch passes from GPU to GPU), so a GPU holds its modules'
weights and optimizer state all through the step, and at its fullest either (backward
through one of its modules) the activations of its modules up to that one, the gradients
of those after it (all of them while gradient accumulation holds an earlier micro-batch's),
and that module's working memory; or (the optimizer step) all its gradients and its share
of the step's working memory. The LM head's working memory is the logits and the loss, on
the GPU that holds it. Pure arithmetic on plain integers: no torch here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

#: transformers' get_balanced_memory: `buffer = int(1.25 * max(biggest_no_split_module,
#: biggest_leaf))` on top of each GPU's share of the model.
BALANCE_BUFFER = Fraction(5, 4)
#: transformers' Bnb4BitHfQuantizer.adjust_max_memory: `val * 0.90` ("more space for
#: buffers that are created during quantization").
BNB_4BIT_SHARE = Fraction(9, 10)


@dataclass(frozen=True)
class ModuleBytes:
    """One module's bytes in a traced step (`modules.py` says when each is read).

    `loaded` is its weights as the model is loaded, before adapters are added (a tied
    weight counted once, with the embedding): what transformers sizes it at to place it."""

    name: str
    loaded: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    working: int

    @property
    def static(self) -> int:
        """What its GPU holds for it all through the step."""
        return self.weights + self.optimizer


@dataclass(frozen=True)
class ModuleTable:
    """The modules in the order forward runs them: the embedding (with whatever else runs
    before the first decoder layer), the decoder layers, the LM head (with the final norm).

    `tied_head`: the LM head's weight is the embedding's, so it goes on the embedding's GPU.
    `step_working`: the optimizer step's working memory for all parameters together
    (foreach AdamW's scratch, fp32 copies of gradients); each GPU holds its share, in
    proportion to its gradients. `accumulating`: gradient accumulation, so backward runs
    with an earlier micro-batch's gradients held. `inputs`: the batch, on the first GPU."""

    modules: tuple[ModuleBytes, ...]
    tied_head: bool
    step_working: int
    accumulating: bool
    inputs: int = 0

    @property
    def layers(self) -> tuple[ModuleBytes, ...]:
        return self.modules[1:-1]


def layer_name(index: int) -> str:
    """A decoder layer's name, as the trace's regions name it."""
    return f"layer {index}"


def balanced_caps(sizes: Sequence[int], gpus: int, share: Fraction = Fraction(1)) -> list[int]:
    """What each GPU but the last may take (the last takes the rest)."""
    per_gpu = sum(sizes) // gpus + int(BALANCE_BUFFER * max(sizes, default=0))
    return [int(per_gpu * share)] * (gpus - 1)


def place(
    sizes: Sequence[int], gpus: int, tied_head: bool = False, share: Fraction = Fraction(1)
) -> tuple[int, ...]:
    """The GPU of each module (`sizes` in forward order, the LM head last), as
    `device_map="auto"` places them on `gpus` alike GPUs (module docstring)."""
    count = len(sizes)
    if gpus <= 1 or count == 0:
        return (0,) * count
    caps = balanced_caps(sizes, gpus, share)
    where = [gpus - 1] * count
    queue = deque(i for i in range(count) if not (tied_head and i == count - 1))
    reserve, largest = _largest(sizes, queue)
    device, used = 0, 0
    while queue:
        unit = queue.popleft()
        largest.discard(unit)
        if not largest:  # as accelerate does: the reserve follows what is left to place
            reserve, largest = _largest(sizes, queue)
        if device == gpus - 1:
            where[unit] = device
            continue
        room = caps[device] - (reserve if device == 0 else 0)
        if used + sizes[unit] <= room:
            used += sizes[unit]
            where[unit] = device
            continue
        device, used = device + 1, 0
        queue.appendleft(unit)
    if tied_head:
        where[-1] = where[0]
    return tuple(where)


def _largest(sizes: Sequence[int], units: Sequence[int]) -> tuple[int, set[int]]:
    """The largest size among `units` and the units of that size."""
    top = max((sizes[u] for u in units), default=0)
    return top, {u for u in units if sizes[u] == top}


def gpu_tensors(table: ModuleTable, on: Sequence[int]) -> int:
    """The tensor bytes a GPU holding the modules `on` (indices, forward order) holds at its
    fullest (module docstring); 0 for a GPU without modules."""
    mods = [table.modules[i] for i in on]
    if not mods:
        return 0
    static = sum(m.static for m in mods) + (table.inputs if 0 in on else 0)
    grads = sum(m.gradients for m in mods)
    all_grads = sum(m.gradients for m in table.modules)
    share = table.step_working * grads // all_grads if all_grads else 0
    fullest = grads + share
    held = 0
    for k, module in enumerate(mods):
        held += module.activations
        later = grads if table.accumulating else sum(m.gradients for m in mods[k:])
        fullest = max(fullest, held + later + module.working)
    return static + fullest


def device_map_tensors(
    table: ModuleTable, gpus: int, share: Fraction = Fraction(1)
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(each module's GPU, each GPU's tensor bytes at its fullest) on `gpus` GPUs."""
    where = place([m.loaded for m in table.modules], gpus, table.tied_head, share)
    per_gpu = tuple(
        gpu_tensors(table, [i for i, g in enumerate(where) if g == gpu]) for gpu in range(gpus)
    )
    return where, per_gpu


def device_map_per_gpu(
    table: ModuleTable, gpus: int, quantized: bool, margin: Fraction, fixed: int
) -> int:
    """The fullest GPU's figure on `gpus` GPUs: its tensors with the caching allocator's
    reserve on them (`margin`: the step's replayed reserve over its peak, as the trace's
    estimate spreads it), plus what every GPU the process touches holds outside the tensors
    (`fixed`: the CUDA context, the cuBLAS workspace). One process drives every GPU of a
    device map: no NCCL communicator. `quantized`: a bitsandbytes 4-bit load."""
    share = BNB_4BIT_SHARE if quantized else Fraction(1)
    held = max(device_map_tensors(table, gpus, share)[1])
    return held + int(held * margin) - held + fixed


def extend_table(
    small: ModuleTable, large: ModuleTable, layers: int, lead: int = 0, period: int = 1
) -> ModuleTable:
    """The table of the model at `layers` layers from traces of n and n + `period` layers
    (`extrapolate.extend`'s two): the embedding, the LM head, the first `lead` + 2 layers
    and the last two as the larger traced them; each layer between as its traced middle
    layer of the same kind (the same place in the period of dense and MoE layers): every
    block of a kind holds the same bytes at any depth, only the ends differ (the first
    layer's backward runs the embedding's, the last layer's output is not saved). The
    optimizer step's working memory is the whole model's, extended per period as the
    trace's other figures are."""
    traced = large.layers
    count = len(traced)

    def source(index: int) -> int:
        if index < lead + 2:
            return index
        if index >= layers - 2:
            return count - (layers - index)
        return lead + 2 + (index - lead - 2) % period

    middle = tuple(replace(traced[source(i)], name=layer_name(i)) for i in range(layers))
    steps = (layers - len(small.layers)) // period
    step = small.step_working + steps * (large.step_working - small.step_working)
    return replace(
        large,
        modules=(large.modules[0], *middle, large.modules[-1]),
        step_working=max(0, step),
    )
