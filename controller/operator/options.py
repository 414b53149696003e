"""What `vramgate operator` can be told, with defaults for a local run.

Kept apart from `run` so that building the CLI parser does not import kopf.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from controller.api.base import GROUP
from controller.errors import DeploymentError

DEFAULT_WEBHOOK_PORT = 9443
DEFAULT_WEBHOOK_CONFIG = GROUP
#: The Service name the Helm chart gives the webhook, so a generated cert covers it.
DEFAULT_SERVICE_DNS = ("vramgate-webhook.vramgate.svc",)
DEFAULT_CERT_DIR = Path(tempfile.gettempdir()) / "vramgate-webhook"


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
    configmap_retry_s: float = 30.0
    liveness: str | None = None  # e.g. http://0.0.0.0:8080/healthz
    verbose: bool = False
    debug: bool = False
