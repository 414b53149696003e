"""The fixed-cost table: every row sourced, and fixed_bytes' lines."""

from __future__ import annotations

import re

import pytest

from controller.allocator import context_rows, fixed_bytes
from controller.allocator.fixed_costs import DEFAULT_CONTEXT, LINES, context_row, nccl_figures
from controller.estimator.overheads import CUDA_CONTEXT_BYTES, NCCL_BYTES_PER_PEER

MIB = 2**20


def test_every_context_row_has_a_source_and_a_quote() -> None:
    rows = context_rows()
    assert len({row.key for row in rows}) == len(rows)
    for row in rows:
        assert row.url and row.quote and row.bytes > 0, row.key


def test_lazy_loading_rows_are_smaller_than_eager_ones_of_the_same_release() -> None:
    # PyTorch PR 86509: 287,047,680 bytes with LAZY against 666,632,192 with DEFAULT.
    lazy = context_row("torch1.13-cu117-lazy")
    eager = context_row("torch1.13-cu117-eager")
    assert lazy.bytes < eager.bytes
    assert eager.bytes - lazy.bytes == 666_632_192 - 287_047_680


def test_the_estimators_context_constant_is_a_row() -> None:
    assert context_row("unsloth-after-training-step").bytes == CUDA_CONTEXT_BYTES


def test_defaults_name_existing_rows_of_their_loading_mode() -> None:
    for lazy, key in DEFAULT_CONTEXT.items():
        assert context_row(key).lazy_loading is lazy


def test_one_gpu_pays_only_the_context() -> None:
    lines = fixed_bytes(1, 1)
    assert tuple(lines) == LINES
    assert lines["cuda_context"] == context_row(DEFAULT_CONTEXT[True]).bytes
    assert lines["nccl_ring_buffers"] == lines["nccl_nvls"] == lines["nccl_p2p"] == 0


def test_ring_buffers_are_buffsize_times_channels_times_two_connections() -> None:
    lines = fixed_bytes(8, 8)
    assert lines["nccl_ring_buffers"] == 4 * MIB * 32 * 2 == NCCL_BYTES_PER_PEER
    assert fixed_bytes(64, 8)["nccl_ring_buffers"] == lines["nccl_ring_buffers"]
    assert fixed_bytes(8, 8, nccl_channels=8, communicators=2)["nccl_ring_buffers"] == (
        2 * 8 * 2 * 4 * MIB
    )


def test_nvls_only_with_more_than_two_gpus_of_a_node() -> None:
    assert fixed_bytes(2, 2, nvls=True)["nccl_nvls"] == 0
    assert fixed_bytes(16, 2, nvls=True)["nccl_nvls"] == 0
    assert fixed_bytes(8, 8, nvls=True)["nccl_nvls"] == nccl_figures().nvls_per_rank
    assert fixed_bytes(8, 8)["nccl_nvls"] == 0


def test_point_to_point_buffers_grow_with_peers() -> None:
    assert fixed_bytes(8, 8, p2p_peers=7)["nccl_p2p"] == 7 * nccl_figures().p2p_per_peer
    with pytest.raises(ValueError):
        fixed_bytes(8, 8, p2p_peers=8)


def test_an_unknown_context_row_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=re.escape("torch2.10-cu130-ada-lazy")):
        fixed_bytes(1, 1, context="h100-made-up")
