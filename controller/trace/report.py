"""How a trace reads: the peak and what was live, by phase; one JSON object for scripts."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from controller.base.units import GIB
from controller.estimator import TrainingSettings
from controller.trace import TraceReport
from controller.trace.run import PHASES, SegmentPeak
from controller.trace.tracker import CATEGORIES

_EXTRA_LABELS = {
    "cuda_context": "CUDA context (constant)",
    "cublas_workspace": "cuBLAS workspace (constant)",
    "allocator_slack": "allocator slack (10 % of peak)",
    "allocator_reserve": "allocator reserve (the step replayed through the caching allocator)",
    "nccl_buffers": "NCCL communicator buffers (constant per rank)",
}


def _segment_json(seg: SegmentPeak) -> dict[str, Any]:
    return {
        "step": seg.step,
        "region": seg.region,
        "peak_bytes": seg.peak,
        "breakdown": dict(seg.breakdown),
    }


def trace_json(model: str, settings: TrainingSettings, report: TraceReport) -> dict[str, Any]:
    """The `vramgate trace --json` object. `breakdown` sums to `peak_bytes`; `total_bytes` is
    the peak plus `extras` (the constants a trace cannot see)."""
    return {
        "model": model,
        "profile": "trace",
        "method": settings.method.value,
        "batch": settings.batch,
        "seq_len": settings.seq_len,
        "image_tokens": settings.image_tokens,
        "gradient_checkpointing": settings.gradient_checkpointing.value,
        "optimizer": settings.optimizer.value,
        "attention": settings.attention.value,
        "attention_traced_as": report.attention_traced_as,
        "precision": settings.precision.value,
        "peak_bytes": report.peak_bytes,
        "peak_phase": report.peak_at.phase,
        "peak_region": report.peak_at.region,
        "breakdown": dict(report.breakdown),
        "phases": {name: _segment_json(seg) for name, seg in report.phases.items()},
        "extras": dict(report.extras),
        "total_bytes": report.total_bytes,
        "total_params": report.total_params,
        "trainable_params": report.trainable_params,
        "layers": report.layers,
        "traced_layers": list(report.traced_layers),
        "seconds": round(report.seconds, 3),
        "distributed": _distributed_json(report),
    }


def _distributed_json(report: TraceReport) -> dict[str, Any] | None:
    """How the traced rank's job is spread (None: one GPU); its peaks are that rank's."""
    d = report.distributed
    if d is None:
        return None
    return {
        "world_size": d.world_size,
        "parallelism": d.parallelism.value,
        "reshard_after_forward": d.reshard_after_forward,
        "prefetch": d.prefetch,
        "param_dtype": d.param_dtype.value if d.param_dtype else None,
        "reduce_dtype": d.reduce_dtype.value if d.reduce_dtype else None,
        "offload_params": d.offload_params,
        "offload_optimizer": d.offload_optimizer,
        "gradient_as_bucket_view": d.gradient_as_bucket_view,
    }


def _g(n: int) -> str:
    return f"{n / GIB:.2f}"


def render_trace(
    console: Console, model: str, settings: TrainingSettings, report: TraceReport
) -> None:
    how = (
        f"traced {report.layers} layers"
        if report.traced_layers == (report.layers,)
        else f"traced {' and '.join(map(str, report.traced_layers))} layers, "
        f"extended to {report.layers}"
    )
    console.print(
        f"{model} · {settings.method.value} · {settings.tokens_said} x batch "
        f"{settings.batch} · profile trace ({how}, {report.seconds:.1f} s)"
    )
    d = report.distributed
    if d is not None:
        console.print(
            f"one rank of {d.world_size} under {d.parallelism.api}: every figure below is "
            "what each GPU holds"
        )
    table = Table(show_edge=False)
    table.add_column("GiB live at")
    for phase in PHASES:
        if phase in report.phases:
            table.add_column(f"{phase} peak", justify="right")
    phases = [report.phases[p] for p in PHASES if p in report.phases]
    for category in CATEGORIES:
        table.add_row(category, *(_g(seg.breakdown[category]) for seg in phases))
    table.add_section()
    table.add_row("total", *(_g(seg.peak) for seg in phases))
    console.print(table)
    console.print(
        f"peak of tensor bytes: {_g(report.peak_bytes)} GiB in {report.peak_at.phase} "
        f"({report.peak_at.region}, step {report.peak_at.step + 1})"
    )
    for name, n_bytes in report.extras.items():
        console.print(f"+ {_EXTRA_LABELS.get(name, name)}: {_g(n_bytes)} GiB")
    console.print(f"total: {_g(report.total_bytes)} GiB")
    if report.attention_traced_as != settings.attention.value:
        console.print(
            f"note: {settings.attention.value} traced as {report.attention_traced_as} "
            "(same saved tensors; no such kernel on CPU)"
        )
    pct = report.trainable_params / report.total_params if report.total_params else 0.0
    console.print(
        f"parameters: {report.total_params:,} total, {report.trainable_params:,} trainable "
        f"({pct:.2%})"
    )
