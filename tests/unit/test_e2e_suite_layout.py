"""The end-to-end suite's premises, offline: the layout's GPUs as the static backend reads
them, and the decisions each scenario expects, from the same core through `vramgate plan`.

If an estimate or a packing rule changes so that a scenario's job would land elsewhere,
this fails here, naming the decision, instead of as a time-out in the e2e run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.agent.static import parse_static
from controller.api.base import PRODUCT_LABEL
from controller.api.finetunejob import FineTuneJobSpec
from controller.base.units import GIB, MIB
from controller.cli import main
from e2e.suite import layout
from e2e.suite.scenarios import FULL, HUGE, QLORA, finetunejob
from e2e.suite.target import Target, condition

NODES = ["suite-0", "suite-1"]
TARGET = Target("kubectl", Path("unused"), NODES, layout.PRODUCT)


def test_the_static_backend_reads_the_layout_with_uuids_of_each_node() -> None:
    text = yaml.safe_dump({"gpus": layout.static_gpus()})
    for node in NODES:
        gpus = parse_static(text, "layout", node_name=node)
        assert [g.uuid for g in gpus] == [f"GPU-{node}-{i}" for i in range(layout.GPUS_PER_NODE)]
        assert {g.product for g in gpus} == {layout.PRODUCT}
        assert [g.used_bytes for g in gpus] == [u * GIB for u in layout.USED_GIB_BY_OTHER_WORK]
        # The other work is a pod's: with the device plugin that GPU is no other pod's.
        held = [{p.pod_uid for p in g.processes} for g in gpus]
        assert held == [{layout.OTHER_POD_UID} if u else set()
                        for u in layout.USED_GIB_BY_OTHER_WORK]  # fmt: skip


@pytest.fixture
def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    def decide(*jobs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return _plan(tmp_path, capsys, *jobs)

    return decide


def _plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *jobs: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """`vramgate plan --json` of `jobs` on the layout, as the compact cluster form (a GPU the
    other work's pod uses is `allocated`)."""
    total = layout.TOTAL_MIB
    gpus = [{"memory": f"{total}MiB", "free": f"{total - used * GIB // MIB}MiB",
             "allocated": bool(used)}
            for used in layout.USED_GIB_BY_OTHER_WORK]  # fmt: skip
    cluster = {"nodes": [{"name": n, "labels": {PRODUCT_LABEL: layout.PRODUCT}, "gpus": gpus}
                         for n in NODES]}  # fmt: skip
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    documents = [{**job, "metadata": {**job["metadata"], "namespace": "suite"}} for job in jobs]
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump_all(documents))
    code = main(["plan", "--json", "--cluster", str(tmp_path / "cluster.yaml"),
                 str(tmp_path / "jobs.yaml")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    return {d["job"].split("/")[1]: d for d in json.loads(out)["decisions"]}


def _where(decision: dict[str, Any]) -> list[tuple[str, list[int]]]:
    return [(p["node"], p["gpus"]) for p in decision["placement"]]


def test_every_suite_job_is_a_valid_spec() -> None:
    for job in (
        finetunejob(TARGET, "small", QLORA, gpus=1),
        finetunejob(
            TARGET, "full", FULL, gpus=1, resources={"maxGPUs": 4}, admissionPolicy="Resize"
        ),
    ):
        FineTuneJobSpec.model_validate(job["spec"])


def test_a_small_job_takes_gpu_1_of_the_first_node(plan: Any) -> None:
    small = plan(finetunejob(TARGET, "small", QLORA, gpus=1))["small"]
    assert (small["decision"], small["reason"]) == ("Admit", "Fits")
    assert _where(small) == [(NODES[0], [1])]


def test_a_full_fine_tune_is_resized_to_one_gpu_1_per_node(plan: Any) -> None:
    job = finetunejob(TARGET, "full", FULL, gpus=1, resources={"maxGPUs": 4},
                      admissionPolicy="Resize")  # fmt: skip
    full = plan(job)["full"]
    assert (full["decision"], full["admitted_gpus"]) == ("Resize", 2)
    assert _where(full) == [(NODES[0], [1]), (NODES[1], [1])]


def test_a_second_full_fine_tune_waits_for_the_first(plan: Any) -> None:
    got = plan(finetunejob(TARGET, "first", FULL, gpus=2),
                finetunejob(TARGET, "second", FULL, gpus=2))  # fmt: skip
    assert (got["first"]["decision"], got["first"]["reason"]) == ("Admit", "Fits")
    assert (got["second"]["decision"], got["second"]["reason"]) == ("Queue", "WaitingForVRAM")
    assert "waits for memory" in got["second"]["message"]


def test_the_72b_full_fine_tune_never_fits(plan: Any) -> None:
    huge = finetunejob(TARGET, "huge", HUGE, gpus=1)
    got = plan(huge)["huge"]
    assert (got["decision"], got["reason"]) == ("Reject", "InsufficientVRAM")


def test_condition_reads_a_type_or_none() -> None:
    job = {"status": {"conditions": [{"type": "Admitted", "status": "True"}]}}
    assert condition(job, "Admitted") == {"type": "Admitted", "status": "True"}
    assert condition(job, "Running") is None
    assert condition(None, "Admitted") is None


def test_the_suite_says_in_one_line_when_it_cannot_reach_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from e2e.suite.__main__ import main as suite

    code = suite(["--kubeconfig", str(tmp_path / "none"), "--kubectl", str(tmp_path / "kubectl")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("e2e.suite: cannot list the suite's nodes:") and err.count("\n") == 1
