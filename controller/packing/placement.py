"""Where a job goes: greedy, deterministic placement on the indexed free memory.

The per-GPU need at n GPUs is `Estimate.per_gpu_bytes(n, parallelism)`, the rule the CLI and
the status use too. Then:

1. **One node first, best fit.** Among nodes that can give n GPUs which each hold the need,
   take the tightest: for one GPU, the GPU with the least effective free memory that still
   holds the need; for n GPUs, the node whose n-th largest free memory is the least that
   holds it, and there its n tightest GPUs. Big GPUs stay free for big jobs. Ties go by
   node name, then GPU index.
2. **Several nodes, DDP and FSDP only** (never with `visibleDevices`, whose UUIDs go into
   one pod's environment), as k nodes x g GPUs with the same g on every node
   (torchrun starts the same number of processes per node), fewest nodes first: g runs from
   the largest count a node has down to 1 over the divisors of n, and for each g the k
   tightest nodes are taken. A job that comes as pods of its own shape (`pods`: a TrainJob's
   numNodes pods of n / numNodes GPUs each) takes only a g that holds a whole number of its
   pods, so no pod is split across nodes (a pod's GPUs are one node's).
3. **Device map: one node,** seed 1's rule on that node's GPUs taken most free first (the
   first holds the LM head and its logits, every further one counts at 85 % towards the
   pool and must hold its share); the tightest node that passes.
4. **`devicePlugin`: any free GPU of the node.** The pod asks its node for n GPUs and the
   device plugin picks which of the node's free GPUs (those no pod's process is on) it gets,
   so a node's n-th largest free memory promises nothing: the node holds the need only when
   its least free such GPU does (`index.bound`), and that least free memory is what best fit
   and a device map's rule judge. The GPUs named are the node's least free open ones, the
   worst the pod may get. `visibleDevices` and `dra` pin the exact GPUs named.

Worked examples (effective free memory in GiB; "need" per GPU):

* one GPU of 20: nodes a = [80, 24], b = [30] -> a GPU 1 (24 is the least that holds 20).
* two GPUs of 40 with FSDP: a = [80, 80, 45, 10], b = [50, 41] -> b (its 2nd largest, 41, is
  tighter than a's 80), GPUs 0 and 1.
* eight GPUs with FSDP on 4-GPU nodes (need 30 at n = 8), devicePlugin or DRA: no node has 8
  GPUs, so g = 4, k = 2: the two nodes whose 4th largest free memory is the least that holds
  30 (30 does). With `visibleDevices` there is no placement: 8 GPUs only as 1 x 8.
* DDP on 3 GPUs, nodes of 2 GPUs, devicePlugin or DRA: 3 is not 1 x 3 (no node has 3);
  3 x 1 -> three nodes, one GPU each, the tightest three. With `visibleDevices`: none.
* one GPU of 12, no pod on any GPU: a = [13, 80, 10], b = [14, 30]. With `dra` -> a GPU 0
  (13 is the least that holds 12); with `devicePlugin` -> b GPU 0 (a's device plugin may
  hand the pod its GPU 2, of 10; b's least free, 14, holds 12).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

from controller.estimator import Estimate, Parallelism
from controller.packing.fit import device_map_holds
from controller.packing.index import FreeIndex, NodeFilter


@dataclass(frozen=True, slots=True)
class Placed:
    """A placement in the index's terms: (node position, GPU positions on it) per node.

    `per_gpu_bytes` is the job's per-GPU figure (what the API records); `head_gpu_extra` is 0
    except for a device map, whose GPUs other than the first (the LM head's) hold that much
    less, and are charged so.
    """

    parts: tuple[tuple[int, tuple[int, ...]], ...]
    gpus: int
    per_gpu_bytes: int
    head_gpu_extra: int = 0

    def charges(self) -> Iterator[tuple[int, tuple[int, ...], tuple[int, ...]]]:
        """(node position, GPU positions, bytes each holds) per node."""
        for p, (pos, gpus) in enumerate(self.parts):
            each = [self.per_gpu_bytes - self.head_gpu_extra] * len(gpus)
            if p == 0 and each:
                each[0] = self.per_gpu_bytes
            yield pos, gpus, tuple(each)


def shapes(
    n: int, max_per_node: int, parallelism: Parallelism, one_node: bool = False, pods: int = 0
) -> Iterator[tuple[int, int]]:
    """(nodes, GPUs per node) for n GPUs, fewest nodes first; only (1, n) for a device map or
    `one_node` (visibleDevices), none when no node has n GPUs. With `pods` (n GPUs as that
    many equal pods, each whole on a node: a TrainJob's numNodes), only shapes whose nodes
    take whole pods, and none for a count `pods` does not divide."""
    if pods and n % pods:
        return
    if parallelism is Parallelism.DEVICE_MAP or one_node:
        if n <= max_per_node:  # every pod on the one node: whole pods
            yield 1, n
        return
    per_pod = n // pods if pods else 1
    for g in range(min(n, max_per_node), 0, -1):
        if n % g == 0 and g % per_pod == 0:
            yield n // g, g


def place(
    index: FreeIndex,
    estimate: Estimate,
    parallelism: Parallelism,
    n: int,
    ok: NodeFilter,
    one_node: bool = False,
    pods: int = 0,
) -> Placed | None:
    """The best-fit placement of the job on n GPUs, or None if none holds it now; on one
    node where the index (visibleDevices) or the job (`one_node`) says so, whole `pods` on
    each node where the job comes as that many pods (`shapes`)."""
    need = estimate.per_gpu_bytes(n, parallelism)
    if parallelism is Parallelism.DEVICE_MAP and n > 1:
        return _device_map(index, estimate, n, ok)
    if index.count_gpus(need) < n:
        return None  # fewer GPUs hold the need than the job takes: no shape can work
    for k, g in shapes(n, index.max_gpus, parallelism, index.one_node or one_node, pods):
        if index.count_nodes(g, need) < k:
            continue
        nodes = list(islice(index.nodes_fitting(g, need, ok), k))
        if len(nodes) == k:
            parts = tuple((pos, tuple(index.tightest(pos, g, need))) for pos in nodes)
            return Placed(parts, n, need)
    return None


def place_by_count(
    index: FreeIndex,
    estimate: Estimate,
    parallelism: Parallelism,
    n: int,
    ok: NodeFilter,
    one_node: bool = False,
    pods: int = 0,
) -> Placed | None:
    """n GPUs with the most free memory, whatever the need (policy Advise, and the GPUs a
    starving job is closest to fitting)."""
    for k, g in shapes(n, index.max_gpus, parallelism, index.one_node or one_node, pods):
        nodes = list(islice(index.nodes_by_free(g, ok), k))
        if len(nodes) == k:
            parts = tuple((pos, tuple(index.by_count(pos, g))) for pos in nodes)
            return Placed(parts, n, estimate.per_gpu_bytes(n, parallelism))
    return None


def closest(
    index: FreeIndex,
    estimate: Estimate,
    parallelism: Parallelism,
    n: int,
    ok: NodeFilter,
    one_node: bool = False,
    pods: int = 0,
) -> Placed | None:
    """The GPUs a waiting job is closest to fitting: n GPUs with the most free memory, or,
    where fewer are open (whole GPUs still in use), the open GPUs of the nodes that have the
    most of them, so that a starving job keeps each GPU that frees up."""
    placed = place_by_count(index, estimate, parallelism, n, ok, one_node, pods)
    if placed is not None:
        return placed
    for k, g in shapes(n, index.max_gpus, parallelism, index.one_node or one_node, pods):
        ranked = sorted(
            (-len(open_gpus), -sum(slot.free for _, slot in open_gpus), pos)
            for pos in range(len(index.nodes))
            if ok(pos) and len(index.nodes[pos].gpus) >= g
            for open_gpus in [index.open_gpus(pos)]
            if open_gpus
        )
        if len(ranked) >= k:
            parts = tuple((pos, tuple(index.by_count(pos, g))) for _, _, pos in ranked[:k])
            return Placed(parts, n, estimate.per_gpu_bytes(n, parallelism))
    return None


def _device_map(index: FreeIndex, estimate: Estimate, n: int, ok: NodeFilter) -> Placed | None:
    if index.count_nodes(n, estimate.device_map_min_bytes(n)) == 0:
        return None
    for pos in index.nodes_fitting(n, estimate.device_map_min_bytes(n), ok):
        if device_map_holds(estimate, index.frees_desc(pos, n)):
            gpus = tuple(index.by_count(pos, n))
            head = estimate.per_gpu_bytes(n, Parallelism.DEVICE_MAP)
            return Placed(((pos, gpus),), n, head, head - estimate.device_map_min_bytes(n))
    return None
