"""Configure and start the kopf operator: `vramgate operator`.

Choices, each with its reason:

* **Progress and diff-base in annotations** (`vramgate.dev/...`), not in `status.kopf`: the
  CRD's structural schema prunes unknown status fields, so kopf's status storage would lose
  its state on every write and loop; annotations survive and are visible to people. The
  estimate handler finishes in one pass, so progress annotations exist only while a
  ConfigMap retry is pending.
* **Standalone** (no peering objects): one replica for now; peering comes with HA.
* **Webhook modes**: `managed` serves the webhook and lets kopf keep a
  ValidatingWebhookConfiguration pointing at it (removed again at a clean exit), for local
  runs and tests; `serve` only serves it (the Helm chart registers a Service-backed
  configuration); `off` runs without a webhook, and the operator alone reports invalid specs.
"""

from __future__ import annotations

import logging

import kopf
from kubernetes import client, config

from controller.api.base import GROUP
from controller.operator import handlers
from controller.operator.options import OperatorOptions, StartupError, WebhookMode
from controller.webhook.certs import ensure_serving_cert

DIFFBASE_KEY = "last-handled-configuration"


def webhook_server(options: OperatorOptions) -> kopf.WebhookServer:
    """kopf's HTTPS server with a certificate from `controller.webhook.certs`."""
    hosts = [*options.cert_hosts]
    if options.webhook_host:
        hosts.append(options.webhook_host)
    if options.webhook_addr not in ("0.0.0.0", "::", ""):
        hosts.append(options.webhook_addr)
    cert = ensure_serving_cert(options.cert_dir, hosts)
    return kopf.WebhookServer(
        addr=options.webhook_addr,
        port=options.webhook_port,
        host=options.webhook_host,
        certfile=str(cert.cert),
        pkeyfile=str(cert.key),
        cafile=str(cert.ca),
    )


def operator_settings(options: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key=DIFFBASE_KEY
    )
    if options.webhook is not WebhookMode.OFF:
        settings.admission.server = webhook_server(options)
    if options.webhook is WebhookMode.MANAGED:
        settings.admission.managed = options.webhook_config
    return settings


def build_registry(options: OperatorOptions) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    # A bare registry has no login handlers (only kopf's implicit default one does): log in
    # through the kubernetes client, in-cluster first, then $KUBECONFIG.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    handlers.register(
        registry,
        validating_webhook=options.webhook is not WebhookMode.OFF,
        configmap_retry_s=options.configmap_retry_s,
    )
    return registry


def _core_api() -> client.CoreV1Api:
    """A client for the reads handlers make: in-cluster credentials, else $KUBECONFIG."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as error:
            raise StartupError(f"no Kubernetes credentials: {error}") from None
    return client.CoreV1Api()


def run(options: OperatorOptions) -> int:
    """Run until SIGINT/SIGTERM; kopf then removes a managed webhook and exits."""
    core = _core_api()
    # log_prefix: every object's log line starts with [namespace/name].
    kopf.configure(verbose=options.verbose, debug=options.debug, log_prefix=True)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    try:
        settings = operator_settings(options)
    except OSError as error:
        raise StartupError(f"--cert-dir: cannot use {options.cert_dir}: {error}") from None
    kopf.run(
        registry=build_registry(options),
        settings=settings,
        clusterwide=not options.namespaces,
        namespaces=options.namespaces,
        standalone=True,
        liveness_endpoint=options.liveness,
        memo=kopf.Memo(core=core),
    )
    return 0
