"""PyTorch's CUDA caching allocator replayed, and the memory a process holds outside it.

    events.py       Event (malloc or free, size, stream): the trace's output, the replay's input
    sizes.py        the sizing rules under their source names: round_size, the pools,
                    get_allocation_size, should_split, and their constants
    config.py       AllocatorConfig: PYTORCH_CUDA_ALLOC_CONF's memory options and a capacity
    replay.py       CachingAllocator and replay(): peak allocated and peak reserved
    fixed_costs.py  the CUDA context and NCCL's buffers per process (fixed_costs.json)

Pure: integers in, integers out, no torch. What NVML shows for a training process is the
replay's reserved peak plus the fixed costs.
"""

from controller.allocator.config import AllocatorConfig, parse_alloc_conf
from controller.allocator.events import Event, Interval, events_from_intervals
from controller.allocator.fixed_costs import ContextRow, context_rows, fixed_bytes
from controller.allocator.replay import (
    CachingAllocator,
    OutOfMemory,
    ReplayResult,
    replay,
    replay_live_intervals,
)

__all__ = [
    "AllocatorConfig",
    "CachingAllocator",
    "ContextRow",
    "Event",
    "Interval",
    "OutOfMemory",
    "ReplayResult",
    "context_rows",
    "events_from_intervals",
    "fixed_bytes",
    "parse_alloc_conf",
    "replay",
    "replay_live_intervals",
]
