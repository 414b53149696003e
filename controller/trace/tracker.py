"""Counts tensor storages as a training step creates and frees them: the exact peak.

`StorageTracker` is a `TorchDispatchMode`: every aten op the step runs (forward, autograd's
backward, the optimizer) passes through it, and every storage an op returns is recorded with
its size, the clock tick it was born at and, through a weak reference, the tick it died at.
The sum of live storages is what `torch.cuda.memory_allocated()` would read, and its maximum
what `torch.cuda.max_memory_allocated()` would: sizes are rounded up to the CUDA caching
allocator's 512-byte block, because that is what the allocator charges.

Storages, not tensors: views share their base's storage and cost nothing, and a storage is
freed when its last tensor (or autograd's saved reference) goes. Parameters never need
special handling (torch's `MemTracker` crashes on frozen ones): they are storages like any
other, registered once before the step with the role "weights".

The tracker keeps a log rather than a running breakdown, because what a storage *is* is often
known only later: an optimizer's moments are created inside `step()`, a gradient is an op's
output before autograd accumulates it into `.grad`. After the run, any tick's live set can be
rebuilt from the log and classified by the roles learnt meanwhile.

The step is cut into segments (phase x region: "forward" / "layer 3", "backward" / "tail",
"optimizer" / "step"); each segment keeps its own peak and the tick it happened at, which is
what the few-layer extrapolation works from.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._guards import active_fake_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: The CUDA caching allocator's kMinBlockSize: every block is a multiple of 512 bytes.
BLOCK = 512

WEIGHTS = "weights"
GRADIENTS = "gradients"
OPTIMIZER = "optimizer"
ACTIVATIONS = "activations"
TEMPORARIES = "temporaries"
CATEGORIES = (WEIGHTS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TEMPORARIES)


def allocated_bytes(nbytes: int) -> int:
    """What the caching allocator charges for a request of `nbytes` (0 stays 0)."""
    return -(-nbytes // BLOCK) * BLOCK


#: Stream ids of `StorageTracker.intervals()`: the compute (default) stream, the side
#: streams FSDP2 allocates its collectives' buffers on, and the one DDP steps an optimizer in
#: backward on (`distributed.py` says which are which).
COMPUTE_STREAM = 0
ALL_GATHER_STREAM = 1
REDUCE_SCATTER_STREAM = 2
OPTIMIZER_STREAM = 3

#: One storage's life for an allocator replay: (requested bytes, born tick, died tick or None
#: while still live at the end, stream id).
Interval = tuple[int, int, int | None, int]


@dataclass(slots=True)
class _Record:
    nbytes: int  # as the allocator charges it (rounded to BLOCK)
    born: int
    segment: int  # index into StorageTracker.segments
    died: int | None = None
    role: str | None = None
    size: int = 0  # as requested (the storage's own nbytes)
    stream: int = COMPUTE_STREAM
    owner: str | None = None  # the module it belongs to ("layer 3"), where one does


@dataclass(slots=True)
class Segment:
    """A stretch of the step: which phase and region, its ticks, its peak."""

    step: int
    phase: str
    region: str
    start: int
    end: int = -1
    peak: int = 0
    peak_at: int = -1


_TORCH = str(Path(torch.__file__).parent) + os.sep

try:
    from torch.distributed.tensor import DTensor as _DTENSOR
    from torch.distributed.tensor._sharding_prop import ShardingPropagator as _PROPAGATOR
except ImportError:  # a build of torch without distributed
    _DTENSOR = None  # type: ignore[assignment,misc]
    _PROPAGATOR = None  # type: ignore[assignment,misc]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor that owns the storage: a DTensor's local shard, else the tensor."""
    return tensor._local_tensor if _DTENSOR is not None and isinstance(tensor, _DTENSOR) else tensor  # type: ignore[attr-defined]


_DRIVER = str(Path(__file__).with_name("run.py"))


def _op_site() -> str | None:
    """The model code's line an op runs for ("modeling_x.py:321": the innermost frame outside
    torch and this file); None for the autograd engine's own ops in backward, which runs
    from the trace's driver."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_TORCH) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or frame.f_code.co_filename == _DRIVER:
        return None
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


#: The tracker active in this thread (a trace may run in any of the operator's threads).
_ACTIVE = threading.local()
_PATCHED: list[bool] = []
_PATCH_LOCK = threading.Lock()


def _install_patches() -> None:
    """Two things no aten op shows, patched once for the process and routed to the tracker
    active in the calling thread (patching per tracker would race between threads):

    * `UntypedStorage.resize_`: FSDP2 allocates and frees its unsharded parameters by
      resizing their storages (torch's MemTracker patches it too,
      torch/distributed/_tools/mem_tracker.py, `_track_resize`).
    * DTensor's sharding propagation, which learns an op's output shape by running it on
      global-shape fake tensors in the fake mode already active (the trace's): those
      allocate nothing on a GPU, and are not counted.
    """
    with _PATCH_LOCK:
        if _PATCHED:
            return
        resize = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = resize(storage, size)
            tracker = getattr(_ACTIVE, "tracker", None)
            if tracker is not None:
                tracker.resized(storage, int(size))
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        if _PROPAGATOR is not None:
            propagate = _PROPAGATOR._propagate_tensor_meta_non_cached

            def quiet(propagator: Any, *args: Any, **kwargs: Any) -> Any:
                tracker = getattr(_ACTIVE, "tracker", None)
                if tracker is None:
                    return propagate(propagator, *args, **kwargs)
                tracker._quiet += 1
                try:
                    return propagate(propagator, *args, **kwargs)
                finally:
                    tracker._quiet -= 1

            _PROPAGATOR._propagate_tensor_meta_non_cached = quiet  # type: ignore[method-assign,assignment]
        _PATCHED.append(True)


class StorageTracker(TorchDispatchMode):
    """Records every storage created while active (and those `register`ed before)."""

    def __init__(self, split_ops: Callable[[str], bool] | None = None) -> None:
        super().__init__()
        self.records: list[_Record] = []
        self.segments = [Segment(step=-1, phase="setup", region="setup", start=0)]
        self.clock = 0
        self.current = 0
        self.peak = 0
        self.peak_at = 0
        #: Live storages: id(storage) -> its record's index. A storage resized to nothing
        #: (FSDP2 frees its unsharded parameters so) leaves it; resized back, it returns with
        #: a new record.
        self._live: dict[int, int] = {}
        #: A weak reference to every storage seen and not yet collected, by id.
        self._refs: dict[int, weakref.ref[Any]] = {}
        #: The stream new storages are allocated on (`intervals`); set by the driver.
        self.stream = COMPUTE_STREAM
        #: While True, storages created are host memory (an optimizer offloaded to the CPU):
        #: recorded as 0 bytes.
        self.on_host = False
        #: The role of storages born while it is set (FSDP2's gathered parameters: weights).
        self.role: str | None = None
        #: Regions whose ops each start a region of their own ("<region>#<site>:<op>:<n>",
        #: the n-th run of that op from that line of the model's code): what runs outside
        #: modules (a Mamba-2 scan is some fifty ops between two modules) then peaks op by op,
        #: not wherever the widths put it. Backward's own ops (the autograd engine's) stay in
        #: their module's region: which of them run changes with the widths. The counts run
        #: over the whole step (calibration traces one micro-batch).
        self.split_ops = split_ops
        self._op_runs: dict[tuple[int, str, str, str], int] = {}
        self._fake_mode: Any = None
        self._outer: StorageTracker | None = None
        self._quiet = 0

    # -- recording ------------------------------------------------------------------------

    def register(self, tensor: torch.Tensor, role: str | None = None) -> None:
        """Count a tensor's storage (if new) and give it a role (weights, gradients...)."""
        index = self._track(_local(tensor))
        if index is not None and role is not None:
            self.records[index].role = role

    def own(self, tensor: torch.Tensor, owner: str) -> None:
        """The tensor's storage (counted already) belongs to `owner`, a module a device map
        places ("embed", "layer 3", "head"); the first owner named keeps it (a tied weight
        is the embedding's)."""
        index = self._live.get(id(_local(tensor).untyped_storage()))
        if index is not None and self.records[index].owner is None:
            self.records[index].owner = owner

    def to_host(self, tensor: torch.Tensor) -> None:
        """The tensor's storage moves to host memory now (CPU offload): it stops counting."""
        storage = _local(tensor).untyped_storage()
        index = self._live.pop(id(storage), None)
        if index is not None:
            self._die(index)

    def _track(self, tensor: torch.Tensor) -> int | None:
        storage = tensor.untyped_storage()
        key = id(storage)
        known = self._live.get(key)
        if known is not None:
            return known
        if key in self._refs:  # resized to nothing, or moved to the host: not counted
            return None
        self._refs[key] = weakref.ref(storage, self._finalizer(key))
        return self._born(key, storage.nbytes())

    def _born(self, key: int, size: int) -> int:
        if self.on_host:
            size = 0
        nbytes = allocated_bytes(size)
        self.clock += 1
        index = len(self.records)
        self.records.append(
            _Record(
                nbytes,
                self.clock,
                len(self.segments) - 1,
                role=self.role,
                size=size,
                stream=self.stream,
            )
        )
        self._live[key] = index
        self.current += nbytes
        segment = self.segments[-1]
        if self.current > segment.peak:
            segment.peak, segment.peak_at = self.current, self.clock
        if self.current > self.peak:
            self.peak, self.peak_at = self.current, self.clock
        return index

    def _die(self, index: int) -> None:
        record = self.records[index]
        self.clock += 1
        record.died = self.clock
        self.current -= record.nbytes

    def _finalizer(self, key: int) -> Any:
        def freed(_: object) -> None:
            self._refs.pop(key, None)
            index = self._live.pop(key, None)
            if index is not None:
                self._die(index)

        return freed

    def resized(self, storage: torch.UntypedStorage, size: int) -> None:
        """`storage` now holds `size` bytes: FSDP2 allocates and frees its unsharded
        parameters by resizing their storages (`UntypedStorage.resize_`), which no aten op
        shows. The old size dies here and the new one is born."""
        key = id(storage)
        index = self._live.pop(key, None)
        if index is not None:
            self._die(index)
        if key not in self._refs:
            self._refs[key] = weakref.ref(storage, self._finalizer(key))
        if size > 0:
            self._born(key, size)

    def __enter__(self) -> StorageTracker:
        _install_patches()
        self._fake_mode = active_fake_mode()
        self._outer = getattr(_ACTIVE, "tracker", None)
        _ACTIVE.tracker = self
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *args: Any) -> None:
        _ACTIVE.tracker = self._outer
        self._outer = None
        super().__exit__(*args)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        # A DTensor (FSDP2's sharded parameters, their gradients and optimizer states) is a
        # wrapper: returning NotImplemented lets it run its local ops, which come back here
        # on the local tensors that own the storage (as torch's MemTracker does).
        if _DTENSOR is not None and any(t is _DTENSOR for t in types):
            return NotImplemented
        if self.split_ops is not None:
            self._enter_op(self.split_ops, str(func.overloadpacket.__name__))
        out = func(*args, **(kwargs or {}))
        # DTensor's sharding propagation runs ops under a fake mode of its own to learn
        # the outputs' shapes: those allocate nothing on the device (torch's MemTracker
        # skips them the same way).
        if self._quiet or active_fake_mode() is not self._fake_mode:
            return out
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        return out

    # -- allocator events -------------------------------------------------------------------

    def intervals(self) -> list[Interval]:
        """Every storage's (requested bytes, born tick, died tick or None, stream), in the
        order they were born: the allocation and free events an allocator replay consumes.
        Live sizes rounded to BLOCK sum, at any tick, to what the tracker counted then, so
        their maximum over ticks is `peak`. Empty storages (and those created on the host
        while an optimizer runs there) allocate nothing and are left out."""
        return [(r.size, r.born, r.died, r.stream) for r in self.records if r.size > 0]

    # -- segments -------------------------------------------------------------------------

    def _enter_op(self, split: Callable[[str], bool], op: str) -> None:
        last = self.segments[-1]
        region = last.region.partition("#")[0]
        if not split(region):
            return
        site = _op_site()
        if site is None:  # backward's own ops: which of them runs depends on the widths
            if region != last.region:  # (a view here, a copy there), so no name stays put
                self.enter(last.step, last.phase, region)
            return
        op = f"{site}:{op}"
        key = (last.step, last.phase, region, op)
        runs = self._op_runs.get(key, 0)
        self._op_runs[key] = runs + 1
        self.enter(last.step, last.phase, f"{region}#{op}:{runs}")

    def enter(self, step: int, phase: str, region: str) -> None:
        """Start a new segment now (the previous one ends here)."""
        last = self.segments[-1]
        if (last.step, last.phase, last.region) == (step, phase, region):
            return
        last.end = self.clock
        self.segments.append(
            Segment(step, phase, region, start=self.clock, peak=self.current, peak_at=self.clock)
        )

    def close(self) -> None:
        self.segments[-1].end = self.clock

    # -- reading (after the run) -----------------------------------------------------------

    def forward_ends(self) -> dict[int, int]:
        """For each segment index of a forward phase, the tick its forward pass ended."""
        ends: dict[int, int] = {}
        run: list[int] = []
        for i, seg in enumerate(self.segments):
            if seg.phase == "forward":
                run.append(i)
                continue
            if run:
                for j in run:
                    ends[j] = self.segments[run[-1]].end
                run = []
        for j in run:
            ends[j] = self.segments[run[-1]].end
        return ends

    def category(self, record: _Record, forward_end: dict[int, int]) -> str:
        """A storage with a role is that role. Otherwise it is an activation when a forward
        segment created it and it outlived that forward pass (kept for backward: saved
        tensors, checkpoint inputs, the loss's log-probabilities), else a temporary."""
        if record.role is not None:
            return record.role
        end = forward_end.get(record.segment)
        if end is not None and (record.died is None or record.died > end):
            return ACTIVATIONS
        return TEMPORARIES
