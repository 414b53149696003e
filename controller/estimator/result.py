"""What an estimate returns: integer bytes per component, and how they spread over GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from controller.estimator.settings import Parallelism


@dataclass(frozen=True, slots=True)
class Estimate:
    """Training memory of one job on one data-parallel replica.

    `components` (ordered, name -> bytes) sums exactly to `total_bytes`. For placement the
    bytes split in two: `sharded_bytes` (weights, adapters, gradients, optimizer states:
    FSDP/ZeRO-3 and a device map divide them across GPUs) and `replicated_bytes` (what each
    GPU holds for itself: one micro-batch of activations and logits, and the CUDA context
    where the profile counts it). `usable_fraction` is the share of a GPU's free memory the
    profile lets the job plan on; with it, the per-card rule replaces the profile's overall
    margin (the analytic 1.1), as seed 2 does for FSDP.
    """

    profile: str
    components: dict[str, int]
    total_params: int
    trainable_params: int
    sharded_bytes: int
    replicated_bytes: int
    usable_fraction: Fraction

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())

    def per_gpu_bytes(self, n_gpus: int) -> int:
        """Bytes each of n GPUs needs when the shardable part is split evenly."""
        return self.sharded_bytes // max(n_gpus, 1) + self.replicated_bytes

    def bytes_per_gpu(self, gpus: int, parallelism: Parallelism) -> int:
        """What each of `gpus` GPUs holds: DDP replicates the job, FSDP and a device map split
        the shardable part. One GPU holds the whole estimate, its margin included."""
        if gpus <= 1:
            return self.total_bytes
        return self.per_gpu_bytes(1 if parallelism is Parallelism.DDP else gpus)

    @property
    def pooled_bytes(self) -> int:
        """Bytes a job needs from a pool of GPUs (the device-map rule), before card limits."""
        return self.sharded_bytes + self.replicated_bytes
