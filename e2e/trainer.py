"""Kubeflow Trainer's CRDs on the local control plane, for the TrainJob sizing tests.

Only the CRDs: vramgate sizes a TrainJob in its mutating webhook when it is created, which
needs the API (its schema, as the API server applies it) and nothing of Trainer's controller
or webhooks. Without them nothing checks that the runtime a TrainJob names exists, and no
JobSet is made. The CRDs come from the pinned modules (``e2e/versions.json``) in Go's module
cache, as Kueue's do (``e2e/kueue.py``): Trainer's, and JobSet's, the API a TrainJob runs as.

Why JobSet's too: Kueue's TrainJob integration watches JobSets; without their API its
caches never sync and Kueue's manager exits two minutes later. Kueue (``e2e/kueue.py``)
installs these CRDs itself before it starts (`crd_files`, with its other integrations'). The
CRDs stay installed until the cluster stops, for the same reason: Kueue's informers would
outlive them.
"""

from __future__ import annotations

from pathlib import Path

from e2e.build import module_dir
from e2e.cluster import Cluster

MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"
API_VERSION = "trainer.kubeflow.org/v1alpha1"


class TrainerError(Exception):
    """The CRDs could not be installed; the message is kubectl's."""


def crd_dir() -> Path:
    """The folder of Trainer's CRDs (``manifests/base/crds`` of the pinned module)."""
    return module_dir(MODULE) / "manifests" / "base" / "crds"


def crd_files() -> list[Path]:
    """The CRD manifests to apply: JobSet's, then Trainer's (the folder's
    kustomization.yaml is no object to apply)."""
    jobset = module_dir(JOBSET_MODULE) / "config" / "components" / "crd" / "bases"
    return [
        *sorted(jobset.glob("jobset.x-k8s.io_*.yaml")),
        *sorted(crd_dir().glob("trainer.kubeflow.org_*.yaml")),
    ]


def install_crds(cluster: Cluster) -> None:
    """Apply the CRDs (server-side: too large for the last-applied annotation) and wait
    until they are Established."""
    found = crd_files()
    if not any(path.name.startswith("trainer.kubeflow.org_") for path in found):
        raise TrainerError(f"no CRDs in {crd_dir()}")
    files = [arg for path in found for arg in ("-f", str(path))]
    _kubectl(cluster, "apply", "--server-side", "--force-conflicts", *files)
    _kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", *files)


def _kubectl(cluster: Cluster, *args: str) -> str:
    done = cluster.kubectl(*args)
    if done.returncode != 0:
        raise TrainerError(f"kubectl {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done.stdout
