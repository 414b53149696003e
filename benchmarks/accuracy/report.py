"""Every profile's error against the published, measured runs of `runs.yaml`.

    python -m benchmarks.accuracy.report [--trace] [--markdown]

For each run and profile: the per-GPU figure vramgate predicts (`controller.jobs.profiles.
estimate` at the run's GPU count and parallelism, then `Estimate.per_gpu_levels`, the rule
admission uses) and its signed error against the measured figure, (predicted - measured) /
measured. Like is compared with like: an `nvml` measurement against the NVML-level figure
admission reserves, a `reserved` one against the allocator's reservation (without the CUDA
context and NCCL's buffers), an `allocated` one against the tensors alone.
Then, per profile, the median |error|, the signed median and the share of runs
under-predicted by more than 5 % (the runs that would die of CUDA OOM at admission's figure),
for single- and multi-GPU runs, by statistic, and without the runs that did something
vramgate's settings cannot say (`unmodelled` in the file).

`--trace` adds the trace profile (needs the trace extra; a 70B model takes minutes).
`--markdown` prints both tables as Markdown, as BENCHMARKS.md shows them.
Not a timed benchmark: the figures are bytes.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from benchmarks.accuracy.runs import Run, job_of, load_document, load_runs
from controller.base.units import GIB
from controller.estimator import Profile, SpecError, SpecErrors
from controller.jobs.profiles import estimate

FORMULA_PROFILES = (Profile.ANALYTIC, Profile.UNSLOTH, Profile.CALIBRATED)
#: An error below this is an under-prediction that admission would turn into an OOM.
UNDER = -0.05


@dataclass(frozen=True)
class Prediction:
    run: Run
    profile: Profile
    predicted: int | None  # per-GPU bytes, None when the profile refused the job
    reason: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return (self.predicted - self.run.measured_bytes) / self.run.measured_bytes


def predict(run: Run, profile: Profile, models: dict) -> Prediction:
    try:
        shape, settings = job_of(run, models)
        est = estimate(
            shape, replace(settings, profile=profile), gpus=run.gpus, parallelism=run.parallelism
        )
    except (SpecError, SpecErrors) as error:
        return Prediction(run, profile, None, str(error))
    levels = est.per_gpu_levels(run.gpus, run.parallelism)
    figure = {"allocated": levels.allocated, "reserved": levels.reserved, "nvml": levels.nvml}
    return Prediction(run, profile, figure[run.statistic])


@dataclass(frozen=True)
class Summary:
    group: str
    count: int
    median_abs: float
    median_signed: float
    under_share: float
    under_count: int


def summarise(group: str, errors: list[float]) -> Summary | None:
    if not errors:
        return None
    under = sum(1 for e in errors if e < UNDER)
    return Summary(
        group,
        len(errors),
        statistics.median(abs(e) for e in errors),
        statistics.median(errors),
        under / len(errors),
        under,
    )


#: The groups of the summary, each a name and which predictions it holds.
GROUPS: tuple[tuple[str, Callable[[Prediction], bool]], ...] = (
    ("single-GPU", lambda p: p.run.gpus == 1),
    ("multi-GPU", lambda p: p.run.gpus > 1),
    ("single-GPU, settings modelled", lambda p: p.run.gpus == 1 and not p.run.unmodelled),
    ("multi-GPU, settings modelled", lambda p: p.run.gpus > 1 and not p.run.unmodelled),
    ("allocated", lambda p: p.run.statistic == "allocated"),
    ("reserved", lambda p: p.run.statistic == "reserved"),
    ("nvml", lambda p: p.run.statistic == "nvml"),
    ("all", lambda p: True),
)


def summaries(predictions: Iterable[Prediction]) -> list[tuple[Profile, Summary]]:
    by_profile: dict[Profile, list[Prediction]] = {}
    for p in predictions:
        by_profile.setdefault(p.profile, []).append(p)
    rows = []
    for profile, preds in by_profile.items():
        for name, member in GROUPS:
            errors = [p.error for p in preds if member(p) and p.error is not None]
            summary = summarise(name, errors)
            if summary is not None:
                rows.append((profile, summary))
    return rows


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def _pct(e: float | None) -> str:
    return "refused" if e is None else f"{e * 100:+.1f} %"


def run_rows(runs: list[Run], preds: dict[tuple[str, Profile], Prediction], profiles):
    header = ["run", "GPUs", "statistic", "measured GiB"]
    header += [f"{p.value} GiB (error)" for p in profiles]
    rows = []
    for run in runs:
        setup = "1" if run.gpus == 1 else f"{run.gpus} {run.fields['parallelism']}"
        cells = [
            run.id + (" *" if run.unmodelled else ""),
            setup,
            run.statistic,
            _gib(run.measured_bytes),
        ]
        for profile in profiles:
            p = preds[(run.id, profile)]
            cells.append(f"{_gib(p.predicted)} ({_pct(p.error)})")
        rows.append(cells)
    return header, rows


def summary_rows(rows: list[tuple[Profile, Summary]]):
    header = ["profile", "runs", "n", "median |error|", "signed median", "under > 5 %"]
    return header, [
        [
            profile.value,
            s.group,
            str(s.count),
            f"{s.median_abs * 100:.1f} %",
            f"{s.median_signed * 100:+.1f} %",
            f"{s.under_share * 100:.0f} % ({s.under_count})",
        ]
        for profile, s in rows
    ]


def markdown(header: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:" if h not in ("runs", "statistic") else "---" for h in header[1:]]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="store_true", help="add the trace profile (slow)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args(argv)
    profiles = FORMULA_PROFILES + ((Profile.TRACE,) if args.trace else ())
    models = load_document().get("models") or {}
    runs = load_runs()
    preds = {(r.id, p): predict(r, p, models) for r in runs for p in profiles}
    per_run = run_rows(runs, preds, profiles)
    summary = summary_rows(summaries(preds.values()))
    refused = [p for p in preds.values() if p.predicted is None]
    singles = sum(1 for r in runs if r.gpus == 1)
    title = (
        f"{len(runs)} published runs ({singles} single-GPU, {len(runs) - singles} multi-GPU); "
        "error = (predicted - measured) / measured; * = the run did something vramgate's "
        "settings cannot say (`unmodelled` in runs.yaml)"
    )
    if args.markdown:
        print(title + "\n")
        print(markdown(*per_run) + "\n")
        print(markdown(*summary))
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=200)
        for heading, (header, rows) in (("Runs", per_run), ("Summary", summary)):
            table = Table(title=heading if heading == "Summary" else title)
            for h in header:
                table.add_column(h, justify="left" if h in ("run", "runs") else "right")
            for row in rows:
                table.add_row(*row)
            console.print(table)
    for p in refused:
        print(f"{p.run.id} ({p.profile.value}): refused: {p.reason}")


if __name__ == "__main__":
    main()
