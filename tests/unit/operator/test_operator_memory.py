"""What keeps the operator's memory small: shared strings in the caches, and freed memory
given back to the system."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from controller.operator import memory
from controller.operator.caches import compact, slim_gpunode, slim_job, slim_pod
from controller.workload.state import workload_state

JOB = json.dumps({
    "metadata": {"name": "j1", "namespace": "team-a",
                 "uid": "0b8e5a7e-2d0c-4b8e-9c55-1f0a3c1e9f11"},
    "spec": {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA"},
    "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Fits",
                               "message": "fits on node gpu-7: " + "x" * 60}]},
})  # fmt: skip


def test_two_decoded_objects_share_their_keys_and_short_strings() -> None:
    one, two = compact(json.loads(JOB)), compact(json.loads(JOB))
    assert one == json.loads(JOB)
    key_one = next(k for k in one["status"]["conditions"][0] if k == "reason")
    key_two = next(k for k in two["status"]["conditions"][0] if k == "reason")
    assert key_one is key_two
    assert one["status"]["conditions"][0]["status"] is two["status"]["conditions"][0]["status"]
    assert one["metadata"]["uid"] is two["metadata"]["uid"]  # 36 characters: shared
    long_one = one["status"]["conditions"][0]["message"]
    assert long_one == two["status"]["conditions"][0]["message"]
    assert long_one is not two["status"]["conditions"][0]["message"]


def test_the_slim_caches_hold_compacted_copies() -> None:
    a, b = slim_job(json.loads(JOB)), slim_job(json.loads(JOB))
    assert a["spec"]["method"] is b["spec"]["method"]
    node = {"metadata": {"name": "gpu-7"}, "status": {"gpus": [{"product": "NVIDIA H100"}]}}
    first, second = slim_gpunode(json.loads(json.dumps(node))), slim_gpunode(node)
    assert first["status"]["gpus"][0]["product"] is second["status"]["gpus"][0]["product"]


def test_a_cached_pods_container_statuses_keep_their_states_and_only_the_images_digest() -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    terminated = {"exitCode": 1, "reason": "Error", "message": "CUDA out of memory"}
    pod = {
        "metadata": {"name": "p", "uid": "u"},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "trainer", "image": "docker.io/library/trainer:v1",
            "imageID": f"docker.io/library/trainer@{digest}", "containerID": "containerd://ab",
            "ready": False, "restartCount": 0, "started": False,
            "state": {"terminated": terminated}, "lastState": {},
            "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets"}],
        }, {"name": "sidecar", "imageID": "", "state": {"running": {}}}]},
    }  # fmt: skip
    one, two = slim_pod(json.loads(json.dumps(pod))), slim_pod(pod)
    trainer, sidecar = one["status"]["containerStatuses"]
    assert trainer == {"name": "trainer", "imageID": digest,
                       "state": {"terminated": terminated}, "lastState": {}}  # fmt: skip
    assert sidecar == {"name": "sidecar", "state": {"running": {}}}, "no digest: no imageID"
    assert trainer["imageID"] is two["status"]["containerStatuses"][0]["imageID"], "shared"


def test_a_cached_pods_init_container_that_cannot_pull_is_why_its_workload_waits() -> None:
    """The cache keeps init containers' statuses: `workload_state` reads them, and without
    them a pod stuck on its init container's image said only that it was starting."""
    waiting = {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "fetch:v9"'}
    pod = {
        "metadata": {"name": "w-0", "uid": "u"},
        "spec": {"nodeName": "n1", "containers": [{"name": "trainer"}]},
        "status": {"phase": "Pending",
                   "initContainerStatuses": [{"name": "fetch", "imageID": "",
                                              "state": {"waiting": waiting}}],
                   "containerStatuses": [{"name": "trainer",
                                          "state": {"waiting": {"reason": "PodInitializing"}}}]},
    }  # fmt: skip
    job = {"metadata": {"name": "w"}, "spec": {"completions": 1, "backoffLimit": 0}}
    state = workload_state(job, [slim_pod(pod)])
    assert state.reason == "ImagePullBackOff", state
    assert "fetch:v9" in state.message


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status)[1]) / 1024  # type: ignore[index]


def test_trim_gives_freed_memory_back_on_glibc() -> None:
    assert memory.limit_arenas() is True  # the test machines and the image run glibc
    chunks = [bytearray(4096) for _ in range(40_000)]  # 160 MiB from malloc, not pymalloc
    pinned = chunks[-1]  # keeps the heap's top in use, so free() alone cannot shrink it
    del chunks
    before = _rss_mib()
    memory.trim()
    after = _rss_mib()
    assert before - after > 100, (before, after)
    assert len(pinned) == 4096


def test_trim_every_trims_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: bool(calls.append(1)))

    async def run() -> None:
        task = asyncio.create_task(memory.trim_every(0.01))
        await asyncio.sleep(0.2)
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
    assert len(calls) >= 3


def test_a_value_nested_past_the_recursion_limit_is_cached_as_it_is() -> None:
    """An inline config takes any fields; a job must never fall out of the cache."""
    deep: dict[str, object] = {}
    for _ in range(3000):
        deep = {"x": deep}
    body = {"metadata": {"name": "j"}, "spec": {"model": {"config": deep}}}
    slim = slim_job(body)
    assert slim["spec"]["model"]["config"] is deep
    assert compact({"a": [deep]})["a"][0] is deep
