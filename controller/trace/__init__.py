"""The `trace` profile: a real training step on fake tensors, counted storage by storage.

    report = trace(config_json, TrainingSettings(method=Method.LORA))
    report.peak_bytes, report.breakdown, report.phases, report.extras

Needs the `trace` extra (torch, transformers, peft); the pure estimator imports this package
only when a job asks for this profile. See `run.py` for what a step is, `build.py` for how the
model is set up, `qlora.py` and `optim.py` for what is modelled rather than run, `tracker.py`
for how bytes are counted and `overheads.py` for what is added on top of the trace.
`inventory.py` reads any model transformers builds into plain data (its layers' linears,
experts and heads, its parameter count) from the model built on the meta device.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from controller.estimator import Estimate, Method, TrainingSettings, overheads
from controller.estimator.settings import Parallelism
from controller.trace import qlora
from controller.trace.build import TRACED_ATTENTION, TraceUnsupported
from controller.trace.device_map import ModuleTable, device_map_per_gpu
from controller.trace.extrapolate import MIN_LAYERS, extend, min_layers
from controller.trace.run import RunResult, SegmentPeak, batch_bytes, trace_run
from controller.trace.tracker import ACTIVATIONS, TEMPORARIES

if TYPE_CHECKING:
    from controller.trace.distributed import Distributed

__all__ = ["Distributed", "TraceReport", "TraceUnsupported", "estimate", "trace"]


def __getattr__(name: str) -> Any:
    # `Distributed` imports torch.distributed, which the single-GPU trace does not need.
    if name == "Distributed":
        from controller.trace.distributed import Distributed

        return Distributed
    raise AttributeError(name)


#: Models up to this depth are traced whole by default; deeper ones from two shallow traces.
FULL_TRACE_MAX_LAYERS = 2 * MIN_LAYERS + 1


@dataclass(frozen=True)
class TraceReport:
    """A traced step: the peak of tensor bytes, where it happened, and what was live."""

    peak_bytes: int
    breakdown: dict[str, int]
    phases: dict[str, SegmentPeak]
    peak_at: SegmentPeak
    extras: dict[str, int]
    total_params: int
    trainable_params: int
    layers: int
    traced_layers: tuple[int, ...]
    attention_traced_as: str
    seconds: float
    #: The job's spread when one rank was traced at its world size (None: one GPU).
    distributed: Distributed | None = None
    #: The step module by module, for a device map's GPUs (`modules.py`; None where the
    #: model's decoder layers were not found).
    modules: ModuleTable | None = None

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + sum(self.extras.values())


def trace(
    config: Mapping[str, Any],
    settings: TrainingSettings,
    layers: int | str = "auto",
    distributed: Distributed | None = None,
) -> TraceReport:
    """Trace the job. `layers`: "auto" (whole model when shallow, else extrapolated),
    "full" (always the whole model) or a depth n >= 4 to extrapolate from n and n + 1 (n + a
    period of dense and MoE layers, `_layout`; n rounded up to end as the model does).
    `distributed`: trace one rank of the job at its world size under FSDP2 or DDP
    (`distributed.py`); the report's peak is then that rank's.

    The config is user input run through transformers: whatever transformers raises while
    building or running it (a field its strict config refuses, a window that overflows its
    mask) is a TraceUnsupported with one line, not a traceback.
    """
    try:
        return _trace(config, settings, layers, distributed)
    except TraceUnsupported:
        raise
    except Exception as error:
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        raise TraceUnsupported(
            f"transformers cannot build or run this config ({type(error).__name__}: {reason})"
        ) from error


def _trace(
    config: Mapping[str, Any],
    settings: TrainingSettings,
    layers: int | str,
    distributed: Distributed | None = None,
) -> TraceReport:
    depth = _depth(config)
    trace_run = _runner(distributed)
    if _traced_whole(config):
        # A hybrid stack's layer types do not repeat from its first layers (and transformers
        # builds the layer list, not num_hidden_layers), nor do Gemma 3n's (sparse first,
        # kv-shared last, both per-layer lists): only the whole model is its own.
        if layers not in ("auto", "full"):
            raise TraceUnsupported(
                "a model whose layers are not alike (a hybrid's Mamba layers among attention, "
                "Gemma 3n's kv-shared layers) is traced whole, not from a few layers; pass "
                f"layers 'auto' or 'full', not {layers!r}"
            )
        layers = "full"
    if layers == "full" or (layers == "auto" and depth <= FULL_TRACE_MAX_LAYERS):
        result = trace_run(config, settings)
        traced: tuple[int, ...] = (depth,)
    else:
        lead, period = _layout(config)
        n = min_layers(lead) if layers == "auto" else int(layers)
        n += (depth - n) % period  # both traces end as the model does
        if n < min_layers(lead) or n + period >= depth:
            result = trace_run(config, settings)
            traced = (depth,)
        else:
            small = trace_run(config, settings, n)
            large = trace_run(config, settings, n + period)
            result = extend(small, large, depth, lead, period)
            traced = (n, n + period)
    return _report(result, settings, traced, distributed)


def _runner(distributed: Distributed | None) -> Any:
    """`run.trace_run`, or the same for one rank at the job's world size."""
    if distributed is None:
        return trace_run
    from controller.trace.distributed import trace_distributed_run

    def run(
        config: Mapping[str, Any], settings: TrainingSettings, layers: int | None = None
    ) -> RunResult:
        return trace_distributed_run(config, settings, distributed, layers).result

    return run


def _depth(config: Mapping[str, Any]) -> int:
    """The model's layer count under whichever name its config gives it (DBRX: `n_layers`),
    read by the parser; a config it does not read (a family, a field), by the model
    transformers builds."""
    from controller.estimator.errors import SpecError
    from controller.estimator.model import parse_config

    try:
        return parse_config(config).num_layers
    except SpecError:
        return _kinds(config)[0]


def _traced_whole(config: Mapping[str, Any]) -> bool:
    """Whether the model's layers are not alike: the parser's hybrid mixers, or Gemma 3n's;
    for a family it does not read, layers built otherwise than as dense and MoE layers of
    one build each (the inventory's kinds of layer: Mamba among attention, cross-attention
    at listed indices)."""
    from controller.estimator.errors import SpecError
    from controller.estimator.model import parse_config

    try:
        dims = parse_config(config).dims
    except SpecError:
        _, _, alike = _kinds(config)
        return not alike
    return dims.mixers is not None or dims.altup_num_inputs > 0


def _kinds(config: Mapping[str, Any]) -> tuple[int, tuple[bool, ...], bool]:
    """(depth, whether each layer has experts, whether the layers are dense and MoE layers of
    one build each) of the model transformers builds for `config` (`inventory`), kept by
    the config's content."""
    import marshal

    try:
        blob = marshal.dumps(config, 2)  # type: ignore[arg-type]
    except ValueError:
        return _kinds_of(config)
    return _kinds_marshalled(blob)


@functools.lru_cache(maxsize=64)
def _kinds_marshalled(blob: bytes) -> tuple[int, tuple[bool, ...], bool]:
    import marshal

    return _kinds_of(marshal.loads(blob))


def _kinds_of(config: Mapping[str, Any]) -> tuple[int, tuple[bool, ...], bool]:
    from controller.trace.inventory import read_inventory

    inv = read_inventory(config)
    moe = [False] * inv.layers
    for kind in inv.kinds:
        for i in kind.indices:
            moe[i] = bool(kind.experts)
    alike = len(inv.kinds) == len(set(moe))
    return inv.config_layers, tuple(moe), alike


#: The longest period of dense and MoE layers looked for (Llama 4 Maverick's is 2).
MAX_PERIOD = 4


def _layout(config: Mapping[str, Any]) -> tuple[int, int]:
    """(how many layers come before the model's repeating pattern of dense and MoE layers,
    how many layers that pattern repeats in): DeepSeek-V3's three dense layers before its
    MoE ones (3, 1), Llama 4 Maverick's dense and MoE layers in turn (0, 2). A pattern that
    does not repeat twice in the model is read from its last layer's kind, as before."""
    from controller.estimator.errors import SpecError
    from controller.estimator.model import parse_config

    try:
        kinds = [layer.moe for layer in parse_config(config).layers]
    except SpecError:
        kinds = list(_kinds(config)[1])
    for lead in range(len(kinds)):
        rest = kinds[lead:]
        for period in range(1, min(MAX_PERIOD, len(rest) // 2) + 1):
            if all(kind == rest[i % period] for i, kind in enumerate(rest)):
                return lead, period
    return next((i for i, kind in enumerate(kinds) if kind == kinds[-1]), 0), 1


def _report(
    result: RunResult,
    settings: TrainingSettings,
    traced: tuple[int, ...],
    distributed: Distributed | None = None,
) -> TraceReport:
    peak_at = max(result.segments, key=lambda s: s.peak)
    extras = _extras(result, distributed)
    return TraceReport(
        peak_bytes=result.peak,
        breakdown=dict(result.breakdown),
        phases=dict(result.phase_peaks),
        peak_at=peak_at,
        extras=extras,
        total_params=result.total_params,
        trainable_params=result.trainable_params,
        layers=result.layers,
        traced_layers=traced,
        attention_traced_as=TRACED_ATTENTION[settings.attention],
        seconds=result.seconds,
        distributed=distributed,
        modules=result.modules,
    )


def _extras(result: RunResult, distributed: Distributed | None) -> dict[str, int]:
    """What the GPU holds beyond the traced tensors, each a line: the CUDA context and the
    cuBLAS workspaces (overheads.py), what the caching allocator reserves beyond the peak
    (`allocator_reserve`: the run's allocations and frees replayed through the model of
    PyTorch's allocator, `controller.allocator`; the flat `allocator_slack` of 10 % only
    where no replay ran), and on more than one rank NCCL's communicator buffers."""
    extras = overheads.extras(result.peak)
    if result.reserved:
        del extras["allocator_slack"]
        extras["allocator_reserve"] = max(0, result.reserved - result.peak)
    if distributed is not None and distributed.world_size > 1:
        extras["nccl_buffers"] = overheads.NCCL_BYTES_PER_PEER
    return extras


def estimate(
    config: Mapping[str, Any],
    settings: TrainingSettings,
    gpus: int = 1,
    parallelism: Parallelism = Parallelism.FSDP,
) -> Estimate:
    """The trace as an `Estimate`: the peak's categories plus the constants, each a line;
    for placement, the peak's split into what FSDP shards and what every GPU holds whole,
    and each phase's peak's as a moment of its own (on n GPUs backward's whole activations
    can need more than the optimizer step's sharded peak).

    On `gpus` > 1 under FSDP or DDP one rank is traced at that world size as well, and
    its peak with the constants is the estimate's per-GPU figure at that count
    (`Estimate.traced_per_gpu`); under a device map that figure is the fullest GPU's, the
    step's modules placed on the GPUs (`device_map.py`). Other counts keep the rule on the
    single-GPU split."""
    report = trace(config, settings)
    traced: tuple[tuple[str, int, int], ...] = ()
    allocated: tuple[tuple[str, int, int], ...] = ()
    if gpus > 1 and parallelism in (Parallelism.FSDP, Parallelism.DDP):
        from controller.trace.distributed import Distributed

        rank = trace(config, settings, distributed=Distributed(gpus, parallelism))
        traced = ((parallelism.value, gpus, rank.total_bytes),)
        allocated = ((parallelism.value, gpus, rank.peak_bytes),)
    components = dict(report.breakdown) | report.extras
    fixed = sum(report.extras[k] for k in overheads.PER_GPU_EXTRAS)
    if gpus > 1 and parallelism is Parallelism.DEVICE_MAP and report.modules is not None:
        quantized = settings.method is Method.QLORA or (
            settings.method is Method.LORA and qlora.is_prequantized(config)
        )
        held = device_map_per_gpu(report.modules, gpus, quantized, _margin(report), fixed)
        traced = ((parallelism.value, gpus, held),)
    sharded, replicated = _split(report.peak_at, settings)
    phases = [_split(peak, settings) for peak in report.phases.values()]
    return Estimate(
        profile="trace",
        components=components,
        total_params=report.total_params,
        trainable_params=report.trainable_params,
        sharded_bytes=sharded,
        replicated_bytes=replicated + fixed,
        margin=_margin(report),
        fixed_bytes=fixed,
        moments=tuple((s, r + fixed) for s, r in phases),
        traced_per_gpu=traced,
        traced_allocated=allocated,
        comm_bytes=overheads.NCCL_BYTES_PER_PEER,
    )


def _margin(report: TraceReport) -> Fraction:
    """The estimate's margin on the tensors each GPU holds: the replayed reserve over the
    peak (so a share of the tensors carries its share of the reserve), or the flat slack."""
    reserve = report.extras.get("allocator_reserve")
    if reserve is None or report.peak_bytes <= 0:
        return overheads.SLACK_MARGIN
    return Fraction(report.peak_bytes + reserve, report.peak_bytes).limit_denominator(10_000)


def _split(peak: SegmentPeak, settings: TrainingSettings) -> tuple[int, int]:
    """(sharded, replicated) bytes of one moment's tensors. Activations are each GPU's own
    micro-batch's. Temporaries in forward and backward are the layers' working buffers, whole
    on every GPU too; at the optimizer step they are its working copies of the parameters it
    updates (foreach AdamW's scratch): under FSDP each GPU updates its own shard, so they are
    sharded with the parameters, as the calibrated profile's optimizer_scratch is. Only the
    batch stays whole."""
    temporaries = peak.breakdown.get(TEMPORARIES, 0)
    if peak.phase == "optimizer":
        temporaries = min(temporaries, batch_bytes(settings))
    replicated = peak.breakdown.get(ACTIVATIONS, 0) + temporaries
    return sum(peak.breakdown.values()) - replicated, replicated
