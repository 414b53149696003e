"""``vramgate agent``: wire the settings to a backend, the API, the metrics, and run the loop.

Why everything that can fail for good fails here, before the loop: a bad flag, an unknown
backend file path, a port in use or a missing kubeconfig is a configuration error (exit 2,
one line), while anything the loop meets later is retried and reported in the GPUNode.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType

from prometheus_client import start_http_server

from controller.agent.dcgm import DcgmBackend
from controller.agent.loop import Agent, LoopTiming
from controller.agent.metrics import AgentMetrics, agent_registry
from controller.agent.pods import PodResolver
from controller.agent.publisher import GpuNodePublisher
from controller.agent.readings import BackendError, GpuBackend
from controller.agent.settings import AgentSettings, SettingsError, load_settings
from controller.agent.static import StaticBackend
from controller.base.clock import SystemClock
from controller.kube import ApiClient, NoCredentials, default_api_client

log = logging.getLogger("vramgate.agent")


def make_backend(settings: AgentSettings) -> GpuBackend:
    if settings.backend == "static":
        assert settings.static_file is not None  # the settings model requires it
        return StaticBackend(settings.static_file, settings.node_name)
    if settings.backend == "dcgm":
        return DcgmBackend(
            settings.dcgm_url,
            settings.dcgm_host or settings.node_name,
            settings.dcgm_timeout_seconds,
        )
    from controller.agent.nvml import NvmlBackend

    return NvmlBackend()


def timing(settings: AgentSettings) -> LoopTiming:
    return LoopTiming(
        poll_interval_s=settings.poll_interval_seconds,
        heartbeat_interval_s=settings.heartbeat_interval_seconds,
        change_threshold_bytes=settings.change_threshold_bytes,
        backoff_initial_s=settings.backoff_initial_seconds,
        backoff_max_s=settings.backoff_max_seconds,
    )


def _api_client(settings: AgentSettings) -> ApiClient:
    try:
        return default_api_client(settings.kubeconfig)
    except NoCredentials as error:
        raise SettingsError(
            f"--kubeconfig: no usable Kubernetes credentials ({error}); run in the cluster "
            "with a ServiceAccount or pass --kubeconfig"
        ) from None


def run_agent(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        backend = make_backend(settings)
    except BackendError as error:
        raise SettingsError(f"--backend {settings.backend}: {error}") from None
    publisher = GpuNodePublisher(_api_client(settings), settings.node_name)
    metrics = AgentMetrics(settings.node_name, backend.name)
    try:
        server, _thread = start_http_server(
            settings.metrics_port, settings.metrics_address, registry=agent_registry(metrics)
        )
    except OSError as error:
        raise SettingsError(
            f"--metrics-port: cannot listen on {settings.metrics_address}:"
            f"{settings.metrics_port}: {error.strerror}"
        ) from None
    agent = Agent(
        backend,
        PodResolver(settings.proc_root),
        publisher,
        metrics,
        timing(settings),
        SystemClock(),
    )
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info(
        "agent for node %s: backend %s, metrics on %s:%d, poll %.1fs, heartbeat %.1fs",
        settings.node_name,
        backend.name,
        settings.metrics_address,
        server.server_port,
        settings.poll_interval_seconds,
        settings.heartbeat_interval_seconds,
    )
    try:
        agent.run(stop)
    finally:
        server.shutdown()
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return 0
