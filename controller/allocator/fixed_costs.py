"""Memory a training process holds on its GPU outside PyTorch's caching allocator.

NVML charges a process its CUDA context (the driver's state and the kernels loaded into it)
and NCCL's communicator buffers besides what the caching allocator reserved. Neither shows in
`torch.cuda.memory_reserved`; both are published measurements, kept with their sources and
exact quotes in fixed_costs.json and read here:

* **cuda_context**: one row per measurement (GPU, torch and CUDA versions, lazy module
  loading). CUDA_MODULE_LOADING=LAZY (CUDA 11.7+, PyTorch's default since 1.13) loads kernels
  on first use, so a bare context is 256-430 MiB where eager loading took 650 MiB to over
  1000 MiB; a training step then loads its kernels and cuBLAS/cuDNN handles on top (the
  `unsloth-after-training-step` row, 1.4 GB, is the figure the estimator adds today).
* **nccl_ring_buffers**: per communicator, NCCL_BUFFSIZE (4 MiB) x channels (up to 32 over
  NVLink) x the ring's 2 connections; it grows with channels, not with the world size.
* **nccl_nvls**: NVLink SHARP's buffers per rank (288 MiB measured on 8 x H200), only on
  NVSwitch nodes (H100 and later) with more than 2 GPUs, unless NCCL_NVLS_ENABLE=0.
* **nccl_p2p**: send/recv and all-to-all connect every peer, each with its own buffers
  (about 480 MiB per peer measured on 8 x H100): expert and pipeline parallelism pay it.

The estimator's constants (controller.estimator.overheads) are unchanged by this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

#: The context row used when none is named: the most recent measurement, per loading mode.
DEFAULT_CONTEXT = {True: "torch2.10-cu130-ada-lazy", False: "torch1.13-cu117-eager"}
#: The lines `fixed_bytes` returns, in order.
LINES = ("cuda_context", "nccl_ring_buffers", "nccl_nvls", "nccl_p2p")


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One published measurement of the CUDA context."""

    key: str
    what: str
    gpu: str
    torch: str
    cuda: str
    lazy_loading: bool
    bytes: int
    quote: str
    url: str


@dataclass(frozen=True, slots=True)
class NcclFigures:
    """NCCL's published figures: the buffer size, channels, ring connections, NVLS per
    rank and point-to-point buffers per peer."""

    buffsize: int
    channels_nvlink: int
    ring_connections: int
    nvls_per_rank: int
    p2p_per_peer: int


@cache
def _table() -> dict[str, Any]:
    text = (resources.files("controller.allocator") / "fixed_costs.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


@cache
def context_rows() -> tuple[ContextRow, ...]:
    """Every CUDA context measurement in fixed_costs.json, in the file's order."""
    return tuple(
        ContextRow(
            key=row["key"],
            what=row["what"],
            gpu=row["gpu"],
            torch=row["torch"],
            cuda=row["cuda"],
            lazy_loading=bool(row["lazy_loading"]),
            bytes=int(row["bytes"]),
            quote=row["quote"],
            url=row["url"],
        )
        for row in _table()["cuda_context"]
    )


def context_row(key: str) -> ContextRow:
    """The context row named `key`; a KeyError lists the known keys."""
    for row in context_rows():
        if row.key == key:
            return row
    known = ", ".join(row.key for row in context_rows())
    raise KeyError(f"no CUDA context row {key!r}; known rows: {known}")


@cache
def nccl_figures() -> NcclFigures:
    nccl = _table()["nccl"]
    return NcclFigures(
        buffsize=int(nccl["buffsize"]["bytes"]),
        channels_nvlink=int(nccl["channels_nvlink"]["count"]),
        ring_connections=int(nccl["ring_connections"]["count"]),
        nvls_per_rank=int(nccl["nvls_per_rank"]["bytes"]),
        p2p_per_peer=int(nccl["p2p_per_peer"]["bytes"]),
    )


def fixed_bytes(
    world_size: int,
    gpus_per_node: int,
    *,
    lazy_loading: bool = True,
    context: str | None = None,
    communicators: int = 1,
    nccl_buffsize: int | None = None,
    nccl_channels: int | None = None,
    nvls: bool = False,
    p2p_peers: int = 0,
) -> dict[str, int]:
    """The bytes each process of a job holds outside the caching allocator, line by line
    (LINES, every line present, 0 where it does not apply).

    `context` names a row of fixed_costs.json (default: DEFAULT_CONTEXT for `lazy_loading`).
    NCCL lines apply only when world_size > 1: `communicators` process groups each with
    `nccl_channels` channels (default 32, NVLink's) of `nccl_buffsize` (NCCL_BUFFSIZE,
    default 4 MiB) on the ring's two connections; `nvls` (NVSwitch nodes of H100 or later
    with NCCL_NVLS_ENABLE on) adds NVLink SHARP's buffers when more than 2 GPUs of a node
    take part; `p2p_peers` is the number of peers send/recv or all-to-all connect to.
    """
    if world_size < 1 or gpus_per_node < 1:
        raise ValueError(
            f"world_size and gpus_per_node must be at least 1; got {world_size}, {gpus_per_node}"
        )
    if communicators < 0 or p2p_peers < 0:
        raise ValueError("communicators and p2p_peers must not be negative")
    if p2p_peers >= world_size:
        raise ValueError(f"p2p_peers must be below world_size ({world_size}); got {p2p_peers}")
    row = context_row(context if context is not None else DEFAULT_CONTEXT[lazy_loading])
    lines = dict.fromkeys(LINES, 0)
    lines["cuda_context"] = row.bytes
    if world_size == 1:
        return lines
    nccl = nccl_figures()
    buffsize = nccl.buffsize if nccl_buffsize is None else nccl_buffsize
    channels = nccl.channels_nvlink if nccl_channels is None else nccl_channels
    lines["nccl_ring_buffers"] = communicators * channels * nccl.ring_connections * buffsize
    if nvls and min(world_size, gpus_per_node) > 2:
        lines["nccl_nvls"] = communicators * nccl.nvls_per_rank
    lines["nccl_p2p"] = p2p_peers * nccl.p2p_per_peer
    return lines
