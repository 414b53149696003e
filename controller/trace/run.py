"""One traced training run: build the model on fake tensors, run the steps, read the peak.

What runs is what a Hugging Face `Trainer` step runs, minus the data loader: the batch
(`input_ids`, `attention_mask` of ones, `labels`, b x s int64 each) sits on the device, the
model computes its own causal-LM loss from `labels` (fp32 upcast of the logits, log-softmax,
NLL; a chunked or fused loss as `loss.py` computes it), the output object is dropped before
`backward()` (so the 16-bit logits are freed, as in `Trainer.training_step`), then the
optimizer steps and gradients are set to None.
The batch is unpadded (packed or equal-length sequences, an all-ones mask), which lets
transformers skip the causal mask for sdpa; a padded batch makes it materialise a
b x 1 x s x s boolean mask and steers CUDA's sdpa from the flash to the memory-efficient
kernel, which is not modelled. Gradient accumulation > 1 runs two micro-batches per step,
so the second backward starts with the first one's gradients still held, which is where
accumulation costs memory.

At least two optimizer steps run: the first creates the optimizer state, so its forward
pass runs without it; the second shows the steady state. The peak is the maximum over all.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from controller.allocator.replay import replay_live_intervals
from controller.estimator import TrainingSettings
from controller.trace import qlora
from controller.trace.build import build_model, step_context, vision_tower
from controller.trace.deepen import Timeline
from controller.trace.device_map import ModuleTable
from controller.trace.loss import compute_loss
from controller.trace.modules import Owners, module_table
from controller.trace.optim import TracedOptimizer, build_optimizer
from controller.trace.tracker import (
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER,
    WEIGHTS,
    StorageTracker,
    allocated_bytes,
)

PHASES = ("forward", "backward", "optimizer")
MIN_STEPS = 2


@dataclass(frozen=True)
class SegmentPeak:
    """The peak of one stretch of the run, with what was live at that moment."""

    step: int
    phase: str
    region: str
    peak: int
    breakdown: dict[str, int]


@dataclass(frozen=True)
class RunResult:
    """What one traced run measured (for one model depth)."""

    layers: int
    peak: int
    breakdown: dict[str, int]
    phase_peaks: dict[str, SegmentPeak]
    segments: tuple[SegmentPeak, ...]
    total_params: int
    trainable_params: int
    seconds: float
    #: The peak the CUDA caching allocator would have reserved for this run's allocations
    #: and frees (`controller.allocator.replay`, PyTorch's default settings): what
    #: `torch.cuda.max_memory_reserved()` reads, and the part of NVML's figure that tensors
    #: cause. 0 where no replay ran.
    reserved: int = 0
    #: The step module by module (`modules.py`), for a device map's GPUs; None where the
    #: model's decoder layers were not found or no breakdowns were asked for.
    modules: ModuleTable | None = None
    #: The run's storages and segments, for a replay at a depth not traced (`deepen.py`);
    #: None where no replay ran.
    timeline: Timeline | None = None


def batch_bytes(settings: TrainingSettings) -> int:
    """What the step's batch takes on each GPU: its input ids, attention mask and labels
    (int64, batch x sequence), as the allocator charges them."""
    return 3 * allocated_bytes(settings.batch * settings.lm_seq_len * 8)


def decoder_layers(model: nn.Module, count: int) -> nn.ModuleList | None:
    """The model's list of decoder blocks (the ModuleList of `num_hidden_layers` entries),
    outside a vision-language model's vision tower (whose encoder layers may number the same)."""
    tower = vision_tower(model)
    inside = {id(m) for m in tower.modules()} if tower is not None else set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or id(module) in inside:
            continue
        if name.endswith("layers") and len(module) == count:
            return module
    return None


def text_layers(model: nn.Module) -> int:
    """The depth of the model's language model (a vision-language model's text config's)."""
    config: Any = model.config
    return int(config.get_text_config(decoder=True).num_hidden_layers)


def head_modules(model: nn.Module, layers: nn.ModuleList | None) -> list[nn.Module]:
    """The final norm and the LM head, the modules a causal LM runs after its blocks."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    inner = [m for m in base.modules() if layers is not None and layers in list(m.children())]
    norm = getattr(inner[0], "norm", None) if inner else None
    head = base.get_output_embeddings()  # type: ignore[operator]
    return [m for m in (norm, head) if isinstance(m, nn.Module)] if norm is not None else []


def _parts(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every sub-module of a block, by its path inside the block ("self_attn.q_proj")."""
    return [(name, module) for name, module in layer.named_modules() if name]


class _Regions:
    """Module hooks that tell the tracker where the step is: which layer, and which module
    inside it ("layer 3/mlp.down_proj"), in forward and in backward.

    Forward uses pre-hooks: a region runs from a module's start to the next module's. Backward
    uses gradient hooks on the outputs the forward produced: the gradient of a layer's output
    arrives as its backward starts (with checkpointing, the recomputation runs there, region
    "layer k"), that of a module's output as that module's backward starts. Regions this
    fine make each one's peak a single op's, so its bytes are linear in the model's widths
    (what the calibrated fit needs); a coarser region's peak moves between ops as widths
    change.
    """

    def __init__(
        self, tracker: StorageTracker, layers: nn.ModuleList | None, head: list[nn.Module]
    ) -> None:
        self.tracker = tracker
        self.step = 0
        self.phase = "forward"
        self.count = len(layers) if layers is not None else 0
        # After the blocks: the final norm and the LM head get regions of their own ("tail/…"),
        # and the loss after the LM head is "tail", as is the loss's backward.
        for name, module in zip(("norm", "lm_head"), head, strict=False):
            module.register_forward_pre_hook(self._pre(f"tail/{name}"))
            module.register_forward_hook(self._post(f"tail/{name}", name == "lm_head"))
        for index, layer in enumerate(layers or ()):
            layer.register_forward_pre_hook(self._pre(f"layer {index}"))
            layer.register_forward_hook(self._post(f"layer {index}", index == self.count - 1))
            for part, module in _parts(layer):
                region = f"layer {index}/{part}"
                module.register_forward_pre_hook(self._pre(region))
                module.register_forward_hook(self._post(region, False))

    def enter(self, step: int, phase: str, region: str) -> None:
        self.step, self.phase = step, phase
        self.tracker.enter(step, phase, region)

    def _pre(self, region: str) -> Any:
        def hook(_module: nn.Module, _args: Any) -> None:
            if self.phase == "forward":
                self.tracker.enter(self.step, "forward", region)
            elif region.startswith("tail"):
                return
            elif "/" not in region:  # checkpointing's recomputation: that layer's backward
                self.tracker.enter(self.step, self.phase, region)
            else:  # a module recomputed inside that layer's backward
                layer, _, part = region.partition("/")
                self.tracker.enter(self.step, self.phase, f"{layer}/recompute:{part}")

        return hook

    def _post(self, region: str, last: bool) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            if self.phase != "forward":
                return
            if last:  # the last block's or the LM head's end: what follows is the tail
                self.tracker.enter(self.step, "forward", "tail")
            hidden = output[0] if isinstance(output, tuple) else output
            if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
                step = self.step

                def on_grad(grad: torch.Tensor) -> None:
                    self.tracker.enter(step, "backward", region)

                hidden.register_hook(on_grad)

        return hook


def _register_model(tracker: StorageTracker, model: nn.Module) -> None:
    for param in model.parameters():
        tracker.register(param, WEIGHTS)
    for buf in model.buffers():
        tracker.register(buf, WEIGHTS)
    for tensor in qlora.quantized_tensors(model):
        tracker.register(tensor, WEIGHTS)


class _InBackward:
    """An optimizer stepped in backward (`Switches.optimizer_in_backward`, torchtune's
    `optimizer_in_bwd`): one optimizer per parameter, stepped by a post-accumulate-grad hook
    as soon as that parameter's gradient is made, which then frees it. The step phase itself
    does nothing: by then every parameter has been stepped.

    FSDP2 runs a sharded parameter's post-accumulate-grad hooks itself once the reduce-scatter
    has made its sharded gradient (`foreach_reduce`), so the same hooks step each shard there.
    DDP steps a bucket's parameters from its comm hook instead (`hooked=False`: the caller
    calls `step_param`). `on_host`: the optimizer runs on the host (FSDP2's CPU offload), its
    state and scratch off the device."""

    def __init__(
        self,
        params: list[nn.Parameter],
        settings: TrainingSettings,
        tracker: StorageTracker,
        owners: Owners | None = None,
        *,
        hooked: bool = True,
        on_host: bool = False,
    ) -> None:
        self.tracker = tracker
        self.owners = owners
        self.on_host = on_host
        self.each = {param: build_optimizer([param], settings.optimizer) for param in params}
        if hooked:
            for param in params:
                param.register_post_accumulate_grad_hook(self._step)

    def _step(self, param: torch.Tensor) -> None:
        self.step_param(param)
        self.each[param].zero_grad(set_to_none=True)  # type: ignore[index]

    def step_param(self, param: torch.Tensor) -> None:
        """Step `param` alone on the gradient it holds now."""
        if param.grad is not None:
            self.tracker.register(param.grad, GRADIENTS)
            if self.owners is not None:
                self.owners.tag_gradient(self.tracker, param)
        optimizer = self.each[param]  # type: ignore[index]
        on_host, role = self.tracker.on_host, self.tracker.role
        # FSDP2 runs this inside its post-backward, whose new storages are gradients: the
        # optimizer's state and scratch are not.
        self.tracker.on_host, self.tracker.role = on_host or self.on_host, None
        try:
            optimizer.step()
        finally:
            self.tracker.on_host, self.tracker.role = on_host, role
        for tensor in optimizer.state_tensors():
            self.tracker.register(tensor, OPTIMIZER)
        if self.owners is not None:
            self.owners.tag_states(self.tracker, optimizer)

    def step(self) -> None:
        """Every parameter was stepped in backward."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Every gradient was freed in backward."""

    def state_tensors(self) -> Iterator[torch.Tensor]:
        for optimizer in self.each.values():
            yield from optimizer.state_tensors()

    def param_states(self) -> Iterator[tuple[torch.Tensor | None, torch.Tensor]]:
        for optimizer in self.each.values():
            yield from optimizer.param_states()


def trace_run(
    config: Mapping[str, Any],
    settings: TrainingSettings,
    layers: int | None = None,
    steps: int = MIN_STEPS,
    breakdowns: bool = True,
    split_ops: Callable[[str], bool] | None = None,
) -> RunResult:
    """Trace `steps` optimizer steps of the model cut to `layers` layers (None: all).

    `steps=1` and `breakdowns=False` serve the calibration, which reads segment peaks of the
    first step only (and adds the optimizer state itself): half the time. `split_ops`: the
    regions whose ops are regions of their own (`StorageTracker.split_ops`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    started = time.perf_counter()
    micro_batches = 2 if settings.gradient_accumulation > 1 else 1
    tracker = StorageTracker(split_ops)
    with FakeTensorMode():
        model = build_model(config, settings, layers)
        count = layers if layers is not None else text_layers(model)
        blocks = decoder_layers(model, count)
        head = head_modules(model, blocks)
        regions = _Regions(tracker, blocks, head)
        owners = Owners(model, blocks, head) if blocks is not None and breakdowns else None
        trainable = [p for p in model.parameters() if p.requires_grad]
        if settings.switches.optimizer_in_backward:
            optimizer: TracedOptimizer = _InBackward(trainable, settings, tracker, owners)
        else:
            optimizer = build_optimizer(model.parameters(), settings.optimizer)
        _register_model(tracker, model)
        for tensor in optimizer.state_tensors():
            tracker.register(tensor, OPTIMIZER)
        if owners is not None:
            owners.tag(tracker)
            owners.tag_states(tracker, optimizer)
        with tracker:
            shape = (settings.batch, settings.lm_seq_len)  # as batch_bytes counts it
            input_ids = torch.zeros(shape, dtype=torch.long)
            attention_mask = torch.ones(shape, dtype=torch.long)
            labels = input_ids.clone()
            for step in range(steps):
                for _ in range(micro_batches):
                    regions.enter(step, "forward", "head")
                    with step_context(settings, config):
                        loss = compute_loss(model, input_ids, attention_mask, labels, settings.loss)
                    regions.enter(step, "backward", "tail")
                    loss.backward()
                    del loss
                    for param in trainable:
                        if param.grad is not None:
                            tracker.register(param.grad, GRADIENTS)
                            if owners is not None:
                                owners.tag_gradient(tracker, param)
                regions.enter(step, "optimizer", "step")
                optimizer.step()
                for tensor in optimizer.state_tensors():
                    tracker.register(tensor, OPTIMIZER)
                if owners is not None:
                    owners.tag_states(tracker, optimizer)
                optimizer.zero_grad(set_to_none=True)
            tracker.close()
        total = sum(p.numel() for p in model.parameters()) + qlora.hidden_params(model)
        trainable_count = sum(p.numel() for p in trainable)
        in_backward = settings.switches.optimizer_in_backward
        modules = None
        if owners is not None:
            modules = module_table(tracker, owners, micro_batches > 1, in_backward)
    seconds = time.perf_counter() - started
    return _result(tracker, count, total, trainable_count, seconds, breakdowns, modules)


def _result(
    tracker: StorageTracker,
    layers: int,
    total: int,
    trainable: int,
    seconds: float,
    breakdowns: bool = True,
    modules: ModuleTable | None = None,
) -> RunResult:
    segments = [s for s in tracker.segments if s.phase in PHASES]
    ticks = sorted({tracker.peak_at, *(s.peak_at for s in segments)})
    if breakdowns:
        by_tick = dict(zip(ticks, _breakdowns(tracker, ticks), strict=True))
    else:
        by_tick = {tick: {} for tick in ticks}
    peaks = tuple(
        SegmentPeak(s.step, s.phase, s.region, s.peak, by_tick[s.peak_at]) for s in segments
    )
    intervals = tracker.intervals() if breakdowns else []
    spans = tuple((s.step, s.phase, s.region, s.start, s.end) for s in tracker.segments)
    phase_peaks: dict[str, SegmentPeak] = {}
    for seg in peaks:
        best = phase_peaks.get(seg.phase)
        if best is None or seg.peak > best.peak:
            phase_peaks[seg.phase] = seg
    return RunResult(
        layers=layers,
        peak=tracker.peak,
        breakdown=by_tick[tracker.peak_at],
        phase_peaks=phase_peaks,
        segments=peaks,
        total_params=total,
        trainable_params=trainable,
        seconds=seconds,
        reserved=replay_live_intervals(intervals).peak_reserved if breakdowns else 0,
        modules=modules,
        timeline=Timeline(tuple(intervals), spans) if breakdowns else None,
    )


def _breakdowns(tracker: StorageTracker, ticks: list[int]) -> list[dict[str, int]]:
    """Breakdowns at many ticks in one sweep over the records (ticks sorted)."""
    out = [dict.fromkeys(CATEGORIES, 0) for _ in ticks]
    forward_end = tracker.forward_ends()
    for record in tracker.records:
        lo = bisect.bisect_left(ticks, record.born)
        hi = len(ticks) if record.died is None else bisect.bisect_left(ticks, record.died)
        if lo >= hi:
            continue
        category = tracker.category(record, forward_end)
        for i in range(lo, hi):
            out[i][category] += record.nbytes
    return out
