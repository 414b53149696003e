"""The load-time moment: what each GPU holds while the model is loaded, before the first step.

With `loadPath: wholeModelPerRank` every rank puts the whole model on its GPU before it is
sharded (from_pretrained with `device_map={"": local_rank}` or Unsloth's "sequential", a
`model.to(device)` before FSDP wraps it): for that moment each GPU holds all the weights in
the dtype they are loaded in (NF4 for a 4-bit load, which bitsandbytes quantises as it loads),
the adapters where the profile counts them with the weights, and the per-GPU fixed costs (the
CUDA context). FSDP does not divide it, so on many GPUs it can need more than the step's
shard of the job: `Estimate.load_moment` carries it and the per-GPU rule takes the larger.

With `metaSharded` (the default) no GPU ever holds more than its shard and one wrapped unit
while loading, which the step's own moments exceed: nothing is added.
"""

from __future__ import annotations

from dataclasses import replace

from controller.estimator.result import Estimate
from controller.estimator.settings import LoadPath, Parallelism, TrainingSettings

#: The components that make up the whole model as loaded, by profile naming; the CUDA context
#: as the unsloth profile names it (the others count it in `fixed_bytes`).
LOADED = ("weights", "lora_adapters")
_CONTEXT = "cuda_overhead"


def load_bytes(est: Estimate) -> int:
    """The whole model's bytes as loaded onto one GPU, without fixed costs."""
    return sum(est.components.get(name, 0) for name in LOADED)


def with_load_moment(est: Estimate, settings: TrainingSettings) -> Estimate:
    """`est` with the load-time moment added where the job loads the whole model per rank
    (unchanged otherwise). On one GPU the step needs more than the load (it holds the same
    weights and more), so only the per-GPU figure on several GPUs can change."""
    if settings.switches.load_path is not LoadPath.WHOLE_MODEL_PER_RANK:
        return est
    fixed = est.fixed_bytes + est.components.get(_CONTEXT, 0)
    moment = load_bytes(est) + fixed
    # FSDP's moments take it (`Estimate.fsdp_pairs`; a device map never loads the whole model
    # on each GPU), and so does a traced rank's figure, which saw only the step (the NCCL
    # communicator exists by then on the rule's path too).
    loaded = int((moment - est.fixed_bytes) * est.margin) + est.fixed_bytes + est.comm_bytes
    device_map = Parallelism.DEVICE_MAP.value
    # Where loading decides a traced rank's figure, its allocated level is the loaded model's.
    loading = {(v, c) for v, c, held in est.traced_per_gpu if v != device_map and loaded > held}
    return replace(
        est,
        load_moment=moment,
        traced_per_gpu=tuple(
            (value, count, held if value == device_map else max(held, loaded))
            for value, count, held in est.traced_per_gpu
        ),
        traced_allocated=tuple(
            (v, c, max(held, load_bytes(est)) if (v, c) in loading else held)
            for v, c, held in est.traced_allocated
        ),
    )
