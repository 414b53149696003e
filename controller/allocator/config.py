"""The allocator's settings: PYTORCH_CUDA_ALLOC_CONF's options that change memory, and the
memory the allocator may take.

The defaults are PyTorch's (c10/core/AllocatorConfig.cpp, AllocatorConfig's constructor):
no max_split_size (SIZE_MAX), max_non_split_rounding kLargeBuffer, no
garbage_collection_threshold, no roundup_power2_divisions, expandable_segments off.
`parse_alloc_conf` reads the environment variable's text with the source's checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from controller.allocator.sizes import K_LARGE_BUFFER, K_ROUND_UP_POWER_OF_TWO_INTERVALS

_MB = 1_048_576
#: max_split_size when the option is unset: std::numeric_limits<size_t>::max().
NO_MAX_SPLIT_SIZE = 2**64 - 1


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """max_split_size: blocks of at least this many bytes are never split, and serve only
    requests of at least this size (max_split_size_mb; at least 20 MiB when set).
    max_non_split_rounding: how far above a request an unsplittable cached block may be and
    still serve it (max_non_split_rounding_mb; kLargeBuffer by default).
    roundup_power2_divisions: one setting per power-of-two interval from 1 MiB to 64 GiB
    (16 entries; 0 or 1 means plain 512-byte rounding).
    garbage_collection_threshold: a fraction in (0, 1) of `capacity`; 0 disables it. PyTorch
    applies it only under torch.cuda.set_per_process_memory_fraction, which `capacity` models.
    expandable_segments: one growing segment per stream and pool instead of one per cudaMalloc.
    capacity: the bytes the allocator may reserve (the memory fraction's share of the GPU, or
    what the device has free for it); None for no limit, so no cudaMalloc ever fails.
    """

    max_split_size: int = NO_MAX_SPLIT_SIZE
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(
        default=(0,) * K_ROUND_UP_POWER_OF_TWO_INTERVALS
    )
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.max_split_size < K_LARGE_BUFFER:
            raise ValueError(
                f"max_split_size must be at least {K_LARGE_BUFFER} bytes (20 MiB), as "
                f"PyTorch requires of max_split_size_mb; got {self.max_split_size}"
            )
        if self.max_non_split_rounding < K_LARGE_BUFFER:
            raise ValueError(
                f"max_non_split_rounding must be at least 20 MiB; got {self.max_non_split_rounding}"
            )
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError(
                "garbage_collection_threshold must be in (0.0, 1.0), or 0 to disable it; "
                f"got {self.garbage_collection_threshold}"
            )
        if len(self.roundup_power2_divisions) != K_ROUND_UP_POWER_OF_TWO_INTERVALS:
            raise ValueError(
                f"roundup_power2_divisions must have {K_ROUND_UP_POWER_OF_TWO_INTERVALS} "
                f"entries (1 MiB to 64 GiB); got {len(self.roundup_power2_divisions)}"
            )
        for divisions in self.roundup_power2_divisions:
            if divisions < 0 or divisions & (divisions - 1):
                raise ValueError(
                    f"roundup_power2_divisions must be powers of 2 or 0; got {divisions}"
                )
        if self.capacity is not None and self.capacity < 0:
            raise ValueError(f"capacity must not be negative; got {self.capacity}")

    @property
    def garbage_collects(self) -> bool:
        """Whether garbage collection runs: a threshold and a capacity (PyTorch's
        `set_fraction && garbage_collection_threshold() > 0.0`)."""
        return self.capacity is not None and self.garbage_collection_threshold > 0.0


def parse_alloc_conf(text: str, capacity: int | None = None) -> AllocatorConfig:
    """The AllocatorConfig a PYTORCH_CUDA_ALLOC_CONF value sets, as AllocatorConfig::parseArgs
    reads it: "max_split_size_mb:512,expandable_segments:True", the list form
    "roundup_power2_divisions:[256:1,512:2,>:4]" (interval sizes in MiB) or the single value
    "roundup_power2_divisions:4". Options that do not change memory (backend:native,
    release_lock_on_cudamalloc, pinned_*) are accepted and ignored."""
    config = AllocatorConfig(capacity=capacity)
    for key, value in _options(text):
        if key == "max_split_size_mb":
            config = replace(config, max_split_size=_mib(key, value))
        elif key == "max_non_split_rounding_mb":
            config = replace(config, max_non_split_rounding=_mib(key, value))
        elif key == "garbage_collection_threshold":
            threshold = float(value)
            if not 0.0 < threshold < 1.0:
                raise ValueError("garbage_collection_threshold must be in (0.0, 1.0)")
            config = replace(config, garbage_collection_threshold=threshold)
        elif key == "roundup_power2_divisions":
            config = replace(config, roundup_power2_divisions=_divisions(value))
        elif key == "expandable_segments":
            config = replace(config, expandable_segments=_bool(key, value))
        elif key not in _IGNORED:
            raise ValueError(f"unrecognized CachingAllocator option: {key}")
    return config


_IGNORED = frozenset(
    {
        "backend",
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
        "pinned_reserve_segment_size_mb",
        "graph_capture_record_stream_reuse",
    }
)
_OPTION = re.compile(r"\s*([A-Za-z0-9_]+)\s*:\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)")


def _options(text: str) -> list[tuple[str, str]]:
    options: list[tuple[str, str]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _OPTION.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"cannot read PYTORCH_CUDA_ALLOC_CONF at {text[position:]!r}")
        options.append((match.group(1), match.group(2).strip()))
        position = match.end()
    return options


def _mib(key: str, value: str) -> int:
    mib = int(value)
    if mib * _MB < K_LARGE_BUFFER:
        raise ValueError(f"CachingAllocator option {key} too small, must be >= 20")
    return mib * _MB


def _bool(key: str, value: str) -> bool:
    if value not in ("True", "False"):
        raise ValueError(f"Expected a single True/False argument for {key}")
    return value == "True"


def _power_of_two(value: int, what: str) -> int:
    if value < 0 or value & (value - 1):
        raise ValueError(f"For roundups, the {what} has to be power of 2")
    return value


def _divisions(value: str) -> tuple[int, ...]:
    """parseRoundUpPower2Divisions: a single power of two for every interval, or a list of
    `MiB:divisions` pairs whose first entry also covers every smaller interval and whose
    `>:divisions` covers every interval after the last one named (c10/test/core/
    AllocatorConfig_test.cpp: "[64:8,128:2,256:4,512:2,1024:4,>:1]" gives 8 at 32 MiB, 4 at
    1024 MiB and 1 from 2048 MiB on)."""
    if not value.startswith("["):
        single = _power_of_two(int(value), "divisions")
        return (single,) * K_ROUND_UP_POWER_OF_TWO_INTERVALS
    table = [0] * K_ROUND_UP_POWER_OF_TWO_INTERVALS
    last_index = 0
    first = True
    for pair in value.strip("[]").split(","):
        interval, _, divisions_text = pair.partition(":")
        divisions = _power_of_two(int(divisions_text), "divisions")
        interval = interval.strip()
        if interval == ">":
            for index in range(last_index + 1, K_ROUND_UP_POWER_OF_TWO_INTERVALS):
                table[index] = divisions
            continue
        mib = _power_of_two(int(interval), "intervals")
        index = min(mib.bit_length() - 1, K_ROUND_UP_POWER_OF_TWO_INTERVALS - 1)
        if first:
            for earlier in range(index):
                table[earlier] = divisions
            first = False
        table[index] = divisions
        last_index = index
    return tuple(table)
