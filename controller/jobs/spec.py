"""A FineTuneJob spec -> what the estimator needs, with every error at its `spec.` path.

One validator for three callers: the admission webhook refuses what it reports, the operator
records it as `Estimated=False, reason InvalidSpec`, and both show the same one line per
field (`spec.lora.rank: must be greater than or equal to 1, got 0`). It collects *every*
error, because fixing one field per round trip is slow.

Pure: the spec arrives as a plain mapping, and a model named by `configMapRef` arrives already
read (`config_map_config`); the operator shell does that read. Without it (the webhook) the
model's own checks are skipped and only the rest of the spec is validated.

The CRD schema already refuses most type and range errors at the API server; this validator
still checks them, because it also serves inputs that never went through the API server
(tests, the CLI, a webhook that runs before schema defaulting is guaranteed). An omitted
field takes the API models' default, the one the API server would write in;
`tests/unit/jobs/test_jobspec_schema.py` checks that the models refuse, at the same path, each
error found here that a schema can state.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from controller.api.base import ApiModel
from controller.api.enums import AdmissionPolicy, allowed, api_spelling
from controller.api.finetunejob import (
    CONFIG_MAP_KEY_PATTERN,
    CONFIG_MAP_MAX_LENGTH,
    DEFAULT_CONFIG_KEY,
    DNS_SUBDOMAIN_PATTERN,
    FRAMEWORK_MAX_LENGTH,
    MAX_PRIORITY,
    MODEL_SOURCES,
    ConfigMapRef,
    EstimatorSpec,
    FineTuneJobSpec,
    LoraSpec,
    ModelSource,
    ResourcesSpec,
    SwitchesSpec,
    TrainingSpec,
)
from controller.estimator import (
    MAX_GPUS,
    MAX_TRACE_GPUS,
    PATHS,
    Attention,
    Checkpointing,
    Choice,
    Estimate,
    Method,
    ModelShape,
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
    int_in_range,
    load_preset,
    load_shape,
    parse_config,
)
from controller.estimator.errors import UnreadFamily
from controller.estimator.presets import read_by_hand
from controller.jobs.profiles import (
    calibrated_hands_to_trace,
    check_generic_type,
    estimate,
    read_shape,
    trace_extra_installed,
)

C = TypeVar("C", bound=StrEnum)

#: Field paths of the estimator's settings in a FineTuneJob, as errors name them.
SPEC_PATHS = {name: f"spec.{path}" for name, path in PATHS.items()}

# Settings parsed from an enum; messages list the members' API spellings.
_ENUMS: dict[str, type[Choice]] = {
    "method": Method,
    "gradient_checkpointing": Checkpointing,
    "optimizer": Optimizer,
    "attention": Attention,
    "precision": Precision,
    "profile": Profile,
}

# Every object in a spec, and the model that knows its field names.
_OBJECTS: dict[str, type[ApiModel]] = {
    "spec": FineTuneJobSpec,
    "spec.model": ModelSource,
    "spec.model.configMapRef": ConfigMapRef,
    "spec.lora": LoraSpec,
    "spec.training": TrainingSpec,
    "spec.training.switches": SwitchesSpec,
    "spec.estimator": EstimatorSpec,
    "spec.resources": ResourcesSpec,
}


@dataclass(frozen=True, slots=True)
class ConfigMapKey:
    """The ConfigMap entry that holds a job's config.json."""

    name: str
    key: str = DEFAULT_CONFIG_KEY

    @property
    def label(self) -> str:
        """`configmaps/<name>[<key>]`: how messages and status name the model."""
        return f"configmaps/{self.name}[{self.key}]"

    def config_in(self, namespace: str, data: Mapping[str, Any] | None) -> dict[str, Any]:
        """The JSON object under `key` of the ConfigMap's `data` (None: no such ConfigMap).
        The operator (reading the API) and `vramgate plan` (reading a dump) both read it here,
        so they say the same thing; a SpecError names the field and the ConfigMap."""
        path, where = "spec.model.configMapRef", f"ConfigMap {namespace}/{self.name}"
        if data is None:
            raise SpecError(f"{path}.name", f"{where} not found")
        if self.key not in data:
            keys = ", ".join(sorted(data)) or "none"
            raise SpecError(f"{path}.key", f"{where} has no key {self.key!r} (keys: {keys})")
        try:
            config = json.loads(data[self.key])
        except (json.JSONDecodeError, TypeError) as error:
            message = f"{where} key {self.key!r} is not valid JSON ({error})"
            raise SpecError(f"{path}.key", message) from None
        if not isinstance(config, dict):
            message = f"{where} key {self.key!r} must hold a JSON object (a config.json)"
            raise SpecError(f"{path}.key", message)
        return config


@dataclass(frozen=True)
class JobPlan:
    """A valid spec, read: what to estimate and how the job asks to be placed.

    `shape` is None only when the model comes from a ConfigMap that was not read (the
    webhook's case); the operator always passes the ConfigMap's content. `warnings` are
    one line each at their `spec.` path, for what is estimated but unusual (a value the
    model's config leaves out, a sequence longer than the model's context).
    """

    model: str
    shape: ModelShape | None = field(repr=False)
    settings: TrainingSettings
    parallelism: Parallelism
    gpus: int
    admission_policy: AdmissionPolicy
    suspend: bool
    gpu_selector: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    min_gpus: int = 1
    max_gpus: int | None = None
    #: spec.priority: a raw number, honoured only where an administrator allows it
    #: (`controller.admission.priority`).
    priority: int = 0
    #: spec.priorityClassName, the PriorityClass whose value orders the queue; None: unset.
    priority_class_name: str | None = None
    #: The job's configuration, as the learning loop keys it (`config_digest`).
    config: str = ""


def config_map_ref(spec: Mapping[str, Any]) -> ConfigMapKey | None:
    """The ConfigMap entry the spec's model names, if it names a well-formed one (a name and
    key the API server allows a ConfigMap: no other can be read)."""
    model = spec.get("model") if isinstance(spec, Mapping) else None
    ref = model.get("configMapRef") if isinstance(model, Mapping) else None
    if not isinstance(ref, Mapping) or _config_map_ref_errors(ref):
        return None
    return ConfigMapKey(ref["name"], ref.get("key", DEFAULT_CONFIG_KEY))


#: ConfigMap and PriorityClass names are both DNS-1123 subdomains.
_CONFIG_MAP_NAME = re.compile(DNS_SUBDOMAIN_PATTERN)
_CONFIG_MAP_KEY = re.compile(CONFIG_MAP_KEY_PATTERN)


def _config_map_ref_errors(ref: Mapping[str, Any]) -> list[SpecError]:
    """What is wrong with a configMapRef's name and key, at their `spec.` paths."""
    path = "spec.model.configMapRef"
    errors = []
    name = ref.get("name")
    if name is None:
        errors.append(SpecError(f"{path}.name", "is required: the ConfigMap's name"))
    elif not _is(name, _CONFIG_MAP_NAME):
        errors.append(
            SpecError(
                f"{path}.name",
                f"must be a ConfigMap name: a DNS-1123 subdomain (lower-case letters, digits, "
                f"'-' and '.', starting and ending alphanumeric, at most "
                f"{CONFIG_MAP_MAX_LENGTH} characters), got {name!r}",
            )
        )
    key = ref.get("key", DEFAULT_CONFIG_KEY)
    if key is None:
        errors.append(_null(f"{path}.key", None))
    elif not _is(key, _CONFIG_MAP_KEY):
        errors.append(
            SpecError(
                f"{path}.key",
                f"must be a ConfigMap key: letters, digits, '-', '_' and '.', not starting "
                f"with '..' nor '.' alone, at most {CONFIG_MAP_MAX_LENGTH} characters, "
                f"got {key!r}",
            )
        )
    return errors


def _is(value: object, pattern: re.Pattern[str]) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= CONFIG_MAP_MAX_LENGTH
        and pattern.fullmatch(value) is not None
    )


def validate_spec(spec: Mapping[str, Any]) -> list[SpecError]:
    """Every error in `spec`, without reading a ConfigMap (the webhook's check)."""
    return translate(spec)[1]


def translate(
    spec: object, config_map_config: Mapping[str, Any] | None = None, generic: str = "read"
) -> tuple[JobPlan | None, list[SpecError]]:
    """Read a FineTuneJob spec; returns the plan, or None and every error (`spec.` paths).

    `generic` says what becomes of a config whose family no hand reading reads: "read" it
    from the model transformers builds (`profiles.read_shape`: blocking, it may import
    torch), or "defer" it (the webhook, which never waits on that: the plan is None, as for a
    ConfigMap not fetched yet, and the operator decides). Without the trace extra either is
    the refusal."""
    if not isinstance(spec, Mapping):
        return None, [SpecError("spec", "must be an object")]
    errors: list[SpecError] = []
    objects = _objects(spec, errors)

    model_name, shape = _model(spec, objects, config_map_config, errors, generic)
    settings = _settings(objects, shape, errors)
    placement = _placement(spec, objects, errors)
    traced = settings is not None and settings.profile is Profile.TRACE
    if traced and placement["gpus"] > MAX_TRACE_GPUS:  # a refused count's stand-in is 1
        errors.append(
            SpecError(
                "spec.resources.gpus",
                f"must be less than or equal to {MAX_TRACE_GPUS} with profile Trace (one rank "
                f"is traced at the job's world size), got {placement['gpus']}",
            )
        )

    if errors or settings is None or model_name is None:
        return None, _in_spec_order(errors)
    warnings: tuple[str, ...] = ()
    if shape is not None:
        said = (f"{_in_spec(path)}: {message}" for path, message in shape.config_warnings)
        warnings = (*said, *context_warnings(shape, settings, SPEC_PATHS))
    plan = JobPlan(
        model=model_name,
        shape=shape,
        settings=settings,
        warnings=warnings,
        config=config_digest(_as_configured(spec, config_map_config)),
        **placement,
    )
    return plan, []


def _as_configured(
    spec: Mapping[str, Any], config_map_config: Mapping[str, Any] | None
) -> Mapping[str, Any]:
    """The spec as its configuration digest reads it: a ConfigMap's model as the config.json
    read from it, inline. The same model inline or from a ConfigMap is one configuration; a
    ConfigMap edited to hold another model is another."""
    if config_map_config is None or config_map_ref(spec) is None:
        return spec
    return {**spec, "model": {"config": _whole(config_map_config)}}  # plain dicts, all down


#: The parts of a FineTuneJob's spec that decide its memory, and so its configuration as the
#: learning loop keys it (`controller.learning.keys`). Not the GPU count: a job resized to
#: other counts is the same configuration, and its per-GPU ratio is what is learned; not the
#: template (its image is a key field of its own, the rest is placement).
CONFIG_FIELDS = ("model", "method", "lora", "training", "parallelism", "estimator")


def config_digest(spec: Mapping[str, Any]) -> str:
    """The configuration's key field: 12 hex digits of the SHA-256 of `CONFIG_FIELDS` with
    every default filled (FineTuneJobSpec's, the CRD's own), as canonical JSON. So a job file
    as written (`vramgate plan`), the object the API server stored with its defaults, and
    either one on another replica name one configuration. A preset is read by its own name
    (its repo id names the same one); a ConfigMap's model as the config.json it holds where
    the caller read it (`translate`), else by its reference.

    Cached by the SHA-256 of the fields' own text (a pass asks for every waiting job's, each
    pass; an inline config.json can be large, so the text itself is not kept)."""
    parts = {f: spec.get(f) for f in CONFIG_FIELDS}
    raw = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    seen = hashlib.sha256(raw.encode()).digest()
    found = _CONFIG_DIGESTS.get(seen)
    if found is None:
        if len(_CONFIG_DIGESTS) >= _CONFIG_DIGESTS_KEPT:
            _CONFIG_DIGESTS.clear()
        found = _CONFIG_DIGESTS[seen] = _normal_digest(parts)
    return found


#: Raw text's SHA-256 -> configuration digest; emptied when full (a dict of 32-byte keys).
_CONFIG_DIGESTS: dict[bytes, str] = {}
_CONFIG_DIGESTS_KEPT = 8192


def _normal_digest(parts: Mapping[str, Any]) -> str:
    model = parts.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("preset"), str):
        # A preset by its own name, not its repo id nor another case of either.
        with contextlib.suppress(SpecError):
            parts = {**parts, "model": {**model, "preset": load_preset(model["preset"]).name}}
    try:
        spec = FineTuneJobSpec.model_validate({k: v for k, v in parts.items() if v is not None})
    except ValueError:
        normal: Mapping[str, Any] = parts  # not a valid spec (no plan is made of it): as is
    else:
        normal = spec.model_dump(
            mode="json", by_alias=True, exclude_none=True, include=set(CONFIG_FIELDS)
        )
    text = json.dumps(_whole(normal), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _whole(value: Any) -> Any:
    """Whole floats as ints, all the way down: an inline config.json's `500000.0` is read as
    a float from a job file but stored as `500000` by the API server (JSON has one number
    type), and the two must name one configuration."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_whole(v) for v in value]
    return value


def estimate_plan(plan: JobPlan) -> Estimate:
    """The estimate of a plan whose model is known (SpecError otherwise), with the profile its
    spec names: raises what `controller.jobs.profiles.estimate` raises."""
    if plan.shape is None:
        raise SpecError("spec.model.configMapRef", "the ConfigMap's config.json was not read")
    return estimate(plan.shape, plan.settings, SPEC_PATHS, plan.gpus, plan.parallelism)


def needs_trace(plan: JobPlan) -> bool:
    """Whether estimating `plan` runs a traced training step (seconds to a minute, on the
    operator's trace workers) rather than a formula (milliseconds): the trace profile, and
    a calibrated job whose family calibrated hands to the trace (`calibrated_hands_to_trace`:
    a family read generically whose layers are no attention the fits price)."""
    if plan.settings.profile is Profile.TRACE:
        return True
    return (
        plan.settings.profile is Profile.CALIBRATED
        and plan.shape is not None
        and calibrated_hands_to_trace(plan.shape)
    )


#: Spec fields that change no estimate: who may run and where, not what the step holds.
#: Left out of `estimate_digest`, so suspending a job, editing its template or its queue
#: place keeps its stored estimate. A field not listed counts (a new one: estimated again).
NOT_ESTIMATED = frozenset({"template", "suspend", "admissionPolicy", "priority",
                           "priorityClassName"})  # fmt: skip
NOT_ESTIMATED_RESOURCES = frozenset({"gpuSelector", "minGPUs", "maxGPUs"})


def estimate_digest(spec: Mapping[str, Any], config: object, estimator: str) -> str:
    """sha256 (hex) of what an estimate of `spec` is computed from: the spec's fields that
    change it (all but `NOT_ESTIMATED`), the ConfigMap's model config (`config`, None when
    the spec holds its model) and `estimator`, what computed it (the caller's versions of
    vramgate and of the trace's libraries). Equal digests, equal estimates."""
    kept = {k: v for k, v in spec.items() if k not in NOT_ESTIMATED}
    resources = spec.get("resources")
    if isinstance(resources, Mapping):
        kept.pop("resources")
        counted = {k: v for k, v in resources.items() if k not in NOT_ESTIMATED_RESOURCES}
        if counted:
            kept["resources"] = counted
    text = json.dumps([kept, config, estimator], sort_keys=True, separators=(",", ":"),
                      default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


# -- helpers --------------------------------------------------------------------------------


def _objects(spec: Mapping[str, Any], errors: list[SpecError]) -> dict[str, Mapping[str, Any]]:
    """Each nested object of the spec ({} when absent or not an object), checking its keys."""
    out: dict[str, Mapping[str, Any]] = {}
    for path, model in _OBJECTS.items():
        parent, _, leaf = path.rpartition(".")
        value = out[parent].get(leaf) if parent else spec
        if value is None:
            out[path] = {}
            continue
        if not isinstance(value, Mapping):
            errors.append(SpecError(path, "must be an object"))
            out[path] = {}
            continue
        known = model.wire_names()
        for key in value:
            if key not in known:
                errors.append(_unknown_field(f"{path}.{key}", str(key), known))
        out[path] = value
    return out


def _model(
    spec: Mapping[str, Any],
    objects: dict[str, Mapping[str, Any]],
    config_map_config: Mapping[str, Any] | None,
    errors: list[SpecError],
    generic: str = "read",
) -> tuple[str | None, ModelShape | None]:
    """The model's display name and shape (None when unknown or not read)."""
    if spec.get("model") is None:
        errors.append(
            SpecError("spec.model", "is required; set one of " + ", ".join(MODEL_SOURCES))
        )
        return None, None
    if not isinstance(spec["model"], Mapping):
        return None, None  # reported with the objects
    model = objects["spec.model"]
    present = [name for name in MODEL_SOURCES if model.get(name) is not None]
    if len(present) != 1:
        got = f", got {' and '.join(present)}" if present else ""
        errors.append(
            SpecError("spec.model", "must set exactly one of " + ", ".join(MODEL_SOURCES) + got)
        )
        return None, None
    try:
        if present[0] == "preset":
            preset = model["preset"]
            if not isinstance(preset, str):
                raise SpecError("model.preset", f"must be a preset name, got {preset!r}")
            named = load_preset(preset)
            if not read_by_hand(named):  # read generically, as an inline config would be
                return named.name, _config_shape(named.config, "model.preset", generic)
            return named.name, load_shape(named.name)
        if present[0] == "config":
            if not isinstance(model["config"], Mapping):
                raise SpecError("model.config", "must be an object (a Hugging Face config.json)")
            return "inline", _config_shape(model["config"], "model.config", generic)
        ref = config_map_ref(spec)
        if ref is None:
            errors.extend(_config_map_ref_errors(objects["spec.model.configMapRef"]))
            return None, None
        if config_map_config is None:
            return ref.label, None
        return ref.label, _config_shape(config_map_config, ref.label, generic)
    except SpecError as error:
        found = error.errors if isinstance(error, SpecErrors) else [error]
        errors.extend(SpecError(_in_spec(e.field), e.message) for e in found)
        return None, None


def _config_shape(config: Mapping[str, Any], prefix: str, generic: str) -> ModelShape | None:
    """The config's shape (`translate`'s `generic` says how a family read generically is)."""
    if generic == "read":
        return read_shape(config, prefix)
    try:
        return parse_config(config, prefix=prefix)
    except UnreadFamily as refusal:
        if trace_extra_installed():
            check_generic_type(config, refusal)  # remote code: refused now, in one line
            return None  # the operator reads it off its event loop
        return read_shape(config, prefix)  # the refusal, saying what would read it


def _in_spec(field_path: str) -> str:
    """A field path of the model's config as the spec names it: the inline config and the
    preset under `spec.`, a ConfigMap's content by the ConfigMap."""
    return field_path if field_path.startswith("configmaps/") else f"spec.{field_path}"


def _settings(
    objects: dict[str, Mapping[str, Any]], shape: ModelShape | None, errors: list[SpecError]
) -> TrainingSettings | None:
    """The estimator's settings, through its own validator (`build_settings`); enum values
    are parsed first so that messages list the API's CamelCase spellings."""
    values: dict[str, object] = {}
    for name, path in SPEC_PATHS.items():
        parent, _, leaf = path.rpartition(".")
        if leaf in objects[parent]:
            values[name] = objects[parent][leaf]
    switches = values.get("switches")
    if isinstance(switches, Mapping):  # an unknown switch is reported with the objects
        known = SwitchesSpec.wire_names()
        values["switches"] = {k: v for k, v in switches.items() if k in known}
    elif switches is not None:  # so is a switches that is no object
        del values["switches"]
    if "framework" in values and not isinstance(values["framework"], str):
        # A label: null was always taken as unset; any other non-string is reported below,
        # once, with the field's bound.
        del values["framework"]
    nulls = [name for name, value in values.items() if value is None and name != "rank"]
    for name in nulls:
        errors.append(_null(SPEC_PATHS[name], _ENUMS.get(name)))
        del values[name]
    if "method" not in values and "method" not in nulls:
        errors.append(SpecError("spec.method", f"is required; allowed: {allowed(Method)}"))
    if "rank" not in values and "method" in values:
        values["rank"] = None  # no default rank: a LoRA or QLoRA job must choose one
    for name, enum in _ENUMS.items():
        if name in values:
            try:
                values[name] = enum.parse(values[name], SPEC_PATHS[name])
            except SpecError:
                errors.append(_unsupported(SPEC_PATHS[name], values.pop(name), enum))
    values.setdefault("profile", _default(EstimatorSpec, "profile"))
    settings, setting_errors = build_settings(values, SPEC_PATHS, api=True)
    errors += setting_errors
    if shape is not None and settings is not None:
        settings, model_errors = check_against_model(shape, settings, SPEC_PATHS)
        errors += model_errors
    elif shape is not None:
        errors += _model_errors_despite(shape, values, setting_errors)
    framework = objects["spec.training"].get("framework")
    if framework is not None and (
        not isinstance(framework, str) or len(framework) > FRAMEWORK_MAX_LENGTH
    ):
        errors.append(
            SpecError(
                "spec.training.framework",
                f"must be a string of at most {FRAMEWORK_MAX_LENGTH} characters, got {framework!r}",
            )
        )
    return settings


def _placement(
    spec: Mapping[str, Any], objects: dict[str, Mapping[str, Any]], errors: list[SpecError]
) -> dict[str, Any]:
    """The JobPlan fields that say how the job asks to be placed and admitted."""
    parallelism = _choice(
        spec, "parallelism", _default(FineTuneJobSpec, "parallelism"), Parallelism, errors
    )
    policy = _choice(
        spec,
        "admissionPolicy",
        _default(FineTuneJobSpec, "admission_policy"),
        AdmissionPolicy,
        errors,
    )
    resources = objects["spec.resources"]
    before = len(errors)
    gpus = resources.get("gpus", _default(ResourcesSpec, "gpus"))
    gpus = int_in_range(gpus, "spec.resources.gpus", 1, MAX_GPUS, errors)
    min_gpus = int_in_range(
        resources.get("minGPUs", 1), "spec.resources.minGPUs", 1, MAX_GPUS, errors
    )
    max_gpus = resources.get("maxGPUs")
    if max_gpus is not None:
        max_gpus = int_in_range(max_gpus, "spec.resources.maxGPUs", 1, MAX_GPUS, errors)
        if max_gpus < min_gpus:
            errors.append(
                SpecError(
                    "spec.resources.maxGPUs",
                    f"must be greater than or equal to minGPUs ({min_gpus}), got {max_gpus}",
                )
            )
    if len(errors) == before:  # a refused count's stand-in would make a second, false error
        errors.extend(_outside_bounds(gpus, min_gpus, max_gpus))
    priority = int_in_range(
        spec.get("priority", 0), "spec.priority", -MAX_PRIORITY, MAX_PRIORITY, errors
    )
    class_name = spec.get("priorityClassName")
    if class_name is not None and not _is(class_name, _CONFIG_MAP_NAME):
        errors.append(
            SpecError(
                "spec.priorityClassName",
                f"must be a PriorityClass name: a DNS-1123 subdomain (lower-case letters, "
                f"digits, '-' and '.', starting and ending alphanumeric, at most 253 "
                f"characters), got {class_name!r}",
            )
        )
    selector = resources.get("gpuSelector") or {}
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        errors.append(
            SpecError("spec.resources.gpuSelector", "must be a map of node label names to strings")
        )
        selector = {}
    suspend = spec.get("suspend", _default(FineTuneJobSpec, "suspend"))
    if not isinstance(suspend, bool):
        errors.append(SpecError("spec.suspend", f"must be true or false, got {suspend!r}"))
    template = spec.get("template")
    if template is not None and not isinstance(template, Mapping):
        errors.append(SpecError("spec.template", "must be an object (a PodTemplateSpec)"))
    return {
        "parallelism": parallelism,
        "gpus": gpus,
        "min_gpus": min_gpus,
        "max_gpus": max_gpus,
        "priority": priority,
        "priority_class_name": class_name if isinstance(class_name, str) else None,
        "admission_policy": policy,
        "suspend": suspend is True,
        "gpu_selector": dict(selector),
    }


def _outside_bounds(gpus: int, low: int, high: int | None) -> list[SpecError]:
    """The request must lie in Resize's bounds: the admission core tries the requested count
    first, so a request outside them would be admitted as asked."""
    if high is not None and not low <= gpus <= high:
        return [
            SpecError(
                "spec.resources.gpus",
                f"must be between minGPUs ({low}) and maxGPUs ({high}), got {gpus}",
            )
        ]
    if gpus < low:
        return [
            SpecError(
                "spec.resources.gpus",
                f"must be greater than or equal to minGPUs ({low}), got {gpus}",
            )
        ]
    return []


def _model_errors_despite(
    shape: ModelShape, values: dict[str, object], setting_errors: list[SpecError]
) -> list[SpecError]:
    """The checks that need the model (target modules, a 4-bit checkpoint) while other
    settings are invalid: those are left at their defaults for the check, so that a bad rank
    does not hide an unknown target module."""
    bad = {error.field for error in setting_errors}
    valid = {k: v for k, v in values.items() if SPEC_PATHS[k] not in bad}
    settings, _ = build_settings(valid, SPEC_PATHS)
    if settings is None:
        return []
    return [e for e in check_against_model(shape, settings, SPEC_PATHS)[1] if e.field not in bad]


def _null(path: str, api_enum: type[StrEnum] | None) -> SpecError:
    """A field written as null: an error, not the default, since null is not a value the
    API offers (the API server prunes it; a raw spec must say what it means)."""
    if api_enum is None:
        return SpecError(path, "must not be null; leave it out for the default")
    return SpecError(path, f"must be one of {allowed(api_enum)}, got null")


def _default(model: type[ApiModel], name: str) -> Any:
    """The API's default of `model.name`: what the API server writes into a spec without it."""
    return model.model_fields[name].default


def _unsupported(path: str, value: object, api_enum: type[StrEnum]) -> SpecError:
    return SpecError(path, f"unsupported value {value!r}; allowed: {allowed(api_enum)}")


def _unknown_field(path: str, key: str, known: list[str]) -> SpecError:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return SpecError(path, f"unknown field{hint}; allowed: {', '.join(known)}")


def _normal(text: str) -> str:
    return text.lower().replace("-", "").replace("_", "")


def _choice(
    spec: Mapping[str, Any],
    key: str,
    default: C,
    enum: type[C],
    errors: list[SpecError],
) -> C:
    """The member of `enum` that `spec[key]` spells as the API does (case, `-` and `_` aside)."""
    if key not in spec:
        return default
    value = spec[key]
    if value is None:
        errors.append(_null(f"spec.{key}", enum))
        return default
    if isinstance(value, str):
        for member in enum:
            if _normal(api_spelling(member)) == _normal(value):
                return member
    errors.append(_unsupported(f"spec.{key}", value, enum))
    return default


_SPEC_ORDER = {name: index for index, name in enumerate(FineTuneJobSpec.wire_names())}


def _in_spec_order(errors: list[SpecError]) -> list[SpecError]:
    """Errors in the order of the spec's fields (stable within a field), so that messages do
    not reorder between runs or between the webhook and the operator."""

    def rank(error: SpecError) -> int:
        parts = error.field.split(".")
        top = parts[1] if parts[0] == "spec" and len(parts) > 1 else "model"
        return _SPEC_ORDER.get(top, len(_SPEC_ORDER))

    return sorted(errors, key=rank)
