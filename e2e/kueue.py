"""The real Kueue controller against the local control plane, for the AdmissionCheck tests.

Why the real one: vramgate is to run as a Kueue AdmissionCheck controller, and what Kueue
does with a check's state (holds a Workload with quota reserved, admits it when the check
is Ready, applies the check's podSetUpdates to the Job) is Kueue's logic, version by
version; a fake would only repeat what we believe it does. The binary is built from the
Go module proxy like the control plane's (``python -m e2e.build kueue``), its CRDs come
from the same module in Go's module cache, and it runs as a process beside the
components, its log and command line in the cluster's state dir.

How it runs here: no Deployment and no webhooks registered (so a Job, JobSet, PyTorchJob or
TrainJob must be created suspended, with the ``kueue.x-k8s.io/queue-name`` label, for Kueue to
manage it; a TrainJob also with the runtime patch Kueue's webhook would add), its own
certificate management off (the webhook server gets a cert from the cluster's CA), leader
election off, no visibility API server, every listener on 127.0.0.1 on ports chosen free.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from e2e import trainer
from e2e.build import ensure_binaries, module_dir
from e2e.cluster import Cluster
from e2e.components import LOOPBACK
from e2e.procs import PORT_TRIES, ManagedProcess, free_ports, is_running, log_tail, port_taken
from e2e.wait import wait_until

MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
#: Kueue's config API (apis/config/v1beta2 in the module).
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
#: The Kueue API the tests use (the CRDs' storage version).
API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
#: Job integrations: the kinds whose Workloads vramgate's check is tested on. Their CRDs
#: (`integration_crds`) are installed before Kueue starts: Kueue would start anyway and set up
#: an integration's controller once its API appears, but only after a backoff of up to two
#: minutes, and its TrainJob controller watches JobSets (without their API its caches never
#: sync and the manager exits).
FRAMEWORKS = (
    "batch/job",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/pytorchjob",
    "trainer.kubeflow.org/trainjob",
)
#: Kubeflow Training Operator (v1: PyTorchJob, deprecated for Trainer v2), the version Kueue
#: v0.17.0 requires: only its PyTorchJob CRD is installed, no controller.
TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"
#: VisibilityOnDemand (beta, on by default) starts an aggregated API server that needs an
#: APIService and its own port; AdmissionGatedBy (alpha, off) holds a Workload's admission
#: while its ``kueue.x-k8s.io/admission-gated-by`` annotation names a gate.
FEATURE_GATES: Mapping[str, bool] = {"VisibilityOnDemand": False, "AdmissionGatedBy": True}
#: With its own certificate management off, Kueue v0.17 reads the metrics server's
#: certificate from this fixed folder, and exits at start without it.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
#: Kueue's client is rate limited to 20 requests/s by default: far too few for tests.
CLIENT_QPS = 1000
CLIENT_BURST = 2000
START_TIMEOUT_S = 90.0


class KueueError(Exception):
    """Kueue could not be installed or started; the message ends with its log's tail."""


def crd_dir() -> Path:
    """The folder of Kueue's CRDs (``config/components/crd/bases`` of the pinned module)."""
    return module_dir(MODULE) / "config" / "components" / "crd" / "bases"


def integration_crds(frameworks: Iterable[str] = FRAMEWORKS) -> list[Path]:
    """The CRDs of the job kinds of `frameworks` besides batch Jobs, from the pinned modules:
    JobSet's and Kubeflow Trainer's together (``e2e/trainer.py``: a TrainJob runs as a
    JobSet), the Training Operator's PyTorchJob. Only the APIs: no controller runs them, so
    no pods are made from them."""
    wanted = set(frameworks)
    found = []
    if wanted & {"jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"}:
        found += trainer.crd_files()
    if "kubeflow.org/pytorchjob" in wanted:
        operator = module_dir(TRAINING_OPERATOR_MODULE) / "manifests" / "base" / "crds"
        found.append(operator / "kubeflow.org_pytorchjobs.yaml")
    return found


def _copy(source: Path, target: Path, *, private: bool = False) -> None:
    """Copy into place by rename (another Kueue may be reading `target`); a key 0600."""
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.copyfile(source, partial)
    if private:
        partial.chmod(0o600)
    partial.replace(target)


@dataclass(frozen=True)
class Ports:
    metrics: int
    health: int
    webhook: int


class Kueue:
    """Kueue's controller manager for one started ``Cluster``; usable as a context manager.

    Its process is one of the cluster's (``Cluster.launch``): ``Cluster.stop`` and
    ``python -m e2e.cluster down`` stop it too.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        frameworks: Sequence[str] = FRAMEWORKS,
        feature_gates: Mapping[str, bool] = FEATURE_GATES,
    ) -> None:
        self.cluster = cluster
        self.frameworks = tuple(frameworks)
        self.feature_gates = dict(feature_gates)
        self.workdir = cluster.state_dir / "kueue"
        self.config_path = self.workdir / "config.yaml"
        self.cert_dir = self.workdir / "webhook-certs"
        self.log_path = cluster.state_dir / "kueue.log"
        self.process: ManagedProcess | None = None
        self.ports: Ports | None = None
        #: Seconds ``start`` took (CRDs, certs, process until ready).
        self.start_seconds = 0.0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Kueue:
        """Install the CRDs and the namespace, then start Kueue and wait until it is ready."""
        started = time.monotonic()
        binary = ensure_binaries(["kueue"], log=self.cluster.log)["kueue"]
        self.install_crds()
        self.cluster.log(f"[kueue] CRDs established after {time.monotonic() - started:.1f}s")
        self._kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        ))  # fmt: skip
        self._write_certs()
        for attempt in range(1, PORT_TRIES + 1):
            self.ports = Ports(*free_ports(3))
            self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
            self.log_path.unlink(missing_ok=True)  # what port_taken reads: this start's only
            self.process = self.cluster.launch("kueue", self.argv(binary), env=self.cluster.env())
            try:
                wait_until(self._ready, timeout=START_TIMEOUT_S, what="Kueue to be ready")
                break
            except KueueError:  # it exited
                self.stop()
                if not (port_taken(self.log_path) and attempt < PORT_TRIES):
                    raise
                self.cluster.log("[kueue] a port was taken: starting again")
            except TimeoutError as error:
                self.stop()
                raise KueueError(
                    f"{error}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
                ) from None
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - started
        self.cluster.log(f"[kueue] ready in {self.start_seconds:.1f}s")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.cluster.stop_process(self.process)
            self.process = None

    def __enter__(self) -> Kueue:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what it runs with -----------------------------------------------------------

    def install_crds(self) -> None:
        """Apply Kueue's CRDs and those of its integrations (`integration_crds`; server-side:
        the Workload CRD is too large for the last-applied annotation) and wait until they are
        Established. The integrations' stay installed until the cluster stops: Kueue's
        informers would outlive them."""
        files = [str(crd_dir()), *(str(path) for path in integration_crds(self.frameworks))]
        args = [arg for path in files for arg in ("-f", path)]
        self._kubectl("apply", "--server-side", "--force-conflicts", *args)
        self._kubectl("wait", "--for=condition=Established", "--timeout=60s", *args)

    def config(self) -> dict[str, Any]:
        """Kueue's ``Configuration`` (apis/config/v1beta2)."""
        if self.ports is None:
            raise KueueError("no ports chosen yet")
        return {
            "apiVersion": CONFIG_API_VERSION,
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"{LOOPBACK}:{self.ports.health}"},
            "metrics": {"bindAddress": f"{LOOPBACK}:{self.ports.metrics}"},
            "webhook": {"host": LOOPBACK, "port": self.ports.webhook,
                        "certDir": str(self.cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": CLIENT_QPS, "burst": CLIENT_BURST},
            "integrations": {"frameworks": list(self.frameworks)},
        }  # fmt: skip

    def argv(self, binary: Path) -> list[str]:
        gates = ",".join(f"{name}={str(on).lower()}" for name, on in self.feature_gates.items())
        return [str(binary), f"--config={self.config_path}", f"--feature-gates={gates}"]

    def _write_certs(self) -> None:
        """The webhook server's cert (signed by the cluster CA) as ``tls.crt``/``tls.key``
        in ``cert_dir``; the same pair in ``METRICS_CERT_DIR`` unless one is there."""
        pair = self.cluster.issue_serving_cert("kueue-webhook")
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        _copy(pair.cert, self.cert_dir / "tls.crt")
        _copy(pair.key, self.cert_dir / "tls.key", private=True)
        wanted = (METRICS_CERT_DIR / "tls.crt", METRICS_CERT_DIR / "tls.key")
        if all(path.is_file() for path in wanted):
            return
        try:
            METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)
            _copy(pair.cert, wanted[0])
            _copy(pair.key, wanted[1], private=True)
        except OSError as error:
            raise KueueError(
                f"Kueue {MODULE} reads its metrics certificate from {METRICS_CERT_DIR} "
                f"(tls.crt, tls.key) and cannot start without it: {error}; create them "
                "as root (any key pair does) or run as root"
            ) from None

    # -- readiness -------------------------------------------------------------------

    @property
    def health_url(self) -> str:
        if self.ports is None:
            raise KueueError("not started")
        return f"http://{LOOPBACK}:{self.ports.health}"

    def _ready(self) -> bool:
        """``/readyz`` answers 200: the manager runs and its webhook server listens."""
        if self.process is not None and not is_running(self.process):
            raise KueueError(
                f"kueue exited during startup; last lines of {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )
        try:
            with urllib.request.urlopen(f"{self.health_url}/readyz", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = self.cluster.kubectl(*args, stdin=stdin)
        if done.returncode != 0:
            raise KueueError(f"kubectl {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
        return done.stdout
