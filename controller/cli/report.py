"""How an estimate reads: a breakdown for people, one JSON object for scripts."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from controller.base.units import GIB
from controller.estimator import Estimate, Parallelism, TrainingSettings
from controller.estimator.frameworks import describe, summary
from controller.packing.fit import Fit

_LABELS = {
    "weights": "weights",
    "lora_adapters": "LoRA adapters",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "logits": "logits",
    "overhead": "overhead (x1.1)",
    "cuda_overhead": "CUDA overhead",
}
_BAR = 30
_NO_COUNT = "no number of GPUs fits"


def estimate_json(
    model: str,
    settings: TrainingSettings,
    est: Estimate,
    n_gpus: int,
    parallelism: Parallelism,
    result: Fit | None,
) -> dict[str, Any]:
    """The `--json` object; `components` sums to `total_bytes` exactly. `gpus` and every
    `per_gpu_bytes` answer for the count asked for; `fit.min_gpus` (with its own per-GPU
    figure) is the fewest that would fit, or null when no count does."""
    out: dict[str, Any] = {
        "model": model,
        "profile": est.profile,
        "method": settings.method.value,
        "settings": {
            "rank": settings.rank,
            "targets": list(settings.targets) if settings.is_adapter else None,
            "modules_to_save": list(settings.modules_to_save),
            "batch": settings.batch,
            "seq_len": settings.seq_len,
            "image_tokens": settings.image_tokens,
            "gradient_checkpointing": settings.gradient_checkpointing.value,
            "optimizer": settings.optimizer.value,
            "attention": settings.attention.value,
            "fused_loss": settings.fused_loss,
            "precision": settings.precision.value,
            "gradient_accumulation": settings.gradient_accumulation,
            "framework": settings.framework,
            "switches": describe(settings.switches, api=False),
        },
        "total_bytes": est.total_bytes,
        "total_params": est.total_params,
        "trainable_params": est.trainable_params,
        "components": dict(est.components),
        "parallelism": parallelism.value,
        "gpus": n_gpus,
        "per_gpu_bytes": est.per_gpu_bytes(n_gpus, parallelism),
        # The same figure at the levels people measure (allocated <= reserved <= nvml, the
        # last being per_gpu_bytes): Estimate.per_gpu_levels.
        "per_gpu_levels": levels_json(est, n_gpus, parallelism),
        # What FSDP leaves whole on every GPU of that figure; null for the other modes.
        "per_gpu_undivided_bytes": (
            est.undivided_bytes(n_gpus) if parallelism is Parallelism.FSDP else None
        ),
    }
    if result is not None:
        out["fit"] = {
            "fits": result.fits,
            "gpus": result.gpus,
            "per_gpu_bytes": result.per_gpu_bytes,
            "min_gpus": result.min_gpus,
            "min_gpus_per_gpu_bytes": result.min_gpus_per_gpu_bytes,
            "reason": result.reason,
        }
    return out


def fit_sentence(result: Fit, card: str) -> str:
    """The fit answer for the count asked for, in words: "fits one 24GiB GPU", "fits 2 x 80GB
    with FSDP", "does not fit one 80GB GPU: needs ...". The figures are the reason's; the
    per-GPU line above carries the one for the count."""
    mode = result.parallelism.prose
    on = f"one {card} GPU" if result.gpus == 1 else f"{result.gpus} x {card} with {mode}"
    if result.fits:
        return f"fits {on}"
    if result.reason.startswith(_NO_COUNT):
        return result.reason.replace(_NO_COUNT, f"no number of {card} GPUs fits", 1)
    return f"does not fit {on}: {result.reason}"


def levels_json(est: Estimate, n_gpus: int, parallelism: Parallelism) -> dict[str, int]:
    levels = est.per_gpu_levels(n_gpus, parallelism)
    return {
        "allocated_bytes": levels.allocated,
        "reserved_bytes": levels.reserved,
        "nvml_bytes": levels.nvml,
    }


def levels_line(est: Estimate, n_gpus: int, parallelism: Parallelism) -> str:
    """The per-GPU figure at three levels: what tensors hold (max_memory_allocated), what the
    caching allocator reserves (max_memory_reserved), what NVML shows (admission's figure)."""
    levels = est.per_gpu_levels(n_gpus, parallelism)
    return (
        f"each GPU: {levels.allocated / GIB:.2f} GiB allocated by tensors, "
        f"{levels.reserved / GIB:.2f} GiB reserved by PyTorch, {levels.nvml / GIB:.2f} GiB in NVML"
    )


def per_gpu_line(est: Estimate, n_gpus: int, parallelism: Parallelism) -> str:
    """The one per-GPU figure, and the count and parallelism it is for."""
    if n_gpus == 1:
        return f"per GPU on 1 GPU: {est.total_bytes / GIB:.2f} GiB"
    per_gpu = est.per_gpu_bytes(n_gpus, parallelism)
    line = f"per GPU on {n_gpus} GPUs with {parallelism.prose}: {per_gpu / GIB:.2f} GiB"
    if parallelism is Parallelism.FSDP:
        line += f" ({est.undivided_bytes(n_gpus) / GIB:.2f} GiB of it FSDP does not divide)"
    return line


def render(
    console: Console,
    model: str,
    settings: TrainingSettings,
    est: Estimate,
    n_gpus: int,
    parallelism: Parallelism,
    result: Fit | None,
    card: str | None,
) -> None:
    total = est.total_bytes
    title = (
        f"{model} · {settings.method.value}"
        + (f" r={settings.rank}" if settings.is_adapter else "")
        + f" · {settings.tokens_said} x batch {settings.batch}"
        + f" · profile {est.profile}"
    )
    console.print(title)
    console.print(summary(settings.switches, settings.framework))
    table = Table(show_edge=False)
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    table.add_column("", no_wrap=True)
    for name, n_bytes in est.components.items():
        share = n_bytes / total if total else 0.0
        table.add_row(
            _LABELS.get(name, name),
            f"{n_bytes / GIB:.2f}",
            f"{share:5.1%}",
            "█" * round(share * _BAR),
        )
    table.add_section()
    table.add_row("total", f"{total / GIB:.2f}", "100.0%", "")
    console.print(table)
    pct = est.trainable_params / est.total_params if est.total_params else 0.0
    console.print(
        f"parameters: {est.total_params:,} total, {est.trainable_params:,} trainable ({pct:.2%})"
    )
    console.print(levels_line(est, n_gpus, parallelism))
    if n_gpus > 1 or result is not None:
        console.print(per_gpu_line(est, n_gpus, parallelism))
    if result is not None and card is not None:
        console.print(fit_sentence(result, card))
