"""Builders of the webhook's inputs: AdmissionWebhooks on a given cluster view, and the
objects a review carries."""

from __future__ import annotations

from typing import Any

from controller.base.units import GIB
from controller.packing.inventory import GpuDevice, NodeState, PackingSettings, Snapshot
from controller.packing.view import ClusterView
from controller.webhook.admission import AdmissionWebhook

QLORA = {"model": {"preset": "llama-3.1-8b"}, "method": "QLoRA", "lora": {"rank": 16}}


FULL = {"model": {"preset": "llama-3.1-8b"}, "method": "Full"}


def cluster(nodes: int = 1, gpus: int = 4, gib: int = 80) -> ClusterView:
    states = tuple(
        NodeState(
            f"n{n}",
            tuple(GpuDevice(f"GPU-{n}-{i}", i, "H100", gib * GIB, gib * GIB) for i in range(gpus)),
            gpu_allocatable=gpus,
        )
        for n in range(nodes)
    )
    return ClusterView(Snapshot(states, (), None), PackingSettings())


def hook(view: ClusterView | None) -> AdmissionWebhook:
    async def current() -> ClusterView | None:
        return view

    return AdmissionWebhook(current)


def body(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "ns"}, "spec": {**QLORA, **spec}}


def admitted(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        **obj,
        "status": {
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Fits"}],
            "placement": {"nodes": [{"node": "n0", "gpuIndices": [0], "gpuUUIDs": ["u"]}],
                          "perGpuBytes": 1},
        },
    }  # fmt: skip
