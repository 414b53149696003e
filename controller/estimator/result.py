"""What an estimate returns: integer bytes per component, and how they spread over GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from controller.allocator.fixed_costs import fixed_bytes
from controller.estimator.settings import Parallelism

#: NCCL's communicator buffers on each rank of a data-parallel job (one communicator, the
#: ring's buffers over NVLink's 32 channels: controller.allocator.fixed_costs, sourced there).
NCCL_BYTES = fixed_bytes(2, 2)["nccl_ring_buffers"]
#: Components a process holds outside PyTorch's caching allocator, by each profile's name for
#: them: NVML counts them, `torch.cuda.max_memory_reserved()` does not.
OUTSIDE_ALLOCATOR = ("cuda_context", "cuda_overhead")


@dataclass(frozen=True)
class Levels:
    """One GPU's figure at the three levels people measure it: what tensors hold
    (`torch.cuda.max_memory_allocated`), what the caching allocator reserved
    (`max_memory_reserved`), and what NVML and `nvidia-smi` show for the process (the
    reservation plus the CUDA context and NCCL's buffers): the figure admission reserves."""

    allocated: int
    reserved: int
    nvml: int


@dataclass(frozen=True)
class Estimate:
    """Training memory of one job on one data-parallel replica.

    `components` (ordered, name -> bytes) sums exactly to `total_bytes`. For placement the
    tensors split in two: `sharded_bytes` (weights, adapters, gradients, optimizer states:
    FSDP/ZeRO-3 and a device map divide them across GPUs) and `replicated_bytes` (what each
    GPU holds for itself: one micro-batch of activations and logits, and the CUDA context
    where the profile counts it). `margin` is the profile's overall factor on those tensors
    (the analytic 1.1; the trace's replayed reserve over its peak; 1 where the overheads are
    components of their own), so that every per-GPU figure carries the same margin as the
    total; calibrated's reserve goes by `reserve_share` instead. `fixed_bytes` is the part of
    `replicated_bytes` the margin does not scale (a CUDA context is the same size on every
    GPU). `head_bytes` is the part of `replicated_bytes` only the GPU holding the LM head
    needs under a device map (the logits).

    `moments` are the (sharded, replicated) splits of the step's other moments, where a
    profile measures them (the trace's phases; the calibrated fits' moments, the decoder
    layers' gradients held by then sharded, `calibrated._holds_layer_gradients`): the largest
    total is the optimizer step's when checkpointing is on, but without it backward keeps
    a whole micro-batch of activations on every GPU, which FSDP does not divide, and on n
    GPUs that moment can need more than the step's. Each GPU needs the largest over them.

    `fsdp_moments`, where a profile prices them (calibrated), are the same moments as each
    rank of an FSDP2 job on two or more GPUs holds them: beside its shards, what FSDP2 keeps
    unsharded at that moment (the root's parameters, the all-gathered block and the
    prefetched one), counted in the replicated part. They replace the peak's split and
    `moments` for FSDP on n >= 2 (a device map all-gathers nothing). `ddp_bytes` is what
    each DDP rank on two or more GPUs holds beyond the single-GPU job: its gradient buckets.

    `traced_per_gpu` holds what one rank was traced to need at a world size, as
    (parallelism value, GPUs, bytes): the trace profile traces the job's own spread. Where
    it has the pair asked for, that is the per-GPU figure (its NCCL buffers included).
    `traced_allocated`, in the same form, is that rank's own tensor peak (the allocated
    level): a rank reserves far more beside its tensors than the single-GPU job does.

    `reserve_share` (numerator, denominator), where a profile measures it (calibrated), is
    what the caching allocator reserves beyond the tensors as a share of the tensors that
    are not `resident_bytes` (the weights, allocated once): on n GPUs each holds 1/n of the
    weights, so its reserve is the share of the rest of what it holds, which a single margin
    on everything would under-count where weights dominate the total. Without it `margin`
    scales every GPU's tensors alike. `fsdp_reserve_share` and `ddp_reserve_share`, where
    measured, replace it on each rank of an FSDP or DDP job on two or more GPUs: such a rank
    reserves more (FSDP2's collectives allocate on streams of their own, whose cached blocks
    the compute stream does not reuse), on what it holds beyond its own weights (1/n of them
    under FSDP, all of them under DDP).

    `load_moment`: what each rank of an FSDP job holds whole while the model loads, where the
    trainer loads the whole model on every rank (`load.py`); a device map never does.

    `comm_bytes`: what each rank on two or more GPUs under FSDP or DDP holds for NCCL's
    communicators (`NCCL_BYTES` where the profile counts them), outside the caching
    allocator: NVML counts them, so admission does.

    `paged_bytes`: the part of `sharded_bytes` a paged optimizer keeps in CUDA unified
    (managed) memory (bitsandbytes' `paged_adamw_32bit`: the state of each tensor of 10^5
    elements or more is allocated with `cudaMallocManaged`, not through PyTorch's caching
    allocator, and prefetched to the GPU as the step reaches it). Neither
    `max_memory_allocated` nor `max_memory_reserved` counts it, so `per_gpu_levels` leaves
    it out of those two levels; NVML counts the pages resident on the GPU, and they stay
    resident while the GPU has room (the driver pages them to host memory only under
    pressure), so the NVML level, the figure admission reserves, keeps it: reserving less
    would let a neighbour take memory the job's optimizer is using, and then every step
    pages it back in. It is resident (`resident_bytes`): no allocator reserve on it.
    """

    profile: str
    components: dict[str, int]
    total_params: int
    trainable_params: int
    sharded_bytes: int
    replicated_bytes: int
    margin: Fraction = Fraction(1)
    head_bytes: int = 0
    fixed_bytes: int = 0
    moments: tuple[tuple[int, int], ...] = ()
    fsdp_moments: tuple[tuple[int, int], ...] = ()
    ddp_bytes: int = 0
    traced_per_gpu: tuple[tuple[str, int, int], ...] = ()
    traced_allocated: tuple[tuple[str, int, int], ...] = ()
    comm_bytes: int = 0
    reserve_share: tuple[int, int] | tuple[()] = ()
    fsdp_reserve_share: tuple[int, int] | tuple[()] = ()
    ddp_reserve_share: tuple[int, int] | tuple[()] = ()
    load_moment: int = 0
    resident_bytes: int = 0
    paged_bytes: int = 0
    #: What admission learned of jobs like this one (`controller.learning.correct`), in whole
    #: percent: every per-GPU figure below is the estimator's x this / 100, rounded up to a
    #: byte. Admission's, not the estimator's: 100 in every estimate made, never encoded
    #: (`codec.py`), set on the copy a decision reads so that the decision core, the packer
    #: and the messages all use the one corrected figure.
    correction_percent: int = 100

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())

    def per_gpu_bytes(self, gpus: int, parallelism: Parallelism = Parallelism.FSDP) -> int:
        """What each of `gpus` GPUs must hold: the one per-GPU rule of vramgate.

        DDP replicates the whole job on every GPU, plus its gradient buckets on two or more
        (`ddp_bytes`); FSDP (and a device map, for the GPU that holds the LM head) holds
        `sharded / n + replicated`, FSDP of its `fsdp_moments` where the profile gives them.
        On one GPU every parallelism holds `total_bytes`. FSDP and DDP ranks add NCCL's
        buffers (`comm_bytes`) and reserve by their own share where there is one
        (`fsdp_reserve_share`, `ddp_reserve_share`). Where the job's rank was traced at this
        count and parallelism (`traced_per_gpu`), the traced figure is the answer. All of it
        x `correction_percent` / 100.
        """
        return self._corrected(self._estimated_per_gpu(gpus, parallelism))

    def _corrected(self, figure: int) -> int:
        """`figure` x `correction_percent` / 100, rounded up (`controller.learning`'s rule,
        so the figure a correction's message names is the figure decided on)."""
        if self.correction_percent == 100:
            return figure
        return -(-figure * self.correction_percent // 100)

    def _estimated_per_gpu(self, gpus: int, parallelism: Parallelism) -> int:
        if self.traced_per_gpu:
            for value, count, held in self.traced_per_gpu:
                # a DDP rank holds the same on any count of two or more
                ddp = parallelism is Parallelism.DDP and gpus >= 2 and count >= 2
                if value == parallelism.value and (count == gpus or ddp):
                    return held
        n = max(gpus, 1)
        if n == 1:
            return self.total_bytes
        if parallelism is Parallelism.DDP:
            if self.ddp_reserve_share:  # the rank's own reserve on the job and its buckets
                held = self.sharded_bytes + self.replicated_bytes + self.ddp_bytes
                return self._with_margin(held, 1, self.ddp_reserve_share) + self.comm_bytes
            buckets = self.ddp_bytes + self._reserved(self.ddp_bytes, 1, False)
            return self.total_bytes + buckets + self.comm_bytes
        fsdp = parallelism is Parallelism.FSDP
        sharded, replicated = self._deciding(n, fsdp)
        held = sharded // n + replicated
        if fsdp:
            return self._with_margin(held, n, self.fsdp_reserve_share) + self.comm_bytes
        return self._with_margin(held, n)

    def undivided_bytes(self, gpus: int) -> int:
        """The part of `per_gpu_bytes(gpus)` under FSDP that FSDP does not divide: what each
        GPU holds whole at the moment that decides the need (its own micro-batch's
        activations and buffers, the CUDA context). Why 8 GPUs can need far more than the
        total over 8."""
        n = max(gpus, 1)
        if n == 1:
            return self._corrected(self.total_bytes)
        held = self._with_margin(self._deciding(n, True)[1], n, self.fsdp_reserve_share)
        return self._corrected(held)

    @property
    def fsdp_pairs(self) -> tuple[tuple[int, int], ...]:
        """The (sharded, replicated) splits FSDP on two or more GPUs chooses among."""
        pairs = self.fsdp_moments or ((self.sharded_bytes, self.replicated_bytes), *self.moments)
        return (*pairs, (0, self.load_moment)) if self.load_moment else pairs

    def _deciding(self, n: int, fsdp: bool) -> tuple[int, int]:
        """The (sharded, replicated) split, of the peak's or a moment's, that needs the most
        on each of n GPUs (under FSDP, of `fsdp_moments` where there are any)."""
        pairs = (
            self.fsdp_pairs
            if fsdp
            else ((self.sharded_bytes, self.replicated_bytes), *self.moments)
        )
        best = pairs[0]
        held = best[0] // n + best[1]
        for pair in pairs:
            if pair[0] // n + pair[1] > held:
                best, held = pair, pair[0] // n + pair[1]
        return best

    @property
    def most_replicated_bytes(self) -> int:
        """What every GPU holds whole at the moment it holds the most so: no count of GPUs
        takes less (under FSDP)."""
        return max(r for _, r in self.fsdp_pairs)

    def per_gpu_levels(self, gpus: int, parallelism: Parallelism = Parallelism.FSDP) -> Levels:
        """`per_gpu_bytes` (the NVML level) with the reserved and allocated levels beneath it:
        reserved is it without what sits outside the allocator (OUTSIDE_ALLOCATOR, NCCL's
        buffers) and a paged optimizer's state (`paged_bytes`, that GPU's share of it);
        allocated is the tensors the rule holds on that GPU before the margin (the
        allocator's reserve, or analytic's 10 % that stands for it), the paged state aside.
        A traced rank's allocated level is its own tensor peak (`traced_allocated`), else its
        figure is split as the single-GPU estimate splits."""
        nvml = self.per_gpu_bytes(gpus, parallelism)
        context = sum(self.components.get(name, 0) for name in OUTSIDE_ALLOCATOR)
        n = max(gpus, 1)
        one_process = n == 1 or parallelism is Parallelism.DEVICE_MAP
        comm = 0 if one_process else self.comm_bytes
        spread = parallelism is not Parallelism.DDP  # FSDP and a device map divide the state
        paged = self.paged_bytes // n if spread else self.paged_bytes
        reserved = nvml - comm - context - paged
        whole = self.sharded_bytes + self.replicated_bytes  # one GPU, before the margin
        traced = any(
            v == parallelism.value
            and (c == gpus or (parallelism is Parallelism.DDP and gpus >= 2 and c >= 2))
            for v, c, _ in self.traced_per_gpu
        )
        own = [
            held
            for v, c, held in self.traced_allocated
            if v == parallelism.value
            and (c == gpus or (parallelism is Parallelism.DDP and gpus >= 2 and c >= 2))
        ]
        if traced and own:
            held = own[0]
        elif traced:
            unreserved = self.total_bytes - context
            held = reserved * (whole - context) // unreserved if unreserved > 0 else reserved
        elif n == 1:
            held = whole - context
        elif parallelism is Parallelism.DDP:
            held = whole + self.ddp_bytes - context
        else:
            sharded, replicated = self._deciding(n, parallelism is Parallelism.FSDP)
            held = sharded // n + replicated - context
        return Levels(allocated=max(0, min(held - paged, reserved)), reserved=reserved, nvml=nvml)

    def device_map_min_bytes(self, gpus: int) -> int:
        """Seed 1's per-GPU minimum for a GPU of a device map that does not hold the LM head:
        its share of the shards and its own activations, without the logits."""
        if gpus <= 1:
            return self._corrected(self.total_bytes)
        share = self.sharded_bytes // gpus + self.replicated_bytes - self.head_bytes
        return self._corrected(self._with_margin(share, gpus))

    def _with_margin(self, held: int, n: int = 1, share: tuple[int, int] | tuple[()] = ()) -> int:
        return held + self._reserved(held - self.fixed_bytes, n, True, share)

    def _reserved(
        self, tensors: int, n: int, resident: bool = True, share: tuple[int, int] | tuple[()] = ()
    ) -> int:
        """The margin on `tensors` of one of n GPUs: the allocator's reserve (`share`, else
        `reserve_share`, of what is not its share of the resident weights), else
        `margin - 1` of them."""
        share = share or self.reserve_share
        if share:
            base = tensors - (self.resident_bytes // n if resident else 0)
            return max(0, base) * share[0] // share[1]
        return int(tensors * self.margin) - tensors
