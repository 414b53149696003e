"""The shipped examples are what the README tells people to apply: each must pass the real
API server's schema (server-side dry run), the operator's own reading of the spec, and make a
workload from its template."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controller.jobspec import translate
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import Admission, build_workload
from e2e.cluster import Cluster
from tests.integration.test_operator import crds  # noqa: F401  (a fixture)

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/ is empty"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_is_accepted_by_the_api_server(
    path: Path, cluster: Cluster, crds: None, namespace: str  # noqa: F811
) -> None:
    done = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_reads_without_errors_and_makes_a_workload(path: Path) -> None:
    for job in yaml.safe_load_all(path.read_text()):
        plan, errors = translate(job["spec"])
        assert plan is not None, errors
        # As the API server returns it: with a namespace and a uid for the owner reference.
        job["metadata"] = {**job["metadata"], "namespace": "research", "uid": "uid-1"}
        placed = (NodeGpus("node-a", (0,), ("GPU-0",)),)
        (workload,) = build_workload(job, Admission(placed, 12 * 2**30, GpuMode.DEVICE_PLUGIN))
        assert workload["kind"] == "Job"
