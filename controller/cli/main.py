"""`vramgate`: the command line. Thin: parse, call the core, print.

Bad input exits 2 with one line on stderr naming the flag and what it allows; nothing a user
types produces a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console

from controller.base.errors import VramgateError
from controller.base.units import MIB, parse_size
from controller.cli import plan as plan_command
from controller.cli.report import estimate_json, render
from controller.estimator import (
    DEFAULT_RANK,
    MAX_GPUS,
    Attention,
    Checkpointing,
    KbitPreparation,
    LoadPath,
    Loss,
    Method,
    ModelShape,
    Offloading,
    Optimizer,
    Parallelism,
    Precision,
    Profile,
    SpecError,
    SpecErrors,
    TrainingSettings,
    build_settings,
    check_against_model,
    context_warnings,
)
from controller.jobs.profiles import estimate, preset_shape, read_shape
from controller.packing.fit import fit

#: A switch (its camelCase name under spec.training.switches) -> the flag that sets it.
SWITCH_FLAGS = {
    "loss": "--loss",
    "compile": "--compile",
    "loadPath": "--load-path",
    "activationOffloading": "--activation-offloading",
    "fsdpVersion": "--fsdp-version",
    "optimizerInBackward": "--optimizer-in-backward",
    "kbitPreparation": "--kbit-preparation",
}
# Settings field -> the flag that sets it, so errors name what the user typed; each switch
# by its own flag (`settings.switch_path`).
FLAG_PATHS = {
    "method": "--method",
    "rank": "--rank",
    "targets": "--targets",
    "modules_to_save": "--modules-to-save",
    "batch": "--batch",
    "seq_len": "--seq-len",
    "image_tokens": "--image-tokens",
    "gradient_checkpointing": "--gradient-checkpointing",
    "optimizer": "--optimizer",
    "attention": "--attention",
    "fused_loss": "--fused-loss",
    "precision": "--precision",
    "profile": "--profile",
    "gradient_accumulation": "--gradient-accumulation",
    "framework": "--framework",
    "switches": "--switches",
} | {f"switches.{camel}": flag for camel, flag in SWITCH_FLAGS.items()}
#: The largest --config file read: a config.json is a few KiB, so this only stops a wrong
#: path (a checkpoint, /dev/zero) from being read whole.
MAX_CONFIG_BYTES = 16 * MIB


class UsageError(Exception):
    """A bad command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _choices(enum: type[StrEnum]) -> str:
    return "|".join(m.value for m in enum)


def _add_job_options(p: argparse.ArgumentParser) -> None:
    """The model and training options `estimate` and `trace` share."""
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument(
        "--model", metavar="PRESET", help="a bundled preset (see `vramgate presets`)"
    )
    model.add_argument("--config", metavar="FILE", help="a Hugging Face config.json")
    p.add_argument("--method", default="qlora", help=f"{_choices(Method)} (default qlora)")
    # None: not given, so that a rank or targets given with --method full can be refused.
    p.add_argument("--rank", type=int, help=f"LoRA rank (default {DEFAULT_RANK})")
    p.add_argument(
        "--targets", help="LoRA target modules: all-linear or NAME,NAME... (default all-linear)"
    )
    p.add_argument(
        "--modules-to-save", default="", help="modules trained in full: embed_tokens,lm_head"
    )
    p.add_argument("--batch", type=int, default=1, help="micro-batch per GPU (default 1)")
    p.add_argument("--seq-len", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument(
        "--image-tokens",
        type=int,
        default=0,
        help="a vision-language model's image tokens per sample: the positions its images take "
        "in the language model (256 per image for Gemma 3, (H/28)x(W/28) per image for "
        "Qwen2.5-VL), added to --seq-len for its activations (default 0: text only)",
    )
    p.add_argument(
        "--gradient-checkpointing", default="on", help=f"{_choices(Checkpointing)} (default on)"
    )
    p.add_argument("--optimizer", default="adamw", help=f"{_choices(Optimizer)} (default adamw)")
    p.add_argument(
        "--attention", default="flash_attention_2", help=f"{_choices(Attention)} (default flash)"
    )
    p.add_argument("--fused-loss", action="store_true", help="the same as --loss fused")
    trainer = p.add_argument_group(
        "trainer",
        "the framework's switches that change memory (see `vramgate frameworks`); "
        "each flag overrides the framework's value",
    )
    trainer.add_argument(
        "--framework",
        help="huggingface (hf, transformers, trl, accelerate), torchtune, litgpt, unsloth, "
        "axolotl or llama-factory; any other name is a label with the default switches",
    )
    trainer.add_argument("--loss", help=f"{_choices(Loss)} (default plain)")
    trainer.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile (recorded, not priced; default off)",
    )
    trainer.add_argument("--load-path", help=f"{_choices(LoadPath)} (default meta-sharded)")
    trainer.add_argument("--activation-offloading", help=f"{_choices(Offloading)} (default none)")
    trainer.add_argument("--fsdp-version", type=int, help="1|2 (default 2)")
    trainer.add_argument(
        "--optimizer-in-backward",
        action=argparse.BooleanOptionalAction,
        help="step each parameter as its gradient is made (default off)",
    )
    trainer.add_argument(
        "--kbit-preparation",
        help=f"{_choices(KbitPreparation)}: a 4-bit model's other parameters in fp32 "
        "(default none)",
    )
    p.add_argument("--precision", default="bf16", help="bf16|fp16|fp32 (default bf16)")
    p.add_argument("--gradient-accumulation", type=int, default=1, help="steps (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_estimate(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate the training VRAM of a fine-tuning job",
        description="Estimate the GPU memory a fine-tuning run needs, component by component, "
        "on --gpus GPUs, and whether it fits that many GPUs of --gpu-memory each.",
    )
    _add_job_options(p)
    p.add_argument(
        "--profile", default="calibrated", help=f"{_choices(Profile)} (default calibrated)"
    )
    p.add_argument(
        "--gpus", type=int, default=1, help=f"GPUs the job runs on, 1 to {MAX_GPUS} (default 1)"
    )
    p.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        help="memory of each GPU, with a unit (80GB, 80GiB, 24G): whether the job fits --gpus "
        "of them, and the fewest that would",
    )
    p.add_argument("--parallelism", default="fsdp", help=f"{_choices(Parallelism)} (default fsdp)")
    p.set_defaults(run=_run_estimate)


def _add_trace(sub: Any) -> None:
    p = sub.add_parser(
        "trace",
        help="trace one training step on fake tensors: the exact peak, by phase and category",
        description="Run the real model's forward, backward and optimizer steps on PyTorch "
        "fake tensors (no GPU, no weights) and count every tensor storage. Needs the `trace` "
        "extra.",
    )
    _add_job_options(p)
    p.add_argument(
        "--trace-layers",
        default="auto",
        help="auto (whole model up to 9 layers, else extrapolated from 4 and 5), full, "
        "or N >= 4 to extrapolate from N and N+1 layers (default auto)",
    )
    dist = p.add_argument_group(
        "one rank of a multi-GPU job (traced under a fake process group at the world size)"
    )
    dist.add_argument(
        "--gpus", type=int, default=1, help="world size, nodes x GPUs (default 1: one GPU)"
    )
    dist.add_argument("--parallelism", default="fsdp", help="fsdp|ddp (default fsdp)")
    dist.add_argument(
        "--no-reshard-after-forward",
        dest="reshard_after_forward",
        action="store_false",
        help="FSDP: keep each block's gathered parameters from forward to backward",
    )
    dist.add_argument(
        "--prefetch",
        type=int,
        help="FSDP: blocks all-gathered ahead in forward and backward (default: FSDP2's "
        "implicit prefetch)",
    )
    dist.add_argument("--param-dtype", help="FSDP mixed precision: bf16|fp16|fp32")
    dist.add_argument("--reduce-dtype", help="FSDP mixed precision: bf16|fp16|fp32")
    dist.add_argument(
        "--offload-params",
        action="store_true",
        help="FSDP CPU offload: shards, their gradients and the optimizer on the host",
    )
    dist.add_argument(
        "--offload-optimizer", action="store_true", help="optimizer state and step on the host"
    )
    dist.add_argument(
        "--gradient-as-bucket-view",
        action="store_true",
        help="DDP: gradients are views into the buckets",
    )
    p.set_defaults(run=_run_trace)


def _add_presets(sub: Any) -> None:
    p = sub.add_parser(
        "presets",
        help="list the bundled model presets, or (--types) every model type and how it is read",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.add_argument(
        "--types",
        action="store_true",
        help="list every model_type vramgate reads: by hand, generically from the model "
        "transformers builds, or by the trace alone (the last two need the trace extra)",
    )
    p.set_defaults(run=_run_presets)


def _read_config(path: str) -> dict[str, Any]:
    """The JSON object in `path`; whatever the file holds, a bad one is one UsageError."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise UsageError(f"--config: cannot read {path!r}: {error.strerror or error}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"--config: {path!r} is larger than 16 MiB; a config.json is a few KiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UsageError(f"--config: {path!r} is not UTF-8 text ({error.reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"--config: {path!r} is not valid JSON ({error})") from None
    except RecursionError:
        raise UsageError(f"--config: {path!r} nests too deeply to be a config.json") from None
    except ValueError:  # an integer past Python's digit limit
        raise UsageError(f"--config: {path!r} holds a number too long to read") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config: {path!r} must hold a JSON object (a config.json)")
    return data


def _job(args: argparse.Namespace, profile: str) -> tuple[str, ModelShape, TrainingSettings]:
    """The model and validated settings from the shared job options; warnings (a value the
    config leaves out, a sequence beyond the model's context) go to stderr, one line each."""
    if args.config:
        model_name = Path(args.config).name
        shape = read_shape(_read_config(args.config), prefix="config")
    else:
        model_name = args.model
        try:
            shape = preset_shape(args.model)
        except SpecError as error:
            raise SpecError("--model", error.message) from None
    values = {
        "method": args.method,
        "profile": profile,
        "rank": DEFAULT_RANK if args.rank is None else args.rank,
        "targets": args.targets or "all-linear",
        "modules_to_save": args.modules_to_save or None,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "image_tokens": args.image_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "optimizer": args.optimizer,
        "attention": args.attention,
        "fused_loss": args.fused_loss,
        "precision": args.precision,
        "gradient_accumulation": args.gradient_accumulation,
        "framework": args.framework,
        "switches": {
            camel: getattr(args, flag[2:].replace("-", "_"))
            for camel, flag in SWITCH_FLAGS.items()
            if getattr(args, flag[2:].replace("-", "_")) is not None
        },
    }
    # An attention implementation outside the known four is estimated on the quadratic path
    # with a warning (context_warnings), as the specification document prices it.
    settings, errors = build_settings(values, FLAG_PATHS, any_attention=True)
    if settings is None:
        raise SpecErrors(errors)
    for flag, value in (("--rank", args.rank), ("--targets", args.targets)):
        if value is not None and not settings.is_adapter:
            raise UsageError(f"{flag}: applies only with --method lora or qlora")
    settings, errors = check_against_model(shape, settings, FLAG_PATHS)
    if errors:
        raise SpecErrors(errors)
    said = (f"{path}: {message}" for path, message in shape.config_warnings)
    for line in (*said, *context_warnings(shape, settings, FLAG_PATHS)):
        print(f"vramgate: warning: {line}", file=sys.stderr)
    return model_name, shape, settings


def _run_estimate(args: argparse.Namespace, console: Console) -> int:
    """The estimate for the job on exactly --gpus GPUs; with --gpu-memory, whether that many
    such cards hold it, and the fewest (up to the API's cap) that would."""
    if not 1 <= args.gpus <= MAX_GPUS:
        low = args.gpus < 1
        bound = "greater than or equal to 1" if low else f"less than or equal to {MAX_GPUS}"
        raise UsageError(f"--gpus: must be {bound}, got {args.gpus}")
    card = None
    if args.gpu_memory is not None:
        try:
            card = parse_size(args.gpu_memory, require_unit=True)
        except ValueError as error:
            raise UsageError(f"--gpu-memory: {error}") from None
    parallelism = Parallelism.parse(args.parallelism, "--parallelism")
    model_name, shape, settings = _job(args, args.profile)
    est = estimate(shape, settings, FLAG_PATHS, args.gpus, parallelism)
    result = None if card is None else fit(est, [card] * MAX_GPUS, parallelism, gpus=args.gpus)
    if args.json:
        print(json.dumps(estimate_json(model_name, settings, est, args.gpus, parallelism, result)))
    else:
        render(console, model_name, settings, est, args.gpus, parallelism, result, args.gpu_memory)
    return 0


def _run_trace(args: argparse.Namespace, console: Console) -> int:
    layers = args.trace_layers
    if layers not in ("auto", "full") and not (layers.isdigit() and int(layers) >= 4):
        raise UsageError(f"--trace-layers: must be auto, full or an integer >= 4, got {layers!r}")
    model_name, shape, settings = _job(args, "trace")
    try:
        from controller.trace import TraceUnsupported, trace
        from controller.trace.report import render_trace, trace_json
    except ImportError as error:
        raise UsageError(
            f"trace needs the `trace` extra (pip install 'vramgate[trace]'): {error}"
        ) from None
    try:
        distributed = _distributed(args)
        report = trace(shape.source or {}, settings, layers, distributed)
    except TraceUnsupported as error:
        raise UsageError(f"trace: {error}") from None
    if args.json:
        print(json.dumps(trace_json(model_name, settings, report)))
    else:
        render_trace(console, model_name, settings, report)
    return 0


def _distributed(args: argparse.Namespace) -> Any:
    """The `Distributed` the trace flags ask for; None for one GPU without them."""
    if not 1 <= args.gpus <= MAX_GPUS:
        raise UsageError(f"--gpus: must be 1 to {MAX_GPUS}, got {args.gpus}")
    parallelism = Parallelism.parse(args.parallelism, "--parallelism")
    asked = (
        args.gpus > 1
        or not args.reshard_after_forward
        or args.prefetch is not None
        or args.param_dtype
        or args.reduce_dtype
        or args.offload_params
        or args.offload_optimizer
        or args.gradient_as_bucket_view
    )
    if not asked:
        return None
    from controller.trace.distributed import Distributed

    def precision(value: str | None, flag: str) -> Precision | None:
        return None if value is None else Precision.parse(value, flag)

    return Distributed(
        world_size=args.gpus,
        parallelism=parallelism,
        reshard_after_forward=args.reshard_after_forward,
        prefetch=args.prefetch,
        param_dtype=precision(args.param_dtype, "--param-dtype"),
        reduce_dtype=precision(args.reduce_dtype, "--reduce-dtype"),
        offload_params=args.offload_params,
        offload_optimizer=args.offload_optimizer,
        gradient_as_bucket_view=args.gradient_as_bucket_view,
    )


def _run_presets(args: argparse.Namespace, console: Console) -> int:
    from controller.estimator.presets import load_preset, preset_names
    from controller.jobs.readings import reading_of

    if args.types:
        return _run_types(args, console)
    rows = []
    for name in preset_names():
        preset = load_preset(name)
        try:
            params: int | None = preset_shape(name).total_params
        except SpecError:  # a generic family without the trace extra: listed, not counted
            params = None
        rows.append(
            {
                "name": name,
                "repo": preset.repo,
                "family": preset.family,
                "reading": str(reading_of(preset.family)),
                "params": params,
                "published_params": preset.published_params,
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    from rich.table import Table

    table = Table(show_edge=False)
    # The name is what `--model` and `spec.model.preset` take: never cut it (nor the count);
    # on a narrow terminal the repo and family fold onto more lines instead.
    table.add_column("preset", no_wrap=True)
    table.add_column("source repo", overflow="fold")
    table.add_column("family", overflow="fold")
    table.add_column("read", overflow="fold")
    table.add_column("parameters", justify="right", no_wrap=True)
    for row in rows:
        count = "-" if row["params"] is None else f"{row['params']:,}"
        table.add_row(
            str(row["name"]), str(row["repo"]), str(row["family"]), str(row["reading"]), count
        )
    console.print(table)
    return 0


def _run_types(args: argparse.Namespace, console: Console) -> int:
    """Every model_type and its reading; without the trace extra, the hand-read ones and a
    line (stderr) saying what the extra adds."""
    from controller.jobs.profiles import TRACE_EXTRA, trace_extra_installed
    from controller.jobs.readings import Reading, model_type_readings

    extra = trace_extra_installed()
    rows = model_type_readings(with_generic=extra)
    if not extra:
        print(
            f"only the hand-read model types: the trace extra ({TRACE_EXTRA}) reads every "
            "other one transformers builds",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps([
            {"model_type": r.model_type, "reading": str(r.reading), "built_as": r.built_as}
            for r in rows
        ]))  # fmt: skip
        return 0
    from rich.table import Table

    table = Table(show_edge=False)
    table.add_column("model_type", no_wrap=True)
    table.add_column("read", no_wrap=True)
    table.add_column("built as (transformers auto mapping)", overflow="fold")
    for row in rows:
        table.add_row(row.model_type, str(row.reading), row.built_as)
    console.print(table)
    counts = {reading: sum(r.reading is reading for r in rows) for reading in Reading}
    console.print(", ".join(f"{n} {reading}" for reading, n in counts.items()))
    if extra:  # listed from transformers' mappings, not built: say what that leaves open
        console.print(
            "generic: read from the model transformers builds from the job's config; a type "
            "whose modelling code needs a package not installed (timm, Pillow) is refused "
            "then, in one line"
        )
    return 0


def _add_frameworks(sub: Any) -> None:
    p = sub.add_parser(
        "frameworks",
        help="list the training-framework presets and the switches each sets",
        description="Each framework preset (spec.training.framework, --framework), its aliases "
        "and the memory-relevant switches it sets; --sources adds where each value is read.",
    )
    p.add_argument("--sources", action="store_true", help="print each value's source")
    p.add_argument("--json", action="store_true", help="print a JSON list, sources included")
    p.set_defaults(run=_run_frameworks)


def _run_frameworks(args: argparse.Namespace, console: Console) -> int:
    from controller.estimator.frameworks import describe, frameworks

    presets = frameworks()
    if args.json:
        rows = [
            {
                "name": f.name,
                "title": f.title,
                "aliases": list(f.aliases),
                "switches": describe(f.switches),
                "sources": dict(f.sources),
            }
            for f in presets
        ]
        print(json.dumps(rows))
        return 0
    from rich.table import Table

    table = Table(show_edge=False)
    table.add_column("framework", no_wrap=True)
    table.add_column("aliases", overflow="fold")
    names = list(describe(presets[0].switches))
    for camel in names:
        table.add_column(camel, overflow="fold")
    for f in presets:
        values = describe(f.switches)
        table.add_row(f.name, ", ".join(f.aliases), *(str(values[c]) for c in names))
    console.print(table)
    if args.sources:
        for f in presets:
            console.print(f"\n{f.name} ({f.title})")
            for camel, source in f.sources.items():
                console.print(f"  {camel} = {describe(f.switches)[camel]}: {source}")
    return 0


def _add_crds(sub: Any) -> None:
    p = sub.add_parser(
        "crds",
        help="write the CRD manifests generated from the API models",
        description="Render the FineTuneJob and GPUNode CustomResourceDefinitions from the "
        "pydantic models in controller/api and write them to the chart.",
    )
    p.add_argument(
        "--dir",
        default="charts/vramgate/crds",
        help="where the manifests live (default charts/vramgate/crds)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--stdout", action="store_true", help="print them instead of writing")
    mode.add_argument(
        "--check", action="store_true", help="exit 1 if the files differ from the models"
    )
    p.set_defaults(run=_run_crds)


def _run_crds(args: argparse.Namespace, console: Console) -> int:
    from controller.api import crds

    directory = Path(args.dir)
    if args.stdout:
        print("---\n".join(crds.rendered().values()), end="")
        return 0
    if args.check:
        problems = crds.drift(directory)
        for line in problems:
            print(f"vramgate crds: {line}; run `vramgate crds` to regenerate", file=sys.stderr)
        return 1 if problems else 0
    for path in crds.write(directory):
        print(f"wrote {path}")
    return 0


def _add_operator(sub: Any) -> None:
    from controller.operator.settings import add_arguments

    p = sub.add_parser(
        "operator",
        help="run the operator and its admission webhook",
        description="Watch FineTuneJobs, estimate and admit them, and serve the admission "
        "webhook. Credentials: in-cluster, else $KUBECONFIG. Each setting is a flag, an "
        "environment variable or a config-file key; flags win over the environment, which "
        "wins over the file.",
    )
    add_arguments(p)
    p.set_defaults(run=_run_operator)


def _run_operator(args: argparse.Namespace, console: Console) -> int:
    from controller.operator.run import StartupError, run
    from controller.operator.settings import SettingsError, load_options

    try:
        options = load_options(args)
    except SettingsError as error:
        raise UsageError(f"operator: {error}") from None
    try:
        return run(options)
    except StartupError as error:
        print(f"vramgate operator: {error}", file=sys.stderr)
        return 1


def _add_agent(sub: Any) -> None:
    from controller.agent.settings import add_arguments

    p = sub.add_parser(
        "agent",
        help="run the node agent: measured GPU memory into the node's GPUNode and Prometheus",
        description="Read this node's GPUs (NVML, dcgm-exporter or a static file), keep the "
        "node's GPUNode status up to date and serve Prometheus metrics. Each setting is a "
        "flag, an environment variable or a config-file key; flags win over the environment, "
        "which wins over the file.",
    )
    add_arguments(p)
    p.set_defaults(run=_run_agent)


def _run_agent(args: argparse.Namespace, console: Console) -> int:
    from controller.agent.command import run_agent
    from controller.agent.settings import SettingsError

    try:
        return run_agent(args)
    except SettingsError as error:
        raise UsageError(f"agent: {error}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vramgate",
        description="Training-VRAM estimation and GPU admission for LLM fine-tuning.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan_command.add_parser(sub)
    _add_estimate(sub)
    _add_trace(sub)
    _add_presets(sub)
    _add_frameworks(sub)
    _add_crds(sub)
    _add_operator(sub)
    _add_agent(sub)
    return parser


def _signed_values_attached(argv: Sequence[str] | None) -> list[str]:
    """`--gpu-memory -1GiB` as `--gpu-memory=-1GiB`: argparse takes a value that starts with
    a dash and is not a bare number for an option of its own, and would say "expected one
    argument" instead of our message about the value."""
    out: list[str] = []
    for token in sys.argv[1:] if argv is None else argv:
        last = out[-1] if out else ""
        if "--" in out:  # after `--` every token is a positional, as the user wrote it
            out.append(token)
        elif re.match(r"-[0-9.]", token) and last.startswith("--") and "=" not in last:
            out[-1] = f"{last}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    # Nothing printed is rich markup, and much is the user's text (names, paths, values in
    # messages) whose brackets must print as they are: `[config.json]`, even a stray `[/]`.
    console = Console(markup=False)
    try:
        args = build_parser().parse_args(_signed_values_attached(argv))
        return int(args.run(args, console))
    except (UsageError, VramgateError) as error:
        print(f"vramgate: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `vramgate plan --json | head`: the reader left, which is no error of ours. Point
        # stdout at /dev/null so that the interpreter's final flush does not raise again.
        # Exit 1, as rich's Console does for the tables.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
