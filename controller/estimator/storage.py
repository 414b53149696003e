"""Exact resident bytes of a training job: weights, adapters, gradients, optimizer state.

These are the tensors whose shapes the config fixes, counted tensor by tensor the way the
`trace` profile sees them allocated (each rounded up to the CUDA caching allocator's
512-byte block), so the `calibrated` profile only has to fit what depends on the step's
data flow (activations, temporaries). Pure: no torch.

What each setting allocates (the trace's modelling, see controller/trace):
* an MoE layer as transformers 5 holds it: each expert projection as one stack (a 3-D
  parameter, E x out x in; gate and up fused into one; DBRX's 2-D, its w1 and v1 apart),
  the router as a parameter (fp32 in DeepSeek-V3, whose score-correction bias is an fp32
  buffer) or, DBRX's, an nn.Linear priced as any linear; QLoRA holds the stacks as NF4
  (trace/qlora.py) and leaves a parameter router 16-bit; LoRA on them is PEFT's
  `ParamWrapper` (A: r·E x in, B: out x r·E, the fused gate/up at rank 2r), for the
  families PEFT maps "all-linear" onto them (`peft_moe_pattern`), else none. PEFT moves
  the names gate_proj/up_proj/down_proj to the stacks in the "qwen2_moe" pattern, so the
  dense MLPs and shared experts of those models (DeepSeek, Qwen2-MoE) get no LoRA.
* weights in the training precision; QLoRA: every decoder linear as bitsandbytes NF4
  (packed 4-bit, per-64 absmax, double-quantised unless the checkpoint says otherwise)
  but those `llm_int8_skip_modules` names (matched by path, as the loader and the trace's
  `qlora.quantize_linears` match them: `_skip_correction`), embeddings, norms and LM head
  16-bit; the expert stacks NF4 whatever the skip list says, as `qlora.quantize_experts`
  holds them; PEFT LoRA adapters A (r x in) and B (out x r) in
  fp32; `modules_to_save` as trainable 16-bit copies beside the frozen originals.
* gradients: one per trainable tensor, in its dtype.
* optimizer state per trainable tensor of n elements, e bytes each (see trace/optim.py):
  torch AdamW 2 moments in the tensor's dtype + a step scalar; fp32-master AdamW an fp32
  master, two fp32 moments and a step; bitsandbytes 8-bit 2 x n uint8 + 2 fp32 absmax per
  256 (n >= 4096, else 2 fp32 moments) and two 256-entry maps; bitsandbytes 32-bit 2 fp32
  moments; SGD nothing.
* optimizer scratch during `step()`: foreach AdamW a parameter-sized list (sqrt of the
  second moments); fp32-master the fp32 gradient copies plus that list over the masters;
  fused AdamW, SGD and bitsandbytes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from controller.estimator.frozen import assemble
from controller.estimator.model import (
    Layer,
    Linear,
    Memo,
    ModelShape,
    family_traits,
    skip_module_matches_text,
)
from controller.estimator.module_paths import layer_linear_paths, outer_linear_paths
from controller.estimator.settings import (
    KbitPreparation,
    Method,
    Optimizer,
    Precision,
    TrainingSettings,
)

BLOCK = 512
NF4_BLOCK = 64
NESTED_BLOCK = 256
MIN_8BIT_SIZE = 4096
#: bitsandbytes' `Optimizer8bit.get_state_buffer`: `if not self.is_paged or p.numel() < 1e5:`
#: a regular CUDA tensor, else `F.get_paged` (cudaMallocManaged) for the state.
PAGED_MIN_SIZE = 100_000
BLOCKWISE_8BIT = 256
_DTYPE_BYTES = {Precision.BF16: 2, Precision.FP16: 2, Precision.FP32: 4}
_FP32 = 4


def block(nbytes: int) -> int:
    """Bytes the caching allocator charges for `nbytes`."""
    return -(-nbytes // BLOCK) * BLOCK


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


_NF4_CODE_BOOK = block(16 * _FP32)
_NESTED_CODE_BOOK = block(256 * _FP32) + block(_FP32)  # nested code book + offset


@lru_cache(maxsize=4096)
def nf4_bytes(numel: int, double_quant: bool = True) -> int:
    """Resident bytes of one NF4 weight of `numel` elements (see trace/qlora.py), rounded.
    Kept per size: a 4-bit estimate asks it of every linear, and a model has a few sizes."""
    blocks = _ceil(numel, NF4_BLOCK)
    total = block(_ceil(numel, 2)) + _NF4_CODE_BOOK  # packed codes + NF4 code book
    if double_quant:
        return (
            total + block(blocks) + block(_ceil(blocks, NESTED_BLOCK) * _FP32) + _NESTED_CODE_BOOK
        )
    return total + block(blocks * _FP32)


@dataclass(frozen=True)
class Static:
    """Resident bytes (and the counts the activation fit uses) of one job."""

    weights: int
    gradients: int
    optimizer: int
    optimizer_scratch: int
    total_params: int
    trainable_params: int
    lora_inputs: int  # sum of in_features over adapted linears (all layers)
    lora_ranks: int  # rank x number of adapted linears (all layers)
    dequantized: int  # bytes of the largest dequantised 4-bit weight (QLoRA), else 0
    expert_stacks: int  # 16-bit bytes of the largest MoE layer's expert stacks, else 0
    layer_gradients: int  # gradient bytes of the largest decoder layer
    head_gradients: int  # LM head (or the embedding it is tied to) + final norm: from the loss on
    embed_gradients: int  # an untied trainable embedding: computed last in backward
    # What data parallelism adds per rank (`calibrated._fsdp_extra`): the resident bytes of
    # the largest decoder layer (FSDP2 all-gathers one block whole, in its own dtypes: frozen
    # base, NF4 codes, fp32 adapters alike) and of the modules outside the layers (embedding,
    # final norm, LM head, `modules_to_save` copies: FSDP2's root unit, held unsharded from
    # the root's all-gather in forward to the end of backward).
    layer_weights: int = 0
    root_weights: int = 0
    # Per entry of `ModelShape.layer_counts`: (gradient bytes, adapted in_features, rank x
    # adapted linears) of one such layer, then the outer linears' if the model has any. The
    # hybrid fit (`hybrid_fit.py`) prices each layer type by its own; equality compares the
    # totals above.
    layer_parts: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)
    # The largest trainable tensor's gradient bytes, and its optimizer step scratch: all an
    # optimizer stepped in backward, one parameter at a time, holds of either at once
    # (`Switches.optimizer_in_backward`).
    largest_gradient: int = 0
    largest_scratch: int = 0
    # The part of `optimizer` a paged optimizer keeps in CUDA unified memory: bitsandbytes
    # pages the state of a tensor of PAGED_MIN_SIZE elements or more (`Estimate.paged_bytes`).
    paged_optimizer: int = 0


def _quantized(shape: ModelShape, settings: TrainingSettings) -> tuple[bool, bool]:
    quant = shape.quantization
    pre = quant is not None and quant.load_in_4bit
    on = settings.method is Method.QLORA or (settings.method is Method.LORA and pre)
    double = quant.double_quant if (pre and quant is not None) else True
    return on, double


def _state_bytes(numel: int, elem: int, optimizer: Optimizer) -> int:
    if optimizer in (Optimizer.ADAMW, Optimizer.ADAMW_TORCH):
        return 2 * block(numel * elem) + BLOCK
    if optimizer is Optimizer.ADAMW_FP32_MASTER:
        return 3 * block(numel * _FP32) + BLOCK
    if optimizer is Optimizer.ADAMW_8BIT and numel >= MIN_8BIT_SIZE:
        return 2 * block(numel) + 2 * block(_ceil(numel, BLOCKWISE_8BIT) * _FP32)
    if optimizer in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_32BIT):
        return 2 * block(numel * _FP32)
    return 0


def _scratch_bytes(numel: int, elem: int, optimizer: Optimizer) -> int:
    if optimizer is Optimizer.ADAMW:
        return block(numel * elem)
    if optimizer is Optimizer.ADAMW_FP32_MASTER:
        return 2 * block(numel * _FP32)
    return 0


#: `static_bytes` by the settings it depends on.
_STATIC: Memo[Static] = Memo("static")


def static_bytes(shape: ModelShape, settings: TrainingSettings) -> Static:
    """Weights, gradients, optimizer state and step scratch of the job, exactly."""
    key = (
        settings.method,
        settings.rank,
        settings.targets,
        settings.modules_to_save,
        settings.precision,
        settings.optimizer,
    )
    cached = _STATIC.get(shape, *key)
    if cached is not None:
        return cached
    return _STATIC.put(shape, _price(shape, settings), *key)


def _price(shape: ModelShape, settings: TrainingSettings) -> Static:
    """`static_bytes` without the memo. A raw config is parsed on every estimate, so this
    runs once per estimate: each distinct layer is priced once and counted as often as it
    repeats, and a linear's tensors are priced inline (sums of integers, so exactly what
    pricing every tensor of every layer one by one gives)."""
    elem = _DTYPE_BYTES[settings.precision]
    quantized, double = _quantized(shape, settings)
    adapter = settings.is_adapter
    targets = settings.targets
    every = "all-linear" in targets
    rank = settings.rank or 0
    h, vocab = shape.hidden_size, shape.vocab_size
    fam = family_traits(shape.model_type)
    lora_on_experts = adapter and (bool(fam.peft_moe_pattern) or shape.peft_adapts_stacks)
    # A router that is an nn.Linear (DBRX's) is priced as any linear: quantised, adapted.
    router_name = "" if fam.router_linear else "router"
    fused = fam.fused_expert_stacks
    # Names PEFT turns into the stacks' parameter targets: no nn.Linear keeps them.
    moved = _MOVED if fam.peft_moe_pattern == "qwen2_moe" else ()
    # The router is a parameter, never quantised; fp32 in DeepSeek-V3.
    router_elem = _FP32 if fam.router_correction_bias else elem

    weights = lora_inputs = lora_ranks = dequantized = layer_grads = stacks_max = 0
    layer_held = in_layers = 0
    # Every trainable tensor as (numel, bytes per element) -> how many the model holds.
    tensors: dict[tuple[int, int], int] = {}
    layer_parts: list[tuple[int, int, int]] = []
    priced = shape.layer_counts
    decoder = len(priced)
    if shape.outer_linears:  # priced as a layer of their own, once (see ModelShape)
        outer_layer = Layer(linears=shape.outer_linears, other_params=0)
        priced = (*priced, (outer_layer, 1))
    for index, (layer, count) in enumerate(priced):
        trainable: list[tuple[int, int]] = []
        held = grads_here = inputs_here = ranks_here = 0
        experts: list[Linear] = []
        for lin in layer.linears:
            if lin.expert:
                experts.append(lin)
                continue
            name, fan_in, fan_out, copies = lin.name, lin.in_features, lin.out_features, lin.copies
            numel = fan_in * fan_out * copies
            bias = fan_out * copies if lin.bias else 0
            router = name == router_name
            size = router_elem if router else elem
            tensor = block(numel * size)
            if quantized and not router and not lin.kept_16bit:
                held += nf4_bytes(numel, double)
                dequantized = max(dequantized, tensor)
            else:
                held += tensor
            if bias:
                held += block(bias * size)
            if not adapter:
                trainable.append((numel, size))
                grads_here += tensor
                if bias:
                    trainable.append((bias, size))
                    grads_here += block(bias * size)
            elif every or name in targets:
                if router:
                    if lora_on_experts:
                        a, b = rank * fan_in, rank * fan_out
                        trainable += [(a, _FP32), (b, _FP32)]
                        pair = block(a * _FP32) + block(b * _FP32)
                        held, grads_here = held + pair, grads_here + pair
                elif name not in moved:
                    a, b = rank * fan_in * copies, rank * fan_out * copies
                    trainable += [(a, _FP32), (b, _FP32)]
                    pair = block(a * _FP32) + block(b * _FP32)
                    held, grads_here = held + pair, grads_here + pair
                    inputs_here += fan_in * copies
                    ranks_here += rank * copies
        stacks_here = 0
        for stack, parts in _expert_stacks(experts, fused) if experts else ():
            stacks_here += stack.weight_params * elem
            weight, grads = _base(stack, quantized, double, elem, adapter, trainable)
            held, grads_here = held + weight, grads_here + grads
            if quantized:
                dequantized = max(dequantized, block(stack.weight_params * elem))
            targeted = sum(every or name in targets for name in parts)
            if lora_on_experts and targeted:
                r = rank * targeted * stack.copies
                pair = _lora_pair(r * stack.in_features, r * stack.out_features, trainable)
                held, grads_here = held + pair, grads_here + pair
        stacks_max = max(stacks_max, stacks_here)
        others: tuple[int, ...] | list[int] = layer.other_tensors
        for numel in layer.fp32_buffers:  # DeepSeek-V3's correction bias: held, never trained
            held += block(numel * _FP32)
        if layer.moe and fam.correction_bias_parameter:
            # ERNIE's fp32 parameter, priced as the buffer the others hold (its gradient and
            # moments, 64 fp32 numbers a layer, left out)
            others = list(others)
            others.remove(shape.dims.num_experts)
            held += block(shape.dims.num_experts * _FP32)
        for numel in others:
            tensor = block(numel * elem)
            held += tensor
            if not adapter:
                trainable.append((numel, elem))
                grads_here += tensor
        layer_grads = max(layer_grads, grads_here)
        if index < decoder:
            layer_held = max(layer_held, held)
            in_layers += held * count
        layer_parts.append((grads_here, inputs_here, ranks_here))
        weights += held * count
        lora_inputs += inputs_here * count
        lora_ranks += ranks_here * count
        for pair_key in trainable:
            tensors[pair_key] = tensors.get(pair_key, 0) + count
    if quantized and shape.quantization is not None and shape.quantization.skip_modules:
        extra, dequantized = _skip_correction(shape, elem, double)
        weights += extra

    trainable = []  # the tensors outside the decoder layers
    for lin in shape.frozen_linears:  # a frozen vision tower: weights; adapters where named
        numel, copies = lin.weight_params, lin.copies
        if quantized:
            weights += nf4_bytes(numel, double)
            dequantized = max(dequantized, block(numel * elem))
        else:
            weights += block(numel * elem)
        if lin.bias:
            weights += block(lin.out_features * copies * elem)
        if adapter and lin.name in targets:
            a, b = rank * lin.in_features * copies, rank * lin.out_features * copies
            trainable += [(a, _FP32), (b, _FP32)]
            weights += block(a * _FP32) + block(b * _FP32)
            lora_inputs += lin.in_features * copies
            lora_ranks += rank * copies
    if shape.frozen_params:
        weights += block(shape.frozen_params * elem)
    tied = not shape.lm_head_params
    outer = [shape.embedding_params, shape.final_norm_params]
    if not tied:
        outer.append(shape.lm_head_params)
    for numel in outer:
        weights += block(numel * elem)
        if not adapter:
            trainable.append((numel, elem))
    head_grads = embed_grads = 0
    if not adapter:
        head_grads = block(shape.final_norm_params * elem)
        head_grads += block((shape.embedding_params if tied else shape.lm_head_params) * elem)
        embed_grads = 0 if tied else block(shape.embedding_params * elem)
    for module in settings.modules_to_save if adapter else ():
        if module == "lm_head" and tied:
            continue
        weights += block(vocab * h * elem)
        trainable.append((vocab * h, elem))
        if module == "lm_head" or tied:
            head_grads += block(vocab * h * elem)
        else:
            embed_grads += block(vocab * h * elem)

    for pair_key in trainable:
        tensors[pair_key] = tensors.get(pair_key, 0) + 1

    gradients = trainable_params = held_tensors = 0
    for (n, e), count in tensors.items():
        gradients += block(n * e) * count
        trainable_params += n * count
        held_tensors += count
    opt = settings.optimizer
    if opt is Optimizer.ADAMW or opt is Optimizer.ADAMW_TORCH:
        # _state_bytes of each tensor is 2 x its gradient's block + BLOCK (the step).
        optimizer = 2 * gradients + BLOCK * held_tensors
    else:
        optimizer = sum(_state_bytes(n, e, opt) * count for (n, e), count in tensors.items())
    largest_gradient = block(max((n * e for n, e in tensors), default=0))  # block is monotone
    if opt is Optimizer.ADAMW:
        # _scratch_bytes: one gradient-sized block per tensor
        scratch, largest_scratch = gradients, largest_gradient
    else:
        scratch = sum(_scratch_bytes(n, e, opt) * count for (n, e), count in tensors.items())
        largest_scratch = max((_scratch_bytes(n, e, opt) for n, e in tensors), default=0)
    if opt is Optimizer.ADAMW_8BIT and any(n >= MIN_8BIT_SIZE for n, _ in tensors):
        optimizer += 2 * block(256 * _FP32)
    paged = 0
    if opt is Optimizer.PAGED_ADAMW_32BIT:
        paged = sum(
            _state_bytes(n, e, opt) * count
            for (n, e), count in tensors.items()
            if n >= PAGED_MIN_SIZE
        )
    return assemble(  # Static(...), faster: see frozen.py
        Static,
        {
            "weights": weights,
            "gradients": gradients,
            "optimizer": optimizer,
            "optimizer_scratch": scratch,
            # Adapters and saved copies are parameters beside the base model's.
            "total_params": shape.total_params + (trainable_params if adapter else 0),
            "trainable_params": trainable_params,
            "lora_inputs": lora_inputs,
            "lora_ranks": lora_ranks,
            "dequantized": dequantized,
            "expert_stacks": stacks_max,
            "layer_gradients": layer_grads,
            "head_gradients": head_grads,
            "embed_gradients": embed_grads,
            "layer_weights": layer_held,
            "root_weights": weights - in_layers,
            "layer_parts": tuple(layer_parts),
            "largest_gradient": largest_gradient,
            "largest_scratch": largest_scratch,
            "paged_optimizer": paged,
        },
    )


_SKIPPED: Memo[tuple[tuple[frozenset[int], ...], frozenset[int]]] = Memo("skipped-linears")


def _skipped_linears(shape: ModelShape) -> tuple[tuple[frozenset[int], ...], frozenset[int]]:
    """Which linears `llm_int8_skip_modules` keeps 16-bit: per layer index, the indices into
    its `Layer.linears`; then the indices into `shape.outer_linears`. Matched by each
    linear's path (`module_paths`) under every text-model root, as `qlora.quantize_linears`
    matches the model's modules; expert stacks and routers are never among them (the
    trace's `quantize_experts` quantises every stack, the router is never quantised)."""
    cached = _SKIPPED.get(shape)
    if cached is not None:
        return cached
    assert shape.quantization is not None
    entries = shape.quantization.skip_modules
    paths_of: dict[int, tuple[str, ...]] = {}
    per_layer = []
    for i, layer in enumerate(shape.layers):
        paths = paths_of.get(id(layer))
        if paths is None:
            paths = paths_of[id(layer)] = layer_linear_paths(shape.model_type, shape.dims, layer)
        per_layer.append(
            frozenset(
                k
                for k, (lin, path) in enumerate(zip(layer.linears, paths, strict=True))
                if not lin.expert
                and lin.name != "router"
                and any(skip_module_matches_text(e, f"layers.{i}.{path}") for e in entries)
            )
        )
    outer = frozenset(
        k
        for k, path in enumerate(outer_linear_paths(shape.outer_linears))
        if any(skip_module_matches_text(e, path) for e in entries)
    )
    return _SKIPPED.put(shape, (tuple(per_layer), outer))


def _skip_correction(shape: ModelShape, elem: int, double: bool) -> tuple[int, int]:
    """For a 4-bit job with a skip list: the bytes its 16-bit linears add to the all-NF4
    weights `_price` counts (each one's 16-bit block instead of its NF4 storage; biases are
    16-bit either way), and the largest dequantised weight among the linears still 4-bit.

    Layers are grouped by (layer object, skipped set): a skip entry naming one layer
    (`model.layers.3.mlp`) sets that layer apart from the others of its kind."""
    per_layer, outer = _skipped_linears(shape)
    counts: dict[tuple[int, frozenset[int]], int] = {}
    layer_of: dict[int, Layer] = {}
    for layer, skipped in zip(shape.layers, per_layer, strict=True):
        key = (id(layer), skipped)
        counts[key] = counts.get(key, 0) + 1
        layer_of[id(layer)] = layer
    priced = [(layer_of[key].linears, skipped, n) for (key, skipped), n in counts.items()]
    if shape.outer_linears:
        priced.append((shape.outer_linears, outer, 1))
    extra = dequantized = 0
    fam = family_traits(shape.model_type)
    fused, router_name = fam.fused_expert_stacks, "" if fam.router_linear else "router"
    for linears, skipped, count in priced:
        experts = []
        for k, lin in enumerate(linears):
            if lin.expert:
                experts.append(lin)
                continue
            if lin.name == router_name:
                continue
            tensor = block(lin.weight_params * elem)
            if k in skipped:
                extra += (tensor - nf4_bytes(lin.weight_params, double)) * count
            else:
                dequantized = max(dequantized, tensor)
        for stack, _ in _expert_stacks(experts, fused) if experts else ():
            dequantized = max(dequantized, block(stack.weight_params * elem))
    return extra, dequantized


_GATE_UP = ("gate_proj", "up_proj", "w1", "w3")
_MOVED = ("gate_proj", "up_proj", "down_proj")


def _expert_stacks(
    experts: list[Linear], fused: bool = True
) -> list[tuple[Linear, tuple[str, ...]]]:
    """A layer's expert stacks (its `expert` linears) as transformers 5 holds them, each with
    the names of the projections fused into it (gate and up become one `gate_up_proj` of
    twice the width, unless the family keeps them apart: DBRX's w1 and v1)."""
    if not fused:
        return [(lin, (lin.name,)) for lin in experts]
    gate_up = [lin for lin in experts if lin.name in _GATE_UP]
    out: list[tuple[Linear, tuple[str, ...]]] = []
    if gate_up:
        first = gate_up[0]
        width = sum(lin.out_features for lin in gate_up)
        stack = Linear("gate_up_proj", first.in_features, width, first.bias, first.copies, True)
        out.append((stack, tuple(lin.name for lin in gate_up)))
    for lin in experts:
        if lin.name not in _GATE_UP:
            parts = ("gate_proj", "up_proj") if lin.name == "gate_up_proj" else (lin.name,)
            out.append((lin, parts))
    return out


def _base(
    lin: Linear,
    quantized: bool,
    double: bool,
    elem: int,
    adapter: bool,
    trainable: list[tuple[int, int]],
) -> tuple[int, int]:
    """(weight bytes, gradient bytes) of a linear's (or stack's) weight and bias: NF4 when
    quantised; trainable, in `elem`-byte elements, unless an adapter trains instead."""
    numel = lin.weight_params
    bias = lin.out_features * lin.copies if lin.bias else 0
    weights = nf4_bytes(numel, double) if quantized else block(numel * elem)
    weights += block(bias * elem) if bias else 0
    if adapter:
        return weights, 0
    trainable.append((numel, elem))
    if bias:
        trainable.append((bias, elem))
    return weights, block(numel * elem) + (block(bias * elem) if bias else 0)


def _lora_pair(a: int, b: int, trainable: list[tuple[int, int]]) -> int:
    """Bytes of a LoRA pair of `a` and `b` fp32 elements (held once, and once as gradient)."""
    trainable += [(a, _FP32), (b, _FP32)]
    return block(a * _FP32) + block(b * _FP32)


def upcast_bytes(shape: ModelShape, settings: TrainingSettings) -> int:
    """What the trainer's k-bit preparation (`Switches.kbit_preparation`) adds to a 4-bit
    model's weights: the parameters it casts from 16 to 32 bits, each its fp32 block less
    its 16-bit one. `upcast-non-quantized` (PEFT's `prepare_model_for_kbit_training`):
    every parameter that is not 4-bit (norms, the linears' biases, a parameter router, the
    embedding, an untied LM head); `upcast-norms`: the norms alone (each layer's other
    parameters, norms for most families, and the final norm). 0 when the job is not 4-bit
    or already trains in fp32. Linears a checkpoint's `llm_int8_skip_modules` keeps 16-bit
    are left out (rare; an under-count of their bytes)."""
    kind = settings.switches.kbit_preparation
    quantized, _ = _quantized(shape, settings)
    if kind is KbitPreparation.NONE or not quantized or settings.precision is Precision.FP32:
        return 0
    elem = _DTYPE_BYTES[settings.precision]
    every = kind is KbitPreparation.UPCAST_NON_QUANTIZED
    fam = family_traits(shape.model_type)
    # A parameter router stays 16-bit under QLoRA (fp32 already in DeepSeek-V3, whose
    # correction bias is an fp32 buffer); DBRX's is a linear, quantised (`_price`).
    router_16 = not (fam.router_linear or fam.router_correction_bias)

    def more(numel: int) -> int:
        return block(numel * _FP32) - block(numel * elem)

    extra = 0
    for layer, count in shape.layer_counts:
        others = list(layer.other_tensors)
        if layer.moe and fam.correction_bias_parameter:  # fp32 already
            others.remove(shape.dims.num_experts)
        here = sum(more(numel) for numel in others)
        if every:
            for lin in layer.linears:
                if lin.expert:
                    continue
                if lin.name == "router" and router_16:
                    here += more(lin.in_features * lin.out_features * lin.copies)
                if lin.bias:
                    here += more(lin.out_features * lin.copies)
        extra += here * count
    extra += more(shape.final_norm_params)
    if every:
        extra += more(shape.embedding_params) + more(shape.lm_head_params)
    return extra
