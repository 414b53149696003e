"""GPU process -> pod UID through /proc/<pid>/cgroup, for every layout the kubelet writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.agent.pods import PodResolver, pod_uid_from_cgroup
from controller.agent.readings import GpuProcess, GpuReading

UID = "0f4c4a5e-8a3a-4b7e-9a51-3c1d2e3f4a5b"
UNDERSCORED = UID.replace("-", "_")
CONTAINER = "4d3c2b1a" * 8

V2_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UNDERSCORED}.slice/cri-containerd-{CONTAINER}.scope\n"
)
V2_SYSTEMD_GUARANTEED = (
    f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CONTAINER}.scope\n"
)
V2_CGROUPFS = f"0::/kubepods/besteffort/pod{UID}/{CONTAINER}\n"
V1_CGROUPFS = (
    f"12:pids:/kubepods/burstable/pod{UID}/{CONTAINER}\n"
    f"11:memory:/kubepods/burstable/pod{UID}/{CONTAINER}\n"
    f"1:name=systemd:/kubepods/burstable/pod{UID}/{CONTAINER}\n"
)
V1_SYSTEMD = (
    "11:devices:/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UNDERSCORED}.slice/docker-{CONTAINER}.scope\n"
)
V1_GUARANTEED_CGROUPFS = f"4:cpu,cpuacct:/kubepods/pod{UID}/{CONTAINER}\n"
# Inside a private cgroup namespace the path is relative to the agent's own cgroup.
V2_NAMESPACED = (
    f"0::/../../kubepods-besteffort-pod{UNDERSCORED}.slice/cri-containerd-{CONTAINER}.scope\n"
)
STATIC_POD = "0::/kubepods/burstable/pod6b1f4e0c9d8a7b6c5d4e3f2a1b0c9d8e/abc\n"


@pytest.mark.parametrize(
    "text",
    [
        V2_SYSTEMD,
        V2_SYSTEMD_GUARANTEED,
        V2_CGROUPFS,
        V1_CGROUPFS,
        V1_SYSTEMD,
        V1_GUARANTEED_CGROUPFS,
        V2_NAMESPACED,
    ],
    ids=[
        "v2-systemd",
        "v2-systemd-guaranteed",
        "v2-cgroupfs",
        "v1-cgroupfs",
        "v1-systemd",
        "v1-cgroupfs-guaranteed",
        "v2-cgroup-namespace",
    ],
)
def test_pod_uid_in_every_kubelet_layout(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


def test_static_pod_uid_is_a_hash() -> None:
    assert pod_uid_from_cgroup(STATIC_POD) == "6b1f4e0c9d8a7b6c5d4e3f2a1b0c9d8e"


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/nvidia-persistenced.service\n",
        "0::/\n",
        "",
        "0::/kubepods.slice/kubepods-burstable.slice\n",  # the QoS level, not a pod
        "0::/podman/pod12345\n",  # 'pod' plus something that is not a UID
    ],
)
def test_processes_outside_pods_have_no_uid(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_resolver_reads_the_injected_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V2_SYSTEMD)
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    resolver = PodResolver(tmp_path)
    assert resolver.pod_uid(4242) == UID
    assert resolver.pod_uid(77) is None
    assert resolver.pod_uid(99999) is None  # exited, or hidden without hostPID

    reading = GpuReading(
        0,
        "GPU-0",
        "H100",
        1,
        1,
        0,
        processes=(GpuProcess(4242, 10), GpuProcess(77, 5), GpuProcess(1, 3, pod_uid="given")),
    )
    (attributed,) = resolver.attribute([reading])
    assert [p.pod_uid for p in attributed.processes] == [UID, None, "given"]
