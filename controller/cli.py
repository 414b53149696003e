"""`vramgate`: the command line. Thin: parse, call the core, print.

Bad input exits 2 with one line on stderr naming the flag and what it allows; nothing a user
types produces a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from controller.estimator import (
    Parallelism,
    SpecError,
    SpecErrors,
    build_settings,
    check_against_model,
    estimate,
    fit,
    load_shape,
    parse_config,
)
from controller.estimator.settings import Attention, Checkpointing, Method, Optimizer, Profile
from controller.report import estimate_json, render
from controller.units import parse_size

# Settings field -> the flag that sets it, so errors name what the user typed.
FLAG_PATHS = {
    "method": "--method",
    "rank": "--rank",
    "targets": "--targets",
    "modules_to_save": "--modules-to-save",
    "batch": "--batch",
    "seq_len": "--seq-len",
    "gradient_checkpointing": "--gradient-checkpointing",
    "optimizer": "--optimizer",
    "attention": "--attention",
    "fused_loss": "--fused-loss",
    "precision": "--precision",
    "profile": "--profile",
    "gradient_accumulation": "--gradient-accumulation",
}
DEFAULT_GPUS_WITH_MEMORY = 8  # a typical GPU node, when --gpu-memory is given alone


class UsageError(Exception):
    """A bad command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _choices(enum: type) -> str:
    return "|".join(m.value for m in enum)


def _add_estimate(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate the training VRAM of a fine-tuning job",
        description="Estimate the GPU memory a fine-tuning run needs, component by component, "
        "and whether it fits a given GPU.",
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--model", metavar="PRESET", help="a bundled preset (see `vramgate presets`)"
    )
    model.add_argument("--config", metavar="FILE", help="a Hugging Face config.json")
    p.add_argument("--method", default="qlora", help=f"{_choices(Method)} (default qlora)")
    p.add_argument("--profile", default="analytic", help=f"{_choices(Profile)} (default analytic)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank (default 16)")
    p.add_argument(
        "--targets",
        default="all-linear",
        help="LoRA target modules: all-linear or NAME,NAME... (default all-linear)",
    )
    p.add_argument(
        "--modules-to-save", default="", help="modules trained in full: embed_tokens,lm_head"
    )
    p.add_argument("--batch", type=int, default=1, help="micro-batch per GPU (default 1)")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument(
        "--gradient-checkpointing", default="on", help=f"{_choices(Checkpointing)} (default on)"
    )
    p.add_argument("--optimizer", default="adamw", help=f"{_choices(Optimizer)} (default adamw)")
    p.add_argument(
        "--attention", default="flash_attention_2", help=f"{_choices(Attention)} (default flash)"
    )
    p.add_argument("--fused-loss", action="store_true", help="fused/chunked cross-entropy")
    p.add_argument("--precision", default="bf16", help="bf16|fp16|fp32 (default bf16)")
    p.add_argument("--gradient-accumulation", type=int, default=1, help="steps (changes no memory)")
    p.add_argument("--gpus", type=int, help="number of GPUs (default 1, or 8 with --gpu-memory)")
    p.add_argument("--gpu-memory", metavar="SIZE", help="memory of each GPU: 80GB, 80GiB, 24G")
    p.add_argument("--parallelism", default="fsdp", help=f"{_choices(Parallelism)} (default fsdp)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=_run_estimate)


def _add_presets(sub: Any) -> None:
    p = sub.add_parser("presets", help="list the bundled model presets")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(run=_run_presets)


def _read_config(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UsageError(f"--config: cannot read {path!r}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--config: {path!r} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config: {path!r} must hold a JSON object (a config.json)")
    return data


def _run_estimate(args: argparse.Namespace, console: Console) -> int:
    if args.config:
        model_name = Path(args.config).name
        shape = parse_config(_read_config(args.config), prefix="config")
    else:
        model_name = args.model
        try:
            shape = load_shape(args.model)
        except SpecError as error:
            raise SpecError("--model", error.message) from None
    values = {
        "method": args.method,
        "profile": args.profile,
        "rank": args.rank,
        "targets": args.targets,
        "modules_to_save": args.modules_to_save or None,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "gradient_checkpointing": args.gradient_checkpointing,
        "optimizer": args.optimizer,
        "attention": args.attention,
        "fused_loss": args.fused_loss,
        "precision": args.precision,
        "gradient_accumulation": args.gradient_accumulation,
    }
    settings, errors = build_settings(values, FLAG_PATHS)
    if settings is None:
        raise SpecErrors(errors)
    settings, errors = check_against_model(shape, settings, FLAG_PATHS)
    if errors:
        raise SpecErrors(errors)
    parallelism = Parallelism.parse(args.parallelism, "--parallelism")
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus: must be greater than or equal to 1, got {args.gpus}")
    est = estimate(shape, settings)
    result = None
    n_gpus = args.gpus or 1
    if args.gpu_memory:
        try:
            card = parse_size(args.gpu_memory)
        except ValueError as error:
            raise UsageError(f"--gpu-memory: {error}") from None
        n_gpus = args.gpus or DEFAULT_GPUS_WITH_MEMORY
        result = fit(est, [card] * n_gpus, parallelism)
    if args.json:
        print(json.dumps(estimate_json(model_name, settings, est, n_gpus, parallelism, result)))
    else:
        shown_gpus = args.gpus or 1  # a per-GPU line only when the user named a count
        render(console, model_name, settings, est, shown_gpus, parallelism, result, args.gpu_memory)
    return 0


def _run_presets(args: argparse.Namespace, console: Console) -> int:
    from controller.estimator.presets import load_preset, preset_names

    rows = []
    for name in preset_names():
        preset = load_preset(name)
        shape = load_shape(name)
        rows.append(
            {
                "name": name,
                "repo": preset.repo,
                "family": preset.family,
                "params": shape.total_params,
                "published_params": preset.published_params,
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.table import Table

    table = Table(show_edge=False)
    for column in ("preset", "source repo", "family", "parameters"):
        table.add_column(column, justify="right" if column == "parameters" else "left")
    for row in rows:
        table.add_row(row["name"], row["repo"], row["family"], f"{row['params']:,}")
    console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vramgate",
        description="Training-VRAM estimation and GPU admission for LLM fine-tuning.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_estimate(sub)
    _add_presets(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    console = Console()
    try:
        args = build_parser().parse_args(argv)
        return int(args.run(args, console))
    except (UsageError, SpecError) as error:
        print(f"vramgate: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
