"""The shipped examples are what the README tells people to apply: each must pass the real
API server's schema (server-side dry run), the operator's own reading of the spec, and make a
workload from its template."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.jobs.spec import translate
from controller.packing.inventory import GpuMode, NodeGpus
from controller.workload import Admission, build_workload
from e2e.cluster import Cluster
from tests.integration.test_operator import crds  # noqa: F401  (a fixture)

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/ is empty"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_is_accepted_by_the_api_server(
    path: Path,
    cluster: Cluster,
    crds: None,  # noqa: F811
    namespace: str,
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


def _torchrun_flags(container: dict[str, Any], rank: int) -> dict[str, str]:
    """The torchrun flags of `container` as the kubelet expands `$(VAR)` from its env, on the
    pod of completion index `rank`; every variable the command names must be set."""
    env = {}
    for var in container.get("env", []):
        env[var["name"]] = var["value"] if "value" in var else str(rank)  # NODE_RANK: the index

    def expand(arg: str) -> str:
        for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
            assert name in env, f"{name} is not set in the trainer's environment"
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], arg)

    argv = [expand(a) for a in [*container.get("command", []), *container.get("args", [])]]
    assert argv[0] == "torchrun", argv
    return dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 1), (1, 2), (2, 1)])
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_runs_one_torchrun_process_per_gpu_of_its_node(
    path: Path, nodes: int, per_node: int
) -> None:
    """Resize may place the job on 2 nodes x 1 GPU: each pod then starts one process and
    joins the others at pod 0; VRAMGATE_GPUS (the total) would start 2 per pod."""
    for job in yaml.safe_load_all(path.read_text()):
        job["metadata"] = {**job["metadata"], "namespace": "research", "uid": "uid-1"}
        gpus = tuple(range(per_node))
        placed = tuple(
            NodeGpus(f"node-{n}", gpus, tuple(f"GPU-{n}-{i}" for i in gpus)) for n in range(nodes)
        )
        admission = Admission(placed, 12 * 2**30, GpuMode.DEVICE_PLUGIN)
        (batch,) = [o for o in build_workload(job, admission) if o["kind"] == "Job"]
        (trainer, *_) = batch["spec"]["template"]["spec"]["containers"]
        for rank in range(nodes):
            flags = _torchrun_flags(trainer, rank)
            assert flags.get("nproc-per-node") == str(per_node), flags
            assert flags.get("nnodes", "1") == str(nodes), flags
            assert flags.get("node-rank", "0") == str(rank), flags
            if nodes > 1:
                assert flags.get("master-addr") and flags.get("master-port"), flags
