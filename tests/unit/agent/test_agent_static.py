"""The static backend: a file of GPUs, re-read every poll; a broken file is a backend error."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.agent.command import make_backend
from controller.agent.readings import BackendError, GpuProcess, MigInstance
from controller.agent.settings import AgentSettings
from controller.agent.static import StaticBackend, parse_static

GIB = 2**30
MIB = 2**20

NODE = """
gpus:
  - index: 0
    uuid: GPU-0
    product: NVIDIA H100 80GB HBM3
    totalBytes: 81559MiB
    usedBytes: 20GiB
    reservedBytes: 475MiB
    processes:
      - {pid: 4242, usedBytes: 19GiB, podUID: 0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b}
      - {pid: 17}
  - {index: 1, uuid: GPU-1, product: NVIDIA H100 80GB HBM3, totalBytes: 85520809984,
     usedBytes: 0GiB, freeBytes: 80GiB}
  - {index: 2, uuid: GPU-2, product: NVIDIA GB10, memoryInfoSupported: false}
  - {index: 3, uuid: MIG-3, product: A100 MIG 3g.20gb, totalBytes: 20GiB, usedBytes: 0,
     mig: {parentUUID: GPU-3, gpuInstanceId: 1}}
  - {index: 3, uuid: MIG-3b, product: A100 MIG 3g.20gb, totalBytes: 20GiB, usedBytes: 1GiB,
     driverReservedBytes: 0, mig: {parentUUID: GPU-3, gpuInstanceId: 2, computeInstanceId: 0}}
"""


def test_sizes_defaults_processes_and_special_parts() -> None:
    gpus = parse_static(NODE, "node.yaml")
    first = gpus[0]
    assert first.total_bytes == 81559 * MIB
    assert first.used_bytes == 20 * GIB
    assert first.reserved_bytes == 475 * MIB
    assert first.free_bytes == 81559 * MIB - 20 * GIB - 475 * MIB
    assert first.processes == (
        GpuProcess(4242, 19 * GIB, "0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b"),
        GpuProcess(17, None),
    )
    assert gpus[1].free_bytes == 80 * GIB  # given explicitly
    assert gpus[1].used_bytes == 0  # an idle GPU: zero is a size here
    assert not gpus[2].memory_info_supported and gpus[2].free_bytes is None
    assert gpus[3].mig == MigInstance("GPU-3", 1)
    # MIG devices repeat their parent's index; driverReservedBytes is the newer spelling.
    assert gpus[4].index == 3 and gpus[4].mig == MigInstance("GPU-3", 2, 0)
    assert (gpus[4].reserved_bytes, gpus[4].free_bytes) == (0, 19 * GIB)


def test_json_is_accepted() -> None:
    text = (
        '{"gpus": [{"index": 0, "uuid": "GPU-0", "product": "L4", '
        '"totalBytes": 1000, "usedBytes": 10}]}'
    )
    assert parse_static(text, "node.json")[0].free_bytes == 990


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, totalBytes: 1GiB, usedBytes: 2GiB}]",
            "exceed totalBytes",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, totalBytes: 1GiB}]",
            "totalBytes and usedBytes are required",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, totalBytes: 12XB, usedBytes: 0}]",
            r"gpus\[0\].totalBytes: invalid size '12XB'",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, colour: red}]",
            r"gpus\[0\].colour: unknown field",
        ),
        (
            "gpus: [{index: -1, uuid: GPU-0, product: X}]",
            r"gpus\[0\].index: must be greater than or equal to 0",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X}, {index: 1, uuid: GPU-0, product: X}]",
            r"gpus\[1\].uuid: GPU-0 is also gpus\[0\]'s",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, memoryInfoSupported: false, "
            "totalBytes: 1GiB}]",
            "memoryInfoSupported is false, so totalBytes",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, totalBytes: 2GiB, usedBytes: 0, "
            "reservedBytes: 1MiB, driverReservedBytes: 1MiB}]",
            r"gpus\[0\]: set driverReservedBytes or reservedBytes",
        ),
        (
            "gpus: [{index: 0, uuid: GPU-0, product: X, totalBytes: 1GiB, usedBytes: 0, "
            "processes: [{pid: 1, podUID: " + "a" * 37 + "}]}]",
            r"gpus\[0\].processes\[0\].podUID: String should have at most 36 characters",
        ),
        (
            "gpus: [{index: 0, uuid: MIG-0, product: X, totalBytes: 1GiB, usedBytes: 0, "
            "mig: {parentUUID: GPU-0, gpuInstanceId: 1, computeInstanceId: -1}}]",
            r"gpus\[0\].mig.computeInstanceId: must be greater than or equal to 0",
        ),
        ("{gpus: [", "not valid YAML or JSON"),
        ("- just a list", "node.yaml: the file: must be a mapping with a gpus list"),
    ],
)
def test_bad_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        parse_static(text, "node.yaml")


def test_backend_rereads_the_file_on_every_read(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    backend = StaticBackend(path)
    with pytest.raises(BackendError, match=f"static: cannot read {path}: No such file"):
        backend.read()
    path.write_text(NODE)
    assert len(backend.read()) == 5
    path.write_text(NODE.replace("usedBytes: 20GiB", "usedBytes: 30GiB"))
    assert backend.read()[0].used_bytes == 30 * GIB


SHARED = """
gpus:
  - {index: 0, uuid: "GPU-{node}-0", product: L4, totalBytes: 1000, usedBytes: 0}
  - {index: 1, uuid: "MIG-{node}-1", product: A100 MIG 3g.20gb, totalBytes: 20GiB, usedBytes: 0,
     mig: {parentUUID: "GPU-{node}-p", gpuInstanceId: 1}}
"""


def test_node_in_the_uuids_is_the_agents_node_name() -> None:
    """One file for every node (the chart's ConfigMap) still gives each node UUIDs of its own:
    the operator packs GPUs by UUID cluster-wide."""
    a, b = parse_static(SHARED, "gpus.yaml", "gpu-a"), parse_static(SHARED, "gpus.yaml", "gpu-b")
    assert [g.uuid for g in a] == ["GPU-gpu-a-0", "MIG-gpu-a-1"]
    assert a[1].mig == MigInstance("GPU-gpu-a-p", 1)
    assert {g.uuid for g in a}.isdisjoint(g.uuid for g in b)
    # Without a node name (the file read on its own) the text is kept as written.
    assert parse_static(SHARED, "gpus.yaml")[0].uuid == "GPU-{node}-0"


def test_the_expanded_uuid_is_held_to_the_maximum_length() -> None:
    with pytest.raises(BackendError, match=r"gpus\[0\]\.uuid"):
        parse_static(SHARED, "gpus.yaml", "n" * 130)


def test_the_agent_gives_the_static_backend_its_node_name(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(SHARED)
    settings = AgentSettings(node_name="gpu-a", backend="static", static_file=path)
    backend = make_backend(settings)
    assert backend.read()[0].uuid == "GPU-gpu-a-0"
