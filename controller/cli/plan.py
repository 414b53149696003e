"""`vramgate plan`: the operator's admission decisions, offline, for a cluster and some jobs.

Thin: read the YAML files, turn them into a snapshot and job requests
(`controller.admission.cluster`), estimate each distinct spec once, decide with
`controller.decision.plan`, print.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from controller.admission import learned
from controller.admission.cluster import (
    ClusterError,
    ClusterObjects,
    Estimator,
    has_template,
    parse_time,
    pending_jobs,
    requests,
    snapshot,
)
from controller.admission.config import SHOWN_DEFAULTS, AdmissionConfig
from controller.admission.traced import read_back
from controller.api.conditions import REASON_NO_TEMPLATE
from controller.base.errors import PermanentError
from controller.base.settings import SettingsError, SettingsLoader
from controller.base.units import GIB, MIB
from controller.cli.apply_checks import refused_at_apply
from controller.decision import (
    ADVISE,
    AdmissionSettings,
    Decision,
    JobRequest,
    plan_on,
)
from controller.estimator import Estimate, Profile
from controller.jobs.profiles import trace_extra_installed
from controller.jobs.spec import JobPlan, estimate_digest, estimate_plan, needs_trace
from controller.learning import LearningSettings
from controller.operator.identity import estimate_identity, trace_libraries
from controller.packing.view import ClusterView
from controller.workload import workload_problem

#: Largest YAML file read: far above any cluster dump of 10,000 nodes, far below memory.
MAX_FILE_BYTES = 256 * MIB
EXAMPLES = files("controller") / "examples"
#: Deepest YAML nesting read: Kubernetes objects nest a few dozen levels at most.
MAX_DEPTH = 100
_C_LOADER = getattr(yaml, "CSafeLoader", None)
#: Aliases may expand a file this many times over, past a floor of this many units (a
#: collection, or 64 characters of a string).
MAX_ALIAS_EXPANSION = 10
MAX_EXPANDED_NODES = 100_000
#: The admission flags, spelled and checked as the operator's; no env prefix, since plan reads
#: no environment (nor a config file): only the command line.
ADMISSION = SettingsLoader(AdmissionConfig, "", typed_flags=True, shown_defaults=SHOWN_DEFAULTS)
#: A job file's job without a pod template is planned as the job it will become; applied as it
#: is, the operator only says what it would do.
DRAFT_WITHOUT_TEMPLATE = (
    "spec.template is empty: planned as if it had one; applied as it is, the job runs nothing "
    "and reserves nothing (NoTemplate)"
)


class PlanInputError(PermanentError, ValueError):
    """Bad input for `vramgate plan`: one line naming the file, document and field."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="decide offline what admission would do with jobs on a cluster",
        description="Decide, as the operator would, which FineTuneJobs are admitted (and "
        "where), resized, queued or rejected on a cluster. Without arguments: a built-in "
        "example cluster and jobs that show all four decisions.",
    )
    p.add_argument(
        "--cluster",
        metavar="FILE",
        help="the cluster: `kubectl get nodes,gpunodes,finetunejobs,pods,configmaps,"
        "priorityclasses -A -o yaml` output, or a compact `nodes:` description (default: the "
        "built-in example)",
    )
    p.add_argument(
        "--profile",
        help="estimate every job with this profile instead of its spec.estimator.profile "
        f"({'|'.join(m.value for m in Profile)})",
    )
    add_admission_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("jobs", nargs="*", metavar="JOB_FILE", help="FineTuneJob manifests")
    p.set_defaults(run=run)


def add_admission_arguments(p: argparse.ArgumentParser) -> None:
    """The admission settings of `vramgate plan`: the operator's flags for them
    (`controller.admission.config`), read from the command line only."""
    ADMISSION.add_arguments(p, example=None)


def run(args: argparse.Namespace, console: Console) -> int:
    profile = None if args.profile is None else Profile.parse(args.profile, "--profile")
    objects, dumped = _load(args)
    try:
        snap = snapshot(objects, _newest_heartbeat(objects))
    except ClusterError as error:
        raise PlanInputError(str(error)) from None
    settings = admission_settings(args)
    jobs, plans, invalid = requests(
        pending_jobs(objects),
        objects.config_maps,
        _estimator(profile),
        objects.origin,
        objects.priorities(settings.raw_priority_namespaces),
    )
    # A job file's error is the user's to fix now; a dumped job's is the cluster's state,
    # which the operator leaves undecided too (Invalid, or waiting for its ConfigMap).
    for key, refused in invalid.items():
        if key not in dumped:
            raise PlanInputError(str(refused))
    # A pod template the workload cannot be built from: refused at apply by the webhook, and
    # left InvalidSpec by the operator, never admitted.
    unusable = {
        key: problem
        for key in plans
        if (problem := workload_problem(objects.jobs[key], settings.packing.gpu_mode))
    }
    for key in (key for key in plans if key not in dumped):  # in file order: one answer
        problem = refused_at_apply(objects.jobs[key]) or unusable.get(key)
        if problem:
            raise PlanInputError(f"{objects.origin[key]} ({key}): {problem}")
    undecided = {key: refused.message for key, refused in invalid.items()} | unusable
    jobs = [job for job in jobs if job.key not in unusable]
    # A dumped job without a template is told what admission would do and holds nothing
    # (NoTemplate), as the operator's pass does. A job file's is the user's draft, planned as
    # if it had one.
    template_less = {
        job.key for job in jobs if job.key in dumped and not has_template(objects.jobs[job.key])
    }
    view = ClusterView(snap, settings.packing)
    jobs = _corrected(objects, jobs, plans, learning_settings(args), view, snap.now)
    decisions = plan_on(view, jobs, settings, snap.now, template_less)
    warnings = {key: list(plan.warnings) for key, plan in plans.items()}
    for key in plans.keys() - dumped:
        if not has_template(objects.jobs[key]):
            warnings[key].append(DRAFT_WITHOUT_TEMPLATE)
    if args.json:
        out = {
            "decisions": [decision_json(d, warnings.get(d.job, ())) for d in decisions],
            "undecided": [{"job": key, "error": message} for key, message in undecided.items()],
        }
        print(json.dumps(out))
    else:
        render(console, decisions, warnings)
        for key, message in undecided.items():
            console.print(f"{key}: not decided: {message}", highlight=False, soft_wrap=True)
    return 0


def _load(args: argparse.Namespace) -> tuple[ClusterObjects, set[str]]:
    """The objects of the cluster file and the job files, and the keys of the jobs that came
    with the cluster (its state, where the job files' jobs are the user's input)."""
    objects = ClusterObjects()
    cluster_file = args.cluster or str(EXAMPLES / "cluster.yaml")
    job_files = args.jobs or ([] if args.cluster else [str(EXAMPLES / "jobs.yaml")])
    _add(objects, cluster_file)
    dumped, config_maps = set(objects.jobs), dict(objects.config_maps)
    classes = dict(objects.priority_classes)
    for path in job_files:
        _add(objects, path)
    # ConfigMaps and PriorityClasses alone are input too: those a dump taken without
    # `configmaps` or `priorityclasses` lacks, or new versions of the dump's own (the one
    # given last counts, as a later apply would).
    given = any(config_maps.get(key) is not cm for key, cm in objects.config_maps.items())
    given |= any(classes.get(key) is not pc for key, pc in objects.priority_classes.items())
    if job_files and objects.jobs.keys() == dumped and not given:
        them = "it" if len(job_files) == 1 else "them"
        raise PlanInputError(
            f"{', '.join(job_files)}: no FineTuneJob, ConfigMap or PriorityClass in {them}"
        )
    return objects, dumped


def _add(objects: ClusterObjects, path: str) -> None:
    for where, document in _documents(path):
        try:
            objects.add(document, where)
        except ClusterError as error:
            raise PlanInputError(str(error)) from None


def admission_settings(args: argparse.Namespace) -> AdmissionSettings:
    """The settings `add_admission_arguments` parsed; one line naming the flag if bad."""
    try:
        return ADMISSION.load(args, environ={}).admission()
    except SettingsError as error:
        raise PlanInputError(str(error)) from None


def learning_settings(args: argparse.Namespace) -> LearningSettings:
    """How the dump's LearnedCorrections correct the jobs (the operator's learning flags)."""
    try:
        return ADMISSION.load(args, environ={}).learning()
    except SettingsError as error:
        raise PlanInputError(str(error)) from None


def _corrected(
    objects: ClusterObjects,
    jobs: Sequence[JobRequest],
    plans: Mapping[str, JobPlan],
    settings: LearningSettings,
    view: ClusterView,
    now: datetime | None,
) -> list[JobRequest]:
    """Each job's estimate with what the dump's LearnedCorrections teach applied, by the
    operator's own rule (`learned.corrected`): a plan decides on the figures it would."""
    records = learned.records(learned.key_states(objects.learned.values(), settings))
    # What each tag's jobs reported last (the dump's status.observed), as the operator's pass
    # builds it from its caches: a waiting job's key names its image by it.
    digests = learned.image_digests(objects.jobs.values())
    out = []
    for job in jobs:
        plan = plans[job.key]
        found = learned.corrected(
            objects.jobs[job.key],
            plan,
            job.estimate,
            plan.gpus,
            records,
            settings,
            view,
            now,
            digests,
        )
        estimate = replace(job.estimate, correction_percent=found.factor_percent)
        out.append(replace(job, estimate=estimate))
    return out


def _documents(path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each YAML document of the file, named `FILE: document N` for messages."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise PlanInputError(f"{path}: cannot read: {error.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PlanInputError(f"{path}: larger than {MAX_FILE_BYTES // MIB} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PlanInputError(f"{path}: not UTF-8 text (byte {error.start})") from None
    documents = _parse(path, text)
    for i, document in enumerate(documents, start=1):
        if document is None:
            continue
        where = f"{Path(path).name}: document {i}"
        if not isinstance(document, Mapping):
            raise PlanInputError(f"{where}: must be a mapping (a Kubernetes object)")
        yield where, document


def _parse(path: str, text: str) -> list[Any]:
    """JSON when the file is JSON (`kubectl get -o json`), else YAML documents.

    YAML goes through libyaml where PyYAML has it (ten times faster: 10,000 job manifests
    in about a second), but only after its event stream (an iterative parser) shows the
    nesting is sane: libyaml's node composer recurses in C and overflows the stack on a
    hostile nesting instead of raising, and PyYAML's own composer runs out of Python stack.
    """
    try:
        if text.lstrip()[:1] in ("{", "["):
            try:
                return [json.loads(text)]
            except json.JSONDecodeError:
                pass  # YAML flow style also starts so
        if _too_deep(text):
            raise PlanInputError(f"{path}: nested more than {MAX_DEPTH} brackets deep")
        loader = _C_LOADER or yaml.SafeLoader
        aliases = _scan(path, yaml.parse(text, Loader=loader))
        documents = list(yaml.load_all(text, Loader=loader))
        if aliases:
            _check_aliases(path, documents)
        return documents
    except (yaml.YAMLError, RecursionError) as error:
        detail = " ".join(str(error).split()) if isinstance(error, yaml.YAMLError) else "too deep"
        raise PlanInputError(f"{path}: not valid YAML or JSON ({detail})") from None


def _scan(path: str, events: Iterator[yaml.Event]) -> int:
    """The number of aliases in a YAML event stream, refused at its first collection nested
    deeper than MAX_DEPTH. The parser yields events as it reads, so the refusal comes before
    it reaches any nesting limit of its own (libyaml's, 1,000 levels in PyYAML 6.0.4; none in
    older ones): the answer is the same whichever PyYAML is installed."""
    document = depth = aliases = 0
    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            document += 1
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark  # always set by PyYAML's parsers
                line = f", line {mark.line + 1}" if mark else ""
                raise PlanInputError(
                    f"{path}: document {document}{line}: nested {depth} deep; at most {MAX_DEPTH}"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
    return aliases


def _check_aliases(path: str, documents: list[Any]) -> None:
    """Refuses documents whose aliases refer to themselves, or expand them far past what the
    file holds ("billion laughs": 1 KB of nested aliases is 10^8 nodes; a long string
    anchored once and aliased thousands of times is gigabytes). PyYAML shares an aliased node
    rather than copying it, so loading is cheap; it is every later walk (JSON for the schema
    check, the workload build) that would run for hours. As kubectl's YAML reader, a few
    aliases (a shared env list) pass.

    Sizes are in units: a collection is one, a string one per 64 characters begun."""

    def units(value: Any) -> int:
        return 1 + len(value) // 64 if isinstance(value, str) else 1

    expanded: dict[int, int] = {}  # container id -> its units, aliases expanded
    opened: set[int] = set()
    strings: dict[int, int] = {}  # each distinct string's units, once
    stack: list[tuple[Any, bool]] = [(document, False) for document in documents]
    while stack:
        node, closing = stack.pop()
        if not isinstance(node, dict | list):
            continue
        children = [*node.keys(), *node.values()] if isinstance(node, dict) else node
        key = id(node)
        if closing:
            expanded[key] = 1 + sum(expanded.get(id(child)) or units(child) for child in children)
            continue
        if key in expanded:
            continue
        if key in opened:
            raise PlanInputError(f"{path}: an alias refers to a node that holds it")
        opened.add(key)
        stack.append((node, True))
        for child in children:
            if isinstance(child, str):
                strings[id(child)] = units(child)
            elif id(child) not in expanded:
                stack.append((child, False))
    total = sum(expanded.get(id(d)) or units(d) for d in documents)
    distinct = len(expanded) + sum(strings.values())
    if total > MAX_ALIAS_EXPANSION * distinct and total > MAX_EXPANDED_NODES:
        raise PlanInputError(
            f"{path}: its aliases expand it {total // distinct:,} times over; at most "
            f"{MAX_ALIAS_EXPANSION} (write the repeated part out)"
        )


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PAIR = re.compile(r"\[\]|\{\}")


def _too_deep(text: str) -> bool:
    """Whether flow collections ([ ], { }) nest deeper than MAX_DEPTH, or that many are left
    open: libyaml's scanner is quadratic in such nesting (80 s for 100,000 levels). Each
    pass strips the innermost pairs at C speed; sane files need a few passes."""
    brackets = _NOT_BRACKET.sub("", text)
    for _ in range(MAX_DEPTH):
        stripped = _PAIR.sub("", brackets)
        if stripped == brackets:
            break
        brackets = stripped
    else:
        return True
    return brackets.count("[") + brackets.count("{") > MAX_DEPTH


def _newest_heartbeat(objects: ClusterObjects) -> datetime | None:
    """Staleness is judged at the moment of the dump: its newest heartbeat, not the clock."""
    beats = [
        parse_time((g.get("status") or {}).get("heartbeatTime")) for g in objects.gpunodes.values()
    ]
    known = [b for b in beats if b is not None]
    return max(known) if known else None


def _estimator(profile: Profile | None) -> Estimator:
    """Estimates cached by spec: a queue of 10,000 jobs holds few distinct specs. A job the
    operator traced keeps the trace in its status (`admission.traced`): read back where its
    digest is the one the operator would compute here, so a dump's jobs are traced only
    where the operator would trace them again too."""
    cache: dict[tuple[int, Any, int, Any], Estimate] = {}
    identity = estimate_identity()
    libraries = trace_libraries() if trace_extra_installed() else None

    def estimate(
        plan: JobPlan, job: Mapping[str, Any], config: Mapping[str, Any] | None
    ) -> Estimate:
        asked = plan
        if profile is not None:
            plan = replace(plan, settings=replace(plan.settings, profile=profile))
        # The GPU count and parallelism too: the trace profile traces the job's own spread.
        key = (id(plan.shape), plan.settings, plan.gpus, plan.parallelism)
        found = cache.get(key)
        if found is None:
            kept = None
            if plan.settings == asked.settings and needs_trace(plan):  # as the operator traces
                digest = estimate_digest(job.get("spec") or {}, config, identity)
                kept = read_back(job, digest, libraries)
            if isinstance(kept, tuple):
                found = cache[key] = kept[0]
            else:
                found = cache[key] = estimate_plan(plan)
        return found

    return estimate


def decision_label(decision: Decision) -> str:
    """The outcome, or Advise for a job told only what admission would do (NoTemplate), as
    the operator's metrics count it: nothing is admitted, whatever the outcome would be."""
    return ADVISE if decision.reason == REASON_NO_TEMPLATE else decision.outcome.value


def decision_json(decision: Decision, warnings: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "job": decision.job,
        "decision": decision_label(decision),
        "reason": decision.reason,
        "message": decision.message,
        "requested_gpus": decision.requested_gpus,
        "admitted_gpus": decision.admitted_gpus,
        "per_gpu_bytes": decision.per_gpu_bytes,
        "placement": [
            {"node": part.node, "gpus": list(part.indices), "uuids": list(part.uuids)}
            for part in decision.placement
        ],
        "warnings": list(warnings),
    }


def render(
    console: Console, decisions: list[Decision], warnings: Mapping[str, Sequence[str]]
) -> None:
    """A row per job in the order decided (queue order, template-less jobs of the cluster
    last), then each job's message (too long for a column)."""
    table = Table(show_edge=False)
    # Whole names up to 64 characters; a longer one (they may have 253) folds onto more lines
    # rather than squeezing the other columns to nothing.
    table.add_column("job", max_width=64, overflow="fold")
    for column in ("decision", "reason", "where", "GiB/GPU"):
        table.add_column(column, justify="right" if column == "GiB/GPU" else "left")
    for decision in decisions:
        where = " ".join(
            f"{part.node}:{','.join(map(str, part.indices))}" for part in decision.placement
        )
        count = decision.admitted_gpus or decision.requested_gpus
        table.add_row(
            decision.job,
            decision_label(decision),
            decision.reason,
            where or f"({count} GPU{'s' if count > 1 else ''})",
            f"{decision.per_gpu_bytes / GIB:.2f}",
        )
    console.print(table)
    for decision in decisions:
        console.print(f"{decision.job}: {decision.message}", highlight=False, soft_wrap=True)
        for warning in warnings.get(decision.job, ()):
            console.print(f"{decision.job}: warning: {warning}", highlight=False, soft_wrap=True)
