"""The agent's settings: one typed model; flag > environment > config file > default.

Every setting gets its flag (``--poll-interval-seconds``), its environment variable
(``VRAMGATE_AGENT_POLL_INTERVAL_SECONDS``) and its config-file key (``pollIntervalSeconds``)
from its field name, through the loader the operator shares (`controller.base.settings`), so the
agent and the operator are configured the same way.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from controller.base.settings import MAX_SECONDS, SettingsError, SettingsLoader
from controller.base.units import MIB, Bytes

ENV_PREFIX = "VRAMGATE_AGENT_"
__all__ = ["AgentSettings", "SettingsError", "add_arguments", "load_settings"]


class AgentSettings(BaseModel):
    """Settings of ``vramgate agent``; each description says what it does and why its default."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    node_name: str = Field(
        min_length=1,
        max_length=253,
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
        5.0, gt=0, le=MAX_SECONDS, description="timeout of one dcgm-exporter scrape."
    )
    poll_interval_seconds: float = Field(
        5.0,
        gt=0,
        le=MAX_SECONDS,
        description="how often the GPUs are read; an NVML read costs milliseconds, and a job's "
        "memory ramps over seconds.",
    )
    heartbeat_interval_seconds: float = Field(
        30.0,
        gt=0,
        le=MAX_SECONDS,
        description="longest time between two GPUNode writes; the operator treats an older "
        "heartbeat as stale. 30 s bounds the steady write rate at 1/30 per second per node.",
    )
    change_threshold_bytes: Annotated[int, Bytes()] = Field(
        256 * MIB,
        description="a change of free, used, total or per-pod memory larger than this is "
        "written at once (bytes, or a size like 256MiB); smaller jitter waits for the "
        "heartbeat. 256 MiB is far below any training job's footprint.",
    )
    backoff_initial_seconds: float = Field(
        1.0,
        gt=0,
        le=MAX_SECONDS,
        description="first retry delay after a failed read or write; doubles.",
    )
    backoff_max_seconds: float = Field(
        60.0,
        gt=0,
        le=MAX_SECONDS,
        description="longest retry delay, so a healed API server is seen quickly.",
    )
    metrics_address: str = Field(
        "0.0.0.0", description="address of the Prometheus metrics endpoint."
    )
    metrics_port: int = Field(
        9402,
        ge=0,
        le=65535,
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
            raise ValueError("heartbeatIntervalSeconds must not be less than pollIntervalSeconds")
        return self


LOADER = SettingsLoader(
    AgentSettings, ENV_PREFIX, shown_defaults={"change_threshold_bytes": "256MiB"}
)
CONFIG_ENV = LOADER.config_env
FIELDS = list(AgentSettings.model_fields)


def flag(name: str) -> str:
    return LOADER.flag(name)


def env_var(name: str) -> str:
    return LOADER.env_var(name)


def key(name: str) -> str:
    return LOADER.key(name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; its help names the environment variable and the default."""
    LOADER.add_arguments(parser, example="pollIntervalSeconds: 5")


def load_settings(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> AgentSettings:
    """Merge the sources (flag > env > config file > default) and validate once."""
    return LOADER.load(args, environ)
