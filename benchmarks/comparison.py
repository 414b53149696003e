"""What the benchmarks that hold a formula to the trace share: the signed error and its
spread over many runs (`per_gpu_vs_trace`, `generic_vs_trace`)."""

from __future__ import annotations


def error(pair: tuple[int, int]) -> float:
    """(predicted - traced) / traced: above zero where the formula reserves more."""
    predicted, traced = pair
    return (predicted - traced) / traced


def spread(values: list[float]) -> str:
    """The median, median |error| and the worst on each side of a set of errors."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return (
        f"median {ordered[middle]:+.1%}, median |error| "
        f"{sorted(abs(v) for v in values)[middle]:.1%}, worst under {ordered[0]:+.1%}, "
        f"worst over {ordered[-1]:+.1%}"
    )
