"""One rank of a data-parallel job, traced at the job's world size in one CPU process.

A job on N GPUs runs the same step on every rank; what one rank holds is what the traced
rank holds. The step runs as `run.py` runs it, on fake tensors, but wrapped the way the job
wraps it, under PyTorch's fake process group (the `fake` backend with a `FakeStore`,
`torch.testing._internal.distributed.fake_pg`): collectives return at once and move no data,
and every buffer they need is allocated as on a GPU, so the rank's peak at N = 64 is traced
as fast as at N = 2.

* FSDP2: `torch.distributed.fsdp.fully_shard` on each decoder block, then on the root (what
  accelerate, TRL, torchtune and torchtitan do), with `reshard_after_forward`, the
  mixed-precision policy (`MixedPrecisionPolicy(param_dtype, reduce_dtype)`) and the prefetch
  (None: FSDP2's implicit prefetch, the previous block in backward and none in forward; k:
  `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch` with the next k
  blocks). The device mesh is built before fake mode starts (inside it, its rank lookup
  fails on a data-dependent scalar).
* DDP: `torch.nn.parallel.DistributedDataParallel` with its gradient buckets
  (`bucket_cap_mb`, `gradient_as_bucket_view`). Three things of DDP's read data across ranks
  and cannot run on fake tensors, and none allocates on the GPU: the parameter-shape check at
  construction (skipped), the all-reduce (a comm hook that reduces in place in the bucket, as
  NCCL does) and the bucket rebuild of the second iteration (kept off, so the first
  iteration's buckets, the same bytes in another order, stay).

What FSDP2 holds beyond the shards is counted because it is allocated: the all-gather
buffer and the unsharded parameters copied out of it (FSDP2 allocates and frees these by
resizing their storages, which `StorageTracker` follows), the unsharded gradients, the
reduce-scatter input and output. Roles: the gathered parameters count as weights, the
unsharded gradients and the reduce-scatter buffers as gradients.

Streams (`StorageTracker.intervals`, for an allocator replay): a storage is tagged with the
stream FSDP2 has made current when it is allocated (`device_handle.stream(...)` is
followed): the all-gather buffer is allocated on the all-gather copy-in stream (1; its
all-gather stream is 1 too), the reduce-scatter output on the reduce-scatter stream (2),
everything else on the compute stream (0), including the unsharded parameters (copied out
on the compute stream) and the reduce-scatter input (allocated before FSDP2 switches
streams). What cannot be told: `record_stream` uses (a block freed on one stream while
another still reads it) and the events FSDP2 waits on; a replay frees each block when its
last tensor goes.

The trainer's switches, as the single-GPU trace runs them:

* `loss`: the same loss (`loss.compute_loss`), run inside the wrapped model's forward
  (`loss.wrapped_loss`), so that FSDP2's root and DDP hook the whole of it, as they do a
  fused loss that replaces the causal LM's forward (Liger, Unsloth).
* `optimizerInBackward`: one optimizer per parameter (`run._InBackward`), as torchtune's
  `optimizer_in_bwd` builds it. FSDP2: each sharded parameter is stepped by its
  post-accumulate-grad hook, which FSDP2 runs once the reduce-scatter has made its sharded
  gradient (on the reduce-scatter stream, where `foreach_reduce` runs it), and its gradient
  is freed there; a block's sharded gradients are views of one reduce-scatter output, which
  goes with the block's last. DDP: each bucket's parameters are stepped from the comm hook
  once the bucket is reduced, on an optimizer stream of their own, their gradients then the
  bucket's views until backward ends, as torch's `_apply_optim_in_backward_hook` does (the
  buckets themselves stay, as they always do).
* `activationOffloading`: refused, as by the single-GPU trace (`build.build_model`).

CPU offload: FSDP2's `CPUOffloadPolicy` keeps the shards, their gradients and the optimizer
step on the host. On fake CPU tensors the host and the device are one, so the offload is
counted, not run: sharded parameters leave the count once sharded, sharded gradients once
reduced, and the optimizer step's state and scratch are host memory. `offload_optimizer`
alone (ZeRO-Offload's split) puts only the optimizer's state and step on the host.

Why this tracker and not `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`: both
count storages through a dispatch mode and follow `resize_`, and on the steady-state step
they agree (Llama-3.1-8B cut to 4 layers, 512 tokens, world size 8: 6,210.14 MiB ours,
6,210.11 theirs for full fine-tuning, 4,899.58 / 4,899.55 for LoRA;
`benchmarks/bench_distributed_trace.py --compare`). FSDPMemTracker serves as that
cross-check only. Under fake tensors it also counts DTensor's first-step shape propagation
(the optimizer's first step runs each op once more on global-shape fake tensors in the
active fake mode, which its fake-mode test does not tell apart: 112 MiB for a rank of the
tests' 4-layer Llama at 8 ranks that holds 53). And it gives per-module and per-FSDP-state
peaks, not what the estimator needs: the run's timeline (allocation and free events with
sizes and streams, for the allocator replay), the step's fine regions (the few-layer
extrapolation keys on them), per-storage roles learnt after the fact (an optimizer moment
is known to be one only once `step()` made it), DDP, and optimizers that are not
`torch.optim.Optimizer`s (the modelled bitsandbytes ones). So `StorageTracker` counts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from controller.estimator import Precision, TrainingSettings
from controller.estimator.settings import Parallelism
from controller.trace import qlora
from controller.trace.build import DTYPES, TraceUnsupported, build_model
from controller.trace.loss import wrapped_loss
from controller.trace.optim import TracedOptimizer, build_optimizer
from controller.trace.run import (
    MIN_STEPS,
    RunResult,
    _InBackward,
    _Regions,
    _register_model,
    _result,
    decoder_layers,
    head_modules,
    text_layers,
)
from controller.trace.tracker import (
    ALL_GATHER_STREAM,
    COMPUTE_STREAM,
    GRADIENTS,
    OPTIMIZER,
    OPTIMIZER_STREAM,
    REDUCE_SCATTER_STREAM,
    WEIGHTS,
    Interval,
    StorageTracker,
)

#: DDP's default bucket size (torch.nn.parallel.DistributedDataParallel, bucket_cap_mb=None
#: -> 25 MiB; its first bucket is 1 MiB, `dist._DEFAULT_FIRST_BUCKET_BYTES`).
DDP_BUCKET_CAP_MB = 25

#: The process group is one per process, and the patches below are global: one trace at a time.
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Distributed:
    """How the job is spread: `world_size` ranks (nodes x GPUs per node) and how.

    `param_dtype` / `reduce_dtype`: FSDP2's mixed-precision policy (None: the parameters'
    own dtype); the shards stay in the job's precision, so fp32 shards with bf16 compute are
    `precision=fp32` with `param_dtype=bf16`. `prefetch`: None for FSDP2's implicit prefetch,
    k >= 1 to prefetch the next k blocks explicitly in forward and backward.
    """

    world_size: int
    parallelism: Parallelism = Parallelism.FSDP
    reshard_after_forward: bool = True
    prefetch: int | None = None
    param_dtype: Precision | None = None
    reduce_dtype: Precision | None = None
    offload_params: bool = False
    offload_optimizer: bool = False
    bucket_cap_mb: int = DDP_BUCKET_CAP_MB
    gradient_as_bucket_view: bool = False

    def check(self) -> None:
        """TraceUnsupported (one line) for what cannot be traced."""
        if self.world_size < 1:
            raise TraceUnsupported(f"world size must be at least 1, got {self.world_size}")
        if self.parallelism not in (Parallelism.FSDP, Parallelism.DDP):
            raise TraceUnsupported(
                f"only FSDP and DDP are traced at a world size, not {self.parallelism.value}"
            )
        if self.prefetch is not None and self.prefetch < 1:
            raise TraceUnsupported(f"prefetch must be None or >= 1, got {self.prefetch}")
        if self.parallelism is Parallelism.DDP and (
            self.param_dtype or self.reduce_dtype or self.offload_params
        ):
            raise TraceUnsupported(
                "DDP is traced without mixed-precision policy or parameter offload "
                "(those are FSDP's)"
            )


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """The fake process group at `world_size` (this process is rank 0) and a 1-D CPU device
    mesh over it; destroyed on the way out, so that it can be set up again in the same
    process. A real process group already set up in this process is left alone (refused)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with _LOCK:
        if dist.is_initialized():
            if dist.get_backend() != "fake":
                raise TraceUnsupported(
                    "a process group is already set up in this process; the distributed "
                    "trace needs its own"
                )
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
        try:
            yield init_device_mesh("cpu", (world_size,))
        finally:
            dist.destroy_process_group()


@dataclass(frozen=True)
class DistributedRun:
    """A traced rank: the run (as `run.trace_run` reads one) and its allocation events."""

    result: RunResult
    intervals: list[Interval]


def trace_distributed_run(
    config: Mapping[str, Any],
    settings: TrainingSettings,
    distributed: Distributed,
    layers: int | None = None,
    steps: int = MIN_STEPS,
) -> DistributedRun:
    """Trace `steps` optimizer steps of one rank at `distributed.world_size`, the model cut
    to `layers` layers (None: all)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    distributed.check()
    started = time.perf_counter()
    micro_batches = 2 if settings.gradient_accumulation > 1 else 1
    tracker = StorageTracker()
    with fake_process_group(distributed.world_size) as mesh, FakeTensorMode():
        model = build_model(config, settings, layers)
        count = layers if layers is not None else text_layers(model)
        blocks = decoder_layers(model, count)
        if blocks is None:
            raise TraceUnsupported("the model's decoder blocks were not found to shard")
        regions = _Regions(tracker, blocks, head_modules(model, blocks))
        total = sum(p.numel() for p in model.parameters()) + qlora.hidden_params(model)
        trainable_count = sum(p.numel() for p in model.parameters() if p.requires_grad)
        offload_step = distributed.offload_params or distributed.offload_optimizer
        in_backward = settings.switches.optimizer_in_backward
        with tracker, _patched(tracker, distributed) as hooks:
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer: TracedOptimizer | None = None
            if distributed.parallelism is Parallelism.FSDP:
                wrapped = _fully_shard(model, blocks, mesh, distributed)
                hooks.state = wrapped._get_fsdp_state()  # type: ignore[operator]
                for tensor in (*model.buffers(), *qlora.quantized_tensors(model)):
                    tracker.register(tensor, WEIGHTS)
                trainable = [p for p in model.parameters() if p.requires_grad]  # the shards
                if in_backward:
                    optimizer = _InBackward(trainable, settings, tracker, on_host=offload_step)
            else:
                _register_model(tracker, model)
                stepper = None
                if in_backward:
                    stepper = _InBackward(
                        trainable, settings, tracker, hooked=False, on_host=offload_step
                    )
                wrapped = _ddp(model, distributed, tracker, stepper)
                optimizer = stepper
            if optimizer is None:
                optimizer = build_optimizer(model.parameters(), settings.optimizer)
            for param in model.parameters():
                tracker.register(param, WEIGHTS)
                if distributed.offload_params:
                    tracker.to_host(param)
            if offload_step:
                for tensor in optimizer.state_tensors():  # fp32 masters, made up front
                    tracker.to_host(tensor)
            shape = (settings.batch, settings.lm_seq_len)
            input_ids = torch.zeros(shape, dtype=torch.long)
            attention_mask = torch.ones(shape, dtype=torch.long)
            labels = input_ids.clone()
            for step in range(steps):
                for _ in range(micro_batches):
                    regions.enter(step, "forward", "head")
                    loss = wrapped_loss(
                        wrapped, model, input_ids, attention_mask, labels, settings.loss
                    )
                    regions.enter(step, "backward", "tail")
                    loss.backward()
                    del loss
                    for param in trainable:
                        if param.grad is not None:
                            tracker.register(param.grad, GRADIENTS)
                regions.enter(step, "optimizer", "step")
                tracker.on_host = offload_step
                optimizer.step()
                tracker.on_host = False
                for tensor in optimizer.state_tensors():
                    tracker.register(tensor, OPTIMIZER)
                optimizer.zero_grad(set_to_none=True)
            tracker.close()
        intervals = tracker.intervals()
    seconds = time.perf_counter() - started
    result = _result(tracker, count, total, trainable_count, seconds)
    return DistributedRun(result, intervals)


def _fully_shard(
    model: nn.Module,
    blocks: nn.ModuleList,
    mesh: Any,
    distributed: Distributed,
) -> Any:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    def dtype(precision: Precision | None) -> torch.dtype | None:
        return None if precision is None else DTYPES[precision]

    policy = MixedPrecisionPolicy(
        param_dtype=dtype(distributed.param_dtype), reduce_dtype=dtype(distributed.reduce_dtype)
    )
    options: dict[str, Any] = {"mesh": mesh, "mp_policy": policy}
    if distributed.offload_params:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    for block in blocks:
        fully_shard(block, reshard_after_forward=distributed.reshard_after_forward, **options)
    root = fully_shard(model, reshard_after_forward=distributed.reshard_after_forward, **options)
    k = distributed.prefetch
    if k is not None:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1 : i + 1 + k]))  # type: ignore[operator]
            block.set_modules_to_backward_prefetch(list(blocks[max(i - k, 0) : i])[::-1])  # type: ignore[operator]
    return root


def _ddp(
    model: nn.Module,
    distributed: Distributed,
    tracker: StorageTracker,
    in_backward: _InBackward | None = None,
) -> Any:
    """DDP around `model`; with `in_backward`, each bucket's parameters are stepped once the
    bucket is reduced (module docstring)."""
    import torch.nn.parallel.distributed as ddp_module
    from torch.autograd import Variable

    # Unannotated: DDP checks a hook's annotations against dist.GradBucket at run time.
    def reduce_in_place(_state, bucket):  # type: ignore[no-untyped-def]
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    stepped: list[nn.Parameter] = []

    def reduce_then_step(state, bucket):  # type: ignore[no-untyped-def]
        assert in_backward is not None
        if not stepped:  # the first bucket of this backward
            Variable._execution_engine.queue_callback(free_grads)
        with _on_stream(tracker, OPTIMIZER_STREAM, contextlib.nullcontext()):
            for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
                if not distributed.gradient_as_bucket_view:
                    param.grad = grad  # the reduced gradient, in the bucket
                in_backward.step_param(param)
                stepped.append(param)
        return reduce_in_place(state, bucket)

    def free_grads() -> None:
        for param in stepped:
            param.grad = None
        stepped.clear()

    check = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *_a, **_k: None  # type: ignore[assignment]
    tracker.role = GRADIENTS  # the buckets
    try:
        wrapped = ddp_module.DistributedDataParallel(
            model,
            bucket_cap_mb=distributed.bucket_cap_mb,
            gradient_as_bucket_view=distributed.gradient_as_bucket_view,
            init_sync=False,
        )
    finally:
        tracker.role = None
        ddp_module._verify_param_shape_across_processes = check
    if in_backward is None:
        wrapped.register_comm_hook(None, reduce_in_place)
    else:
        wrapped.register_comm_hook(None, reduce_then_step)
        wrapped.reducer._set_optimizer_in_backward()  # the reducer leaves .grad to the hook
    wrapped.reducer = _NoRebuild(wrapped.reducer)  # type: ignore[assignment]
    return wrapped


class _NoRebuild:
    """DDP's reducer without the second iteration's bucket rebuild (module docstring)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


class _Hooks:
    state: Any = None


@contextlib.contextmanager
def _patched(tracker: StorageTracker, distributed: Distributed) -> Iterator[_Hooks]:
    """While FSDP2 runs: the stream it makes current tags new storages; the all-gather's
    storages are weights, the post-backward's (reduce-scatter) gradients; under parameter
    offload the reduced sharded gradients leave the device."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    hooks = _Hooks()
    original_stream = torch.cpu.stream

    def stream(target: Any) -> Any:
        ctx = getattr(hooks.state, "_comm_ctx", None)
        ids = {
            id(getattr(ctx, "all_gather_copy_in_stream", None)): ALL_GATHER_STREAM,
            id(getattr(ctx, "all_gather_stream", None)): ALL_GATHER_STREAM,
            id(getattr(ctx, "reduce_scatter_stream", None)): REDUCE_SCATTER_STREAM,
            id(getattr(ctx, "all_reduce_stream", None)): REDUCE_SCATTER_STREAM,
        }
        return _on_stream(tracker, ids.get(id(target), COMPUTE_STREAM), original_stream(target))

    def with_role(method: Callable[..., Any], role: str, after: Callable[[Any], None]) -> Any:
        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            before = tracker.role
            tracker.role = role
            try:
                return method(group, *args, **kwargs)
            finally:
                tracker.role = before
                after(group)

        return wrapper

    def nothing(_group: Any) -> None:
        pass

    def grads_before(method: Callable[..., Any]) -> Any:
        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            for fsdp_param in group.fsdp_params:
                grad = getattr(fsdp_param.unsharded_param, "grad", None)
                if grad is not None:
                    tracker.register(grad, GRADIENTS)
            return method(group, *args, **kwargs)

        return wrapper

    def offload_grads(group: Any) -> None:
        if distributed.offload_params:
            for fsdp_param in group.fsdp_params:
                if fsdp_param.sharded_param.grad is not None:
                    tracker.to_host(fsdp_param.sharded_param.grad)

    saved = {
        name: getattr(FSDPParamGroup, name)
        for name in ("unshard", "wait_for_unshard", "post_backward")
    }
    torch.cpu.stream = stream  # type: ignore[assignment]
    FSDPParamGroup.unshard = with_role(saved["unshard"], WEIGHTS, nothing)  # type: ignore[method-assign]
    FSDPParamGroup.wait_for_unshard = with_role(saved["wait_for_unshard"], WEIGHTS, nothing)  # type: ignore[method-assign]
    FSDPParamGroup.post_backward = grads_before(  # type: ignore[method-assign]
        with_role(saved["post_backward"], GRADIENTS, offload_grads)
    )
    try:
        yield hooks
    finally:
        torch.cpu.stream = original_stream  # type: ignore[assignment]
        for name, method in saved.items():
            setattr(FSDPParamGroup, name, method)


@contextlib.contextmanager
def _on_stream(tracker: StorageTracker, stream_id: int, inner: Any) -> Iterator[None]:
    before = tracker.stream
    tracker.stream = stream_id
    try:
        with inner:
            yield
    finally:
        tracker.stream = before
