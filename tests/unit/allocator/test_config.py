"""PYTORCH_CUDA_ALLOC_CONF as c10/core/AllocatorConfig.cpp reads it."""

from __future__ import annotations

import pytest

from controller.allocator.config import NO_MAX_SPLIT_SIZE, AllocatorConfig, parse_alloc_conf
from controller.allocator.sizes import divisions_for

MIB = 2**20


def test_defaults_are_pytorchs() -> None:
    config = parse_alloc_conf("")
    assert config == AllocatorConfig()
    assert config.max_split_size == NO_MAX_SPLIT_SIZE
    assert config.max_non_split_rounding == 20 * MIB
    assert not config.expandable_segments


def test_the_options_pytorchs_config_test_sets() -> None:
    # c10/test/core/AllocatorConfig_test.cpp, the first setting (memory options only).
    config = parse_alloc_conf(
        "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
        "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],backend:native,"
        "expandable_segments:True",
        capacity=80 * 2**30,
    )
    assert config.max_split_size == 40 * MIB
    assert config.max_non_split_rounding == 30 * MIB
    assert config.garbage_collection_threshold == 0.5
    assert config.expandable_segments
    expected = {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 4096: 1, 8192: 1}
    for mib, divisions in expected.items():
        assert divisions_for(mib * MIB, config.roundup_power2_divisions) == divisions, mib


def test_single_roundup_value_covers_every_interval() -> None:
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16


@pytest.mark.parametrize(
    "text",
    [
        "max_split_size_mb:2",  # test_allocator_settings: "max_split_size_mb:2" raises
        "garbage_collection_threshold:1.2",  # ... and so does a threshold outside (0, 1)
        "foo:1,bar:2",  # ... and an unknown option
        "roundup_power2_divisions:3",
        "expandable_segments:yes",
    ],
)
def test_pytorch_rejects_these_and_so_do_we(text: str) -> None:
    with pytest.raises(ValueError):
        parse_alloc_conf(text)


def test_garbage_collection_needs_a_capacity() -> None:
    # PyTorch collects only under set_per_process_memory_fraction (`set_fraction`).
    assert not AllocatorConfig(garbage_collection_threshold=0.5).garbage_collects
    assert AllocatorConfig(garbage_collection_threshold=0.5, capacity=2**30).garbage_collects
