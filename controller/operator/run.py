"""Configure and start the kopf operator: `vramgate operator`.

Choices, each with its reason:

* **Progress and diff-base in annotations** (`vramgate.dev/...`), not in `status.kopf`: the
  CRD's structural schema prunes unknown status fields, so kopf's status storage would lose
  its state on every write and loop; annotations survive and are visible to people. The
  estimate handler finishes in one pass, so progress annotations exist only while a
  ConfigMap retry is pending.
* **Standalone** (no kopf peering): replicas elect one leader on a Lease (`leader.py`);
  only it decides, the others keep their caches and serve the webhook.
* **Webhook modes**: `managed` serves the webhooks and registers configurations calling
  them, the chart's own (`controller.webhook.registration`; removed again at a clean exit),
  for local runs and tests; `serve` only serves it (the Helm chart registers a Service-backed
  configuration); `off` runs without a webhook, and the operator alone reports invalid specs.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from typing import Any, cast

import kopf

from controller.api.base import GROUP
from controller.base.errors import DeploymentError
from controller.kube import Kube, api_client
from controller.operator import handlers, memory
from controller.operator.leader import Leader
from controller.operator.metrics import OperatorMetrics, start_metrics_server
from controller.operator.scheduler import Scheduler, SchedulerOptions
from controller.operator.settings import OperatorOptions, WebhookMode
from controller.webhook.cert_secret import CertSecret, CertSecretError
from controller.webhook.certs import ServingCert, ensure_serving_cert
from controller.webhook.registration import Registrar
from controller.webhook.server import ReviewServer


class StartupError(DeploymentError):
    """The operator cannot start (no credentials, unusable certificate directory)."""


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base: the operator registers no create/update/resume handlers and no daemons
    (handlers.py; a test holds it to that), the only kopf handlers that read one. kopf's own
    storages build it on every watch event anyway, a deep copy of the whole body (pods and
    Jobs included): a fifth of the event loop's time while 1,000 jobs arrive."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        pass


def cert_hosts(options: OperatorOptions) -> list[str]:
    """The names the serving certificate covers: --cert-host, the URL's host, the address."""
    hosts = [*options.cert_hosts]
    if options.webhook_host:
        hosts.append(options.webhook_host)
    if options.webhook_addr not in ("0.0.0.0", "::", ""):
        hosts.append(options.webhook_addr)
    return hosts


def webhook_server(options: OperatorOptions, cert: ServingCert | None = None) -> ReviewServer:
    """kopf's HTTPS server with `cert`, else a certificate from `controller.webhook.certs`,
    answering the reviews itself (`controller.webhook.server`)."""
    cert = cert or ensure_serving_cert(options.cert_dir, cert_hosts(options))
    return ReviewServer(
        addr=options.webhook_addr,
        port=options.webhook_port,
        host=options.webhook_host,
        certfile=str(cert.cert),
        pkeyfile=str(cert.key),
        cafile=str(cert.ca),
    )


def operator_settings(
    options: OperatorOptions, cert: ServingCert | None = None
) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Handlers' own log lines stay in the log: as Events they would cost a write per event.
    settings.posting.level = logging.WARNING
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    if options.webhook is not WebhookMode.OFF:
        settings.admission.server = webhook_server(options, cert)
    return settings


def build_registry(
    options: OperatorOptions,
    scheduler: Scheduler,
    leader: Leader | None,
    server: object = None,
) -> kopf.OperatorRegistry:
    """The handlers; `server`, when it is a `ReviewServer`, answers with their webhooks."""
    registry = kopf.OperatorRegistry()
    # A bare registry has no login handlers (only kopf's implicit default one does): log in
    # through the kubernetes client, in-cluster first, then $KUBECONFIG.
    kopf.on.login(registry=registry)(kopf.login_via_client)

    def background() -> list[Any]:
        return [scheduler.run(), memory.trim_every(), scheduler.check_holds()] + (
            [] if leader is None else [leader.run()]
        )

    trainjobs = options.train_job_sizing and options.webhook is not WebhookMode.OFF
    hook = handlers.register(
        registry,
        scheduler,
        webhooks=options.webhook is not WebhookMode.OFF,
        background=background,
        trainjobs=trainjobs,
    )
    if isinstance(server, ReviewServer):
        server.hook = hook
    if trainjobs:
        sizer = handlers.register_trainjobs(registry, scheduler, options.train_job_hold_s)
        if isinstance(server, ReviewServer):
            server.trainjobs = sizer
    return registry


def run(options: OperatorOptions) -> int:
    """Run until SIGINT/SIGTERM; a managed webhook's configurations are then deleted."""
    memory.limit_arenas()  # before any thread starts (memory.py)
    try:
        kube = Kube(api_client(pool_size=32))
    except DeploymentError as error:
        raise StartupError(str(error)) from None
    # log_prefix: every object's log line starts with [namespace/name].
    kopf.configure(verbose=options.verbose, debug=options.debug, log_prefix=True)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    if not (options.verbose or options.debug):
        # kopf logs each handler call ("Handler 'wake-pods' succeeded"): thousands of lines a
        # minute on a busy cluster, and their formatting costs the event loop.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    # One access-log line per admission request: about a tenth of the operator's CPU in a
    # profile of the webhook benchmark (BENCHMARKS.md).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("vramgate").setLevel(logging.DEBUG if options.verbose else logging.INFO)
    cert_secret = None
    if options.cert_secret_name and options.webhook is not WebhookMode.OFF:
        # In managed mode the registrar writes the caBundle itself; in serve mode the chart's
        # configurations get it from here.
        config = options.webhook_config if options.webhook is WebhookMode.SERVE else None
        cert_secret = CertSecret(
            kube.api, options.own_namespace, options.cert_secret_name, cert_hosts(options),
            options.cert_dir, config,
            # The chart's Lease, with or without leader election: uninstalled, it takes the
            # Secret (and its CA key) with it.
            owner_lease=options.lease_name
            if options.lease_namespace == options.own_namespace else None,
        )  # fmt: skip
    try:
        if cert_secret is not None:
            cert_secret.sync()
        settings = operator_settings(options, cert_secret.files() if cert_secret else None)
    except CertSecretError as error:
        raise StartupError(str(error)) from None
    except OSError as error:
        raise StartupError(f"--cert-dir: cannot use {options.cert_dir}: {error}") from None
    reviews = settings.admission.server
    if options.webhook is WebhookMode.MANAGED and isinstance(reviews, ReviewServer):
        reviews.registrar = Registrar(
            kube.api, options.webhook_config, options.namespaces, options.train_job_sizing
        )
    if cert_secret is not None:
        cert_secret.start()
    leader = None
    if options.leader_election:
        leader = Leader(kube, options.lease_namespace, options.lease_name, options.identity)
    metrics = OperatorMetrics(
        options.identity, leading=lambda: leader is None or leader.is_leader()
    )
    metrics_addr = options.metrics_addr
    metrics_port = options.metrics_port
    try:
        server = start_metrics_server(metrics, metrics_addr, metrics_port)
    except OSError as error:
        raise StartupError(
            f"--metrics-port: cannot listen on {metrics_addr}:{metrics_port}: {error.strerror}"
        ) from None
    logging.getLogger("vramgate").info(
        "metrics on http://%s:%d/metrics", metrics_addr, server.server_address[1]
    )
    scheduler = Scheduler(
        kube,
        SchedulerOptions(
            admission=options.admission,
            learning=options.learning,
            resync_s=options.resync_s,
            configmap_retry_s=options.configmap_retry_s,
            trace_workers=options.trace_workers,
            namespaces=tuple(options.namespaces),
            kueue=options.kueue_admission_check,
            kueue_retry_s=options.kueue_retry_seconds,
        ),
        leader,
        metrics=metrics,
    )
    if leader is not None:
        leader.on_change.append(scheduler.wake)
    # What exists now (modules, classes, the presets: about 80,000 objects) lives as long as
    # the process. Left to the collector, each full collection walks it again: 80 ms with
    # the event loop stopped, a webhook request's budget four times over.
    gc.collect()  # what is garbage now would otherwise be frozen with the rest, for good
    gc.freeze()
    try:
        kopf.run(
            registry=build_registry(options, scheduler, leader, settings.admission.server),
            settings=settings,
            clusterwide=not options.namespaces,
            namespaces=options.namespaces,
            standalone=True,
            liveness_endpoint=options.liveness,
        )
    finally:
        if cert_secret is not None:
            cert_secret.stop()
        if leader is not None:
            leader.release()
    return 0
