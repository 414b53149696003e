"""What `controller.operator.run` is given, with defaults for a local run.

Users set these through `controller.operator.settings` (flags, environment, config file);
this is the result in the types the operator works with. Kept apart from `run` so that
building the CLI parser does not import kopf.
"""

from __future__ import annotations

import socket
import tempfile
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from controller.api.base import GROUP
from controller.base.errors import DeploymentError
from controller.decision import AdmissionSettings

DEFAULT_WEBHOOK_PORT = 9443
DEFAULT_WEBHOOK_CONFIG = GROUP
#: The Service name the Helm chart gives the webhook, so a generated cert covers it.
DEFAULT_SERVICE_DNS = ("vramgate-webhook.vramgate.svc",)
DEFAULT_CERT_DIR = Path(tempfile.gettempdir()) / "vramgate-webhook"
DEFAULT_LEASE = "vramgate-operator"


class StartupError(DeploymentError):
    """The operator cannot start (no credentials, unusable certificate directory)."""


class WebhookMode(StrEnum):
    MANAGED = "managed"
    SERVE = "serve"
    OFF = "off"


@dataclass(frozen=True)
class OperatorOptions:
    """Everything `vramgate operator` can be told; defaults suit a local run."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace
    webhook: WebhookMode = WebhookMode.MANAGED
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = DEFAULT_WEBHOOK_PORT
    webhook_host: str | None = None  # host in the registered URL; default: the address
    webhook_config: str = DEFAULT_WEBHOOK_CONFIG
    cert_dir: Path = DEFAULT_CERT_DIR
    cert_hosts: tuple[str, ...] = DEFAULT_SERVICE_DNS
    #: The kubernetes.io/tls Secret the certificate lives in (`controller.webhook.cert_secret`);
    #: None: the files in cert_dir only.
    cert_secret_name: str | None = None
    #: The operator's own namespace ($POD_NAMESPACE): where the certificate Secret lives.
    own_namespace: str = "default"
    configmap_retry_s: float = 30.0
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    resync_s: float = 10.0
    #: Leader election on a Lease (off: this replica decides alone; for one-replica runs).
    leader_election: bool = True
    lease_namespace: str = "default"
    lease_name: str = DEFAULT_LEASE
    #: The Lease holder's name: the pod's name in a cluster (a restarted container takes its
    #: own Lease back at once), the host name and process id elsewhere.
    identity: str = field(default_factory=lambda: socket.gethostname())
    liveness: str | None = None  # kopf's liveness endpoint, e.g. http://0.0.0.0:8081/healthz
    metrics_addr: str = "0.0.0.0"
    metrics_port: int = 8080  # /metrics; 0: any free port
    verbose: bool = False
    debug: bool = False
