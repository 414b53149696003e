"""The agent's settings: one typed model; flag > environment > config file > default.

Why one model for all three sources: every setting gets its flag (``--poll-interval-seconds``),
its environment variable (``VRAMGATE_AGENT_POLL_INTERVAL_SECONDS``) and its config-file key
(``pollIntervalSeconds``, camelCase like the rest of the API) from its field name, and its
``--help`` text from its description, so the four cannot drift apart. Bad values fail at
start with one line naming where the value came from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from controller.agent.sizes import ByteSize
from controller.errors import DeploymentError

ENV_PREFIX = "VRAMGATE_AGENT_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
MIB = 2**20


class SettingsError(DeploymentError):
    """Bad configuration: one line naming the setting, its source and what it allows."""


class AgentSettings(BaseModel):
    """Settings of ``vramgate agent``; each description says what it does and why its default."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    node_name: str = Field(
        min_length=1, max_length=253,
        description="name of the Node this agent runs on; its GPUNode gets the same name. "
        "Required: in a DaemonSet, set it from spec.nodeName with the downward API.",
    )
    backend: Literal["nvml", "dcgm", "static"] = Field(
        "nvml",
        description="where GPU memory is read: nvml (the driver's library, needs the NVIDIA "
        "container runtime), dcgm (an existing dcgm-exporter), or static (a file).",
    )
    static_file: Path | None = Field(
        None, description="YAML or JSON file of GPUs for --backend static; re-read every poll."
    )
    dcgm_url: str = Field(
        "http://localhost:9400/metrics",
        description="dcgm-exporter's metrics URL for --backend dcgm; 9400 is its default port "
        "(hostNetwork or a node-local Service).",
    )
    dcgm_host: str | None = Field(
        None,
        description="keep only dcgm-exporter series whose Hostname label is this; defaults to "
        "--node-name, so a URL that reaches another node's exporter is an error, not data.",
    )
    dcgm_timeout_seconds: float = Field(
        5.0, gt=0, description="timeout of one dcgm-exporter scrape."
    )
    poll_interval_seconds: float = Field(
        5.0, gt=0,
        description="how often the GPUs are read; an NVML read costs milliseconds, and a job's "
        "memory ramps over seconds.",
    )
    heartbeat_interval_seconds: float = Field(
        30.0, gt=0,
        description="longest time between two GPUNode writes; the operator treats an older "
        "heartbeat as stale. 30 s bounds the steady write rate at 1/30 per second per node.",
    )
    change_threshold_bytes: ByteSize = Field(
        256 * MIB,
        description="a change of free, used, total or per-pod memory larger than this is "
        "written at once (bytes, or a size like 256MiB); smaller jitter waits for the "
        "heartbeat. 256 MiB is far below any training job's footprint.",
    )
    backoff_initial_seconds: float = Field(
        1.0, gt=0, description="first retry delay after a failed read or write; doubles."
    )
    backoff_max_seconds: float = Field(
        60.0, gt=0, description="longest retry delay, so a healed API server is seen quickly."
    )
    metrics_address: str = Field(
        "0.0.0.0", description="address of the Prometheus metrics endpoint."
    )
    metrics_port: int = Field(
        9402, ge=0, le=65535,
        description="port of the Prometheus metrics endpoint (0: any free port); 9402 sits "
        "beside dcgm-exporter's 9400.",
    )
    proc_root: Path = Field(
        Path("/proc"),
        description="the host's /proc, to map GPU processes to pods through their cgroups; "
        "needs hostPID, or the host's /proc mounted here.",
    )
    kubeconfig: Path | None = Field(
        None,
        description="kubeconfig file; default: the in-cluster ServiceAccount, else $KUBECONFIG "
        "or ~/.kube/config.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="log verbosity."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AgentSettings:
        if self.backend == "static" and self.static_file is None:
            raise ValueError("--static-file is required with --backend static")
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoffMaxSeconds must not be less than backoffInitialSeconds")
        if self.heartbeat_interval_seconds < self.poll_interval_seconds:
            raise ValueError("heartbeatIntervalSeconds must not be less than "
                             "pollIntervalSeconds")
        return self


FIELDS = list(AgentSettings.model_fields)
DEFAULTS_SHOWN = {"change_threshold_bytes": "256MiB"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def key(name: str) -> str:
    return to_camel(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; its help names the environment variable and the default."""
    parser.add_argument(
        "--config", metavar="FILE",
        help=f"YAML config file of camelCase keys, e.g. pollIntervalSeconds: 5 (env {CONFIG_ENV})",
    )
    for name, info in AgentSettings.model_fields.items():
        shown = DEFAULTS_SHOWN.get(name, info.default)
        default = "" if info.is_required() or shown is None else f"; default {shown}"
        choices = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        parser.add_argument(
            flag(name), dest=name,
            metavar="|".join(choices) if choices else name.split("_")[-1].upper(),
            help=f"{info.description} (env {env_var(name)}{default})",
        )


def _read_config(path: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as error:
        raise SettingsError(f"{source}: cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"{source}: {path} is not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: {path} must hold a mapping of camelCase keys")
    by_key = {key(name): name for name in FIELDS}
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        raise SettingsError(
            f"{path}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(by_key))}"
        )
    return {by_key[k]: v for k, v in data.items()}


def load_settings(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> AgentSettings:
    """Merge the sources (flag > env > config file > default) and validate once."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config = args.config or environ.get(CONFIG_ENV)
    if config:
        where = "--config" if args.config else CONFIG_ENV
        for name, value in _read_config(config, where).items():
            values[name], sources[name] = value, f"{key(name)} in {config}"
    for name in FIELDS:
        if env_var(name) in environ:
            values[name], sources[name] = environ[env_var(name)], env_var(name)
        if getattr(args, name, None) is not None:
            values[name], sources[name] = getattr(args, name), flag(name)
    try:
        return AgentSettings.model_validate(values)
    except ValidationError as error:
        raise SettingsError(_one_line(error, values, sources)) from None


def _one_line(error: ValidationError, values: dict[str, Any], sources: dict[str, str]) -> str:
    first = error.errors()[0]
    message = first["msg"].replace("Input should be", "must be").replace("Value error, ", "")
    if not first["loc"]:
        return message
    name = {key(n): n for n in FIELDS}.get(str(first["loc"][0]), str(first["loc"][0]))
    if first["type"] == "missing":
        return (f"{flag(name)} is required (or {env_var(name)}, or {key(name)} in the "
                "config file)")
    return f"{sources.get(name, flag(name))}: {message}, got {values.get(name)!r}"
