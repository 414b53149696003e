"""The GPUs the end-to-end suite expects: two nodes of two simulated 80 GB GPUs each.

GPU 0 of every node is held by a pod outside vramgate (an inference server, say, that uses
56 GiB of it): with the device plugin it is no GPU any other pod gets; GPU 1 is free. That is
enough for every decision the suite checks: a small job lands on the first node (the nodes
tie), GPU 1, a full fine-tune of an 8B model needs two whole GPUs (GPU 1 of each node: an
Indexed Job across nodes), a second such job waits for the first, and a 72B full fine-tune
never fits. (Were GPU 0's 56 GiB used outside any pod, the device plugin might hand GPU 0 to
a job's pod, and no node would take the full fine-tune.)

Reference figures (calibrated profile, the operator's default): llama-3.1-8b QLoRA r=16
needs 11.64 GiB on one GPU; llama-3.1-8b Full needs 86.09 GiB on one GPU and 45.49 GiB per
GPU on two with FSDP.
"""

from __future__ import annotations

from typing import Any

NODES = 2
GPUS_PER_NODE = 2
#: What NVML reports as an H100 80GB's total memory, in MiB.
TOTAL_MIB = 81559
#: Per GPU index: GiB that work outside vramgate holds.
USED_GIB_BY_OTHER_WORK = (56, 0)
#: The pod of that work, on every GPU it uses (its process: the agent reads no /proc for it).
OTHER_POD_UID = "00000000-0000-4000-8000-0000000e2e00"
#: The product label of the suite's nodes, where the cluster is the suite's alone (kind).
PRODUCT = "SIM-H100-80GB"


def static_gpus(product: str = PRODUCT) -> list[dict[str, Any]]:
    """The static backend's `gpus:` for every suite node (`{node}` becomes the node's name,
    so UUIDs are unique across the cluster)."""
    return [
        {"index": i, "uuid": f"GPU-{{node}}-{i}", "product": product,
         "totalBytes": f"{TOTAL_MIB}MiB", "usedBytes": f"{USED_GIB_BY_OTHER_WORK[i]}GiB",
         "processes": [{"pid": 4242, "usedBytes": f"{USED_GIB_BY_OTHER_WORK[i]}GiB",
                        "podUID": OTHER_POD_UID}] if USED_GIB_BY_OTHER_WORK[i] else []}
        for i in range(GPUS_PER_NODE)
    ]  # fmt: skip
