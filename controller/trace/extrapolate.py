"""Deep models from shallow traces: trace n and n+1 layers, extend each segment per layer.

Every decoder block of a model adds the same tensors (same shapes, same ops), so any moment
of the step that has a counterpart in a model of another depth holds bytes that are affine in
the depth L: weights, gradients and optimizer state grow by one block's worth per layer,
checkpoints or saved activations by one layer's worth. The moments compared are segment peaks
keyed by their place in the step: the embedding ("head"), the loss and LM head ("tail"), the
optimizer step, and the first two and last two decoder layers of forward and backward.
Inside a phase the live bytes move monotonically across layers (forward keeps saving,
backward frees activations and adds gradients), so the largest layer segment is at one of
the ends, and the first two and last two cover a first or last layer that differs from the
middle ones.

A model whose first `lead` layers are of another kind (DeepSeek-V3's three dense layers
before its MoE ones) also keys those layers and the first two of the repeating kind by
their index ("start 3"): the backward peak can sit in the first MoE layer, where the most
gradients have accumulated, and it is a middle layer otherwise.

A model whose layers repeat in a period of more than one (Llama 4 Maverick: a dense layer,
then an MoE one, in turn) is traced at n and n + period layers, n as far from the depth as a
whole number of periods, so both traces end as the model does; each period adds what one
more layer would add elsewhere. (Extended one layer at a time, Maverick's every layer was
read as an MoE one: 736 billion parameters for its 401.)

With traces at n and n+p layers (n >= lead + 4, so the layer positions are distinct):

    peak_key(L) = peak_key(n) + (L - n) / p x (peak_key(n+p) - peak_key(n))

and the same for each category of its breakdown; the model's peak is the largest key.
Tests hold this to the full trace within 0.5 % where both run. What the caching allocator
reserves is not such a figure (cached blocks serve or fail to serve what comes next, so the
reserve rises and falls with the depth): the deeper run's allocations are replayed at the
model's depth instead (`deepen.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.allocator.replay import replay_live_intervals
from controller.trace.deepen import deepen, live_peak
from controller.trace.device_map import ModuleTable, extend_table
from controller.trace.run import RunResult, SegmentPeak

MIN_LAYERS = 4


def _names(layers: int, lead: int) -> dict[int, str]:
    names = {i: f"start {i}" for i in range(2, lead + 2)}
    names |= {0: "first", 1: "second", layers - 2: "second-last", layers - 1: "last"}
    return names


def position(region: str, layers: int, lead: int = 0) -> str | None:
    """A layer region's place, counted from the nearer end ("last/mlp"); None for a middle
    layer."""
    if not region.startswith("layer "):
        return region
    layer, _, part = region.partition("/")
    index = int(layer.split()[1])
    name = _names(layers, lead).get(index)
    return None if name is None else f"{name}/{part}" if part else name


def keyed(result: RunResult, lead: int = 0) -> dict[tuple[int, str, str], SegmentPeak]:
    """Each segment's largest peak by (step, phase, place)."""
    out: dict[tuple[int, str, str], SegmentPeak] = {}
    for seg in result.segments:
        place = position(seg.region, result.layers, lead)
        if place is None:
            continue
        key = (seg.step, seg.phase, place)
        if key not in out or seg.peak > out[key].peak:
            out[key] = seg
    return out


def _affine(a: int, b: int, steps: int) -> int:
    return a + steps * (b - a)


def extend(
    small: RunResult, large: RunResult, layers: int, lead: int = 0, period: int = 1
) -> RunResult:
    """The run at `layers` layers from runs at n and n + `period` layers (`lead`: leading
    layers of another kind, `period`: the layers the rest repeats in; the module docstring)."""
    if (
        large.layers != small.layers + period
        or small.layers < min_layers(lead)
        or (layers - small.layers) % period
    ):
        raise ValueError(
            f"extend needs runs at n and n + {period} layers, n >= {min_layers(lead)}, "
            f"{layers} layers a whole number of periods from n"
        )
    steps = (layers - small.layers) // period
    a, b = keyed(small, lead), keyed(large, lead)
    segments: list[SegmentPeak] = []
    for key in a.keys() & b.keys():
        sa, sb = a[key], b[key]
        breakdown = {
            name: _affine(sa.breakdown[name], sb.breakdown[name], steps) for name in sa.breakdown
        }
        region = _region(key[2], layers, lead)
        peak = _affine(sa.peak, sb.peak, steps)
        segments.append(SegmentPeak(sa.step, sa.phase, region, peak, breakdown))
    segments.sort(key=lambda s: (s.step, s.phase, s.region))
    top = _top(segments)
    phase_peaks = {p: _top(s for s in segments if s.phase == p) for p in _phases(segments)}
    return RunResult(
        layers=layers,
        peak=top.peak,
        breakdown=top.breakdown,
        phase_peaks=phase_peaks,
        segments=tuple(segments),
        total_params=_affine(small.total_params, large.total_params, steps),
        trainable_params=_affine(small.trainable_params, large.trainable_params, steps),
        seconds=small.seconds + large.seconds,
        reserved=(
            top.peak + _reserve(small, large, steps, lead, period, top.peak)
            if small.reserved and large.reserved
            else 0
        ),
        modules=_modules(small, large, layers, lead, period),
    )


def _modules(
    small: RunResult, large: RunResult, layers: int, lead: int, period: int
) -> ModuleTable | None:
    """The step module by module at the extended depth, where both runs read it."""
    if small.modules is None or large.modules is None:
        return None
    return extend_table(small.modules, large.modules, layers, lead, period)


def _reserve(
    small: RunResult, large: RunResult, steps: int, lead: int, period: int, peak: int
) -> int:
    """What the allocator reserves beyond the peak at the extended depth: the deeper run's
    mallocs and frees with its middle block copied in to that depth, replayed (`deepen.py`:
    the reserve is not affine in the depth). The block is a period of layers with a whole
    period of its kind before it and after it (the copies' neighbours, where a layer's
    output and a prefetch are freed). Where the deeper run has no such block, the runs do
    not show it, or the built sequence's live bytes do not peak at the extended peak
    (within 0.5 %), the deeper run's own gap: bounded as the depth grows, unlike its affine
    extension."""
    own = max(0, large.reserved - large.peak)
    if small.timeline is None or large.timeline is None:
        return own
    start = lead + max(2, period)
    if start + 2 * period > large.layers:
        return own
    block = range(start, start + period)
    intervals = deepen(large.timeline, small.timeline, block, steps - 1)
    if intervals is None:
        return own
    if abs(live_peak(intervals) - peak) > peak // 200:
        return own
    return max(0, replay_live_intervals(intervals).peak_reserved - peak)


def min_layers(lead: int = 0) -> int:
    """The shallowest n to extend from: four distinct positions past the leading layers."""
    return MIN_LAYERS + lead


def _region(place: str, layers: int, lead: int) -> str:
    name, _, part = place.partition("/")
    index = {v: k for k, v in _names(layers, lead).items()}.get(name)
    if index is None:
        return place
    return f"layer {index}/{part}" if part else f"layer {index}"


def _top(segments: Iterable[SegmentPeak]) -> SegmentPeak:
    return max(segments, key=lambda s: s.peak)


def _phases(segments: list[SegmentPeak]) -> list[str]:
    return sorted({s.phase for s in segments})
