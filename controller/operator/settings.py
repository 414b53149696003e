"""The operator's settings: one typed model; flag > environment > config file > default.

Loaded like the agent's (`controller.base.settings`): ``--webhook-port``,
``VRAMGATE_OPERATOR_WEBHOOK_PORT`` and ``webhookPort:`` in the ``--config`` file (or
``$VRAMGATE_OPERATOR_CONFIG``) set the same field, so the Helm chart renders every setting
into one ConfigMap. The command line of earlier releases keeps working: ``-n`` /
``--namespace`` and ``--cert-host`` are the list fields' flags, and ``-A``, ``--liveness
URL``, ``-v`` and ``--debug`` are shorthands for ``namespaces: []``, ``probeAddr`` /
``probePort`` and ``logLevel``.

One shape, one set of defaults: `OperatorSettings` is what users set, each default stated
once, there (the admission fields' defaults are the pure core's, `AdmissionConfig`);
`OperatorOptions` is the same in the types `controller.operator.run` works with, its
defaults read from `DEFAULTS`. Kept apart from `run` so that building the CLI parser does
not import kopf.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from controller.admission.config import SHOWN_DEFAULTS, AdmissionConfig, NamespaceName
from controller.api.base import GROUP
from controller.base.settings import MAX_SECONDS, Flag, SettingsError, SettingsLoader
from controller.decision import AdmissionSettings
from controller.learning import LearningSettings
from controller.packing.inventory import GpuMode

ENV_PREFIX = "VRAMGATE_OPERATOR_"
PROBE_PATH = "/healthz"
#: The Service name the Helm chart gives the webhook, so a generated cert covers it.
DEFAULT_SERVICE_DNS = ("vramgate-webhook.vramgate.svc",)
__all__ = [
    "DEFAULTS",
    "OperatorOptions",
    "OperatorSettings",
    "SettingsError",
    "WebhookMode",
    "add_arguments",
    "load_options",
    "load_settings",
]


class WebhookMode(StrEnum):
    MANAGED = "managed"
    SERVE = "serve"
    OFF = "off"


LogLevel = Literal["info", "verbose", "debug"]


def _process_identity() -> str:
    """Outside a pod: the host name alone would be shared by two operators run side by side
    on one machine, and both would hold the Lease as the same holder."""
    return f"{socket.gethostname()}-{os.getpid()}"


class OperatorSettings(AdmissionConfig):
    """Settings of ``vramgate operator``; each description says what it does and why its
    default. The admission settings (`AdmissionConfig`, shared with ``vramgate plan``) come
    first."""

    namespaces: Annotated[
        list[NamespaceName],
        Flag("-n", "--namespace", metavar="NAMESPACE"),
    ] = Field(
        default_factory=list,
        description="namespaces whose FineTuneJobs are watched; empty: every namespace, since "
        "one operator serves the whole cluster's GPUs (listed, pods are seen only there too: "
        "a GPU given to an idle pod elsewhere looks free).",
    )
    webhook: WebhookMode = Field(
        WebhookMode.MANAGED,
        description="managed: serve the webhook and register it (local runs); serve: serve "
        "only, the chart registers it; off: no webhook. managed needs no chart at all.",
    )
    webhook_addr: str = Field(
        "0.0.0.0", description="listen address of the webhook; every interface, for a Service."
    )
    webhook_port: int = Field(
        9443,
        ge=0,
        le=65535,
        description="HTTPS port of the webhook (0: any free port, logged; webhook managed "
        "registers it); 9443 is the convention of Kubernetes webhooks and needs no privilege.",
    )
    webhook_host: str | None = Field(
        None, description="host in the URL a managed webhook registers; default: the address."
    )
    webhook_config_name: str = Field(
        GROUP,
        description="name of the Validating- and MutatingWebhookConfiguration: the operator "
        "registers them in managed mode and injects their caBundle in serve mode.",
    )
    cert_dir: Path = Field(
        Path(tempfile.gettempdir()) / "vramgate-webhook",
        description="directory of the webhook's tls.crt, tls.key and ca.crt; generated when "
        "absent, so a local run needs nothing. Must be writable with certSecretName.",
    )
    cert_hosts: Annotated[list[str], Flag("--cert-host", metavar="HOST")] = Field(
        default_factory=lambda: list(DEFAULT_SERVICE_DNS),
        description="DNS names or IPs a generated certificate covers besides 127.0.0.1 and "
        "localhost; the default is the chart's webhook Service.",
    )
    cert_secret_name: str | None = Field(
        None,
        description="kubernetes.io/tls Secret in the operator's namespace that holds the "
        "webhook certificate, generated and rotated by the operator (serve mode); none: the "
        "files in certDir only (cert-manager mounts its Secret there).",
    )
    configmap_retry_seconds: float = Field(
        30.0,
        gt=0,
        le=MAX_SECONDS,
        description="retry interval while a job's ConfigMap cannot be read, and how often a "
        "waiting job's ConfigMap is read again; a missing ConfigMap is usually created, and a "
        "wrong one fixed, within seconds to minutes.",
    )
    trace_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="traced estimates (profile Trace) run at once, each on a thread of its "
        "own beside the formula estimates, which never wait for them: a trace holds about a "
        "core and up to 1 GiB of memory for seconds to a minute, so 1 keeps the operator "
        "within its resources; raise it with its CPU and memory for many Trace jobs.",
    )
    resync_seconds: float = Field(
        10.0,
        gt=0,
        le=MAX_SECONDS,
        description="an admission pass at least this often, events or not, so a missed "
        "event delays a decision by seconds only.",
    )
    leader_election: bool = Field(
        True,
        description="decide only while holding a Lease, so two replicas never decide at "
        "once; off only for a single replica.",
    )
    lease_namespace: str = Field(
        "default",
        min_length=1,
        description="namespace of the Lease, and of the certificate Secret when "
        "$POD_NAMESPACE is unset; the pod's own namespace in a cluster.",
    )
    lease_name: str = Field(
        "vramgate-operator", min_length=1, description="name of the Lease the replicas share."
    )
    identity: str = Field(
        default_factory=_process_identity,
        min_length=1,
        description="this replica's name in the Lease; the pod's name, so a restarted "
        "container takes its own Lease back at once.",
    )
    metrics_addr: str = Field("0.0.0.0", description="address of the Prometheus endpoint /metrics.")
    metrics_port: int = Field(
        8080,
        ge=0,
        le=65535,
        description="port of /metrics (0: any free port); 8080 is the usual metrics port.",
    )
    probe_addr: str = Field(
        "0.0.0.0", description="address of the liveness probe /healthz, for the kubelet."
    )
    probe_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="port of /healthz (0: any free port); 8081, beside the metrics.",
    )
    kueue_admission_check: bool = Field(
        False,
        description="answer Kueue's AdmissionChecks whose controllerName is vramgate.dev/vram "
        "(needs Kueue's CRDs): Kueue keeps quotas, vramgate checks GPU memory in one ledger "
        "with its FineTuneJobs; off by default, since most clusters do not run Kueue.",
    )
    kueue_retry_seconds: int = Field(
        30,
        ge=1,
        le=3600,
        description="requeueAfterSeconds of a Kueue Workload that waits for GPU memory: how "
        "long Kueue waits before it reserves quota and asks again; memory frees as jobs end, "
        "minutes apart, and each ask costs Kueue a quota reservation.",
    )
    train_job_sizing: bool = Field(
        False,
        description="size Kubeflow Trainer's TrainJobs (trainer.kubeflow.org/v1alpha1) that "
        "carry the annotation vramgate.dev/finetune or vramgate.dev/admission-policy when they "
        "are created, the one time their "
        "trainer may change, in the mutating webhook; off by default, since most clusters do "
        "not run Kubeflow Trainer.",
    )
    train_job_hold_seconds: int = Field(
        600,
        ge=0,
        le=3600,
        description="how long at most the TrainJob webhook holds the GPU memory a TrainJob was "
        "sized onto at its create, for the TrainJobs sized after it and the FineTuneJobs "
        "admitted meanwhile (0: none held); a hold ends sooner once its pods' memory shows "
        "in the GPUNodes. 600 s: a runtime's dataset and model initializers run before its "
        "trainer, whose GPU pods start only after the download, often minutes after the "
        "create; short enough that a TrainJob refused or deleted after its create holds "
        "nothing for long. Each replica holds only what it sized; only the leader's holds "
        "keep FineTuneJobs off that memory.",
    )
    log_level: LogLevel = Field(
        "info",
        description="info: decisions and problems; verbose: each handler call; debug: "
        "everything kopf does. info because handler lines cost CPU on a busy cluster.",
    )

    @model_validator(mode="after")
    def _kueue_needs_the_device_plugin(self) -> OperatorSettings:
        if self.kueue_admission_check and self.gpu_mode is not GpuMode.DEVICE_PLUGIN:
            raise ValueError(
                "kueueAdmissionCheck: needs gpuMode devicePlugin (a Kueue Workload's GPUs are "
                f"its pods' nvidia.com/gpu requests), got gpuMode {self.gpu_mode.value}"
            )
        return self

    @model_validator(mode="after")
    def _train_job_sizing_needs_the_webhook(self) -> OperatorSettings:
        if self.train_job_sizing and self.webhook is WebhookMode.OFF:
            raise ValueError(
                "trainJobSizing: needs the webhook (webhook managed or serve): TrainJobs are "
                "sized by the mutating webhook when they are created, got webhook off"
            )
        if self.train_job_sizing and self.gpu_mode is not GpuMode.DEVICE_PLUGIN:
            raise ValueError(
                "trainJobSizing: needs gpuMode devicePlugin (a TrainJob's GPUs are its pods' "
                f"nvidia.com/gpu requests), got gpuMode {self.gpu_mode.value}"
            )
        return self

    def options(self, environ: Mapping[str, str] = os.environ) -> OperatorOptions:
        """What `controller.operator.run` needs, in its own types."""
        return OperatorOptions(
            namespaces=tuple(self.namespaces),
            webhook=self.webhook,
            webhook_addr=self.webhook_addr,
            webhook_port=self.webhook_port,
            webhook_host=self.webhook_host,
            webhook_config=self.webhook_config_name,
            cert_dir=self.cert_dir,
            cert_hosts=tuple(self.cert_hosts),
            cert_secret_name=self.cert_secret_name,
            own_namespace=environ.get("POD_NAMESPACE") or self.lease_namespace,
            configmap_retry_s=self.configmap_retry_seconds,
            trace_workers=self.trace_workers,
            admission=self.admission(),
            learning=self.learning(),
            resync_s=self.resync_seconds,
            leader_election=self.leader_election,
            lease_namespace=self.lease_namespace,
            lease_name=self.lease_name,
            identity=self.identity,
            probe_addr=self.probe_addr,
            probe_port=self.probe_port,
            metrics_addr=self.metrics_addr,
            metrics_port=self.metrics_port,
            log_level=self.log_level,
            kueue_admission_check=self.kueue_admission_check,
            kueue_retry_seconds=self.kueue_retry_seconds,
            train_job_sizing=self.train_job_sizing,
            train_job_hold_s=self.train_job_hold_seconds,
        )


#: Every setting at its default: what the dataclasses that carry settings further
#: (`OperatorOptions`, `controller.operator.scheduler.SchedulerOptions`) default to.
DEFAULTS = OperatorSettings()


@dataclass(frozen=True)
class OperatorOptions:
    """Everything `vramgate operator` can be told (`OperatorSettings.options`), in the types
    the operator works with; the defaults are the settings' own, a local run's."""

    namespaces: tuple[str, ...] = tuple(DEFAULTS.namespaces)  # empty: every namespace
    webhook: WebhookMode = DEFAULTS.webhook
    webhook_addr: str = DEFAULTS.webhook_addr
    webhook_port: int = DEFAULTS.webhook_port
    webhook_host: str | None = DEFAULTS.webhook_host  # host in the registered URL
    webhook_config: str = DEFAULTS.webhook_config_name
    cert_dir: Path = DEFAULTS.cert_dir
    cert_hosts: tuple[str, ...] = tuple(DEFAULTS.cert_hosts)
    #: The kubernetes.io/tls Secret the certificate lives in (`controller.webhook.cert_secret`);
    #: None: the files in cert_dir only.
    cert_secret_name: str | None = DEFAULTS.cert_secret_name
    #: The operator's own namespace ($POD_NAMESPACE, else the Lease's): where the certificate
    #: Secret lives.
    own_namespace: str = DEFAULTS.lease_namespace
    configmap_retry_s: float = DEFAULTS.configmap_retry_seconds
    trace_workers: int = DEFAULTS.trace_workers
    admission: AdmissionSettings = field(default_factory=DEFAULTS.admission)
    learning: LearningSettings = field(default_factory=DEFAULTS.learning)
    resync_s: float = DEFAULTS.resync_seconds
    #: Leader election on a Lease (off: this replica decides alone; for one-replica runs).
    leader_election: bool = DEFAULTS.leader_election
    lease_namespace: str = DEFAULTS.lease_namespace
    lease_name: str = DEFAULTS.lease_name
    #: The Lease holder's name: the pod's name in a cluster (a restarted container takes its
    #: own Lease back at once), the host name and process id elsewhere.
    identity: str = field(default_factory=_process_identity)
    probe_addr: str = DEFAULTS.probe_addr
    probe_port: int = DEFAULTS.probe_port
    metrics_addr: str = DEFAULTS.metrics_addr
    metrics_port: int = DEFAULTS.metrics_port  # /metrics; 0: any free port
    log_level: LogLevel = DEFAULTS.log_level
    #: Answer Kueue's AdmissionChecks of controllerName vramgate.dev/vram (`admission.kueue`).
    kueue_admission_check: bool = DEFAULTS.kueue_admission_check
    kueue_retry_seconds: int = DEFAULTS.kueue_retry_seconds
    #: Size TrainJobs at create in the mutating webhook (`controller.webhook.trainjob`).
    train_job_sizing: bool = DEFAULTS.train_job_sizing
    #: How long a TrainJob's hold lasts at most (`controller.webhook.trainjob.TrainJobHolds`).
    train_job_hold_s: float = DEFAULTS.train_job_hold_seconds

    @property
    def liveness(self) -> str:
        """kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz."""
        host = f"[{self.probe_addr}]" if ":" in self.probe_addr else self.probe_addr
        return f"http://{host}:{self.probe_port}{PROBE_PATH}"

    @property
    def verbose(self) -> bool:
        return self.log_level in ("verbose", "debug")

    @property
    def debug(self) -> bool:
        return self.log_level == "debug"


LOADER = SettingsLoader(
    OperatorSettings,
    ENV_PREFIX,
    typed_flags=True,
    shown_defaults={
        "namespaces": "none (every namespace)",
        "cert_hosts": ",".join(DEFAULT_SERVICE_DNS),
        **SHOWN_DEFAULTS,
        "lease_namespace": "$POD_NAMESPACE, else default",
        "identity": "$POD_NAME, else HOSTNAME-PID",
    },
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, and the shorthands earlier releases had."""
    LOADER.add_arguments(parser, example="webhookPort: 9443")
    parser.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch every namespace: namespaces: [] (the default)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help=f"http://ADDR:PORT{PROBE_PATH}: sets --probe-addr and --probe-port",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="--log-level verbose")
    parser.add_argument("--debug", action="store_true", help="--log-level debug")


def load_settings(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> OperatorSettings:
    """Merge flag > env > config file > default; the shorthands count as flags."""
    implied: dict[str, tuple[Any, str]] = {}
    if getattr(args, "all_namespaces", False):
        if args.namespaces:
            raise SettingsError("-A/--all-namespaces: not allowed with -n/--namespace")
        implied["namespaces"] = ([], "-A/--all-namespaces")
    if getattr(args, "liveness", None):
        implied.update(_probe_from_url(args.liveness))
    if getattr(args, "debug", False):
        implied["log_level"] = ("debug", "--debug")
    elif getattr(args, "verbose", False):
        implied["log_level"] = ("verbose", "--verbose")
    defaults = {
        "lease_namespace": environ.get("POD_NAMESPACE") or "default",
        "identity": environ.get("POD_NAME") or _process_identity(),
    }
    return LOADER.load(args, environ, defaults=defaults, flags=implied)


def load_options(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> OperatorOptions:
    return load_settings(args, environ).options(environ)


def _probe_from_url(url: str) -> dict[str, tuple[Any, str]]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme != "http"
        or not parts.hostname
        or port is None
        or parts.path not in ("", PROBE_PATH)
    ):
        raise SettingsError(f"--liveness: must be http://ADDR:PORT{PROBE_PATH}, got {url!r}")
    return {"probe_addr": (parts.hostname, "--liveness"), "probe_port": (port, "--liveness")}
